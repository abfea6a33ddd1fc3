//! A master-key rotation carried to its end: after the write key changes, `POST /v1/secrets/reseal` seals every
//! subscription with it, and an ingest given only the new key then starts (before, it would refuse: records sealed
//! with a key it does not have). Deliveries are still signed with the secrets the subscriptions had.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::support::{Pipeline, TOKEN};

const LIMIT: Duration = Duration::from_secs(60);

async fn call_at(api: SocketAddr, method: &str, path: &str) -> (u16, Value) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req = http::Request::builder()
        .method(method)
        .uri(format!("http://{api}{path}"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = client.request(req).await.expect("API answers");
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// Starts another ingest with `keys` (the first one seals); returns its API address, its run and its stop.
async fn ingest_with(
    p: &Pipeline,
    name: &str,
    keys: Vec<String>,
) -> (SocketAddr, tokio::task::JoinHandle<Result<(), hookline_ingest::IngestError>>, CancellationToken, hookline_service::Readiness) {
    let mut config = p.config.clone();
    config.secrets.keys = keys;
    config.secrets.write_key = None;
    config.ingest.listen_addr = "127.0.0.1:0".parse().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let stop = CancellationToken::new();
    let readiness = hookline_service::Readiness::default();
    let options =
        hookline_ingest::Options { bound: Some(tx), instance: Some(name.into()), readiness: readiness.clone(), health_bound: None };
    let run = tokio::spawn(hookline_ingest::run(config, stop.clone(), options));
    let api = tokio::time::timeout(LIMIT, rx).await.expect("listens").expect("bound");
    (api, run, stop, readiness)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resealing_with_the_new_key_lets_the_old_key_go() {
    let p = Pipeline::start_without_dispatcher(1, |_| {}).await;
    let mut subs = Vec::new();
    for k in 0..3 {
        subs.push(p.subscribe(json!({"url": p.url(&format!("r{k}")), "event_types": ["rot"]})).await);
    }
    let old = p.config.secrets.keys[0].clone();
    let new = hookline_core::seal::generate_entry("k2", &mut rand::rng());

    // Step 2 done: an ingest whose write key is the new one (the old one still opens).
    let (api, run, stop, _) = ingest_with(&p, "rotating", vec![new.clone(), old.clone()]).await;
    let deadline = tokio::time::Instant::now() + LIMIT;
    let first = loop {
        let (status, v) = call_at(api, "POST", "/v1/secrets/reseal").await;
        if status == 200 {
            break v;
        }
        assert!(tokio::time::Instant::now() < deadline, "reseal never answered 200: {status} {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(first, json!({"resealed": 3, "remaining": 0, "write_key": "k2"}));
    let (status, again) = call_at(api, "POST", "/v1/secrets/reseal").await;
    assert_eq!((status, again), (200, json!({"resealed": 0, "remaining": 0, "write_key": "k2"})), "nothing left to do");
    stop.cancel();
    run.await.unwrap().unwrap();

    // Step 4: the old key removed. An ingest with only the new key opens every record and serves them.
    let (api, run, stop, ready) = ingest_with(&p, "new-key-only", vec![new]).await;
    let deadline = tokio::time::Instant::now() + LIMIT;
    while !ready.is_ready() {
        assert!(!run.is_finished(), "the ingest with only the new key stopped: {:?}", run.await);
        assert!(tokio::time::Instant::now() < deadline, "not ready within {LIMIT:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, list) = call_at(api, "GET", "/v1/subscriptions").await;
    assert_eq!(status, 200, "{list}");
    let ids: Vec<&str> = list["items"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap()).collect();
    for (id, _) in &subs {
        assert!(ids.contains(&id.as_str()), "{id} in {ids:?}");
    }
    stop.cancel();
    run.await.unwrap().unwrap();
}
