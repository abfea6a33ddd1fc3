//! Credentials through the real pipeline: every route of the API × {no credential, admin token, tenant A's API
//! key, tenant B's API key, tenant A's portal link, an expired link, a tampered link}, each with the status it
//! must answer (the matrix covers every operation of the OpenAPI document, so a new route cannot go unchecked).
//! Then what a tenant key does to events, what revoking and deleting do, read-only links, and the signing
//! secrets on the `subscriptions` topic (sealed, and a process without their key refuses to start).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hookline_core::credential::{sign_portal_token, PortalGrant};
use serde_json::{json, Value};

use crate::support::{link_token, Pipeline, TOKEN};

const LIMIT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cred {
    None,
    Admin,
    KeyA,
    KeyB,
    LinkA,
    Expired,
    Tampered,
}

const CREDS: [Cred; 7] = [Cred::None, Cred::Admin, Cred::KeyA, Cred::KeyB, Cred::LinkA, Cred::Expired, Cred::Tampered];

struct Tokens {
    key_a: String,
    key_b: String,
    link_a: String,
    expired: String,
    tampered: String,
}

impl Tokens {
    fn of(&self, c: Cred) -> Option<&str> {
        match c {
            Cred::None => None,
            Cred::Admin => Some(TOKEN),
            Cred::KeyA => Some(&self.key_a),
            Cred::KeyB => Some(&self.key_b),
            Cred::LinkA => Some(&self.link_a),
            Cred::Expired => Some(&self.expired),
            Cred::Tampered => Some(&self.tampered),
        }
    }
}

/// What a row answers for (admin, tenant A key, tenant B key, portal link A); the three bad credentials always 401.
struct Row {
    method: &'static str,
    /// `{sub}` (a fresh subscription of tenant A for each call), `{dlv}` (a delivery of A), `{tenant}` (a fresh
    /// tenant), `{key}` (a fresh key of A).
    path: &'static str,
    /// The OpenAPI path it covers.
    template: &'static str,
    body: Option<Value>,
    expect: [u16; 4],
    public: bool,
}

fn row(method: &'static str, path: &'static str, template: &'static str, body: Option<Value>, expect: [u16; 4]) -> Row {
    Row { method, path, template, body, expect, public: false }
}

