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
    for (method, path, allow) in
        [("PUT", "/v1/events", "POST"), ("DELETE", "/v1/subscriptions", "GET,HEAD,POST"), ("PUT", "/v1/subscriptions/sub_x", "")]
    {
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
    // A path segment that is not UTF-8 (it used to be a text/plain 400).
    for path in
        ["/v1/subscriptions/%FF", "/v1/deliveries/%FF", "/v1/tenants/%FF", "/v1/event-types/%FF", "/v1/subscriptions/%FF/deliveries"]
    {
        let (status, _, v) = send(&p, "GET", path, &bearer, None).await;
        assert_eq!(
            (status, v["error"]["code"].as_str(), v["error"]["field"].as_str()),
            (400, Some("invalid_path"), Some("path")),
            "{path}: {v}"
        );
    }
    // A body that is a JSON array is not an object read by position (schemathesis found `[null, null]` accepted).
    for path in ["/v1/subscriptions", "/v1/tenants", "/v1/dlq/redrive"] {
        let (status, v) = p.call_raw("POST", path, "[null, null]").await;
        assert_eq!((status, v["error"]["code"].as_str()), (422, Some("invalid_body")), "{path}: {v}");
    }
    // A target and a header block too large (they used to be empty bodies).
    let long = format!("/v1/subscriptions?after={}", "a".repeat(10_000));
    let (status, _, v) = send(&p, "GET", &long, &bearer, None).await;
    assert_eq!((status, v["error"]["code"].as_str()), (414, Some("uri_too_long")), "{v}");
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let mut req = http::Request::get(format!("http://{}/v1/subscriptions", p.api)).header("authorization", &bearer);
    for i in 0..20 {
        req = req.header(format!("x-big-{i}"), "b".repeat(4_000));
    }
    let resp = client.request(req.body(Full::new(Bytes::new())).unwrap()).await.unwrap();
    assert_eq!(resp.status(), 431);
    let v: Value = serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(v["error"]["code"], "headers_too_large", "{v}");

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
    let (status, _, v) =
        send(&p, "PATCH", &format!("/v1/subscriptions/{id}"), &bearer, Some(json!({"description": "d".repeat(4097)}))).await;
    assert_eq!((status, v["error"]["field"].as_str()), (422, Some("description")), "{v}");

    // A wait that used to wrap the due time into the past (sent at once) is refused, naming the key.
    let mut g = hookline_core::policy::builtin("gauge").unwrap();
    g.schedule.waits_s = Some(vec![1e16]);
    g.schedule.max_attempts = Some(2);
    let (status, _, v) =
        send(&p, "POST", "/v1/subscriptions", &bearer, Some(with("policy_toml", json!(toml::to_string(&g).unwrap())))).await;
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

/// A connection to the API from `ip` (any address of 127.0.0.0/8 reaches a listener on 127.0.0.1): another client
/// as the server counts them.
async fn connect_from(ip: [u8; 4], addr: std::net::SocketAddr) -> std::io::Result<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(std::net::SocketAddr::from((ip, 0)))?;
    socket.connect(addr).await
}

/// What another client sees while an attack runs: an authenticated list on the API and `/healthz` on the health
/// listener, every 100 ms until `stop`; returns the slowest answer of each (panics on an error).
async fn victim(p: &Pipeline, health: std::net::SocketAddr, stop: tokio_util::sync::CancellationToken) -> (Duration, Duration, usize) {
    let (mut api, mut probe, mut n) = (Duration::ZERO, Duration::ZERO, 0);
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http::<Full<Bytes>>();
    while !stop.is_cancelled() {
        let t = Instant::now();
        let (status, v) = tokio::time::timeout(Duration::from_secs(5), p.call("GET", "/v1/subscriptions?limit=5", None))
            .await
            .expect("the API answered within 5 s");
        assert_eq!(status, 200, "{v}");
        api = api.max(t.elapsed());
        let t = Instant::now();
        let req = http::Request::get(format!("http://{health}/healthz")).body(Full::new(Bytes::new())).unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(5), client.request(req)).await.expect("healthz answered within 5 s").unwrap();
        assert_eq!(resp.status(), 200);
        probe = probe.max(t.elapsed());
        n += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (api, probe, n)
}

async fn with_health_listener(edit: impl FnOnce(&mut hookline_service::Config)) -> (Pipeline, std::net::SocketAddr) {
    let p = Pipeline::start_with(1, |c| {
        c.ingest.health_addr = Some("127.0.0.1:0".parse().unwrap());
        edit(c);
    })
    .await;
    let health = p.ingest_health.expect("the health listener's address");
    (p, health)
}

