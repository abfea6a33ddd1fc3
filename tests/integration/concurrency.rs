//! Adaptive concurrency (policy `[concurrency]`): an overloaded endpoint gets fewer concurrent requests, one that
//! recovers gets more; a `Retry-After` on a 429 pauses the whole endpoint, not only the delivery that got it.

use std::time::Duration;

use hookline_core::policy::ConcurrencyRule;
use serde_json::json;

use crate::pipeline::quick_policy;
use crate::support::{wait_for, Pipeline};

const LIMIT: Duration = Duration::from_secs(60);

/// The API's `concurrency_limit` once `done` holds for it. It follows the endpoint-state topic, so there is no
/// signal to wait on: re-read every 50 ms, bounded by `LIMIT`.
async fn limit_reaches(p: &Pipeline, sub: &str, done: impl Fn(u64) -> bool) -> u64 {
    let t = std::time::Instant::now();
    let mut last = serde_json::Value::Null;
    while t.elapsed() < LIMIT {
        let (_, v) = p.call("GET", &format!("/v1/subscriptions/{sub}"), None).await;
        if let Some(l) = v["concurrency_limit"].as_u64().filter(|l| done(*l)) {
            return l;
        }
        last = v;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("concurrency_limit never reached the expected value: {last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overloaded_endpoint_gets_fewer_concurrent_requests_and_more_once_it_recovers() {
    let p = Pipeline::start_with(1, |c| c.dispatcher.per_subscription_concurrency = 8).await;
    let policy = quick_policy(&[0.2; 12], |pol| {
        pol.attempt.timeout_ms = 400;
        pol.concurrency = Some(ConcurrencyRule { min: 1, max: 8, slow_ms: None, pause_on_retry_after: true });
    });
    // Overloaded for its first 30 requests (no answer within the 400 ms timeout: a few seconds at 8, then 4, 2
    // and 1 at a time), then healthy.
    let mut script = vec![None; 30];
    script.push(Some((204, None)));
    p.script("c", script);
    let (sub, _) = p.subscribe(json!({"url": p.url("c"), "event_types": ["*"], "policy_toml": policy})).await;
    for i in 0..16 {
        p.publish(&format!("evt_{i}"), "order.created").await;
    }
    // 8 → 4 → 2 → 1, at most one halving a second.
    limit_reaches(&p, &sub, |l| l == 1).await;
    let finals = p.wait_final_of(&sub, 16, LIMIT).await;
    assert!(finals.iter().filter(|a| !a.final_state.is_empty()).all(|a| a.final_state == "succeeded"), "nothing lost: {finals:?}");
    // Healthy answers raise it again: 1 → 2 → 3 → 4 (each step takes a window of `limit` answers). Sixteen more
    // events, so the rise does not depend on how many of the first ones the overload used up on a loaded host.
    for i in 16..32 {
        p.publish(&format!("evt_{i}"), "order.created").await;
    }
    let l = limit_reaches(&p, &sub, |l| l >= 4).await;
    assert!(l <= 8, "{l}");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_pauses_the_whole_endpoint() {
    let p = Pipeline::start_with(1, |c| c.dispatcher.per_subscription_concurrency = 1).await;
    let policy = quick_policy(&[0.2, 0.2], |pol| {
        pol.concurrency = Some(ConcurrencyRule { min: 1, max: 1, slow_ms: None, pause_on_retry_after: true });
    });
    p.script("r", vec![Some((429, Some("2"))), Some((204, None))]);
    let (sub, _) = p.subscribe(json!({"url": p.url("r"), "event_types": ["*"], "policy_toml": policy})).await;
    for i in 0..3 {
        p.publish(&format!("evt_{i}"), "order.created").await;
    }
    p.wait_final_of(&sub, 3, LIMIT).await;
    wait_for(&p.seen.changed, LIMIT, "four requests", || p.requests_to("r").len() >= 4).await;
    let mut at: Vec<_> = p.requests_to("r").into_iter().map(|r| r.at).collect();
    at.sort();
    let quiet = at[1].duration_since(at[0]);
    // Without the pause, the next event's request would follow the 429 at once.
    assert!(quiet >= Duration::from_millis(1_900), "the endpoint got its next request {quiet:?} after Retry-After: 2");
    assert_eq!(at.len(), 4, "the 429'd delivery once more, the other two once each");
    p.stop().await;
}

/// A short `Retry-After` pause is waited out inside the endpoint's lane: its other deliveries go as soon as it
/// ends, in the order they came, without a round trip through the retry ladder each. No retry-scheduler runs
/// here, so a delivery parked on the ladder would never come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_retry_after_pause_is_waited_out_in_the_lane_in_order() {
    let p = Pipeline::start_without_scheduler(1, |c| c.dispatcher.per_subscription_concurrency = 1).await;
    let policy = quick_policy(&[0.2], |pol| {
        pol.concurrency = Some(ConcurrencyRule { min: 1, max: 1, slow_ms: None, pause_on_retry_after: true });
    });
    p.script("r", vec![Some((429, Some("1"))), Some((204, None))]);
    let (sub, _) = p.subscribe(json!({"url": p.url("r"), "event_types": ["*"], "policy_toml": policy})).await;
    for i in 0..5 {
        p.publish(&format!("evt_{i}"), "order.created").await;
    }
    wait_for(&p.seen.changed, LIMIT, "the four other deliveries after the pause", || p.requests_to("r").len() >= 5).await;
    let mut reqs = p.requests_to("r");
    reqs.sort_by_key(|r| r.at);
    let ids: Vec<String> =
        reqs.iter().map(|r| serde_json::from_slice::<serde_json::Value>(&r.body).unwrap()["id"].as_str().unwrap().to_owned()).collect();
    assert_eq!(ids, ["evt_0", "evt_1", "evt_2", "evt_3", "evt_4"], "in the order they came");
    let quiet = reqs[1].at.duration_since(reqs[0].at);
    assert!(quiet >= Duration::from_millis(900), "the endpoint got its next request {quiet:?} after Retry-After: 1");
    let attempts = p.wait_final_of(&sub, 4, LIMIT).await;
    let finals: Vec<_> = attempts.iter().filter(|a| !a.final_state.is_empty()).collect();
    assert!(finals.len() == 4 && finals.iter().all(|a| a.final_state == "succeeded"), "{attempts:?}");
    // The 429'd delivery's own next attempt is its policy's: on the ladder (1 s), which nobody reads here.
    assert_eq!(p.requests_for("r", "evt_0"), 1);
    p.stop().await;
}