fn matrix(url: &str) -> Vec<Row> {
    let sub_body = json!({"url": url, "event_types": ["matrix.*"], "tenant": "acme"});
    let event = json!({"id": "evt_matrix", "type": "matrix.x", "tenant": "acme", "data": {}});
    let since = json!({"since_ms": i64::MAX / 2});
    let mut rows = vec![
        // Admin, key A, key B, link A.
        row("POST", "/v1/events", "/v1/events", Some(event), [202, 202, 403, 403]),
        row("POST", "/v1/subscriptions", "/v1/subscriptions", Some(sub_body), [201, 201, 403, 201]),
        row("GET", "/v1/subscriptions", "/v1/subscriptions", None, [200, 200, 200, 200]),
        row("GET", "/v1/subscriptions?tenant=acme", "/v1/subscriptions", None, [200, 200, 403, 200]),
        row("GET", "/v1/subscriptions/{sub}", "/v1/subscriptions/{id}", None, [200, 200, 404, 200]),
        row("PATCH", "/v1/subscriptions/{sub}", "/v1/subscriptions/{id}", Some(json!({"description": "d"})), [200, 200, 404, 200]),
        row("DELETE", "/v1/subscriptions/{sub}", "/v1/subscriptions/{id}", None, [204, 204, 404, 204]),
        row("POST", "/v1/subscriptions/{sub}/pause", "/v1/subscriptions/{id}/pause", None, [200, 200, 404, 200]),
        row("POST", "/v1/subscriptions/{sub}/resume", "/v1/subscriptions/{id}/resume", None, [200, 200, 404, 200]),
        row("POST", "/v1/subscriptions/{sub}/rotate-secret", "/v1/subscriptions/{id}/rotate-secret", None, [200, 200, 404, 200]),
        // Search: a tenant finds only its own (B gets an empty page).
        row("GET", "/v1/deliveries?event_id=evt_m", "/v1/deliveries", None, [200, 200, 200, 200]),
        // The subscription's policy has no [verification]: who may ask gets 409 verification_not_required.
        row("POST", "/v1/subscriptions/{sub}/verify", "/v1/subscriptions/{id}/verify", None, [409, 409, 404, 409]),
        row("GET", "/v1/subscriptions/{sub}/deliveries", "/v1/subscriptions/{id}/deliveries", None, [200, 200, 404, 200]),
        row("POST", "/v1/subscriptions/{sub}/replay", "/v1/subscriptions/{id}/replay", Some(since.clone()), [202, 202, 404, 202]),
        row("GET", "/v1/subscriptions/{sub}/stats", "/v1/subscriptions/{id}/stats", None, [200, 200, 404, 200]),
        row("GET", "/v1/deliveries/{dlv}", "/v1/deliveries/{id}", None, [200, 200, 404, 200]),
        // A succeeded delivery is resent (the store keeps its event): 202 for whoever may see it.
        row("POST", "/v1/deliveries/{dlv}/replay", "/v1/deliveries/{id}/replay", None, [202, 202, 404, 202]),
        row("POST", "/v1/dlq/redrive", "/v1/dlq/redrive", Some(since), [202, 202, 202, 202]),
        row("POST", "/v1/secrets/reseal", "/v1/secrets/reseal", None, [200, 403, 403, 403]),
        row("POST", "/v1/tenants", "/v1/tenants", Some(json!({"id": "{tenant}"})), [201, 403, 403, 403]),
        row("GET", "/v1/tenants", "/v1/tenants", None, [200, 403, 403, 403]),
        row("GET", "/v1/tenants/acme", "/v1/tenants/{id}", None, [200, 200, 404, 200]),
        row("PATCH", "/v1/tenants/acme", "/v1/tenants/{id}", Some(json!({"name": "Acme"})), [200, 403, 403, 403]),
        row("DELETE", "/v1/tenants/{tenant}", "/v1/tenants/{id}", None, [200, 403, 403, 403]),
        row("POST", "/v1/tenants/acme/api-keys", "/v1/tenants/{id}/api-keys", None, [201, 403, 403, 403]),
        row("GET", "/v1/tenants/acme/api-keys", "/v1/tenants/{id}/api-keys", None, [200, 403, 403, 403]),
        row("DELETE", "/v1/tenants/acme/api-keys/{key}", "/v1/tenants/{id}/api-keys/{key_id}", None, [204, 403, 403, 403]),
        row("POST", "/v1/tenants/acme/portal-links", "/v1/tenants/{id}/portal-links", Some(json!({"ttl_s": 60})), [201, 403, 403, 403]),
        // Any valid credential may ask what it is.
        row("GET", "/v1/whoami", "/v1/whoami", None, [200, 200, 200, 200]),
        // The event-type catalogue is the app's: admins manage it, every credential reads it.
        row("POST", "/v1/event-types", "/v1/event-types", Some(json!({"name": "{etype}"})), [201, 403, 403, 403]),
        row("GET", "/v1/event-types", "/v1/event-types", None, [200, 200, 200, 200]),
        row("GET", "/v1/event-types/matrix.x", "/v1/event-types/{name}", None, [200, 200, 200, 200]),
        row("PATCH", "/v1/event-types/matrix.x", "/v1/event-types/{name}", Some(json!({"description": "d"})), [200, 403, 403, 403]),
        row("DELETE", "/v1/event-types/{etype}", "/v1/event-types/{name}", None, [204, 403, 403, 403]),
        // A test event to one's own subscription (a read-only link may not: see the read-only link's test).
        row(
            "POST",
            "/v1/subscriptions/{sub}/test-event",
            "/v1/subscriptions/{id}/test-event",
            Some(json!({"event_type": "matrix.x"})),
            [202, 202, 404, 202],
        ),
    ];
    for (path, template) in [("/openapi.json", "/openapi.json"), ("/portal/", "/portal/")] {
        rows.push(Row { method: "GET", path, template, body: None, expect: [200; 4], public: true });
    }
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_every_kind_of_credential_as_it_should() {
    let p = Pipeline::start(1).await;
    p.tenant("acme").await;
    p.tenant("globex").await;
    let (_, key_a) = p.api_key("acme").await;
    let (_, key_b) = p.api_key("globex").await;
    let (status, link) = p.call_as(Some(TOKEN), "POST", "/v1/tenants/acme/portal-links", None).await;
    assert_eq!(status, 201, "{link}");
    assert!(link["url"].as_str().unwrap().contains("/portal/#token=hlp_"), "{link}");
    let link_a = link_token(&link);
    let secret = p.config.ingest.portal.link_secret.clone().unwrap();
    let expired =
        sign_portal_token(&PortalGrant { tenant: "acme".into(), expires_at_ms: 1, read_only: false, nonce: "x".into() }, secret.as_bytes());
    // The payload of A's link re-encoded for globex, with A's signature.
    let tampered = {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let (payload, sig) = link_a.strip_prefix("hlp_").unwrap().split_once('.').unwrap();
        let mut g: Value = serde_json::from_slice(&b64.decode(payload).unwrap()).unwrap();
        g["t"] = json!("globex");
        format!("hlp_{}.{sig}", b64.encode(g.to_string()))
    };
    let tokens = Tokens { key_a, key_b, link_a, expired, tampered };
    let (status, v) = p.call_as(Some(TOKEN), "POST", "/v1/event-types", Some(json!({"name": "matrix.x", "examples": [{}]}))).await;
    assert_eq!(status, 201, "{v}");

    // One delivery of tenant A in the log.
    let (sub, _) = p.subscribe(json!({"url": p.url("ok"), "event_types": ["matrix.*"], "tenant": "acme"})).await;
    let (status, v) =
        p.call_as(Some(TOKEN), "POST", "/v1/events", Some(json!({"id": "evt_m", "type": "matrix.x", "tenant": "acme", "data": {}}))).await;
    assert_eq!(status, 202, "{v}");
    p.wait_final_of(&sub, 1, LIMIT).await;
    let dlv = p.get_when(&format!("/v1/subscriptions/{sub}/deliveries"), |v| v["items"][0]["state"] == "succeeded").await["items"][0]
        ["delivery_id"]
        .as_str()
        .unwrap()
        .to_owned();

    let rows = matrix(&p.url("ok"));
    let mut failures = Vec::new();
    let mut n = 0usize;
    for r in &rows {
        for c in CREDS {
            n += 1;
            let mut path = r.path.to_owned();
            let mut body = r.body.clone();
            if path.contains("{sub}") {
                let (id, _) = p.subscribe(json!({"url": p.url("ok"), "event_types": ["matrix.*"], "tenant": "acme"})).await;
                path = path.replace("{sub}", &id);
            }
            path = path.replace("{dlv}", &dlv);
            let fresh = format!("t-{n}");
            if path.contains("{tenant}") {
                p.tenant(&fresh).await;
                path = path.replace("{tenant}", &fresh);
            }
            if body.as_ref().is_some_and(|b| b["id"] == "{tenant}") {
                body = Some(json!({"id": fresh}));
            }
            let etype = format!("matrix.t-{n}");
            if path.contains("{etype}") {
                let (status, v) = p.call_as(Some(TOKEN), "POST", "/v1/event-types", Some(json!({"name": etype}))).await;
                assert_eq!(status, 201, "{v}");
                path = path.replace("{etype}", &etype);
            }
            if body.as_ref().is_some_and(|b| b["name"] == "{etype}") {
                body = Some(json!({"name": etype}));
            }
            if path.contains("{key}") {
                let (id, _) = p.api_key("acme").await;
                path = path.replace("{key}", &id);
            }
            let want = match c {
                _ if r.public => 200,
                Cred::None | Cred::Expired | Cred::Tampered => 401,
                Cred::Admin => r.expect[0],
                Cred::KeyA => r.expect[1],
                Cred::KeyB => r.expect[2],
                Cred::LinkA => r.expect[3],
            };
            let (got, answer) = p.call_as(tokens.of(c), r.method, &path, body).await;
            if got != want {
                failures.push(format!("{} {path} as {c:?}: {got}, expected {want}: {answer}", r.method));
            }
            if got >= 400 && !r.public {
                assert!(answer["error"]["code"].is_string(), "{} {path} as {c:?}: a JSON error body: {answer}", r.method);
            }
        }
    }
    assert!(failures.is_empty(), "{} of {n} cells wrong:\n{}", failures.len(), failures.join("\n"));

    // Every operation of the OpenAPI document is in the matrix.
    let doc: Value = serde_json::from_str(include_str!("../../crates/api/src/openapi.json")).unwrap();
    let covered: BTreeSet<(String, String)> = rows.iter().map(|r| (r.method.to_lowercase(), r.template.to_owned())).collect();
    let mut missing = Vec::new();
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for method in ops.as_object().unwrap().keys().filter(|m| ["get", "post", "patch", "put", "delete"].contains(&m.as_str())) {
            if !covered.contains(&(method.clone(), path.clone())) && path.starts_with("/v1/") {
                missing.push(format!("{method} {path}"));
            }
        }
    }
    assert!(missing.is_empty(), "routes not in the credential matrix: {missing:?}");
    // And every row is a documented operation.
    for r in rows.iter().filter(|r| !r.public) {
        assert!(
            doc["paths"][r.template][r.method.to_lowercase()].is_object(),
            "{} {} is not in the OpenAPI document",
            r.method,
            r.template
        );
    }
}

