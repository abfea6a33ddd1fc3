//! `throughput`: events fanned out to subscriptions on the `standard` profile, receiver answering 204, as fast as
//! the pipeline goes; then the raw baseline, a plain hyper client with the dispatcher's connection settings and
//! the same concurrency POSTing the same bodies to the same receiver.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Map, Value};

use super::cluster::{cpu_per_1k, event_json, own_threads_cpu, Cluster, CpuSnapshot, Publisher};
use super::receiver::Receiver;
use super::stats::Progress;
use super::{print_table, round, row, BenchArgs};

pub const PROCS: &[&str] = &[
    "dispatcher",
    "dispatcher_librdkafka",
    "dispatcher_tokio",
    "ingest",
    "ingest_librdkafka",
    "ingest_tokio",
    "retry_scheduler",
    "broker",
    "receiver",
    "driver",
];

/// Default window of deliveries published but not yet received.
pub fn window(args: &BenchArgs) -> u64 {
    args.window.unwrap_or(if args.brokers.is_some() { 50_000 } else { 8_000 })
}

pub struct Flood {
    pub events: u64,
    pub deliveries: u64,
    pub seconds: f64,
    pub cpu_before: CpuSnapshot,
    pub cpu_after: CpuSnapshot,
    pub complete: bool,
}

