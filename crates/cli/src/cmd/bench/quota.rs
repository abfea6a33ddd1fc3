//! `publish-quota`: a quiet tenant publishes 50 events/s through `POST /v1/events` (one request at a time, with its
//! API key) while a loud tenant floods the same API from 32 connections as fast as answers come. Three phases of
//! `--duration-s` each (10 s at most): the quiet tenant alone, the flood with the loud tenant's quota (200/s, burst
//! 200), and the flood with no quota. Reported: the quiet tenant's publish (request → 202) p50/p99 in each phase and
//! what the loud tenant got accepted and refused. Goal: the quiet tenant's p99 ≤ 50 ms under the flood with a quota.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Map, Value};

use super::cluster::{Cluster, TOKEN};
use super::receiver::Receiver;
use super::stats::{pct, sorted};
use super::{print_table, round, row, BenchArgs};

const QUIET_PER_S: u64 = 50;
const FLOODERS: usize = 32;
const LOUD_QUOTA: u32 = 200;
const TARGET_P99_MS: f64 = 50.0;

type Http = Client<HttpConnector, Full<Bytes>>;

async fn call(http: &Http, api: std::net::SocketAddr, token: &str, method: &str, path: &str, body: Value) -> anyhow::Result<(u16, Value)> {
    let req = http::Request::builder()
        .method(method)
        .uri(format!("http://{api}{path}"))
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(&body)?)))?;
    let resp = http.request(req).await?;
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await?.to_bytes();
    Ok((status, serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
}

/// A tenant and an API key of it; returns the key.
async fn tenant(http: &Http, api: std::net::SocketAddr, id: &str) -> anyhow::Result<String> {
    let (status, v) = call(http, api, TOKEN, "POST", "/v1/tenants", json!({"id": id})).await?;
    anyhow::ensure!(status == 201, "creating tenant {id}: {status} {v}");
    let (status, v) = call(http, api, TOKEN, "POST", &format!("/v1/tenants/{id}/api-keys"), json!({"name": "bench"})).await?;
    anyhow::ensure!(status == 201, "creating a key of {id}: {status} {v}");
    Ok(v["key"].as_str().unwrap_or_default().to_owned())
}

/// What one phase measured.
struct Phase {
    quiet_ms: Vec<f64>,
    quiet_refused: u64,
    loud_accepted: u64,
    loud_refused: u64,
}

async fn phase(http: &Http, api: std::net::SocketAddr, quiet: &str, loud: Option<&str>, seconds: u64, tag: &str) -> anyhow::Result<Phase> {
    let stop = Arc::new(AtomicBool::new(false));
    let (accepted, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut flood = Vec::new();
    if let Some(key) = loud {
        for f in 0..FLOODERS {
            // A connection of its own per flooder (as 32 clients would have).
            let http: Http = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(1).build_http();
            let (key, stop, accepted, refused) = (key.to_owned(), stop.clone(), accepted.clone(), refused.clone());
            let tag = tag.to_owned();
            flood.push(tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let body = json!({"id": format!("loud-{tag}-{f}-{n}"), "type": "quota.loud", "data": {"n": n}});
                    match call(&http, api, &key, "POST", "/v1/events", body).await {
                        Ok((202, _)) => accepted.fetch_add(1, Ordering::Relaxed),
                        Ok(_) | Err(_) => refused.fetch_add(1, Ordering::Relaxed),
                    };
                    n += 1;
                }
            }));
        }
    }
    let total = QUIET_PER_S * seconds;
    let (mut quiet_ms, mut quiet_refused) = (Vec::with_capacity(total as usize), 0u64);
    let start = Instant::now();
    for i in 0..total {
        let due = start + Duration::from_micros(i * 1_000_000 / QUIET_PER_S);
        tokio::time::sleep_until(due.into()).await;
        let t = Instant::now();
        let body = json!({"id": format!("quiet-{tag}-{i}"), "type": "quota.quiet", "data": {"n": i}});
        match call(http, api, quiet, "POST", "/v1/events", body).await? {
            (202, _) => quiet_ms.push(t.elapsed().as_secs_f64() * 1000.0),
            _ => quiet_refused += 1,
        }
    }
    stop.store(true, Ordering::Relaxed);
    for f in flood {
        let _ = f.await;
    }
    Ok(Phase {
        quiet_ms: sorted(quiet_ms),
        quiet_refused,
        loud_accepted: accepted.load(Ordering::Relaxed),
        loud_refused: refused.load(Ordering::Relaxed),
    })
}

