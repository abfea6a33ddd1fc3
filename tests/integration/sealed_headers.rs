//! Custom header values are credentials as often as not (`Authorization: Bearer …`, `X-Api-Key`, or any name a
//! partner chose): they are sealed on the `subscriptions` topic as signing secrets are, sent in the clear only to
//! the endpoint, and recorded as `<redacted>` in attempt records and the delivery log unless the subscription
//! marks a header as safe to show. Every place they could rest is searched for each value: the raw bytes of the
//! `subscriptions` and `attempts` topics, the SQLite file and its WAL, and a dump of the PostgreSQL database.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::Pipeline;

const LIMIT: Duration = Duration::from_secs(60);
/// A name no list of "secret-looking" header names would catch.
const CRED: (&str, &str) = ("X-Custom-Cred", "cred-value-6f1d2a");
const BEARER: (&str, &str) = ("Authorization", "Bearer partner-token-9c4e7b");
const SHOWN: (&str, &str) = ("X-Partner", "acme-visible-3b8d");

/// Every record value of `topic`, concatenated.
async fn topic_bytes(p: &Pipeline, topic: &str) -> Vec<u8> {
    let mut all = Vec::new();
    hookline_kafka::scan::scan(&p.config.kafka, topic, None, LIMIT, |m| {
        all.extend_from_slice(rdkafka::Message::payload(m).unwrap_or_default());
    })
    .await
    .expect("the topic reads");
    all
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

async fn custom_headers_are_sealed_and_redacted(p: Pipeline, store_bytes: impl AsyncFnOnce(&Pipeline) -> Vec<u8>) {
    let body = json!({
        "url": p.url("partner"), "event_types": ["*"],
        "headers": {CRED.0: CRED.1, BEARER.0: BEARER.1, SHOWN.0: SHOWN.1},
        "shown_headers": ["x-partner"],
    });
    let (status, created) = p.call("POST", "/v1/subscriptions", Some(body)).await;
    assert_eq!(status, 201, "{created}");
    let sub = created["id"].as_str().unwrap().to_owned();
    assert_eq!(created["shown_headers"], json!(["x-partner"]), "{created}");
    assert!(!created.to_string().contains(CRED.1), "values are write-only: {created}");
    p.publish("evt_sealed_1", "order.created").await;
    p.wait_final_of(&sub, 1, LIMIT).await;

    // The endpoint gets every value in the clear.
    let got = &p.requests_to("partner")[0];
    for (name, value) in [CRED, BEARER, SHOWN] {
        assert_eq!(got.headers.get(name).and_then(|v| v.to_str().ok()), Some(value), "{name}");
    }
    // The delivery log shows the marked header and redacts the rest.
    let found = p.get_when("/v1/deliveries?event_id=evt_sealed_1", |v| v["items"][0]["state"] == "succeeded").await;
    let d = p
        .get_when(&format!("/v1/deliveries/{}", found["items"][0]["delivery_id"].as_str().unwrap()), |d| d["attempts"][0].is_object())
        .await;
    let sent: Vec<(String, String)> = serde_json::from_value(d["attempts"][0]["request_headers"].clone()).unwrap();
    let value_of = |name: &str| sent.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.clone());
    assert_eq!(value_of(SHOWN.0).as_deref(), Some(SHOWN.1), "{sent:?}");
    assert_eq!(value_of(CRED.0).as_deref(), Some("<redacted>"), "{sent:?}");
    assert_eq!(value_of(BEARER.0).as_deref(), Some("<redacted>"), "{sent:?}");

    // Nowhere at rest.
    let subscriptions = topic_bytes(&p, hookline_kafka::Topics::new(p.config.kafka.topic_prefix.clone()).subscriptions()).await;
    assert!(contains(&subscriptions, CRED.0), "the record is there (names are not secret)");
    let attempts = topic_bytes(&p, hookline_kafka::Topics::new(p.config.kafka.topic_prefix.clone()).attempts()).await;
    assert!(contains(&attempts, SHOWN.1), "the shown header's value is recorded");
    let store = store_bytes(&p).await;
    assert!(contains(&store, "evt_sealed_1"), "the store holds the delivery");
    for (place, bytes) in
        [("the subscriptions topic", &subscriptions), ("the attempts topic", &attempts), ("the delivery log store", &store)]
    {
        for (name, value) in [CRED, BEARER] {
            assert!(!contains(bytes, value), "{name}'s value is in {place}");
        }
    }
    // A PATCH keeps them sealed, and removing them removes them.
    let (status, v) = p.call("PATCH", &format!("/v1/subscriptions/{sub}"), Some(json!({"description": "touched"}))).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["header_names"],
        json!([BEARER.0, SHOWN.0, CRED.0].iter().map(|s| s.to_string()).collect::<std::collections::BTreeSet<_>>()),
        "{v}"
    );
    assert!(!contains(&topic_bytes(&p, hookline_kafka::Topics::new(p.config.kafka.topic_prefix.clone()).subscriptions()).await, CRED.1));
    // `shown_headers` names only headers the subscription has.
    let (status, v) = p.call("PATCH", &format!("/v1/subscriptions/{sub}"), Some(json!({"shown_headers": ["X-Nope"]}))).await;
    assert_eq!((status, v["error"]["field"].as_str()), (422, Some("shown_headers[0]")), "{v}");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_headers_are_sealed_and_redacted_sqlite() {
    let p = Pipeline::start(1).await;
    custom_headers_are_sealed_and_redacted(p, async |p: &Pipeline| {
        // The file and its write-ahead log, as they are on disk.
        let path = p.config.log.sqlite_path.clone();
        let mut bytes = std::fs::read(&path).unwrap_or_default();
        bytes.extend(std::fs::read(format!("{}-wal", path.display())).unwrap_or_default());
        bytes
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_headers_are_sealed_and_redacted_postgres() {
    let Some(url) = crate::support::postgres_url().await else { return };
    let dump_url = url.clone();
    let p = Pipeline::start_with(1, move |c| {
        c.log.store = hookline_service::config::LogStoreKind::Postgres;
        c.log.postgres_url = Some(url);
    })
    .await;
    custom_headers_are_sealed_and_redacted(p, async move |_: &Pipeline| {
        let out = std::process::Command::new("pg_dump").args(["--data-only", "--dbname", &dump_url]).output().expect("pg_dump runs");
        assert!(out.status.success(), "pg_dump: {}", String::from_utf8_lossy(&out.stderr));
        out.stdout
    })
    .await;
}

/// A header value that is not valid in a subscription is refused naming it, and a duplicated key is refused, not
/// silently replaced by its last value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_keys_in_headers_and_metadata_are_refused() {
    let p = Pipeline::start(1).await;
    for field in ["headers", "metadata"] {
        let raw = format!(r#"{{"url":"{}","event_types":["*"],"{field}":{{"X-A":"1","X-A":"2"}}}}"#, p.url("dup"));
        let (status, v) = p.call_raw("POST", "/v1/subscriptions", &raw).await;
        assert_eq!(status, 422, "{field}: {v}");
        assert_eq!(v["error"]["field"], field, "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("duplicate key \"X-A\""), "{v}");
    }
    let (status, v) = p
        .call(
            "POST",
            "/v1/subscriptions",
            Some(json!({"url": p.url("x"), "event_types": ["*"], "owner_email": "ops@example.com\r\nBcc: all@example.com"})),
        )
        .await;
    assert_eq!((status, v["error"]["field"].as_str()), (422, Some("owner_email")), "{v}");
    for bad in ["not-an-address", "a@", "@b.com", "Name <a@b.com>"] {
        let (status, v): (u16, Value) =
            p.call("POST", "/v1/subscriptions", Some(json!({"url": p.url("x"), "event_types": ["*"], "owner_email": bad}))).await;
        assert_eq!((status, v["error"]["field"].as_str()), (422, Some("owner_email")), "{bad}: {v}");
    }
    let (status, v) =
        p.call("POST", "/v1/subscriptions", Some(json!({"url": p.url("x"), "event_types": ["*"], "owner_email": "ops@example.com"}))).await;
    assert_eq!(status, 201, "{v}");
    p.stop().await;
}
