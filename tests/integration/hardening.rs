//! Edges a hostile run against `hookline dev` found: oversized subscription fields, `/v1` errors that were not the
//! documented JSON (405), a policy whose wait wrapped the due time, and a server that slow clients could tie up.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{Pipeline, TOKEN};

/// (status, `Allow` header, JSON body) of one request to the API.
async fn send(p: &Pipeline, method: &str, path: &str, auth: &str, body: Option<Value>) -> (u16, Option<String>, Value) {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let req = http::Request::builder()
        .method(method)
        .uri(format!("http://{}{path}", p.api))
        .header("authorization", auth)
        .header("content-type", "application/json")
        .body(Full::new(body.map(|b| Bytes::from(b.to_string())).unwrap_or_default()))
        .unwrap();
    let resp = client.request(req).await.expect("the API answers");
    let status = resp.status().as_u16();
    let allow = resp.headers().get("allow").map(|v| v.to_str().unwrap().to_owned());
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, allow, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_v1_error_is_json_and_oversized_subscription_fields_are_named() {
    // The default request limit (2 MiB), so a 1.5 MiB description reaches the handler, as it did in `hookline dev`.
    let p = Pipeline::start_with(1, |c| c.ingest.max_request_bytes = 2 << 20).await;
    let bearer = format!("Bearer {TOKEN}");

    // 405 with the documented JSON error and an Allow header; 404 likewise.
    for (method, path, allow) in [("PUT", "/v1/events", "POST"), ("DELETE", "/v1/subscriptions", "GET,HEAD,POST"), ("PUT", "/v1/subscriptions/sub_x", "")] {
        let (status, got_allow, v) = send(&p, method, path, &bearer, None).await;
        assert_eq!((status, v["error"]["code"].as_str()), (405, Some("method_not_allowed")), "{method} {path}: {v}");
        assert!(!v["error"]["message"].as_str().unwrap_or("").is_empty(), "{v}");
        let got_allow = got_allow.unwrap_or_else(|| panic!("{method} {path}: no Allow header"));
        for m in allow.split(',').filter(|m| !m.is_empty()) {
            assert!(got_allow.split(',').any(|g| g.trim() == m), "{method} {path}: Allow {got_allow:?} lacks {m}");
        }
    }
    let (status, _, v) = send(&p, "GET", "/v1/nope", &bearer, None).await;
    assert_eq!((status, v["error"]["code"].as_str()), (404, Some("not_found")), "{v}");

    // The scheme name is case-insensitive, as docs/api.md says.
    let (status, _, v) = send(&p, "GET", "/v1/subscriptions", &format!("bEaReR {TOKEN}"), None).await;
    assert_eq!(status, 200, "{v}");

    // Each oversized field is refused with 422 naming it (a 1.5 MiB description used to get 503 kafka_unavailable,
    // 20,000 event types were accepted).
    let base = || json!({"url": p.url("ok"), "event_types": ["order.*"]});
    let with = |key: &str, value: Value| {
        let mut b = base();
        b[key] = value;
        b
    };
    let many_types: Vec<String> = (0..20_000).map(|i| format!("t.{i}")).collect();
    let cases = [
        (with("description", json!("d".repeat(1536 << 10))), "description"),
        (with("event_types", json!(many_types)), "event_types"),
        (with("event_types", json!(["ok", "x".repeat(256)])), "event_types[1]"),
        (with("owner_email", json!(format!("{}@example.com", "o".repeat(300)))), "owner_email"),
        (with("url", json!(format!("{}?{}", p.url("ok"), "q".repeat(3000)))), "url"),
        (with("metadata", json!({"k": "v".repeat(1001)})), "metadata.k"),
        (with("metadata", json!((0..51).map(|i| (format!("k{i}"), json!("v"))).collect::<serde_json::Map<_, _>>())), "metadata"),
        (with("policy_toml", json!("#".repeat(70_000))), "policy_toml"),
        (with("tenant", json!("t".repeat(256))), "tenant"),
        (with("secret", json!(format!("whsec_{}", "A".repeat(600)))), "secret"),
    ];
    for (body, field) in cases {
        let (status, _, v) = send(&p, "POST", "/v1/subscriptions", &bearer, Some(body)).await;
        assert_eq!((status, v["error"]["code"].as_str(), v["error"]["field"].as_str()), (422, Some("invalid_field"), Some(field)), "{v}");
    }
    // At the limits, a subscription is saved; an update past them is refused like a create.
    let at_limits = json!({
        "url": p.url("ok"), "event_types": (0..100).map(|i| format!("t{i}.{}", "x".repeat(250))).collect::<Vec<_>>(),
        "description": "d".repeat(4096), "owner_email": format!("{}@example.com", "o".repeat(242)),
    });
    let (status, _, v) = send(&p, "POST", "/v1/subscriptions", &bearer, Some(at_limits)).await;
    assert_eq!(status, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_owned();
    let (status, _, v) = send(&p, "PATCH", &format!("/v1/subscriptions/{id}"), &bearer, Some(json!({"description": "d".repeat(4097)}))).await;
    assert_eq!((status, v["error"]["field"].as_str()), (422, Some("description")), "{v}");

    // A wait that used to wrap the due time into the past (sent at once) is refused, naming the key.
    let mut g = hookline_core::policy::builtin("gauge").unwrap();
    g.schedule.waits_s = Some(vec![1e16]);
    g.schedule.max_attempts = Some(2);
    let (status, _, v) = send(&p, "POST", "/v1/subscriptions", &bearer, Some(with("policy_toml", json!(toml::to_string(&g).unwrap())))).await;
    assert_eq!((status, v["error"]["field"].as_str()), (422, Some("policy_toml")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("schedule.waits_s[0]"), "{v}");
    p.stop().await;
}

/// Reads until the server closes the connection (or the limit passes): true if it closed.
async fn closed_within(s: &mut (impl tokio::io::AsyncRead + Unpin), limit: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

/// The ingest API serves through the bounded server: a client that dribbles its headers is closed after
/// `ingest.http.header_read_timeout_ms`, and idle sockets do not keep `POST /v1/events` from answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_closes_slow_clients_and_keeps_answering() {
    let p = Pipeline::start_with(1, |c| {
        c.ingest.http.header_read_timeout_ms = 400;
        c.ingest.http.max_connections = 64;
    })
    .await;
    let mut idle = Vec::new();
    for _ in 0..40 {
        idle.push(TcpStream::connect(p.api).await.unwrap());
    }
    let dribbler = TcpStream::connect(p.api).await.unwrap();
    let (mut rd, mut wr) = dribbler.into_split();
    wr.write_all(b"POST /v1/events HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let started = Instant::now();
    p.publish("evt_slowloris", "order.created").await;
    // A header byte every 50 ms, until the server closes the connection.
    let drip = async {
        while wr.write_all(b"X").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        std::future::pending::<()>().await;
    };
    tokio::select! {
        closed = closed_within(&mut rd, Duration::from_secs(10)) => assert!(closed, "a dribbling client was never closed"),
        _ = drip => unreachable!(),
    }
    assert!(started.elapsed() < Duration::from_secs(5), "closed only after {:?}", started.elapsed());
    for s in &mut idle {
        assert!(closed_within(s, Duration::from_secs(10)).await, "an idle client was never closed");
    }
    p.stop().await;
}