/// Publishes events of `types` (round robin) as fast as `window` allows, for `secs` or until `events` were sent,
/// then waits for `per_event` healthy deliveries of each. Measured from the first publish to the last arrival.
#[allow(clippy::too_many_arguments)]
pub async fn flood(
    cluster: &Cluster,
    recv: &Receiver,
    publisher: &Publisher,
    prefix: &str,
    types: &[String],
    per_event: u64,
    events: Option<u64>,
    secs: u64,
    window: u64,
) -> Flood {
    let ok = &recv.state.ok_healthy;
    let base = ok.load(Ordering::Relaxed);
    let mut progress = Progress::new();
    let cpu_before = cluster.cpu();
    let start = Instant::now();
    let mut published: u64 = 0;
    let mut target: Option<(u64, Instant)> = None;
    let mut last_got = 0;
    let mut last_t = 0.0;
    // When the last delivery arrived: the end of the measurement if some never arrive.
    let (mut seen_got, mut last_arrival) = (0, start);
    let mut last_metrics = start;
    let complete = loop {
        if last_metrics.elapsed() >= Duration::from_secs(5) {
            last_metrics = Instant::now();
            eprintln!("           {}", cluster.metrics_line().await);
        }
        let got = ok.load(Ordering::Relaxed) - base;
        if got != seen_got {
            seen_got = got;
            last_arrival = Instant::now();
        }
        let done_publishing = match events {
            Some(n) => published >= n,
            None => start.elapsed() >= Duration::from_secs(secs),
        };
        if !done_publishing {
            let outstanding = (published * per_event).saturating_sub(got);
            let room = window.saturating_sub(outstanding) / per_event.max(1);
            let remaining = events.map_or(u64::MAX, |n| n - published);
            let k = room.min(256).min(remaining);
            for _ in 0..k {
                let id = format!("{prefix}{published}");
                let ty = &types[(published % types.len() as u64) as usize];
                publisher.send(&id, &event_json(&id, ty, published));
                published += 1;
            }
            if k == 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            } else {
                tokio::task::yield_now().await;
            }
        } else {
            let (want, since) = *target.get_or_insert((published * per_event, Instant::now()));
            if got >= want {
                break true;
            }
            if since.elapsed() > Duration::from_secs(60) && last_arrival.elapsed() > Duration::from_secs(20) {
                eprintln!("  gave up waiting: {got} of {want} deliveries arrived; {}", cluster.metrics_line().await);
                break false;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        progress.tick(|t| {
            let rate = (got - last_got) as f64 / (t - last_t).max(1e-3);
            last_got = got;
            last_t = t;
            format!("published {published:>8} events · delivered {got:>9} · {rate:>8.0}/s")
        });
    };
    let seconds = if complete { start.elapsed() } else { last_arrival - start }.as_secs_f64();
    let cpu_after = cluster.cpu();
    Flood { events: published, deliveries: ok.load(Ordering::Relaxed) - base, seconds, cpu_before, cpu_after, complete }
}

pub async fn run(args: &BenchArgs) -> anyhow::Result<(Map<String, Value>, bool)> {
    let fanout = args.fanout.max(1);
    let groups = 4usize;
    let subs = groups * fanout;
    let per_sub = (args.concurrency / subs).max(1);
    let concurrency = per_sub * subs;
    let cluster = Arc::new(
        Cluster::start(args, |c| {
            c.dispatcher.per_subscription_concurrency = per_sub;
            c.dispatcher.max_queued_per_subscription = c.dispatcher.max_queued_per_subscription.max(per_sub);
            if let Some(ttl) = args.dns_cache_ttl_s {
                c.egress.dns_cache_ttl_s = ttl;
            }
        })
        .await?,
    );
    let dns_cache_ttl_s = cluster.config.egress.dns_cache_ttl_s;
    let recv = Receiver::start(Instant::now())?;
    let host = if args.named_host { super::cluster::named_host().await? } else { "127.0.0.1".to_owned() };
    let url = |k: usize| recv.url(&format!("ok/{k}")).replacen("127.0.0.1", &host, 1);
    let bodies = (0..subs)
        .map(|k| json!({"url": url(k), "event_types": [format!("tp.{}", k / fanout), "bench.warm"], "policy": "standard"}))
        .collect();
    cluster.subscribe_all(bodies).await?;
    let publisher = Publisher::new(cluster.producer(5)?, cluster.topics().events().to_owned());
    cluster.warm_up(&publisher, &recv, subs).await?;
    eprintln!(
        "  {subs} subscriptions (standard profile), fan-out {fanout}, {per_sub} concurrent per subscription = {concurrency}; window {} deliveries",
        window(args)
    );
    let types: Vec<String> = (0..groups).map(|g| format!("tp.{g}")).collect();
    let f = flood(&cluster, &recv, &publisher, "t", &types, fanout as u64, args.events, args.duration_s, window(args)).await;
    let deliveries_per_s = f.deliveries as f64 / f.seconds;
    let cpu = cpu_per_1k(&f.cpu_before, &f.cpu_after, f.deliveries as f64, PROCS);
    let publish_failures = publisher.failed.load(Ordering::Relaxed);
    let cluster = Arc::try_unwrap(cluster).map_err(|_| anyhow::anyhow!("cluster still shared"))?;
    cluster.stop().await;

    // The raw baseline, on its own runtime (threads `bench-raw`), against the same receiver.
    eprintln!("  raw baseline: {concurrency} concurrent POSTs of the same body for {} s", args.raw_s);
    let event = hookline_core::event_decode::decode(&event_json("t0", "tp.0", 0), 1 << 20, false).map_err(|e| anyhow::anyhow!("{e}"))?;
    let policy = hookline_core::policy::builtin("standard").expect("built-in profile");
    let body = hookline_core::request::body(&policy, &event).map_err(|e| anyhow::anyhow!("{e}"))?;
    let urls: Vec<String> = (0..subs).map(|k| recv.url(&format!("ok/{k}"))).collect();
    let raw_s = args.raw_s;
    let raw = tokio::task::spawn_blocking(move || raw_baseline(urls, body, concurrency, Duration::from_secs(raw_s))).await??;
    drop(recv);

    let ratio = deliveries_per_s / raw.per_s;
    let mut out = Map::new();
    out.insert("events".into(), json!(f.events));
    out.insert("fanout".into(), json!(fanout));
    out.insert("subscriptions".into(), json!(subs));
    out.insert("concurrency".into(), json!(concurrency));
    out.insert("deliveries".into(), json!(f.deliveries));
    out.insert("complete".into(), json!(f.complete));
    out.insert("deliveries_per_s".into(), json!(round(deliveries_per_s, 1)));
    out.insert("raw_http_per_s".into(), json!(round(raw.per_s, 1)));
    out.insert("ratio".into(), json!(round(ratio, 3)));
    out.insert("cpu_s_per_1k_deliveries".into(), cpu.clone());
    out.insert("raw_cpu_s_per_1k_requests".into(), raw.cpu.clone());
    out.insert("publish_failures".into(), json!(publish_failures));
    out.insert("named_host".into(), json!(args.named_host));
    out.insert("receiver_host".into(), json!(host));
    out.insert("dns_cache_ttl_s".into(), json!(dns_cache_ttl_s));
    let met = ratio >= 0.5 && f.complete;
    let c = |k: &str| cpu.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
    print_table(
        "throughput",
        &[
            row("events published", f.events, "", None),
            row("receiver host", &host, "", None),
            row("dispatcher egress.dns_cache_ttl_s", dns_cache_ttl_s, "", None),
            row("deliveries", f.deliveries, "", Some(f.complete)),
            row("deliveries_per_s", format!("{deliveries_per_s:.0}"), "", None),
            row("raw_http_per_s", format!("{:.0}", raw.per_s), "", None),
            row("ratio", format!("{ratio:.3}"), "≥ 0.5 (≥ 0.2)", Some(ratio >= 0.5)),
            row("cpu s/1k: dispatcher", format!("{:.3}", c("dispatcher")), "", None),
            row("  of which librdkafka threads", format!("{:.3}", c("dispatcher_librdkafka")), "", None),
            row("cpu s/1k: ingest", format!("{:.3}", c("ingest")), "", None),
            row("  of which librdkafka threads", format!("{:.3}", c("ingest_librdkafka")), "", None),
            row("cpu s/1k: retry-scheduler", format!("{:.3}", c("retry_scheduler")), "", None),
            row("cpu s/1k: broker", format!("{:.3}", c("broker")), "", None),
            row("cpu s/1k: receiver", format!("{:.3}", c("receiver")), "", None),
            row("cpu s/1k: bench driver", format!("{:.3}", c("driver")), "", None),
            row(
                "raw cpu s/1k: client",
                format!("{:.3}", raw.cpu.get("raw_client").and_then(Value::as_f64).unwrap_or(f64::NAN)),
                "",
                None,
            ),
            row(
                "raw cpu s/1k: receiver",
                format!("{:.3}", raw.cpu.get("receiver").and_then(Value::as_f64).unwrap_or(f64::NAN)),
                "",
                None,
            ),
        ],
    );
    Ok((out, met))
}

pub struct Raw {
    pub per_s: f64,
    pub cpu: Value,
}

/// `concurrency` loops POSTing `body` to `/ok/{k}` with the dispatcher's pool settings, for `duration`.
pub fn raw_baseline(urls: Vec<String>, body: Bytes, concurrency: usize, duration: Duration) -> anyhow::Result<Raw> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name("bench-raw").enable_all().build()?;
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(64)
        .build(connector);
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let urls = Arc::new(urls);
    let cpu_a = own_threads_cpu();
    let start = Instant::now();
    let handles: Vec<_> = (0..concurrency)
        .map(|i| {
            let (client, stop, count, urls, body) = (client.clone(), stop.clone(), count.clone(), urls.clone(), body.clone());
            rt.spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let url = &urls[i % urls.len()];
                    let req = http::Request::post(url.as_str())
                        .header("content-type", "application/json")
                        .header("webhook-id", format!("raw-{i}-{n}"))
                        .header("webhook-timestamp", "1700000000")
                        .header("webhook-signature", "v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4=")
                        .body(Full::new(body.clone()))
                        .expect("static request");
                    n += 1;
                    if let Ok(resp) = client.request(req).await {
                        let ok = resp.status().is_success();
                        let _ = resp.into_body().collect().await;
                        if ok {
                            count.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(duration);
    stop.store(true, Ordering::Relaxed);
    let got = count.load(Ordering::Relaxed);
    let secs = start.elapsed().as_secs_f64();
    let cpu_b = own_threads_cpu();
    rt.block_on(async {
        for h in handles {
            let _ = h.await;
        }
    });
    rt.shutdown_timeout(Duration::from_secs(2));
    let snap = |m: std::collections::HashMap<&'static str, f64>| CpuSnapshot(m);
    let cpu = cpu_per_1k(&snap(cpu_a), &snap(cpu_b), got as f64, &["raw_client", "receiver"]);
    Ok(Raw { per_s: got as f64 / secs, cpu })
}
