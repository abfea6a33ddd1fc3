//! The delivery log as a store, through the whole pipeline: any finished delivery resent from the API (arriving
//! with the same event id), the list's filters and their 400s, and an API restarted over a stored history that
//! answers at once from the store (nothing to replay from Kafka).

use std::time::{Duration, Instant};

use hookline_core::model::AttemptRecord;
use hookline_core::policy;
use serde_json::{json, Value};

use crate::support::{temp_dir, Pipeline};

const LIMIT: Duration = Duration::from_secs(60);

fn quick(name: &str) -> String {
    let mut g = policy::builtin(name).unwrap();
    g.schedule.waits_s = Some(vec![0.5]);
    g.schedule.max_attempts = Some(2);
    toml::to_string(&g).unwrap()
}

fn ids(list: &Value, key: &str) -> Vec<String> {
    list["items"].as_array().unwrap_or(&Vec::new()).iter().map(|d| d[key].as_str().unwrap_or_default().to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_that_succeeded_is_resent_and_arrives_with_the_same_event_id() {
    a_delivery_that_succeeded_is_resent_and_arrives_with_the_same_event_id_on(Pipeline::start(2).await).await;
}

/// The body of the test above, on any broker's pipeline (also run on Apache Kafka: `apache_kafka.rs`).
pub(crate) async fn a_delivery_that_succeeded_is_resent_and_arrives_with_the_same_event_id_on(p: Pipeline) {
    let (sub, _) = p.subscribe(json!({"url": p.url("ok"), "event_types": ["*"], "policy_toml": quick("gauge")})).await;
    p.publish("evt_resend1", "order.created").await;
    p.wait_final_of(&sub, 1, LIMIT).await;
    let (_, found) = p.get_when_ok("/v1/deliveries?event_id=evt_resend1", |v| ids(v, "state") == ["succeeded"]).await;
    let delivery = found["items"][0]["delivery_id"].as_str().unwrap().to_owned();
    let d = p.get_when(&format!("/v1/deliveries/{delivery}"), |d| d["replayable"] == true).await;
    assert_eq!((d["state"].as_str(), d["attempts_made"].as_u64()), (Some("succeeded"), Some(1)), "{d}");
    assert_eq!(d["event"]["id"], "evt_resend1", "the stored event: {d}");
    assert_eq!(d["event"]["data"], json!({"n": 1}));
    assert_eq!(d["attempts"][0]["http_status"], 204);

    let (status, v) = p.call("POST", &format!("/v1/deliveries/{delivery}/replay"), None).await;
    assert_eq!((status, v["replayed"].as_u64()), (202, Some(1)), "a succeeded delivery is resent: {v}");
    p.wait_final_of(&sub, 2, LIMIT).await;
    let got = p.requests_to("ok");
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|r| r.headers["gauge-event-id"] == "evt_resend1"), "the same event id both times");
    assert_eq!(got[0].body, got[1].body, "the same event sent again");
    let counts: Vec<&str> = got.iter().map(|r| r.headers["gauge-delivery-attempt"].to_str().unwrap()).collect();
    assert_eq!(counts, ["1", "2"], "the resend continues the attempt count");
    // The log shows the new run, under the same delivery.
    let d = p.get_when(&format!("/v1/deliveries/{delivery}"), |d| d["attempts"].as_array().is_some_and(|a| a.len() == 2)).await;
    assert_eq!(d["attempts_made"], 2, "{d}");
    assert_ne!(d["attempts"][0]["run_id"], d["attempts"][1]["run_id"], "a resend is a run of its own: {d}");
    p.stop().await;
}

