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
    let mut ids: Vec<String> =
        p.requests_to("held").iter().map(|r| r.headers["webhook-id"].to_str().unwrap().to_owned()).collect();
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
    // The third counted failure paused it: visible on the subscription, with the policy's reason.
    let mut view = serde_json::Value::Null;
    for _ in 0..100 {
        view = p.call("GET", &format!("/v1/subscriptions/{id}"), None).await.1;
        if view["state"] == "paused" {
            break;
        }
        // The API's state table follows the endpoint-state topic; give it the time of a fetch.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(view["state"], "paused", "{view}");
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
