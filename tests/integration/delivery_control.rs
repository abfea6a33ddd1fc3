//! Delivery control set per subscription: custom headers on every attempt, payload filters in the fan-out,
//! and the endpoint verification challenge.

use std::time::Duration;

use serde_json::json;

use crate::pipeline::quick_policy;
use crate::support::Pipeline;

const LIMIT: Duration = Duration::from_secs(60);

async fn publish_data(p: &Pipeline, id: &str, event_type: &str, data: serde_json::Value) {
    let (status, v) = p.call("POST", "/v1/events", Some(json!({"id": id, "type": event_type, "data": data}))).await;
    assert_eq!(status, 202, "publish: {v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_headers_are_refused_when_unsafe_and_sent_on_every_attempt() {
    let p = Pipeline::start(2).await;
    // Refused, each with the header named in `field`.
    for (name, value, code_field) in [
        ("Webhook-Signature", "v1,forged", "headers.Webhook-Signature"),
        ("Connection", "close", "headers.Connection"),
        ("Host", "elsewhere.example", "headers.Host"),
        ("Content-Type", "text/plain", "headers.Content-Type"),
        ("X-Bad Name", "v", "headers.X-Bad Name"),
        ("X-Injected", "a\r\nb: c", "headers.X-Injected"),
    ] {
        let (status, v) =
            p.call("POST", "/v1/subscriptions", Some(json!({"url": p.url("h"), "event_types": ["*"], "headers": {name: value}}))).await;
        assert_eq!(status, 422, "{name}: {v}");
        assert_eq!(v["error"]["field"], code_field, "{v}");
    }

    let toml = quick_policy(&[0.2], |_| {});
    p.script("h", vec![Some((503, None)), Some((204, None))]);
    let (id, _) = p
        .subscribe(json!({"url": p.url("h"), "event_types": ["*"], "policy_toml": toml,
            "headers": {"X-Api-Key": "k-123", "Authorization": "Bearer partner-token"}}))
        .await;
    let (_, view) = p.call("GET", &format!("/v1/subscriptions/{id}"), None).await;
    assert_eq!(view["header_names"], json!(["Authorization", "X-Api-Key"]));
    assert!(!view.to_string().contains("partner-token"), "values are write-only: {view}");

    p.publish("evt_h1", "thing.happened").await;
    p.wait_final_of(&id, 1, LIMIT).await;
    let got = p.requests_to("h");
    assert_eq!(got.len(), 2, "a failed attempt and its retry");
    for r in &got {
        assert_eq!(r.headers["x-api-key"], "k-123");
        assert_eq!(r.headers["authorization"], "Bearer partner-token");
        assert_eq!(r.headers.get_all("content-type").iter().count(), 1);
        assert!(r.headers.contains_key("webhook-signature"));
    }

    // A change applies from the next delivery (prepared again when the subscription reloads).
    let (status, v) = p.call("PATCH", &format!("/v1/subscriptions/{id}"), Some(json!({"headers": {"X-Api-Key": "k-456"}}))).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["header_names"], json!(["X-Api-Key"]));
    p.publish("evt_h2", "thing.happened").await;
    p.wait_final_of(&id, 2, LIMIT).await;
    let last = p.requests_to("h").pop().unwrap();
    assert_eq!(last.headers["x-api-key"], "k-456");
    assert!(!last.headers.contains_key("authorization"));
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payload_filters_route_an_event_only_to_the_subscription_it_matches() {
    let p = Pipeline::start(2).await;
    let (status, v) = p
        .call(
            "POST",
            "/v1/subscriptions",
            Some(json!({"url": p.url("big"), "event_types": ["order.created"],
            "filter": {"all": [{"path": "data.amount", "gte": 100}, {"path": "amount", "lt": 5}]}})),
        )
        .await;
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["error"]["field"], "filter.all[1].path", "{v}");

    let (big, _) = p
        .subscribe(json!({"url": p.url("big"), "event_types": ["order.created"],
            "filter": {"all": [{"path": "data.amount", "gte": 100}, {"path": "data.currency", "eq": "EUR"}]}}))
        .await;
    let (small, _) = p
        .subscribe(json!({"url": p.url("small"), "event_types": ["order.created"],
            "filter": {"any": [{"path": "data.amount", "lt": 100}, {"path": "data.amount", "exists": false}]}}))
        .await;
    let (_, view) = p.call("GET", &format!("/v1/subscriptions/{big}"), None).await;
    assert_eq!(view["filter"]["all"][0], json!({"path": "data.amount", "gte": 100}));

    publish_data(&p, "evt_big", "order.created", json!({"amount": 250, "currency": "EUR"})).await;
    publish_data(&p, "evt_usd", "order.created", json!({"amount": 250, "currency": "USD"})).await;
    publish_data(&p, "evt_small", "order.created", json!({"amount": 20, "currency": "EUR"})).await;
    publish_data(&p, "evt_none", "order.created", json!({"note": "no amount"})).await;
    // Another type: the type match comes first, whatever the data.
    publish_data(&p, "evt_other", "order.deleted", json!({"amount": 5})).await;
    p.wait_final_of(&small, 2, LIMIT).await;
    p.wait_final_of(&big, 1, LIMIT).await;
    // The USD event matched neither: wait for a later event of the same flow to be sure nothing else comes.
    publish_data(&p, "evt_marker", "order.created", json!({"amount": 1})).await;
    p.wait_final_of(&small, 3, LIMIT).await;

    let ids = |path: &str| -> Vec<String> {
        p.requests_to(path)
            .iter()
            .map(|r| serde_json::from_slice::<serde_json::Value>(&r.body).unwrap()["id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(ids("big"), ["evt_big"]);
    let mut small_ids = ids("small");
    small_ids.sort();
    assert_eq!(small_ids, ["evt_marker", "evt_none", "evt_small"]);

    // Removing the filter: the subscription gets every event of its type again.
    let (status, v) = p.call("PATCH", &format!("/v1/subscriptions/{big}"), Some(json!({"filter": null}))).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["filter"], serde_json::Value::Null);
    publish_data(&p, "evt_after", "order.created", json!({"amount": 1})).await;
    p.wait_final_of(&big, 2, LIMIT).await;
    assert_eq!(ids("big"), ["evt_big", "evt_after"]);
    p.stop().await;
}

/// What the verifying receiver answers to a challenge on one path.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Answer {
    Echo,
    Ignore,
    Fail,
}

#[derive(Default)]
struct Verifier {
    answers: std::sync::Mutex<std::collections::HashMap<String, Answer>>,
    /// (path, body, headers) of every request, challenges and deliveries alike.
    seen: std::sync::Mutex<Vec<(String, serde_json::Value, axum::http::HeaderMap)>>,
    changed: tokio::sync::Notify,
}

async fn verifier(
    axum::extract::State(v): axum::extract::State<std::sync::Arc<Verifier>>,
    axum::extract::Path(path): axum::extract::Path<String>,
    headers: axum::http::HeaderMap,
    body: bytes::Bytes,
) -> (axum::http::StatusCode, String) {
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    v.seen.lock().unwrap().push((path.clone(), json.clone(), headers));
    v.changed.notify_waiters();
    if json["type"] != hookline_core::verification::CHALLENGE_TYPE {
        return (axum::http::StatusCode::NO_CONTENT, String::new());
    }
    let answer = v.answers.lock().unwrap().get(&path).copied().unwrap_or(Answer::Ignore);
    match answer {
        Answer::Echo => (axum::http::StatusCode::OK, json!({"challenge": json["challenge"]}).to_string()),
        Answer::Ignore => (axum::http::StatusCode::OK, "ok".into()),
        Answer::Fail => (axum::http::StatusCode::INTERNAL_SERVER_ERROR, String::new()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verification_holds_deliveries_until_the_endpoint_echoes_the_challenge() {
    let p = Pipeline::start(2).await;
    let v = std::sync::Arc::new(Verifier::default());
    let app = axum::Router::new().route("/{path}", axum::routing::post(verifier)).with_state(v.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let url = |path: &str| format!("http://{addr}/{path}");
    let deliveries_to = |path: &str| -> Vec<String> {
        v.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, b, _)| p == path && b["type"] != hookline_core::verification::CHALLENGE_TYPE)
            .map(|(_, b, _)| b["id"].as_str().unwrap_or("").to_owned())
            .collect()
    };
    // Held deliveries, as the dispatcher parks them.
    let held = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let held_changed = std::sync::Arc::new(tokio::sync::Notify::new());
    {
        let (held, changed) = (held.clone(), held_changed.clone());
        hookline_kafka::table::spawn(
            &p.config.kafka,
            p.topics().held(),
            "held-collector",
            move |_, _, val| {
                if let Some(t) = val.and_then(|b| <hookline_core::model::DeliveryTask as prost::Message>::decode(b).ok()) {
                    held.lock().unwrap().push(t.event.map(|e| e.id).unwrap_or_default());
                    changed.notify_waiters();
                }
            },
            p.shutdown.clone(),
        )
        .await
        .unwrap();
    }

    // `inactive = "cancel"`: a pending endpoint's deliveries are held all the same (they wait for it).
    let toml = quick_policy(&[0.2], |pol| {
        pol.inactive = hookline_core::policy::InactiveAction::Cancel;
        pol.verification = Some(hookline_core::policy::Verification {
            method: hookline_core::policy::VerificationMethod::Challenge,
            timeout_ms: 3000,
            origin: None,
        });
    });
    v.answers.lock().unwrap().insert("ep".into(), Answer::Ignore);
    let (id, secret) =
        p.subscribe(json!({"url": url("ep"), "event_types": ["*"], "policy_toml": toml, "headers": {"X-Api-Key": "k"}})).await;
    let (_, view) = p.call("GET", &format!("/v1/subscriptions/{id}"), None).await;
    assert_eq!(view["state"], "pending_verification", "{view}");
    assert_eq!(view["verification"], "pending");
    assert!(view["verification_error"].as_str().unwrap().contains("without echoing"), "{view}");

    // The challenge: signed like a delivery, with the custom headers, carrying a token.
    let (_, body, headers) = v.seen.lock().unwrap()[0].clone();
    assert_eq!(body["type"], "hookline.endpoint_verification");
    assert_eq!(body["subscription_id"], id.as_str());
    assert_eq!(body["challenge"].as_str().unwrap().len(), 64);
    assert_eq!(headers["x-api-key"], "k");
    let pairs: Vec<(String, String)> = headers.iter().map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap().to_owned())).collect();
    let raw = serde_json::to_vec(&body).unwrap();
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    hookline_core::sign::verify_standard(&[secret.as_str()], pairs.as_slice(), &raw, now_ms, 300).expect("the challenge is signed");

    // Not verified: the event is held, not sent and not cancelled.
    p.publish("evt_v1", "thing.happened").await;
    crate::support::wait_for(&held_changed, LIMIT, "the delivery held", || held.lock().unwrap().iter().any(|e| e == "evt_v1")).await;
    assert!(deliveries_to("ep").is_empty());
    assert!(p.attempts_of(&id).is_empty(), "no attempt, no cancellation: {:?}", p.attempts_of(&id));

    // The endpoint now echoes; a retried challenge verifies it and the held delivery arrives.
    v.answers.lock().unwrap().insert("ep".into(), Answer::Echo);
    let (status, view) = p.call("POST", &format!("/v1/subscriptions/{id}/verify"), None).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["verification"], "verified", "{view}");
    assert_eq!(view["state"], "active");
    assert_eq!(view["verification_error"], serde_json::Value::Null);
    assert!(view["verified_at_ms"].as_i64().unwrap() > 0);
    let attempts = p.wait_final_of(&id, 1, LIMIT).await;
    assert_eq!(attempts.iter().find(|a| !a.final_state.is_empty()).unwrap().final_state, "succeeded");
    assert_eq!(deliveries_to("ep"), ["evt_v1"]);

    // A change that keeps the verified URL sends no challenge.
    let challenges =
        |path: &str| v.seen.lock().unwrap().iter().filter(|(p, b, _)| p == path && b["type"] == "hookline.endpoint_verification").count();
    let (status, view) = p.call("PATCH", &format!("/v1/subscriptions/{id}"), Some(json!({"description": "renamed"}))).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["verification"], "verified");
    assert_eq!(challenges("ep"), 2);

    // A URL change is challenged again; an endpoint answering 500 stays pending and says why.
    v.answers.lock().unwrap().insert("moved".into(), Answer::Fail);
    let (status, view) = p.call("PATCH", &format!("/v1/subscriptions/{id}"), Some(json!({"url": url("moved")}))).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["state"], "pending_verification", "{view}");
    assert!(view["verification_error"].as_str().unwrap().contains("HTTP 500"), "{view}");
    assert_eq!(challenges("moved"), 1);

    // A policy without `[verification]`: nothing to verify.
    let (plain, _) = p.subscribe(json!({"url": url("plain"), "event_types": ["none.*"]})).await;
    let (status, v2) = p.call("POST", &format!("/v1/subscriptions/{plain}/verify"), None).await;
    assert_eq!(status, 409, "{v2}");
    assert_eq!(v2["error"]["code"], "verification_not_required");
    assert_eq!(v2["verification"], serde_json::Value::Null);
    let (_, pv) = p.call("GET", &format!("/v1/subscriptions/{plain}"), None).await;
    assert_eq!(pv["verification"], "not_required");
    assert_eq!(challenges("plain"), 0);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_endpoint_never_gets_more_than_its_burst_rule() {
    let p = Pipeline::start(2).await;
    let (status, v) = p.call("POST", "/v1/subscriptions", Some(json!({"url": p.url("limited"), "event_types": ["*"], "burst": 5}))).await;
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["error"]["field"], "burst", "{v}");
    let (status, v) =
        p.call("POST", "/v1/subscriptions", Some(json!({"url": p.url("limited"), "event_types": ["*"], "rate_limit_per_s": 10_001}))).await;
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["error"]["field"], "rate_limit_per_s", "{v}");

    let (id, _) = p.subscribe(json!({"url": p.url("limited"), "event_types": ["*"], "rate_limit_per_s": 10, "burst": 5})).await;
    let (_, view) = p.call("GET", &format!("/v1/subscriptions/{id}"), None).await;
    assert_eq!(view["rate_limit"], json!({"per_s": 10, "burst": 5}), "{view}");
    const N: usize = 200;
    for i in 0..N {
        p.publish(&format!("evt_rl{i}"), "thing.happened").await;
    }
    let attempts = p.wait_final_of(&id, N, Duration::from_secs(240)).await;
    // Held back, never failed: one successful attempt per delivery and nothing counted against the endpoint.
    assert!(attempts.iter().all(|a| a.verdict == "success"), "{:?}", attempts.iter().find(|a| a.verdict != "success"));
    assert_eq!(attempts.len(), N);
    let (_, view) = p.call("GET", &format!("/v1/subscriptions/{id}"), None).await;
    assert_eq!(view["consecutive_failures"], 0);

    let mut at: Vec<std::time::Instant> = p.requests_to("limited").iter().map(|r| r.at).collect();
    assert_eq!(at.len(), N);
    at.sort();
    // In any window of w seconds: at most burst + 10 * w requests (w = 1 s and 2 s, each window starting at a request).
    for (i, start) in at.iter().enumerate() {
        for (w, max) in [(Duration::from_secs(1), 5 + 10), (Duration::from_secs(2), 5 + 20)] {
            let n = at[i..].iter().take_while(|t| **t < *start + w).count();
            assert!(n <= max, "{n} requests in the {w:?} from request {i} (at most {max})");
        }
    }
    let span = at[N - 1] - at[0];
    assert!(span >= Duration::from_millis(19_000), "200 at 10/s after a burst of 5 take 19.5 s, took {span:?}");
    p.stop().await;
}
