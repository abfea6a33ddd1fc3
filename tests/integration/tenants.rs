//! Tenant isolation through the real pipeline: tenants A and B both subscribe to the same event type, and each
//! event reaches only the subscriptions of its own tenant; an event without a tenant reaches only the
//! subscription without one; a replay keeps to the same rule. A tenant that is not a usable id is refused on
//! publish and on create.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::{wait_for, Pipeline};

const LIMIT: Duration = Duration::from_secs(60);

fn event(id: &str, event_type: &str, tenant: Option<&str>) -> Value {
    let mut v = json!({"id": id, "type": event_type, "data": {"n": 1}});
    if let Some(t) = tenant {
        v["tenant"] = json!(t);
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_reaches_only_its_own_tenants_subscriptions() {
    // One partition: each subscription's tasks are dispatched in the order the fan-out made them, so once the
    // last event (the sentinel) has arrived everywhere, anything leaked from earlier events would have too.
    let p = Pipeline::start(1).await;
    let types = json!(["invoice.paid", "sentinel.*"]);
    let (sub_a, _) = p.subscribe(json!({"url": p.url("a"), "event_types": types, "tenant": "tenant-a"})).await;
    p.subscribe(json!({"url": p.url("a-all"), "event_types": ["*"], "tenant": "tenant-a"})).await;
    p.subscribe(json!({"url": p.url("b"), "event_types": types, "tenant": "tenant-b"})).await;
    let (sub_none, _) = p.subscribe(json!({"url": p.url("none"), "event_types": types})).await;

    let events = [
        event("evt_a", "invoice.paid", Some("tenant-a")),
        event("evt_b", "invoice.paid", Some("tenant-b")),
        event("evt_none", "invoice.paid", None),
        // An empty tenant is no tenant.
        event("evt_empty", "invoice.paid", Some("")),
        // A tenant nobody subscribed for reaches nobody, not the tenant-less subscription.
        event("evt_c", "invoice.paid", Some("tenant-c")),
        event("evt_sentinel_a", "sentinel.end", Some("tenant-a")),
        event("evt_sentinel_b", "sentinel.end", Some("tenant-b")),
        event("evt_sentinel_none", "sentinel.end", None),
    ];
    for e in events {
        let (status, v) = p.call("POST", "/v1/events", Some(e)).await;
        assert_eq!(status, 202, "publish: {v}");
    }
    let seen = p.seen.clone();
    wait_for(&p.seen.changed, LIMIT, "every sentinel delivered", || {
        let got = seen.requests.lock().unwrap();
        ["a", "a-all", "b", "none"]
            .iter()
            .all(|path| got.iter().any(|r| r.path == *path && String::from_utf8_lossy(&r.body).contains("\"evt_sentinel_")))
    })
    .await;
    // a: 2, a-all: 2, b: 2, none: 3.
    p.wait_finals(9, LIMIT).await;

    let ids = |path: &str| -> BTreeSet<String> {
        p.requests_to(path).iter().map(|r| serde_json::from_slice::<Value>(&r.body).unwrap()["id"].as_str().unwrap().to_owned()).collect()
    };
    let set = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<BTreeSet<_>>();
    assert_eq!(ids("a"), set(&["evt_a", "evt_sentinel_a"]));
    assert_eq!(ids("a-all"), set(&["evt_a", "evt_sentinel_a"]));
    assert_eq!(ids("b"), set(&["evt_b", "evt_sentinel_b"]));
    assert_eq!(ids("none"), set(&["evt_none", "evt_empty", "evt_sentinel_none"]));
    // The request body carries the tenant it was published for.
    let body: Value = serde_json::from_slice(&p.requests_to("b")[0].body).unwrap();
    assert_eq!(body["tenant"], "tenant-b");
    assert_eq!(p.finals().len(), 9, "{:?}", p.finals());

    // A replay of the whole topic sends a subscription only its own tenant's events, too.
    for (sub, want) in [(&sub_a, 2), (&sub_none, 3)] {
        let (status, v) = p.call("POST", &format!("/v1/subscriptions/{sub}/replay"), Some(json!({"since_ms": 0}))).await;
        assert_eq!((status, v["replayed"].as_u64()), (202, Some(want)), "{v}");
    }

    // Tenants that are not usable ids are refused, naming the field.
    let (status, v) = p.call("POST", "/v1/events", Some(event("evt_bad", "invoice.paid", Some("a/b")))).await;
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["error"]["code"], "invalid_field");
    assert!(v["error"]["message"].as_str().unwrap().starts_with("tenant: "), "{v}");
    let long = "t".repeat(hookline_core::filter::MAX_TENANT_LEN + 1);
    for tenant in ["a b", long.as_str()] {
        let (status, v) =
            p.call("POST", "/v1/subscriptions", Some(json!({"url": p.url("x"), "event_types": ["*"], "tenant": tenant}))).await;
        assert_eq!(status, 422, "{v}");
        assert_eq!(v["error"]["field"], "tenant", "{v}");
    }
    p.stop().await;
}

/// Two tenants use the same event id (their own order numbers), in both orders: A first then B (`order-2000`), and B
/// first then A (`order-3000`). Each tenant's API key and A's read-only portal link read the tenant's own delivery
/// with its own event, and a resend and a replay of each delivery send the tenant's own bytes.
pub(crate) async fn the_same_event_id_from_two_tenants_stays_each_tenants(p: Pipeline) {
    p.tenant("tenant-a").await;
    p.tenant("tenant-b").await;
    let (_, key_a) = p.api_key("tenant-a").await;
    let (_, key_b) = p.api_key("tenant-b").await;
    let (status, link) = p.call("POST", "/v1/tenants/tenant-a/portal-links", Some(json!({"read_only": true}))).await;
    assert_eq!(status, 201, "{link}");
    let link_a = crate::support::link_token(&link);
    let mut subs = Vec::new();
    for (key, path) in [(&key_a, "a"), (&key_b, "b")] {
        let (status, v) =
            p.call_as(Some(key), "POST", "/v1/subscriptions", Some(json!({"url": p.url(path), "event_types": ["order.*"]}))).await;
        assert_eq!(status, 201, "{v}");
        subs.push(v["id"].as_str().unwrap().to_owned());
    }
    let card = |tenant: &str| if tenant == "a" { "1111" } else { "4242" };
    let publish = |key: String, id: &'static str, tenant: &'static str| {
        let p = &p;
        async move {
            let body = json!({"id": id, "type": "order.paid", "data": {"card_last4": card(tenant), "tenant": tenant}});
            let (status, v) = p.call_as(Some(&key), "POST", "/v1/events", Some(body)).await;
            assert_eq!(status, 202, "{v}");
        }
    };
    // Each delivery is stored before the other tenant publishes: the second event of the id is the newer one.
    let mut deliveries = Vec::new();
    for (first, second, id) in [("a", "b", "order-2000"), ("b", "a", "order-3000")] {
        for tenant in [first, second] {
            let key = if tenant == "a" { key_a.clone() } else { key_b.clone() };
            publish(key.clone(), id, tenant).await;
            let found =
                p.get_when_as(Some(&key), &format!("/v1/deliveries?event_id={id}"), |v| v["items"][0]["state"] == "succeeded").await;
            let items = found["items"].as_array().unwrap();
            assert_eq!(items.len(), 1, "a tenant finds its own delivery of the id only: {found}");
            deliveries.push((tenant, id, key, items[0]["delivery_id"].as_str().unwrap().to_owned()));
        }
    }
    let body_card = |r: &crate::support::Received| serde_json::from_slice::<Value>(&r.body).unwrap()["data"]["card_last4"].clone();
    for (tenant, id, key, delivery) in &deliveries {
        let path = format!("/v1/deliveries/{delivery}");
        let mut readers = vec![key.clone()];
        if *tenant == "a" {
            readers.push(link_a.clone());
        }
        for reader in &readers {
            let (status, d) = p.call_as(Some(reader), "GET", &path, None).await;
            assert_eq!(status, 200, "{d}");
            assert_eq!((d["event"]["id"].as_str(), d["event"]["tenant"].as_str()), (Some(*id), Some(&*format!("tenant-{tenant}"))), "{d}");
            assert_eq!(d["event"]["data"]["card_last4"], card(tenant), "{tenant} reads its own event: {d}");
            assert_eq!(d["replayable"], true, "{d}");
        }
        // The other tenant's key finds nothing there.
        let other = if *tenant == "a" { &key_b } else { &key_a };
        assert_eq!(p.call_as(Some(other), "GET", &path, None).await.0, 404);
        // A resend sends the tenant's own bytes again.
        let before = p.requests_to(tenant).len();
        let (status, v) = p.call_as(Some(key), "POST", &format!("{path}/replay"), None).await;
        assert_eq!(status, 202, "{v}");
        let seen = p.seen.clone();
        wait_for(&p.seen.changed, LIMIT, "the resend", || {
            seen.requests.lock().unwrap().iter().filter(|r| r.path == *tenant).count() > before
        })
        .await;
        let resent = p.requests_to(tenant);
        assert_eq!(body_card(resent.last().unwrap()), card(tenant), "{tenant}'s resend of {id}");
    }
    // A replay of everything since the start: each subscription gets its own tenant's two events, nothing else.
    for (i, tenant) in ["a", "b"].into_iter().enumerate() {
        let key = if tenant == "a" { &key_a } else { &key_b };
        let before = p.requests_to(tenant).len();
        let (status, v) =
            p.call_as(Some(key), "POST", &format!("/v1/subscriptions/{}/replay", subs[i]), Some(json!({"since_ms": 0}))).await;
        assert_eq!((status, v["replayed"].as_u64()), (202, Some(2)), "{v}");
        let seen = p.seen.clone();
        wait_for(&p.seen.changed, LIMIT, "the replay", || {
            seen.requests.lock().unwrap().iter().filter(|r| r.path == tenant).count() >= before + 2
        })
        .await;
        for r in &p.requests_to(tenant)[before..] {
            assert_eq!(body_card(r), card(tenant), "{tenant}'s replay");
        }
    }
    // Every request a tenant's endpoint ever got carried its own tenant's data.
    for tenant in ["a", "b"] {
        let all = p.requests_to(tenant);
        assert!(all.len() >= 6, "{tenant}: {}", all.len());
        assert!(all.iter().all(|r| body_card(r) == card(tenant)), "{tenant} got another tenant's event");
    }
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_event_id_from_two_tenants_stays_each_tenants_sqlite() {
    the_same_event_id_from_two_tenants_stays_each_tenants(Pipeline::start(2).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_event_id_from_two_tenants_stays_each_tenants_postgres() {
    let Some(url) = crate::support::postgres_url().await else { return };
    let p = Pipeline::start_with(2, move |c| {
        c.log.store = hookline_service::config::LogStoreKind::Postgres;
        c.log.postgres_url = Some(url);
    })
    .await;
    the_same_event_id_from_two_tenants_stays_each_tenants(p).await;
}

/// Publish quotas: a tenant over its quota (its own, set through the API) gets 429 with `Retry-After` and nothing
/// is written; a key's own quota applies within its tenant's; another tenant publishes meanwhile; after the wait
/// it was told, the tenant publishes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_publish_quota_gets_429_and_others_publish() {
    let p = Pipeline::start_with(1, |c| c.ingest.publish_rate_per_s = 1_000).await;
    p.tenant("loud").await;
    p.tenant("quiet").await;
    let (status, t) = p.call("PATCH", "/v1/tenants/loud", Some(json!({"publish_rate_per_s": 2, "publish_burst": 3}))).await;
    assert_eq!((status, t["publish_rate_per_s"].as_u64(), t["publish_burst"].as_u64()), (200, Some(2), Some(3)), "{t}");
    let (status, v) = p.call("PATCH", "/v1/tenants/loud", Some(json!({"publish_burst": 5, "publish_rate_per_s": 0}))).await;
    assert_eq!((status, v["error"]["field"].as_str()), (422, Some("publish_burst")), "a burst needs a rate: {v}");
    let (_, loud_key) = p.api_key("loud").await;
    let (_, quiet_key) = p.api_key("quiet").await;
    let publish = |key: String, id: String| {
        let p = &p;
        async move { p.call_as(Some(&key), "POST", "/v1/events", Some(json!({"id": id, "type": "quota.test", "data": {}}))).await }
    };
    // The burst of 3, then refused, with the wait in whole seconds and the field that names whose quota it was.
    for i in 0..3 {
        assert_eq!(publish(loud_key.clone(), format!("evt_loud_{i}")).await.0, 202);
    }
    let (status, v) = publish(loud_key.clone(), "evt_loud_3".into()).await;
    assert_eq!((status, v["error"]["code"].as_str(), v["error"]["field"].as_str()), (429, Some("rate_limited"), Some("tenant")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("2 events/s (burst 3)"), "{v}");
    // The quiet tenant's default quota (1,000/s) is untouched by the loud one.
    for i in 0..20 {
        assert_eq!(publish(quiet_key.clone(), format!("evt_quiet_{i}")).await.0, 202);
    }
    // Retry-After is honoured: after it, accepted again.
    let req = http::Request::post(format!("http://{}/v1/events", p.api))
        .header("authorization", format!("Bearer {loud_key}"))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(json!({"id": "evt_loud_4", "type": "quota.test", "data": {}}).to_string())))
        .unwrap();
    let resp = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http().request(req).await.unwrap();
    assert_eq!(resp.status(), 429);
    let wait: u64 = resp.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=2).contains(&wait), "{wait}");
    tokio::time::sleep(Duration::from_secs(wait)).await;
    assert_eq!(publish(loud_key.clone(), "evt_loud_5".into()).await.0, 202);

    // A key's own quota, within its tenant's: its second publish in a second is refused naming the credential.
    let (status, k) = p.call("POST", "/v1/tenants/quiet/api-keys", Some(json!({"name": "slow", "publish_rate_per_s": 1}))).await;
    assert_eq!((status, k["publish_rate_per_s"].as_u64()), (201, Some(1)), "{k}");
    let slow_key = k["key"].as_str().unwrap().to_owned();
    assert_eq!(publish(slow_key.clone(), "evt_slow_1".into()).await.0, 202);
    let (status, v) = publish(slow_key, "evt_slow_2".into()).await;
    assert_eq!((status, v["error"]["field"].as_str()), (429, Some("Authorization")), "{v}");
    assert_eq!(publish(quiet_key, "evt_quiet_after".into()).await.0, 202, "the tenant's other keys are not held back");

    // Nothing refused was written: only the accepted events reached the topic (20 quiet + 4 loud + 1 slow + 1).
    let mut written = std::collections::BTreeSet::new();
    hookline_kafka::scan::scan(
        &p.config.kafka,
        hookline_kafka::Topics::new(p.config.kafka.topic_prefix.clone()).events(),
        None,
        LIMIT,
        |m| {
            let ev: hookline_core::model::Event = prost::Message::decode(rdkafka::Message::payload(m).unwrap_or_default()).unwrap();
            written.insert(ev.id);
        },
    )
    .await
    .unwrap();
    assert!(!written.contains("evt_loud_3") && !written.contains("evt_loud_4") && !written.contains("evt_slow_2"), "{written:?}");
    assert_eq!(written.len(), 26, "{written:?}");
    p.stop().await;
}