/// The list's `history`: an event record whose Kafka timestamp is a minute old (a backlog the indexer reaches a
/// minute late) makes the page say the history was a minute behind; the next delivery, indexed at once, brings it
/// back under a few seconds. Before the indexer's first batch there is nothing to say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_says_how_far_the_history_trails_kafka() {
    use rdkafka::producer::FutureRecord;
    let p = Pipeline::start(1).await;
    let (sub, _) = p.subscribe(json!({"url": p.url("ok"), "event_types": ["now.*"]})).await;
    let path = format!("/v1/subscriptions/{sub}/deliveries");
    let (status, v) = p.call("GET", &path, None).await;
    assert_eq!((status, &v["history"]), (200, &Value::Null), "nothing indexed yet: {v}");

    // An event nobody subscribes to, its record stamped a minute ago: the batch that holds it alone is a minute late.
    let producer = hookline_kafka::client::producer(&p.config.kafka, "late-upstream").unwrap();
    let minute_ago = hookline_service::now_ms() - 60_000;
    let record = br#"{"id":"evt_late","type":"late.unwatched","data":{}}"#;
    producer
        .send(
            FutureRecord::<str, [u8]>::to(p.topics().events()).key("k").payload(&record[..]).timestamp(minute_ago),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    let v = p.get_when(&path, |v| v["history"]["behind_ms"].as_i64().is_some_and(|b| b >= 60_000)).await;
    let history = &v["history"];
    assert!(history["behind_ms"].as_i64().is_some_and(|b| (60_000..120_000).contains(&b)), "a minute behind: {v}");
    assert!(history["as_of_ms"].as_i64().is_some_and(|t| t > minute_ago), "{v}");

    p.publish("evt_now", "now.happened").await;
    p.wait_final_of(&sub, 1, LIMIT).await;
    // The event and its attempts may land in separate batches: the page with the delivery is the one to read.
    let v = p.get_when(&path, |v| ids(v, "event_id") == ["evt_now"]).await;
    assert!(v["history"]["behind_ms"].as_i64().is_some_and(|b| b < 5_000), "{v}");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_filters_by_state_status_type_time_and_event_and_refuses_bad_filters() {
    let p = Pipeline::start(2).await;
    // Fynapse: a 410 is terminal (dead at once).
    p.script("f", vec![Some((200, None)), Some((410, None))]);
    let (sub, _) = p.subscribe(json!({"url": p.url("f"), "event_types": ["order.*"], "policy": "fynapse"})).await;
    p.publish("evt_ok", "order.created").await;
    p.wait_final_of(&sub, 1, LIMIT).await;
    p.publish("evt_gone", "order.paid").await;
    p.wait_final_of(&sub, 2, LIMIT).await;
    let base = format!("/v1/subscriptions/{sub}/deliveries");
    let all = p.get_when(&base, |v| ids(v, "state").len() == 2 && !ids(v, "state").contains(&"pending".to_owned())).await;
    assert_eq!(ids(&all, "event_id"), ["evt_gone", "evt_ok"], "newest first: {all}");
    assert_eq!(all["items"][0]["last_attempt"]["http_status"], 410, "{all}");

    let pr = &p;
    let q = |query: &str| {
        let path = format!("{base}?{query}");
        async move { pr.call("GET", &path, None).await }
    };
    for (query, want) in [
        ("state=succeeded", vec!["evt_ok"]),
        ("state=dead", vec!["evt_gone"]),
        ("state=failed", vec![]),
        ("http_status=410", vec!["evt_gone"]),
        ("http_status=200", vec!["evt_ok"]),
        ("event_type=order.created", vec!["evt_ok"]),
        ("event_type=order.paid&state=succeeded", vec![]),
        ("event_id=evt_gone", vec!["evt_gone"]),
        ("event_id=evt_none", vec![]),
    ] {
        let (status, v) = q(query).await;
        assert_eq!((status, ids(&v, "event_id")), (200, want.iter().map(|s| s.to_string()).collect::<Vec<_>>()), "{query}: {v}");
    }
    let gone_at = all["items"][0]["first_attempt_at_ms"].as_i64().unwrap();
    let (_, v) = q(&format!("since_ms={gone_at}")).await;
    assert_eq!(ids(&v, "event_id"), ["evt_gone"], "{v}");
    let (_, v) = q(&format!("until_ms={gone_at}")).await;
    assert_eq!(ids(&v, "event_id"), ["evt_ok"], "{v}");

    // Cursor pagination: two pages of one, no repeats, then no cursor.
    let (_, first) = q("limit=1").await;
    let next = first["next_after"].as_str().expect("a next page").to_owned();
    let (_, second) = q(&format!("limit=1&after={next}")).await;
    assert_eq!((ids(&first, "event_id"), ids(&second, "event_id")), (vec!["evt_gone".to_owned()], vec!["evt_ok".to_owned()]));
    assert!(second["next_after"].is_null(), "{second}");

    // Search across subscriptions, by event id or delivery id.
    let (status, v) = p.call("GET", "/v1/deliveries?event_id=evt_ok", None).await;
    assert_eq!((status, ids(&v, "event_id")), (200, vec!["evt_ok".to_owned()]), "{v}");
    let dlv = v["items"][0]["delivery_id"].as_str().unwrap().to_owned();
    let (status, v) = p.call("GET", &format!("/v1/deliveries?delivery_id={dlv}"), None).await;
    assert_eq!((status, ids(&v, "delivery_id")), (200, vec![dlv.clone()]), "{v}");

    // Bad filters are refused naming the parameter, never answered with an empty list.
    for (query, field) in [
        ("state=delivered", "state"),
        ("state=DEAD", "state"),
        ("http_status=abc", "http_status"),
        ("http_status=999", "http_status"),
        ("after=garbage", "after"),
        ("after=12.has%20space", "after"),
        ("since_ms=10&until_ms=5", "until_ms"),
        ("event_type=", "event_type"),
        ("colour=red", "colour"),
    ] {
        let (status, v) = q(query).await;
        assert_eq!(
            (status, v["error"]["code"].as_str(), v["error"]["field"].as_str()),
            (400, Some("invalid_query"), Some(field)),
            "{query}: {v}"
        );
    }
    for (query, field) in [("", "event_id"), ("event_id=", "event_id"), ("event_id=a&delivery_id=b", "delivery_id")] {
        let (status, v) = p.call("GET", &format!("/v1/deliveries?{query}"), None).await;
        assert_eq!((status, v["error"]["field"].as_str()), (400, Some(field)), "{query}: {v}");
    }

    // The stats count the window's deliveries by state (from the store) beside the chart's tries.
    let (status, st) = p.call("GET", &format!("/v1/subscriptions/{sub}/stats"), None).await;
    assert_eq!(status, 200, "{st}");
    assert_eq!(st["deliveries"], json!({"total": 2, "by_state": {"succeeded": 1, "dead": 1}}), "{st}");
    assert_eq!(
        (st["totals"]["attempts"].as_u64(), st["totals"]["counts"]["succeeded"].as_u64(), st["totals"]["counts"]["dead"].as_u64()),
        (Some(2), Some(1), Some(1)),
        "{st}"
    );
    p.stop().await;
}

/// Stored history the restarted API never read from Kafka: deliveries indexed straight into the file.
async fn seed(path: &std::path::Path, deliveries: usize) {
    let store = hookline_log::LogStore::open(&hookline_log::Target::Sqlite(path.to_owned())).await.unwrap();
    let now = hookline_service::now_ms();
    let mut attempts = Vec::new();
    for i in 0..deliveries {
        let at = now - 3_600_000 + i as i64;
        attempts.push(AttemptRecord {
            delivery_id: format!("dlv_hist{i:07}"),
            subscription_id: format!("sub_hist{}", i % 50),
            event_id: format!("evt_hist{i}"),
            event_type: "order.created".into(),
            attempt: 1,
            r#try: 1,
            started_at_ms: at,
            outcome: "200".into(),
            http_status: 200,
            final_state: "succeeded".into(),
            ..Default::default()
        });
        if attempts.len() == 5_000 {
            store.index(hookline_log::Batch { attempts: std::mem::take(&mut attempts), ..Default::default() }, 30, now).await.unwrap();
        }
    }
    store.index(hookline_log::Batch { attempts, ..Default::default() }, 30, now).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_api_answers_its_first_query_from_the_store_at_once() {
    let dir = temp_dir("restart");
    let file = dir.join("delivery-log.sqlite3");
    let f = file.clone();
    let p = Pipeline::start_with(2, move |c| c.log.sqlite_path = f).await;
    let (sub, _) = p.subscribe(json!({"url": p.url("ok"), "event_types": ["*"]})).await;
    p.publish("evt_before_restart", "order.created").await;
    p.wait_final_of(&sub, 1, LIMIT).await;
    let (_, v) = p.get_when_ok("/v1/deliveries?event_id=evt_before_restart", |v| ids(v, "state") == ["succeeded"]).await;
    let delivery = v["items"][0]["delivery_id"].as_str().unwrap().to_owned();
    p.stop().await;
    seed(&file, 50_000).await;

    // A new broker: Kafka holds none of that history, so whatever the API answers comes from the store.
    let f = file.clone();
    let p = Pipeline::start_with(2, move |c| c.log.sqlite_path = f).await;
    let t = Instant::now();
    let (status, d) = p.call("GET", &format!("/v1/deliveries/{delivery}"), None).await;
    let first_query = t.elapsed();
    assert_eq!((status, d["state"].as_str(), d["event_id"].as_str()), (200, Some("succeeded"), Some("evt_before_restart")), "{d}");
    assert_eq!(d["attempts"].as_array().map(Vec::len), Some(1), "{d}");
    assert!(first_query < Duration::from_secs(2), "the first query took {first_query:?}");
    let (status, v) = p.call("GET", "/v1/deliveries?event_id=evt_hist49999", None).await;
    assert_eq!((status, ids(&v, "delivery_id")), (200, vec!["dlv_hist0049999".to_owned()]), "{v}");
    p.stop().await;
    let _ = std::fs::remove_dir_all(dir);
}

fn header<'a>(headers: &'a Value, name: &str) -> Option<&'a str> {
    headers.as_array()?.iter().find(|h| h[0].as_str().is_some_and(|n| n.eq_ignore_ascii_case(name)))?[1].as_str()
}