/// One unauthenticated client reconnects idle sockets as fast as they are closed (at most 64 held: its share of
/// `ingest.http.max_connections`): another client's authenticated request and the health check keep answering
/// within a second throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reconnecting_idle_sockets_cannot_starve_the_api_or_its_health_check() {
    let (p, health) = with_health_listener(|c| c.ingest.http.header_read_timeout_ms = 1_000).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let api = p.api;
    let attack = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let (mut opened, mut refused) = (0usize, 0usize);
            let mut held: Vec<TcpStream> = Vec::new();
            // Bounded: at most 20,000 connections, and only while the victim runs.
            while !stop.is_cancelled() && opened < 20_000 {
                // Keep 1,000 sockets, dropping those the server closed (a read of 0 bytes at once).
                held.retain(|s| matches!(s.try_read(&mut [0u8; 1]), Err(ref e) if e.kind() == std::io::ErrorKind::WouldBlock));
                while held.len() < 1_000 && opened < 20_000 {
                    match connect_from([127, 0, 0, 2], api).await {
                        Ok(s) => {
                            opened += 1;
                            held.push(s);
                        }
                        Err(_) => {
                            refused += 1;
                            break;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (opened, refused)
        })
    };
    let watch = {
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(6)).await;
            stop.cancel();
        })
    };
    let (slowest_api, slowest_probe, n) = victim(&p, health, stop.clone()).await;
    watch.await.unwrap();
    let (opened, refused) = attack.await.unwrap();
    eprintln!("reconnecting idle sockets: {opened} opened ({refused} refused), {n} rounds, slowest list {slowest_api:?}, slowest /healthz {slowest_probe:?}");
    assert!(opened > 1_000, "the attack reconnected: {opened}");
    assert!(n >= 20, "{n} rounds");
    assert!(slowest_api < Duration::from_secs(1), "an authenticated request took {slowest_api:?}");
    assert!(slowest_probe < Duration::from_secs(1), "/healthz took {slowest_probe:?}");
    p.stop().await;
}

/// A tenant's valid key sends 600 `POST /v1/events` announcing 1 MB bodies and dribbles a byte every 5 s into each:
/// past its share of connections they are closed at once, and each one held is answered 408 once it falls below
/// `min_body_bytes_per_s` after the grace. Another client and the health check answer within a second throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_dribbled_by_a_valid_key_are_cut_and_cannot_starve_the_api() {
    let (p, health) = with_health_listener(|c| c.ingest.http.body_rate_grace_ms = 1_500).await;
    p.tenant("slowco").await;
    let (_, key) = p.api_key("slowco").await;
    let stop = tokio_util::sync::CancellationToken::new();
    let api = p.api;
    let attack = tokio::spawn(async move {
        let mut tasks = Vec::new();
        for _ in 0..600 {
            let key = key.clone();
            tasks.push(tokio::spawn(async move {
                let Ok(s) = connect_from([127, 0, 0, 2], api).await else { return None };
                let (mut rd, mut wr) = s.into_split();
                let head = format!(
                    "POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{{"
                );
                if wr.write_all(head.as_bytes()).await.is_err() {
                    return None;
                }
                let drip = async {
                    loop {
                        tokio::time::sleep(Duration::from_secs(5)).await;
                        if wr.write_all(b" ").await.is_err() {
                            break;
                        }
                    }
                    std::future::pending::<()>().await;
                };
                let mut answer = Vec::new();
                tokio::select! {
                    _ = tokio::time::timeout(Duration::from_secs(10), rd.read_to_end(&mut answer)) => {}
                    _ = drip => {}
                }
                Some(String::from_utf8_lossy(&answer).into_owned())
            }));
        }
        let mut answers = Vec::new();
        for t in tasks {
            answers.push(t.await.unwrap());
        }
        answers
    });
    let watch = {
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            stop.cancel();
        })
    };
    let (slowest_api, slowest_probe, n) = victim(&p, health, stop.clone()).await;
    watch.await.unwrap();
    let answers = attack.await.unwrap();
    eprintln!(
        "dribbled bodies: {} answered 408, {} closed unanswered, {n} rounds, slowest list {slowest_api:?}, slowest /healthz {slowest_probe:?}",
        answers.iter().flatten().filter(|a| a.starts_with("HTTP/1.1 408")).count(),
        answers.iter().flatten().filter(|a| a.is_empty()).count()
    );
    assert!(n >= 20, "{n} rounds");
    assert!(slowest_api < Duration::from_secs(1), "an authenticated request took {slowest_api:?}");
    assert!(slowest_probe < Duration::from_secs(1), "/healthz took {slowest_probe:?}");
    let cut: Vec<&String> = answers.iter().flatten().filter(|a| a.starts_with("HTTP/1.1 408")).collect();
    assert!(!cut.is_empty() && cut.len() <= 64, "{} cut with 408 (at most the client's share is ever served)", cut.len());
    assert!(cut[0].contains("\"request_timeout\"") && cut[0].contains("min_body_bytes_per_s"), "{}", cut[0]);
    let closed_at_once = answers.iter().flatten().filter(|a| a.is_empty()).count();
    assert!(closed_at_once >= 600 - 64 - answers.iter().filter(|a| a.is_none()).count(), "{closed_at_once} closed without an answer");
    p.stop().await;
}

/// Replay since a time on a broker that cannot look offsets up by time (the embedded mock, with
/// `kafka.offsets_by_time` left on) used to answer `{"replayed":0}` as if nothing had been published: the topic is now
/// read from its start and filtered by time, so the replay finds what it should.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_on_a_broker_without_a_time_index_still_finds_the_events() {
    let p = Pipeline::start_with(1, |c| c.kafka.offsets_by_time = true).await;
    let (sub, _) = p.subscribe(json!({"url": p.url("ok"), "event_types": ["*"]})).await;
    p.publish("evt_replay_time", "order.created").await;
    p.wait_final_of(&sub, 1, Duration::from_secs(60)).await;
    let (status, v) = p.call("POST", &format!("/v1/subscriptions/{sub}/replay"), Some(json!({"since_ms": 0}))).await;
    assert_eq!((status, v["replayed"].as_u64()), (202, Some(1)), "{v}");
    let far = hookline_service::now_ms() + 3_600_000;
    let (status, v) = p.call("POST", &format!("/v1/subscriptions/{sub}/replay"), Some(json!({"since_ms": far}))).await;
    assert_eq!((status, v["replayed"].as_u64()), (202, Some(0)), "nothing after the future: {v}");
    p.stop().await;
}
