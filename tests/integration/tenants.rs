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
        ["a", "a-all", "b", "none"].iter().all(|path| {
            got.iter().any(|r| r.path == *path && String::from_utf8_lossy(&r.body).contains("\"evt_sentinel_"))
        })
    })
    .await;
    // a: 2, a-all: 2, b: 2, none: 3.
    p.wait_finals(9, LIMIT).await;

    let ids = |path: &str| -> BTreeSet<String> {
        p.requests_to(path)
            .iter()
            .map(|r| serde_json::from_slice::<Value>(&r.body).unwrap()["id"].as_str().unwrap().to_owned())
            .collect()
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
        let (status, v) = p
            .call("POST", "/v1/subscriptions", Some(json!({"url": p.url("x"), "event_types": ["*"], "tenant": tenant})))
            .await;
        assert_eq!(status, 422, "{v}");
        assert_eq!(v["error"]["field"], "tenant", "{v}");
    }
    p.stop().await;
}
