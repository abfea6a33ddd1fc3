//! The management API with real HTTP: the delivery log, replays and redrives, secret rotation, and clear errors
//! for bad requests.

use std::time::Duration;

use hookline_core::policy;
use serde_json::json;

use crate::support::{wait_for, Pipeline, TOKEN};

const LIMIT: Duration = Duration::from_secs(60);

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

/// Gauge, scaled down: two attempts half a second apart.
fn quick_gauge() -> String {
    let mut g = policy::builtin("gauge").unwrap();
    g.schedule.waits_s = Some(vec![0.5]);
    g.schedule.max_attempts = Some(2);
    toml::to_string(&g).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_delivery_log_shows_every_attempt_and_a_replay_counts_on() {
    let p = Pipeline::start(2).await;
    p.script("g", vec![Some((500, None)), Some((503, None)), Some((200, None))]);
    let (sub, _) = p.subscribe(json!({"url": p.url("g"), "event_types": ["*"], "policy_toml": quick_gauge()})).await;
    p.publish("evt_log1", "message.received").await;
    p.wait_finals(1, LIMIT).await;

    let dlq = p.dlq.clone();
    wait_for(&p.dlq.changed, LIMIT, "the dead letter", || !dlq.items.lock().unwrap().is_empty()).await;
    let delivery = p.dlq.items.lock().unwrap()[0].delivery_id.clone();
    // The API's log follows the topics: wait until it has the dead letter too.
    let d = p.get_when(&format!("/v1/deliveries/{delivery}"), |d| d["replayable"] == true).await;
    assert_eq!(d["state"], "dead", "{d}");
    assert_eq!(d["attempts"].as_array().unwrap().len(), 2);
    assert_eq!(d["attempts"][0]["reason"], "HTTP 500");
    assert_eq!(d["attempts"][0]["response_excerpt"], "scripted");
    assert_eq!(d["attempts"][1]["http_status"], 503);

    let (status, list) = p.call("GET", &format!("/v1/subscriptions/{sub}/deliveries?state=dead"), None).await;
    assert_eq!(status, 200);
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    let (_, none) = p.call("GET", &format!("/v1/subscriptions/{sub}/deliveries?state=succeeded"), None).await;
    assert!(none["items"].as_array().unwrap().is_empty());
    // hookline's words only, in `state`; the platform's word is a field of the delivery, not a filter.
    assert!(d["platform_status"].is_string() && d.get("status").is_none(), "one field for the policy's word: {d}");
    for bad in ["DEAD_LETTER", "dead_lettered", "nope"] {
        let (status, v) = p.call("GET", &format!("/v1/subscriptions/{sub}/deliveries?state={bad}"), None).await;
        assert_eq!(
            (status, v["error"]["code"].as_str(), v["error"]["field"].as_str()),
            (400, Some("invalid_query"), Some("state")),
            "{bad}: {v}"
        );
    }
    // A redrive filter with a reason no delivery's dead letter carries is refused, not an empty redrive.
    for bad in ["terminal_response", "egress_refused", "invalid_json"] {
        let (status, v) = p.call("POST", "/v1/dlq/redrive", Some(json!({"reason": bad}))).await;
        assert_eq!((status, v["error"]["field"].as_str()), (422, Some("reason")), "{bad}: {v}");
    }

    let (status, v) = p.call("POST", &format!("/v1/deliveries/{delivery}/replay"), None).await;
    assert_eq!(status, 202, "{v}");
    p.wait_finals(2, LIMIT).await;
    let got = p.requests_to("g");
    assert_eq!(got.len(), 3);
    // Gauge: 1 on the first try, then 2, 3, … across retries and redeliveries; the event id never changes.
    let attempts: Vec<&str> = got.iter().map(|r| r.headers["gauge-delivery-attempt"].to_str().unwrap()).collect();
    assert_eq!(attempts, ["1", "2", "3"]);
    assert!(got.iter().all(|r| r.headers["gauge-event-id"] == "evt_log1"));
    p.stop().await;
}

/// One attempt per delivery, so a failure ends the delivery `failed` at once.
fn one_attempt() -> String {
    let mut g = policy::builtin("standard").unwrap();
    g.schedule.max_attempts = Some(1);
    toml::to_string(&g).unwrap()
}

/// The list shows each endpoint's health at a glance: a failing endpoint is `failing` (not "active"), a paused one
/// `paused`, and each item carries its 24 h success counts from the delivery log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_shows_each_endpoints_health_and_its_24h_success_rate() {
    let p = Pipeline::start(1).await;
    p.script("bad", vec![Some((500, None))]);
    let (ok, _) = p.subscribe(json!({"url": p.url("ok"), "event_types": ["health.*"], "policy_toml": one_attempt()})).await;
    let (bad, _) = p.subscribe(json!({"url": p.url("bad"), "event_types": ["health.*"], "policy_toml": one_attempt()})).await;
    let (quiet, _) = p.subscribe(json!({"url": p.url("quiet"), "event_types": ["other.*"]})).await;
    for i in 0..3 {
        p.publish(&format!("evt_health_{i}"), "health.check").await;
    }
    p.wait_finals(6, LIMIT).await;
    let (status, _) = p.call("POST", &format!("/v1/subscriptions/{quiet}/pause"), None).await;
    assert_eq!(status, 200);

    let item = |list: &serde_json::Value, id: &str| list["items"].as_array().unwrap().iter().find(|i| i["id"] == id).cloned().unwrap();
    // The log follows the topics: wait until it has every delivery.
    let list = p
        .get_when("/v1/subscriptions?limit=10&include=success_24h", |l| {
            let done = |id: &str| {
                item(l, id)["success_24h"]["pending"] == 0
                    && item(l, id)["success_24h"]["succeeded"].as_u64().unwrap_or(0)
                        + item(l, id)["success_24h"]["failed"].as_u64().unwrap_or(0)
                        == 3
            };
            done(&ok) && done(&bad) && item(l, &bad)["consecutive_failures"] == 3
        })
        .await;
    let (o, b, q) = (item(&list, &ok), item(&list, &bad), item(&list, &quiet));
    assert_eq!((o["health"].as_str(), o["state"].as_str()), (Some("healthy"), Some("active")), "{o}");
    assert_eq!(o["success_24h"], json!({"succeeded": 3, "failed": 0, "pending": 0, "rate": 1.0}));
    assert_eq!((b["health"].as_str(), b["state"].as_str()), (Some("failing"), Some("active")), "still active, but failing: {b}");
    assert_eq!(b["consecutive_failures"], 3);
    assert_eq!(b["success_24h"], json!({"succeeded": 0, "failed": 3, "pending": 0, "rate": 0.0}));
    assert_eq!(q["health"], "paused", "{q}");
    assert_eq!(q["success_24h"], json!({"succeeded": 0, "failed": 0, "pending": 0, "rate": null}), "no deliveries: no rate");
    // The single read has the health, not the list's log counts.
    let (_, one) = p.call("GET", &format!("/v1/subscriptions/{bad}"), None).await;
    assert_eq!((one["health"].as_str(), one.get("success_24h")), (Some("failing"), None), "{one}");
    // Without `include`, a page costs only the subscription index: no log counts.
    let (_, plain) = p.call("GET", "/v1/subscriptions?limit=10", None).await;
    assert!(plain["items"].as_array().unwrap().iter().all(|i| i.get("success_24h").is_none()), "{plain}");
    let (status, bad_include) = p.call("GET", "/v1/subscriptions?include=everything", None).await;
    assert_eq!((status, bad_include["error"]["field"].as_str()), (400, Some("include")), "{bad_include}");
    p.stop().await;
}

