//! The circuit breaker of a policy's `[breaker]`: after consecutive timeouts the endpoint gets no request for the
//! cool-off (the deliveries wait, uncounted), then one probe; its success lets the rest through.

use std::time::Duration;

use hookline_core::policy::BreakerRule;
use serde_json::json;

use crate::pipeline::quick_policy;
use crate::support::Pipeline;

const LIMIT: Duration = Duration::from_secs(60);
const COOL_OFF_MS: u64 = 3_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_endpoint_gets_no_requests_while_its_breaker_is_open() {
    let p = Pipeline::start_with(1, |c| c.dispatcher.per_subscription_concurrency = 1).await;
    let policy = quick_policy(&[0.2, 0.2, 0.2, 0.2], |pol| {
        pol.attempt.timeout_ms = 300;
        pol.breaker = Some(BreakerRule { consecutive_errors: 3, cool_off_ms: COOL_OFF_MS, max_cool_off_ms: COOL_OFF_MS });
    });
    // Three requests that never get an answer (timeouts), then a healthy endpoint.
    p.script("b", vec![None, None, None, Some((200, None))]);
    let (sub, _) = p.subscribe(json!({"url": p.url("b"), "event_types": ["*"], "policy_toml": policy})).await;
    for i in 1..=4 {
        p.publish(&format!("evt_{i}"), "order.created").await;
    }
    let v = p.subscription_when(&sub, |v| v["circuit_breaker"]["state"] == "open").await;
    assert!(v["circuit_breaker"]["open_until_ms"].as_i64().is_some(), "{v}");

    let attempts = p.wait_final_of(&sub, 4, LIMIT).await;
    let mut requests: Vec<_> = p.requests_to("b").into_iter().map(|r| r.at).collect();
    requests.sort();
    assert_eq!(requests.len(), 7, "three timeouts, then each event once: parked deliveries sent nothing");
    let quiet = requests[3].duration_since(requests[2]);
    // The third timeout opened it 300 ms after its request; nothing went out for the cool-off after that.
    assert!(quiet >= Duration::from_millis(COOL_OFF_MS), "the next request came {quiet:?} after the third timeout");
    let timeouts = attempts.iter().filter(|a| a.outcome == "timeout").count();
    assert_eq!((timeouts, attempts.len()), (3, 7), "waiting behind the breaker is not an attempt: {attempts:?}");
    assert!(attempts.iter().filter(|a| !a.final_state.is_empty()).all(|a| a.final_state == "succeeded"), "{attempts:?}");
    p.subscription_when(&sub, |v| v["circuit_breaker"]["state"] == "closed").await;
    p.stop().await;
}