pub async fn run(args: &BenchArgs) -> anyhow::Result<(Map<String, Value>, bool)> {
    let seconds = args.duration_s.clamp(1, 10);
    let cluster = Cluster::start(args, |_| {}).await?;
    let recv = Receiver::start(Instant::now())?;
    let http: Http = Client::builder(TokioExecutor::new()).build_http();
    let api = cluster.api;
    let quiet = tenant(&http, api, "quiet").await?;
    let loud = tenant(&http, api, "loud").await?;
    // Each tenant's events are delivered too (to the bench's receiver), as a deployment's would be.
    for (t, key) in [("quiet", &quiet), ("loud", &loud)] {
        let (status, v) =
            call(&http, api, key, "POST", "/v1/subscriptions", json!({"url": recv.url(&format!("ok/{t}")), "event_types": ["quota.*"]}))
                .await?;
        anyhow::ensure!(status == 201, "subscribing {t}: {status} {v}");
    }
    eprintln!(
        "  quiet tenant: {QUIET_PER_S} publishes/s, one at a time; loud tenant: {FLOODERS} connections flooding; {seconds} s per phase"
    );
    let alone = phase(&http, api, &quiet, None, seconds, "a").await?;
    let (status, v) =
        call(&http, api, TOKEN, "PATCH", "/v1/tenants/loud", json!({"publish_rate_per_s": LOUD_QUOTA, "publish_burst": LOUD_QUOTA}))
            .await?;
    anyhow::ensure!(status == 200, "setting the loud tenant's quota: {status} {v}");
    let quota = phase(&http, api, &quiet, Some(&loud), seconds, "q").await?;
    let (status, v) = call(&http, api, TOKEN, "PATCH", "/v1/tenants/loud", json!({"publish_rate_per_s": 0})).await?;
    anyhow::ensure!(status == 200, "removing the loud tenant's quota: {status} {v}");
    let open = phase(&http, api, &quiet, Some(&loud), seconds, "o").await?;
    cluster.stop().await;
    drop(recv);

    let ms = |p: &Phase, q: f64| pct(&p.quiet_ms, q);
    let per_s = |n: u64| round(n as f64 / seconds as f64, 1);
    let met = ms(&quota, 99.0) <= TARGET_P99_MS && quota.quiet_refused == 0;
    let lat = |p: &Phase| format!("{:.2} / {:.2} / {:.1}", ms(p, 50.0), ms(p, 99.0), p.quiet_ms.last().copied().unwrap_or(f64::NAN));
    print_table(
        "publish quota (the quiet tenant's POST /v1/events → 202, ms: p50 / p99 / max)",
        &[
            row("quiet tenant alone", lat(&alone), "", None),
            row(
                "loud tenant flooding, its quota 200/s",
                lat(&quota),
                format!("p99 ≤ {TARGET_P99_MS}"),
                Some(ms(&quota, 99.0) <= TARGET_P99_MS),
            ),
            row("  loud: accepted / refused per s", format!("{} / {}", per_s(quota.loud_accepted), per_s(quota.loud_refused)), "", None),
            row("loud tenant flooding, no quota", lat(&open), "", None),
            row("  loud: accepted / refused per s", format!("{} / {}", per_s(open.loud_accepted), per_s(open.loud_refused)), "", None),
            row(
                "quiet publishes refused",
                quota.quiet_refused + open.quiet_refused + alone.quiet_refused,
                "0",
                Some(quota.quiet_refused == 0),
            ),
        ],
    );
    let mut o = Map::new();
    let phase_json = |p: &Phase| {
        json!({
            "quiet_p50_ms": round(ms(p, 50.0), 2), "quiet_p99_ms": round(ms(p, 99.0), 2), "quiet_published": p.quiet_ms.len(),
            "quiet_refused": p.quiet_refused, "loud_accepted_per_s": per_s(p.loud_accepted), "loud_refused_per_s": per_s(p.loud_refused),
        })
    };
    o.insert("seconds_per_phase".into(), json!(seconds));
    o.insert("quiet_alone".into(), phase_json(&alone));
    o.insert("flood_with_quota".into(), phase_json(&quota));
    o.insert("flood_without_quota".into(), phase_json(&open));
    o.insert("target_quiet_p99_ms".into(), json!(TARGET_P99_MS));
    Ok((o, met))
}