/// What the portal asks on opening: each kind of credential says what it is, and an expired link is told apart
/// from one that is not valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whoami_says_what_each_credential_is_and_an_expired_link_says_so() {
    let p = Pipeline::start(1).await;
    p.tenant("acme").await;
    let (_, key) = p.api_key("acme").await;
    let (status, link) = p.call_as(Some(TOKEN), "POST", "/v1/tenants/acme/portal-links", Some(json!({"read_only": true}))).await;
    assert_eq!(status, 201, "{link}");
    let (_, writable) = p.call_as(Some(TOKEN), "POST", "/v1/tenants/acme/portal-links", None).await;

    let (status, v) = p.call_as(Some(TOKEN), "GET", "/v1/whoami", None).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v,
        json!({"kind": "admin", "tenant": null, "tenant_name": null, "read_only": false, "expires_at_ms": null, "admin": true, "can_write": true})
    );
    let (_, v) = p.call_as(Some(&key), "GET", "/v1/whoami", None).await;
    assert_eq!(
        v,
        json!({"kind": "tenant_key", "tenant": "acme", "tenant_name": "ACME", "read_only": false, "expires_at_ms": null, "admin": false, "can_write": true})
    );
    let (_, v) = p.call_as(Some(&link_token(&link)), "GET", "/v1/whoami", None).await;
    assert_eq!(
        v,
        json!({"kind": "portal_link", "tenant": "acme", "tenant_name": "ACME", "read_only": true,
               "expires_at_ms": link["expires_at_ms"], "admin": false, "can_write": false})
    );
    let (_, v) = p.call_as(Some(&link_token(&writable)), "GET", "/v1/whoami", None).await;
    assert_eq!(
        (v["kind"].as_str(), v["read_only"].as_bool(), v["can_write"].as_bool()),
        (Some("portal_link"), Some(false), Some(true)),
        "{v}"
    );

    // A genuine link past its time: `link_expired`, so the portal can say "ask for a new one".
    let secret = p.config.ingest.portal.link_secret.clone().unwrap();
    let expired =
        sign_portal_token(&PortalGrant { tenant: "acme".into(), expires_at_ms: 1, read_only: false, nonce: "x".into() }, secret.as_bytes());
    let (status, v) = p.call_as(Some(&expired), "GET", "/v1/whoami", None).await;
    assert_eq!(
        (status, v["error"]["code"].as_str(), v["error"]["field"].as_str()),
        (401, Some("link_expired"), Some("Authorization")),
        "{v}"
    );
    // One signed with another key is not "expired", even when it is past its time too.
    let forged = sign_portal_token(
        &PortalGrant { tenant: "acme".into(), expires_at_ms: 1, read_only: false, nonce: "x".into() },
        b"another key, another key, another",
    );
    let (status, v) = p.call_as(Some(&forged), "GET", "/v1/whoami", None).await;
    assert_eq!((status, v["error"]["code"].as_str()), (401, Some("unauthorized")), "{v}");
    let (status, v) = p.call_as(None, "GET", "/v1/whoami", None).await;
    assert_eq!((status, v["error"]["code"].as_str()), (401, Some("unauthorized")), "{v}");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_key_publishes_for_its_tenant_and_stops_working_when_revoked_or_its_tenant_is_deleted() {
    let p = Pipeline::start(1).await;
    p.tenant("acme").await;
    p.tenant("globex").await;
    let (key_id, key) = p.api_key("acme").await;
    let (status, created) =
        p.call_as(Some(&key), "POST", "/v1/subscriptions", Some(json!({"url": p.url("a"), "event_types": ["x.*"]}))).await;
    assert_eq!((status, created["tenant"].as_str()), (201, Some("acme")), "a subscription made with a key is its tenant's: {created}");
    let sub_a = created["id"].as_str().unwrap().to_owned();
    let (sub_b, _) = p.subscribe(json!({"url": p.url("b"), "event_types": ["x.*"], "tenant": "globex"})).await;
    let (sub_none, _) = p.subscribe(json!({"url": p.url("none"), "event_types": ["x.*"]})).await;

    // Published without a tenant, the event is acme's: it reaches acme's subscription only.
    let (status, v) = p.call_as(Some(&key), "POST", "/v1/events", Some(json!({"id": "evt_k", "type": "x.y", "data": {}}))).await;
    assert_eq!(status, 202, "{v}");
    let (status, v) =
        p.call_as(Some(&key), "POST", "/v1/events", Some(json!({"id": "evt_k2", "type": "x.y", "tenant": "globex", "data": {}}))).await;
    assert_eq!((status, v["error"]["field"].as_str()), (403, Some("tenant")), "{v}");
    p.wait_final_of(&sub_a, 1, LIMIT).await;
    let body: Value = serde_json::from_slice(&p.requests_to("a")[0].body).unwrap();
    assert_eq!(body["tenant"], "acme");
    // A sentinel for the others, so a leak would have arrived by the time it has.
    p.call("POST", "/v1/events", Some(json!({"id": "evt_s", "type": "x.end", "tenant": "globex", "data": {}}))).await;
    p.call("POST", "/v1/events", Some(json!({"id": "evt_t", "type": "x.end", "data": {}}))).await;
    p.wait_final_of(&sub_b, 1, LIMIT).await;
    p.wait_final_of(&sub_none, 1, LIMIT).await;
    let ids = |path: &str| {
        p.requests_to(path).iter().map(|r| serde_json::from_slice::<Value>(&r.body).unwrap()["id"].clone()).collect::<Vec<_>>()
    };
    assert_eq!(ids("a"), [json!("evt_k")]);
    assert_eq!(ids("b"), [json!("evt_s")]);
    assert_eq!(ids("none"), [json!("evt_t")]);

    // The key lists only its tenant's subscriptions, and the admin's list shows when the key was last used.
    let (_, list) = p.call_as(Some(&key), "GET", "/v1/subscriptions", None).await;
    let listed: Vec<&str> = list["items"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(listed, [sub_a.as_str()]);
    let (_, keys) = p.call_as(Some(TOKEN), "GET", "/v1/tenants/acme/api-keys", None).await;
    assert!(keys["items"][0]["last_used_at_ms"].as_i64().is_some_and(|t| t > 0), "{keys}");
    assert!(keys["items"][0]["prefix"].as_str().is_some_and(|x| key.starts_with(x) && x.len() < key.len()), "{keys}");
    assert!(!keys.to_string().contains(&key), "the key is shown only once");

    // Revoked: refused at once.
    let (status, _) = p.call_as(Some(TOKEN), "DELETE", &format!("/v1/tenants/acme/api-keys/{key_id}"), None).await;
    assert_eq!(status, 204);
    let (status, v) = p.call_as(Some(&key), "GET", "/v1/subscriptions", None).await;
    assert_eq!(status, 401, "{v}");

    // Deleting a tenant deletes its subscriptions and keys; others are untouched.
    let (_, key2) = p.api_key("acme").await;
    let (status, v) = p.call_as(Some(TOKEN), "DELETE", "/v1/tenants/acme", None).await;
    assert_eq!((status, v["deleted_subscriptions"].as_u64(), v["revoked_api_keys"].as_u64()), (200, Some(1), Some(1)), "{v}");
    assert_eq!(p.call_as(Some(TOKEN), "GET", &format!("/v1/subscriptions/{sub_a}"), None).await.0, 404);
    assert_eq!(p.call_as(Some(TOKEN), "GET", &format!("/v1/subscriptions/{sub_b}"), None).await.0, 200);
    assert_eq!(p.call_as(Some(&key2), "GET", "/v1/subscriptions", None).await.0, 401);
    assert_eq!(p.call_as(Some(TOKEN), "GET", "/v1/tenants/acme", None).await.0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_portal_link_reads_but_changes_nothing_and_tenants_page_by_cursor() {
    let p = Pipeline::start(1).await;
    for id in ["t-a", "t-b", "t-c"] {
        p.tenant(id).await;
    }
    let (status, v) = p.call_as(Some(TOKEN), "POST", "/v1/tenants", Some(json!({"id": "t-a"}))).await;
    assert_eq!((status, v["error"]["code"].as_str()), (409, Some("tenant_exists")), "{v}");
    let (status, v) = p.call_as(Some(TOKEN), "POST", "/v1/tenants", Some(json!({"id": "a b"}))).await;
    assert_eq!((status, v["error"]["field"].as_str()), (422, Some("id")), "{v}");
    let (_, page) = p.call_as(Some(TOKEN), "GET", "/v1/tenants?limit=2", None).await;
    assert_eq!(page["items"].as_array().unwrap().len(), 2);
    assert_eq!(page["next_after"], "t-b");
    let (_, page) = p.call_as(Some(TOKEN), "GET", "/v1/tenants?limit=2&after=t-b", None).await;
    assert_eq!((page["items"][0]["id"].as_str(), page["next_after"].is_null()), (Some("t-c"), true), "{page}");

    let (sub, _) = p.subscribe(json!({"url": p.url("a"), "event_types": ["x"], "tenant": "t-a"})).await;
    let (status, link) =
        p.call_as(Some(TOKEN), "POST", "/v1/tenants/t-a/portal-links", Some(json!({"read_only": true, "ttl_s": 600}))).await;
    assert_eq!((status, link["read_only"].as_bool()), (201, Some(true)), "{link}");
    let now = hookline_service::now_ms();
    assert!((now + 590_000..=now + 600_000).contains(&link["expires_at_ms"].as_i64().unwrap()), "{link}");
    let ro = link_token(&link);
    assert_eq!(p.call_as(Some(&ro), "GET", &format!("/v1/subscriptions/{sub}"), None).await.0, 200);
    assert_eq!(p.call_as(Some(&ro), "GET", "/v1/tenants/t-a", None).await.0, 200);
    for (method, path) in [("POST", format!("/v1/subscriptions/{sub}/pause")), ("DELETE", format!("/v1/subscriptions/{sub}"))] {
        let (status, v) = p.call_as(Some(&ro), method, &path, None).await;
        assert_eq!(status, 403, "{method} {path}: {v}");
    }
    let (status, _) = p.call_as(Some(&ro), "POST", "/v1/subscriptions", Some(json!({"url": p.url("a"), "event_types": ["x"]}))).await;
    assert_eq!(status, 403);
    // Nor a test event (the catalogue it reads is open to it).
    assert_eq!(p.call_as(Some(TOKEN), "POST", "/v1/event-types", Some(json!({"name": "x", "examples": [{}]}))).await.0, 201);
    assert_eq!(p.call_as(Some(&ro), "GET", "/v1/event-types/x", None).await.0, 200);
    let (status, v) = p.call_as(Some(&ro), "POST", &format!("/v1/subscriptions/{sub}/test-event"), Some(json!({"event_type": "x"}))).await;
    assert_eq!(status, 403, "{v}");
    let (status, v) = p.call_as(Some(TOKEN), "POST", "/v1/tenants/t-a/portal-links", Some(json!({"ttl_s": 0}))).await;
    assert_eq!((status, v["error"]["field"].as_str()), (422, Some("ttl_s")), "{v}");
    // A link of a deleted tenant is refused.
    p.call_as(Some(TOKEN), "DELETE", "/v1/tenants/t-a", None).await;
    assert_eq!(p.call_as(Some(&ro), "GET", "/v1/tenants/t-a", None).await.0, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signing_secrets_are_sealed_on_the_topic_and_a_process_without_their_key_refuses_to_start() {
    let p = Pipeline::start(1).await;
    let (sub, secret) =
        p.subscribe(json!({"url": p.url("a"), "event_types": ["x"], "secret": "whsec_c2VhbGVkLXNlY3JldC1vZi10aGUtdGVzdA=="})).await;
    let (status, rotated) = p.call("POST", &format!("/v1/subscriptions/{sub}/rotate-secret"), None).await;
    assert_eq!(status, 200, "{rotated}");
    let new_secret = rotated["secret"].as_str().unwrap().to_owned();
    // Still signed with the secret it was given.
    p.publish("evt_1", "x").await;
    p.wait_final_of(&sub, 1, LIMIT).await;
    let got = &p.requests_to("a")[0];
    assert!(got.headers.contains_key("webhook-signature"));

    // Every record of the topic, raw.
    let records: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let r = records.clone();
    let stop = tokio_util::sync::CancellationToken::new();
    let topics = hookline_kafka::Topics::new(p.config.kafka.topic_prefix.clone());
    let reader = hookline_kafka::table::spawn(
        &p.config.kafka,
        topics.subscriptions(),
        "test-raw",
        move |_, _, v| r.lock().unwrap().push(v.unwrap_or_default().to_vec()),
        stop.clone(),
    )
    .await
    .unwrap();
    reader.wait_caught_up().await;
    stop.cancel();
    let records = records.lock().unwrap().clone();
    assert!(records.len() >= 2, "create and rotate");
    let key_material = p.config.secrets.keys[0].split_once(':').unwrap().1.to_owned();
    for rec in &records {
        for s in [secret.as_str(), new_secret.as_str(), "c2VhbGVkLXNlY3JldC1vZi10aGUtdGVzdA", &key_material] {
            assert!(!rec.windows(s.len()).any(|w| w == s.as_bytes()), "a record holds {s:?} in the clear");
        }
        let decoded = <hookline_core::model::Subscription as prost::Message>::decode(rec.as_slice()).unwrap();
        assert!(decoded.secrets.iter().all(|s| s.value.is_empty() && s.key_id == "dev" && !s.sealed.is_empty()), "{decoded:?}");
    }

    // An ingest and a dispatcher given another key (under the same id) and one missing the key altogether stop at
    // start, naming the subscription and the setting.
    let mut wrong = p.config.clone();
    wrong.secrets.keys = vec![hookline_core::seal::generate_entry("dev", &mut rand::rng())];
    wrong.ingest.listen_addr = "127.0.0.1:0".parse().unwrap();
    let e = hookline_ingest::run(
        wrong.clone(),
        Default::default(),
        hookline_ingest::Options { instance: Some("wrong-key".into()), ..Default::default() },
    )
    .await
    .expect_err("ingest refuses to start");
    assert!(e.to_string().contains(&sub) && e.to_string().contains("secrets.keys"), "{e}");
    let mut missing = wrong.clone();
    missing.secrets.keys = vec![hookline_core::seal::generate_entry("other", &mut rand::rng())];
    let e = hookline_dispatcher::run(
        missing,
        Default::default(),
        hookline_dispatcher::Options { instance: Some("no-key".into()), ..Default::default() },
    )
    .await
    .expect_err("dispatcher refuses to start");
    assert!(e.to_string().contains("\"dev\""), "{e}");
    let mut none = p.config.clone();
    none.secrets.keys.clear();
    let e = hookline_ingest::run(none, Default::default(), Default::default()).await.expect_err("no key configured");
    assert!(e.to_string().contains("secrets.keys"), "{e}");

    // Rotation: the old key still opens, the new one seals from the next write on.
    let mut rotated_cfg = p.config.clone();
    let old = rotated_cfg.secrets.keys[0].clone();
    rotated_cfg.secrets.keys = vec![hookline_core::seal::generate_entry("k2", &mut rand::rng()), old];
    let keyring = rotated_cfg.secrets.keyring().unwrap();
    assert_eq!(keyring.write_key_id(), "k2");
    let mut opened = <hookline_core::model::Subscription as prost::Message>::decode(records.last().unwrap().as_slice()).unwrap();
    opened.id = sub.clone();
    hookline_core::seal::open_secrets(&mut opened, &keyring).unwrap();
    assert_eq!(opened.secrets[0].value, new_secret);
}
