//! What happens to deliveries of inactive subscriptions (hold, cancel, skip), automatic pause after consecutive
//! failures and resume, and Relay's follow-up event for a dead `message.received`.

use std::time::Duration;

use hookline_core::policy;
use serde_json::json;

use crate::support::{wait_for, Pipeline};

const LIMIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_hold_subscription_gets_its_deliveries_after_resume() {
    let p = Pipeline::start(2).await;
    let (id, _) = p.subscribe(json!({"url": p.url("held"), "event_types": ["*"], "policy": "lucibook"})).await;
    let (status, v) = p.call("POST", &format!("/v1/subscriptions/{id}/pause"), None).await;
    assert_eq!((status, v["state"].as_str()), (200, Some("paused")));
    // A delivery of another subscription proves the pipeline moved past the held events.
    p.subscribe(json!({"url": p.url("witness"), "event_types": ["*"]})).await;
    for i in 0..3 {
        p.publish(&format!("evt_hold{i}"), "thing.happened").await;
    }
    p.wait_finals(3, LIMIT).await;
    assert!(p.requests_to("held").is_empty(), "nothing is delivered while paused");
    let (status, v) = p.call("POST", &format!("/v1/subscriptions/{id}/resume"), None).await;
    assert_eq!((status, v["state"].as_str()), (200, Some("active")));
    p.wait_finals(6, LIMIT).await;
    let mut ids: Vec<String> = p.requests_to("held").iter().map(|r| r.headers["webhook-id"].to_str().unwrap().to_owned()).collect();
    ids.sort();
    assert_eq!(ids, ["evt_hold0", "evt_hold1", "evt_hold2"]);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inactive_subscriptions_cancel_or_skip_as_their_policy_says() {
    let p = Pipeline::start(2).await;
    let (fynapse, _) = p.subscribe(json!({"url": p.url("f"), "event_types": ["*"], "policy": "fynapse"})).await;
    let (gauge, _) = p.subscribe(json!({"url": p.url("g"), "event_types": ["*"], "policy": "gauge"})).await;
    // Gauge's vocabulary: switched off with PATCH {"enabled": false}.
    let (status, _) = p.call("PATCH", &format!("/v1/subscriptions/{gauge}"), Some(json!({"enabled": false}))).await;
    assert_eq!(status, 200);
    let (status, _) = p.call("POST", &format!("/v1/subscriptions/{fynapse}/pause"), None).await;
    assert_eq!(status, 200);
    p.publish("evt_inactive", "thing.happened").await;
    p.wait_finals(2, LIMIT).await;
    let finals = p.finals();
    let f = finals.iter().find(|a| a.subscription_id == fynapse).unwrap();
    assert_eq!((f.final_state.as_str(), f.status_word.as_str()), ("cancelled", "CANCELLED"));
    let g = finals.iter().find(|a| a.subscription_id == gauge).unwrap();
    assert_eq!(g.final_state, "skipped");
    assert!(p.requests_to("f").is_empty() && p.requests_to("g").is_empty());
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consecutive_failures_pause_the_endpoint_until_its_owner_resumes_it() {
    let p = Pipeline::start(2).await;
    // LuciBook scaled down: pause after 3 counted failures, one attempt per delivery.
    let mut lb = policy::builtin("lucibook").unwrap();
    lb.schedule.waits_s = Some(vec![1.0]);
    lb.schedule.max_attempts = Some(1);
    lb.disable.as_mut().unwrap().after_consecutive_failures = Some(3);
    let toml = toml::to_string(&lb).unwrap();
    p.script("sick", vec![Some((500, None)), Some((500, None)), Some((500, None)), Some((204, None))]);
    let (id, _) = p.subscribe(json!({"url": p.url("sick"), "event_types": ["*"], "policy_toml": toml})).await;
    for i in 0..3 {
        p.publish(&format!("evt_sick{i}"), "thing.happened").await;
        p.wait_finals(i + 1, LIMIT).await;
    }
    // The third counted failure paused it: an ops event, and visible on the subscription with the reason.
    let ev = p.wait_ops("endpoint_paused").await;
    assert_eq!((ev.subscription_id.as_str(), ev.reason.as_str()), (id.as_str(), "consecutive_failures"));
    let view = p.subscription_when(&id, |v| v["state"] == "paused").await;
    assert_eq!(view["disabled_reason"], "consecutive_failures");
    assert_eq!(view["consecutive_failures"], 3);
    p.publish("evt_while_paused", "thing.happened").await;
    let (status, _) = p.call("POST", &format!("/v1/subscriptions/{id}/resume"), None).await;
    assert_eq!(status, 200);
    p.wait_finals(4, LIMIT).await;
    let got = p.requests_to("sick");
    assert_eq!(got.len(), 4);
    assert_eq!(got[3].headers["webhook-id"], "evt_while_paused", "the held delivery went out after resume");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_sends_message_failed_when_a_message_received_delivery_dies() {
    let p = Pipeline::start(2).await;
    // 404 is terminal for Relay ("any other HTTP response").
    p.script("agent-bot", vec![Some((404, None))]);
    p.subscribe(json!({"url": p.url("agent-bot"), "event_types": ["message.received"], "policy": "relay"})).await;
    p.subscribe(json!({"url": p.url("sender"), "event_types": ["message.failed"], "policy": "relay"})).await;
    p.publish("evt_msg1", "message.received").await;
    p.wait_finals(2, LIMIT).await;
    let seen = p.seen.clone();
    wait_for(&p.seen.changed, LIMIT, "the follow-up", || seen.requests.lock().unwrap().iter().any(|r| r.path == "sender")).await;
    let follow = &p.requests_to("sender")[0];
    let body: serde_json::Value = serde_json::from_slice(&follow.body).unwrap();
    assert_eq!(body["type"], "message.failed");
    assert_eq!(body["data"]["event_id"], "evt_msg1");
    assert_eq!(p.requests_to("agent-bot").len(), 1, "terminal: one attempt");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lucibook_429s_do_not_count_toward_auto_pause() {
    let p = Pipeline::start(2).await;
    let mut lb = policy::builtin("lucibook").unwrap();
    lb.schedule.waits_s = Some(vec![1.0]);
    lb.schedule.max_attempts = Some(1);
    lb.disable.as_mut().unwrap().after_consecutive_failures = Some(2);
    let toml = toml::to_string(&lb).unwrap();
    // 500, 429, 429, 429: one counted failure; a pause would need two.
    p.script("busy", vec![Some((500, None)), Some((429, Some("1")))]);
    let (id, _) = p.subscribe(json!({"url": p.url("busy"), "event_types": ["*"], "policy_toml": toml})).await;
    for i in 0..4 {
        p.publish(&format!("evt_busy{i}"), "thing.happened").await;
        p.wait_finals(i + 1, LIMIT).await;
    }
    let view = p.subscription_when(&id, |v| v["consecutive_failures"] == 1).await;
    assert_eq!(view["state"], "active", "{view}");
    assert!(p.ops.items.lock().unwrap().is_empty(), "no pause, no ops event");
    assert_eq!(p.requests_to("busy").len(), 4);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gauge_disables_an_endpoint_failing_for_its_duration_and_enabled_true_clears_the_reason() {
    let p = Pipeline::start(2).await;
    // Gauge with "3 days" scaled down to 1 s and one attempt per delivery.
    let mut g = policy::builtin("gauge").unwrap();
    g.schedule.waits_s = Some(vec![1.0]);
    g.schedule.max_attempts = Some(1);
    g.disable.as_mut().unwrap().after_failing_for_s = Some(1.0);
    let toml = toml::to_string(&g).unwrap();
    p.script("down", vec![Some((503, None))]);
    let (id, _) = p.subscribe(json!({"url": p.url("down"), "event_types": ["*"], "policy_toml": toml})).await;
    p.publish("evt_down0", "thing.happened").await;
    p.wait_finals(1, LIMIT).await;
    // Failing since the first failure; the first failure after the duration switches it off. The rule is about
    // elapsed wall time, so the test lets that time pass (the only sleep here: there is no signal for "1 s later").
    let first = p.finals()[0].started_at_ms;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    tokio::time::sleep(Duration::from_millis(u64::try_from(first + 1_100 - now).unwrap_or(0))).await;
    assert!(p.ops.items.lock().unwrap().is_empty(), "not disabled before a failure past the duration");
    p.publish("evt_down1", "thing.happened").await;
    let n = 2;
    p.wait_finals(n, LIMIT).await;
    let ev = p.wait_ops("endpoint_disabled").await;
    assert!(ev.at_ms - first >= 1_000, "not before the duration: {}", ev.at_ms - first);
    let view = p.subscription_when(&id, |v| v["enabled"] == false).await;
    assert_eq!(view["disabled_reason"], "consecutive_failures");
    // While off, nothing is delivered (skip).
    let before = p.requests_to("down").len();
    p.publish("evt_while_off", "thing.happened").await;
    p.wait_finals(n + 1, LIMIT).await;
    assert_eq!(p.requests_to("down").len(), before);
    assert_eq!(p.finals().last().unwrap().final_state, "skipped");
    let (status, v) = p.call("PATCH", &format!("/v1/subscriptions/{id}"), Some(json!({"enabled": true}))).await;
    assert_eq!(status, 200);
    assert_eq!((v["enabled"].as_bool(), v["disabled_reason"].is_null()), (Some(true), true), "{v}");
    p.stop().await;
}