/// The subscriptions with a record on the endpoint-state topic.
async fn state_keys(p: &Pipeline) -> Vec<String> {
    use rdkafka::Message as _;
    let mut keys = Vec::new();
    let topic = p.topics();
    hookline_kafka::scan::scan(&p.config.kafka, topic.endpoint_state(), None, LIMIT, |m| {
        keys.extend(m.key().map(|k| String::from_utf8_lossy(k).into_owned()));
    })
    .await
    .expect("scan endpoint-state");
    keys
}

/// An endpoint whose deliveries only succeeded gets no endpoint-state record (the dispatcher writes changes of
/// health; unknown → healthy is none), and the API shows it as it shows a healthy endpoint that has one: the same
/// health and counters, and its last success (from the delivery log), in the single read and the list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_only_succeeded_has_no_state_record_and_reads_like_a_healthy_one_that_has() {
    let p = Pipeline::start(1).await;
    p.script("flaky", vec![Some((503, None)), Some((200, None))]);
    let (ok, _) = p.subscribe(json!({"url": p.url("ok"), "event_types": ["first.*"], "policy_toml": quick_gauge()})).await;
    let (recovered, _) = p.subscribe(json!({"url": p.url("flaky"), "event_types": ["first.*"], "policy_toml": quick_gauge()})).await;
    let before = now_ms();
    p.publish("evt_first_1", "first.sent").await;
    p.wait_finals(2, LIMIT).await;
    // `recovered` failed once, then succeeded: its state was written (failing, then healthy again).
    let has_success = |v: &serde_json::Value| v["last_success_at_ms"].as_i64().is_some();
    let r = p.subscription_when(&recovered, has_success).await;
    let o = p.subscription_when(&ok, has_success).await;
    for key in
        ["health", "state", "endpoint_condition", "consecutive_failures", "first_failure_at_ms", "enabled", "paused", "disabled_reason"]
    {
        assert_eq!(o[key], r[key], "{key}: {o} against {r}");
    }
    assert_eq!(
        (o["health"].as_str(), o["endpoint_condition"].as_str(), o["consecutive_failures"].as_u64()),
        (Some("healthy"), Some("healthy"), Some(0)),
        "{o}"
    );
    for v in [&o, &r] {
        let at = v["last_success_at_ms"].as_i64().unwrap();
        assert!((before..=now_ms()).contains(&at), "the success of this run: {v}");
    }
    let (_, list) = p.call("GET", "/v1/subscriptions?limit=10", None).await;
    let item = list["items"].as_array().unwrap().iter().find(|i| i["id"] == ok.as_str()).cloned().unwrap();
    assert_eq!((&item["health"], &item["last_success_at_ms"]), (&o["health"], &o["last_success_at_ms"]), "{item}");
    let (status, paused) = p.call("POST", &format!("/v1/subscriptions/{ok}/pause"), None).await;
    assert_eq!((status, &paused["last_success_at_ms"]), (200, &o["last_success_at_ms"]), "{paused}");
    let keys = state_keys(&p).await;
    assert!(keys.contains(&recovered), "a failure and a recovery are written: {keys:?}");
    assert!(!keys.contains(&ok), "a first success is not: {keys:?}");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_is_refused_while_paused_and_replays_what_was_missed_once_enabled() {
    let p = Pipeline::start(2).await;
    let (sub, _) = p.subscribe(json!({"url": p.url("g"), "event_types": ["*"], "policy": "gauge"})).await;
    let t0 = now_ms();
    let (status, _) = p.call("PATCH", &format!("/v1/subscriptions/{sub}"), Some(json!({"enabled": false}))).await;
    assert_eq!(status, 200);
    p.publish("evt_missed1", "thing.happened").await;
    p.publish("evt_missed2", "thing.happened").await;
    p.wait_finals(2, LIMIT).await;
    assert!(p.finals().iter().all(|a| a.final_state == "skipped"));

    let (status, v) = p.call("POST", &format!("/v1/subscriptions/{sub}/replay"), Some(json!({"since_ms": t0}))).await;
    assert_eq!((status, v["error"]["code"].as_str()), (409, Some("subscription_inactive")), "{v}");

    let (status, v) = p.call("PATCH", &format!("/v1/subscriptions/{sub}"), Some(json!({"enabled": true}))).await;
    assert_eq!((status, v["state"].as_str()), (200, Some("active")));
    let (status, v) = p.call("POST", &format!("/v1/subscriptions/{sub}/replay"), Some(json!({"since_ms": t0}))).await;
    assert_eq!((status, v["replayed"].as_u64()), (202, Some(2)), "{v}");
    p.wait_finals(4, LIMIT).await;
    let mut ids: Vec<String> = p.requests_to("g").iter().map(|r| r.headers["gauge-event-id"].to_str().unwrap().to_owned()).collect();
    ids.sort();
    assert_eq!(ids, ["evt_missed1", "evt_missed2"]);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redriving_the_dead_letter_topic_delivers_again() {
    let p = Pipeline::start(2).await;
    p.script("f", vec![Some((410, None)), Some((200, None))]);
    let (sub, _) = p.subscribe(json!({"url": p.url("f"), "event_types": ["*"], "policy": "fynapse"})).await;
    p.publish("evt_dead1", "thing.happened").await;
    p.wait_finals(1, LIMIT).await;
    let dlq = p.dlq.clone();
    wait_for(&p.dlq.changed, LIMIT, "the dead letter", || !dlq.items.lock().unwrap().is_empty()).await;
    let (status, v) = p.call("POST", "/v1/dlq/redrive", Some(json!({"subscription_id": sub, "final_state": "dead"}))).await;
    assert_eq!((status, v["redriven"].as_u64()), (202, Some(1)), "{v}");
    p.wait_finals(2, LIMIT).await;
    assert_eq!(p.requests_to("f").len(), 2);
    assert!(p.finals().iter().any(|a| a.final_state == "succeeded" && a.status_word == "DELIVERED"));
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_secrets_sign_during_a_rotation_overlap() {
    let p = Pipeline::start(2).await;
    let (sub, old) = p.subscribe(json!({"url": p.url("s"), "event_types": ["*"]})).await;
    let (status, v) = p.call("POST", &format!("/v1/subscriptions/{sub}/rotate-secret"), Some(json!({"overlap_s": 3600}))).await;
    assert_eq!(status, 200, "{v}");
    let new = v["secret"].as_str().unwrap().to_owned();
    assert_ne!(new, old);
    let (_, listed) = p.call("GET", "/v1/subscriptions", None).await;
    assert!(!listed.to_string().contains(&new) && !listed.to_string().contains(&old), "secrets never listed");
    p.publish("evt_rot", "thing.happened").await;
    p.wait_finals(1, LIMIT).await;
    let r = &p.requests_to("s")[0];
    let headers: Vec<(String, String)> = r.headers.iter().map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap().to_owned())).collect();
    assert_eq!(r.headers["webhook-signature"].to_str().unwrap().split(' ').count(), 2);
    for secret in [&old, &new] {
        hookline_core::sign::verify_standard(&[secret.as_str()], headers.as_slice(), &r.body, now_ms(), 300)
            .expect("each secret verifies during the overlap");
    }
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_json_errors_that_name_the_problem() {
    let p = Pipeline::start(1).await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let send = |auth: Option<&str>, ctype: &str, path: &str, body: Vec<u8>| {
        let mut req = http::Request::post(format!("http://{}{path}", p.api)).header("content-type", ctype);
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let req = req.body(http_body_util::Full::new(bytes::Bytes::from(body))).unwrap();
        let client = client.clone();
        async move {
            use http_body_util::BodyExt;
            let resp = client.request(req).await.unwrap();
            let status = resp.status().as_u16();
            // A body too large is not read to its end: the server closes, and says so, so no client reuses it.
            if status == 413 {
                assert_eq!(resp.headers().get("connection").map(|v| v.as_bytes()), Some(&b"close"[..]));
            }
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            (status, serde_json::from_slice::<serde_json::Value>(&body).unwrap_or_default())
        }
    };
    let bearer = format!("Bearer {TOKEN}");
    let sub = br#"{"url":"https://example.com/hook","event_types":["*"]}"#.to_vec();
    let cases: Vec<(Option<&str>, &str, &str, Vec<u8>, u16, &str)> = vec![
        (None, "application/json", "/v1/subscriptions", sub.clone(), 401, "unauthorized"),
        (Some("Bearer wrong-token-wrong-token"), "application/json", "/v1/subscriptions", sub.clone(), 401, "unauthorized"),
        (Some(&bearer), "text/plain", "/v1/subscriptions", sub.clone(), 415, "unsupported_media_type"),
        (Some(&bearer), "application/json", "/v1/subscriptions", b"{nope".to_vec(), 400, "invalid_json"),
        (
            Some(&bearer),
            "application/json",
            "/v1/subscriptions",
            br#"{"url":"https://x.example","event_types":["*"],"colour":1}"#.to_vec(),
            422,
            "invalid_body",
        ),
        (
            Some(&bearer),
            "application/json",
            "/v1/subscriptions",
            br#"{"url":"http://10.0.0.7/x","event_types":["*"]}"#.to_vec(),
            422,
            "invalid_field",
        ),
        (
            Some(&bearer),
            "application/json",
            "/v1/subscriptions",
            br#"{"url":"https://93.184.216.34/x","event_types":["a*b"]}"#.to_vec(),
            422,
            "invalid_field",
        ),
        (
            Some(&bearer),
            "application/json",
            "/v1/subscriptions",
            br#"{"url":"https://93.184.216.34/x","event_types":["*"],"policy":"nope"}"#.to_vec(),
            422,
            "invalid_field",
        ),
        (Some(&bearer), "application/json", "/v1/events", br#"{"type":"x"}"#.to_vec(), 422, "missing_field"),
        (Some(&bearer), "application/json", "/v1/events", vec![b' '; 64 << 10], 413, "body_too_large"),
    ];
    let fields = ["Authorization", "Authorization", "Content-Type", "body", "colour", "url", "event_types[0]", "policy", "id", "body"];
    for ((auth, ctype, path, body, want_status, want_code), field) in cases.into_iter().zip(fields) {
        let (status, v) = send(auth, ctype, path, body).await;
        assert_eq!((status, v["error"]["code"].as_str().unwrap_or("")), (want_status, want_code), "{path}: {v}");
        let message = v["error"]["message"].as_str().unwrap_or("");
        assert!(!message.is_empty());
        // Every 4xx names what is at fault, in hookline's words rather than the parser's.
        assert_eq!(v["error"]["field"], field, "{path}: {v}");
        assert!(!message.contains("Failed to deserialize") && !message.contains("at line"), "{path}: {message}");
    }
    // A value of the wrong type, and a missing field, deep in the body.
    let (_, v) =
        send(Some(&bearer), "application/json", "/v1/subscriptions", br#"{"url":"https://x.example","event_types":[7]}"#.to_vec()).await;
    assert_eq!((v["error"]["code"].as_str(), v["error"]["field"].as_str()), (Some("invalid_body"), Some("event_types[0]")), "{v}");
    let (_, v) = send(Some(&bearer), "application/json", "/v1/subscriptions", br#"{"event_types":["*"]}"#.to_vec()).await;
    assert_eq!((v["error"]["code"].as_str(), v["error"]["field"].as_str()), (Some("invalid_body"), Some("url")), "{v}");
    let (_, v) =
        send(Some(&bearer), "application/json", "/v1/subscriptions", br#"{"url":"http://10.0.0.7/x","event_types":["*"]}"#.to_vec()).await;
    assert_eq!(v["error"]["field"], "url");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_portal_opens_with_or_without_a_trailing_slash() {
    let p = Pipeline::start(1).await;
    for path in ["/portal", "/portal/", "/portal/app.js"] {
        let (status, _) = p.call("GET", path, None).await;
        assert_eq!(status, 200, "{path}");
    }
    let (status, v) = p.call("GET", "/portal/nope.js", None).await;
    assert_eq!((status, v["error"]["code"].as_str()), (404, Some("not_found")), "{v}");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_retried_with_its_idempotency_key_returns_the_same_subscription() {
    let p = Pipeline::start(1).await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let create = |key: Option<&str>, body: serde_json::Value| {
        let mut req = http::Request::post(format!("http://{}/v1/subscriptions", p.api))
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {TOKEN}"));
        if let Some(k) = key {
            req = req.header("idempotency-key", k);
        }
        let req = req.body(http_body_util::Full::new(bytes::Bytes::from(body.to_string()))).unwrap();
        let client = client.clone();
        async move {
            use http_body_util::BodyExt;
            let resp = client.request(req).await.unwrap();
            let status = resp.status().as_u16();
            let replayed = resp.headers().get("idempotent-replayed").is_some();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            (status, replayed, serde_json::from_slice::<serde_json::Value>(&body).unwrap_or_default())
        }
    };
    let body = json!({"url": p.url("idem"), "event_types": ["order.*"], "metadata": {"b": "2", "a": "1"}});
    let (status, replayed, first) = create(Some("create-orders-hook-7"), body.clone()).await;
    assert_eq!((status, replayed), (201, false), "{first}");
    let (status, replayed, again) = create(Some("create-orders-hook-7"), body.clone()).await;
    assert_eq!((status, replayed), (200, true), "{again}");
    assert_eq!(again["id"], first["id"], "the retry names the same subscription");
    assert_eq!(again["secret"], first["secret"], "and repeats its secret, which the first response may have lost");
    let (_, list) = p.call("GET", "/v1/subscriptions", None).await;
    let same_url = list["items"].as_array().unwrap().iter().filter(|s| s["url"] == p.url("idem")).count();
    assert_eq!(same_url, 1, "one subscription, not two: {list}");
    // After a rotation, a retry hands out the secret that signs now.
    let (status, rotated) = p.call("POST", &format!("/v1/subscriptions/{}/rotate-secret", first["id"].as_str().unwrap()), None).await;
    assert_eq!(status, 200, "{rotated}");
    let (_, _, again) = create(Some("create-orders-hook-7"), body.clone()).await;
    assert_eq!(again["secret"], rotated["secret"]);
    assert_ne!(again["secret"], first["secret"]);

    // The same key for a different request is refused; another key is another subscription.
    let other = json!({"url": p.url("elsewhere"), "event_types": ["order.*"]});
    let (status, _, v) = create(Some("create-orders-hook-7"), other.clone()).await;
    assert_eq!((status, v["error"]["code"].as_str()), (409, Some("idempotency_conflict")), "{v}");
    let (status, _, v) = create(Some("create-orders-hook-8"), other).await;
    assert_eq!(status, 201, "{v}");
    assert_ne!(v["id"], first["id"]);
    // Without a key, each create is new.
    let (_, _, a) = create(None, body.clone()).await;
    let (_, _, b) = create(None, body.clone()).await;
    assert_ne!(a["id"], b["id"]);
    for bad in ["", "has space", "ü", &"k".repeat(256)] {
        let (status, _, v) = create(Some(bad), body.clone()).await;
        assert_eq!((status, v["error"]["field"].as_str()), (422, Some("Idempotency-Key")), "{bad:?}: {v}");
    }
    p.stop().await;
}