/// Through the whole pipeline: the request headers as sent (the signature redacted, never stored), the receiver's
/// response headers, and the policy's reasoning (rule, next due time) of a retried attempt, read back from the API.
pub(crate) async fn attempt_detail_keeps_headers_and_reasoning(p: crate::support::Pipeline) {
    p.script("hdr", vec![Some((503, Some("0"))), Some((200, None))]);
    let body = json!({
        "url": p.url("hdr"), "event_types": ["*"], "policy_toml": quick("standard"),
        "headers": {"X-Partner": "acme", "Authorization": "Bearer partner-token"},
        "shown_headers": ["X-Partner"],
    });
    let (sub, _) = p.subscribe(body).await;
    p.publish("evt_headers1", "order.created").await;
    p.wait_final_of(&sub, 1, LIMIT).await;
    let (_, found) = p.get_when_ok("/v1/deliveries?event_id=evt_headers1", |v| ids(v, "state") == ["succeeded"]).await;
    let delivery = found["items"][0]["delivery_id"].as_str().unwrap().to_owned();
    let d = p.get_when(&format!("/v1/deliveries/{delivery}"), |d| d["attempts"].as_array().is_some_and(|a| a.len() == 2)).await;
    let sent = p.requests_to("hdr");
    assert_eq!(sent.len(), 2);
    let (retried, done) = (&d["attempts"][0], &d["attempts"][1]);

    // The request headers as sent: the event id and timestamp, the signature's name without its value.
    let req = &retried["request_headers"];
    assert_eq!(header(req, "webhook-id"), Some("evt_headers1"), "{req}");
    assert_eq!(header(req, "webhook-timestamp"), sent[0].headers["webhook-timestamp"].to_str().ok(), "{req}");
    assert_eq!(header(req, "content-type"), Some("application/json"));
    assert_eq!(header(req, "x-partner"), Some("acme"), "a custom header marked as shown: {req}");
    assert_eq!(header(req, "webhook-signature"), Some("<redacted>"), "{req}");
    assert_eq!(header(req, "authorization"), Some("<redacted>"), "{req}");
    let signature = sent[0].headers["webhook-signature"].to_str().unwrap();
    assert!(signature.starts_with("v1,"), "the receiver got the real signature: {signature}");
    assert!(!d.to_string().contains(&signature[3..]) && !d.to_string().contains("partner-token"), "no secret in the log: {d}");
    // Nor in the attempts topic: the record itself carries the redacted value.
    let recs = p.attempts.items.lock().unwrap().clone();
    let rec = recs.iter().find(|r| r.delivery_id == delivery).expect("the attempt record");
    assert!(
        rec.request_headers.iter().any(|h| h.name == "webhook-signature" && &h.value[..] == b"<redacted>"),
        "{:?}",
        rec.request_headers
    );

    // The receiver's response headers, and the policy's reasoning.
    assert_eq!(retried["http_status"], 503);
    assert_eq!(header(&retried["response_headers"], "retry-after"), Some("0"), "{retried}");
    assert!(header(&retried["response_headers"], "content-type").is_some_and(|c| c.starts_with("text/plain")), "{retried}");
    assert_eq!(retried["decided_by"], "schedule", "Retry-After 0 does not outrank the schedule: {retried}");
    assert_eq!(retried["rule"], json!({"number": 4, "when": "429 503"}), "{retried}");
    let next = retried["next_attempt_at_ms"].as_i64().expect("a retry is scheduled");
    let started = retried["started_at_ms"].as_i64().unwrap();
    assert!(next >= started + 500 && next <= done["started_at_ms"].as_i64().unwrap() + 50, "next due {next}: {d}");
    assert_eq!(
        (done["decided_by"].as_str(), done["rule"]["number"].as_u64(), &done["next_attempt_at_ms"]),
        (Some("success_rule"), Some(1), &Value::Null),
        "{done}"
    );
    assert_eq!(header(&done["request_headers"], "webhook-id"), Some("evt_headers1"));
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempt_detail_keeps_headers_and_reasoning_sqlite() {
    attempt_detail_keeps_headers_and_reasoning(crate::support::Pipeline::start(2).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempt_detail_keeps_headers_and_reasoning_postgres() {
    let Some(url) = crate::support::postgres_url().await else { return };
    let p = crate::support::Pipeline::start_with(2, move |c| {
        c.log.store = hookline_service::config::LogStoreKind::Postgres;
        c.log.postgres_url = Some(url);
    })
    .await;
    assert_eq!(p.config.log.store, hookline_service::config::LogStoreKind::Postgres);
    attempt_detail_keeps_headers_and_reasoning(p).await;
}
