//! `throughput`: events fanned out to subscriptions on the `standard` profile, receiver answering 204, as fast as
//! the pipeline goes; then the raw baseline, a plain hyper client with the dispatcher's connection settings and
//! the same concurrency POSTing the same bodies to the same receiver; then the Kafka floor (see [`kafka_floor`]),
//! what librdkafka and the broker alone cost per delivery.

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
    "ingest_log_writer",
    "retry_scheduler",
    "log_indexer",
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
    // The raw client's cost per request moves with the host, by up to a fifth between baselines minutes apart here,
    // and it is the denominator of the CPU ratios: it is measured before the services start (a receiver of its
    // own, so that the run's counts stay the flood's) and again after they stop, and the run uses the mean.
    let event = hookline_core::event_decode::decode(&event_json("t0", "tp.0", 0), 1 << 20, false).map_err(|e| anyhow::anyhow!("{e}"))?;
    let policy = hookline_core::policy::builtin("standard").expect("built-in profile");
    let body = hookline_core::request::body(&policy, &event).map_err(|e| anyhow::anyhow!("{e}"))?;
    let raw_before = {
        let recv = Receiver::start(Instant::now())?;
        eprintln!("  raw baseline, before: {concurrency} concurrent POSTs of the same body for {} s", args.raw_s);
        let urls: Vec<String> = (0..subs).map(|k| recv.url(&format!("ok/{k}"))).collect();
        let (body, raw_s) = (body.clone(), args.raw_s);
        tokio::task::spawn_blocking(move || raw_baseline(urls, body, concurrency, Duration::from_secs(raw_s))).await??
    };
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
    let cluster_log_apart = cluster.log_indexer.is_some();
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
    // Ingest's CPU is read once its delivery log has indexed the run (a store slower than the flood, such as a
    // PostgreSQL server on the same two cores, would otherwise leave part of the log's work out of the figure).
    let log_wait = log_caught_up(&cluster).await;
    // Every request the receiver answered is an attempt the log must hold. The embedded broker keeps ~5 MiB per
    // partition, so an indexer far enough behind finds records gone: its CPU then leaves that work out.
    let arrivals = recv.state.ok.load(Ordering::Relaxed);
    let log_complete = log_wait.indexed_attempts >= arrivals as f64;
    // A log that lost records did that much less work: its CPU is scaled up to every request answered (its cost per
    // attempt indexed, once per delivery).
    let log_scale = if log_complete || log_wait.indexed_attempts <= 0.0 { 1.0 } else { arrivals as f64 / log_wait.indexed_attempts };
    if !log_complete {
        eprintln!(
            "  the delivery log indexed {:.0} attempts of the {arrivals} requests answered ({:.0} records lost, by its \
             own count): the broker dropped records before the indexer read them (the embedded broker keeps ~5 MiB \
             a partition); the log's CPU is scaled to every request answered",
            log_wait.indexed_attempts, log_wait.lost
        );
    }
    let mut cpu_after = f.cpu_after;
    for (k, v) in log_wait.cpu.0 {
        if k.starts_with("ingest") || k == "log_indexer" {
            cpu_after.0.insert(k, v);
        }
    }
    let cpu = cpu_per_1k(&f.cpu_before, &cpu_after, f.deliveries as f64, PROCS);
    let publish_failures = publisher.failed.load(Ordering::Relaxed);
    // The Kafka floor below measures this process's new Kafka clients: the event producer goes first.
    drop(publisher);
    let mut cluster = Arc::try_unwrap(cluster).map_err(|_| anyhow::anyhow!("cluster still shared"))?;
    // The services (and the log's indexer, its CPU already read) stop; the broker stays up, idle, for the Kafka
    // floor after the raw baseline.
    tokio::task::block_in_place(|| {
        let indexer = cluster.log_indexer.as_mut().map(|(p, _)| p);
        for p in [&mut cluster.ingest, &mut cluster.dispatcher, &mut cluster.scheduler].into_iter().chain(indexer) {
            p.stop(Duration::from_secs(8));
        }
    });

    // The raw baseline again, on its own runtime (threads `bench-raw`), against the run's receiver.
    eprintln!("  raw baseline, after: {concurrency} concurrent POSTs of the same body for {} s", args.raw_s);
    let urls: Vec<String> = (0..subs).map(|k| recv.url(&format!("ok/{k}"))).collect();
    let raw_s = args.raw_s;
    let raw_after = tokio::task::spawn_blocking(move || raw_baseline(urls, body, concurrency, Duration::from_secs(raw_s))).await??;
    drop(recv);
    let raw = Raw::mean(&raw_before, &raw_after);
    // Paced at the deliveries' own rate, and batched (all of it at once, the cheapest Kafka can be).
    let floors = if args.kafka_floor_records == 0 { None } else { Some(run_floor(args, &cluster, deliveries_per_s).await?) };
    cluster.stop().await;

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
    out.insert("raw_runs".into(), json!([raw_before.json(), raw_after.json()]));
    out.insert("publish_failures".into(), json!(publish_failures));
    out.insert("named_host".into(), json!(args.named_host));
    out.insert("receiver_host".into(), json!(host));
    out.insert("log_store".into(), json!(format!("{:?}", args.log_store).to_lowercase()));
    out.insert("log_indexer_apart".into(), json!(cluster_log_apart));
    out.insert("log_caught_up".into(), json!(log_wait.caught_up));
    out.insert("log_catch_up_s".into(), json!(round(log_wait.seconds, 2)));
    out.insert("log_indexed_attempts".into(), json!(log_wait.indexed_attempts));
    out.insert("requests_answered".into(), json!(arrivals));
    out.insert("log_complete".into(), json!(log_complete));
    out.insert("log_records_lost".into(), json!(log_wait.lost));
    out.insert("log_cpu_scale".into(), json!(round(log_scale, 3)));
    out.insert("dns_cache_ttl_s".into(), json!(dns_cache_ttl_s));
    let c = |k: &str| cpu.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
    let (batched, paced) = match &floors {
        Some([b, p]) => (Some(b), Some(p)),
        None => (None, None),
    };
    let fc = |f: Option<&Floor>, k: &str| f.and_then(|f| f.cpu.get(k)).and_then(Value::as_f64).unwrap_or(f64::NAN);
    if let (Some(b), Some(p)) = (batched, paced) {
        out.insert("kafka_floor_records".into(), json!(p.records));
        out.insert("kafka_floor_record_bytes".into(), json!({"task": p.task_bytes, "attempt": p.attempt_bytes}));
        out.insert("kafka_floor_per_s".into(), json!(round(p.per_s, 1)));
        out.insert("kafka_floor_cpu_s_per_1k".into(), Value::Object(p.cpu.clone()));
        out.insert("kafka_floor_batched_per_s".into(), json!(round(b.per_s, 1)));
        out.insert("kafka_floor_batched_join_s".into(), json!(round(b.join_s, 2)));
        out.insert("kafka_floor_batched_cpu_s_per_1k".into(), Value::Object(b.cpu.clone()));
        // Per delivery the dispatcher does at least the floor's Kafka work (consume a task, produce an attempt
        // record, store the offset), at the same pace: what is above it is hookline's.
        out.insert("dispatcher_over_kafka_floor".into(), json!(round(c("dispatcher") / fc(paced, "total"), 2)));
        out.insert(
            "dispatcher_librdkafka_over_kafka_floor_librdkafka".into(),
            json!(round(c("dispatcher_librdkafka") / fc(paced, "librdkafka"), 2)),
        );
    }
    // The CPU figures: each service's CPU per delivery over the raw client's per request, and the least each could
    // be with this Kafka client. Per delivery the dispatcher makes the raw client's request and does the floor's
    // Kafka work (a record in, a record out, an offset); ingest does it again at least (the task out; the event in,
    // shared by the fan-out, and the attempt in for the delivery log).
    let raw_cpu = raw.cpu.get("raw_client").and_then(Value::as_f64).unwrap_or(f64::NAN);
    // The delivery log's indexer is hookline's too: a process of its own by default (SQLite beside ingest, or
    // PostgreSQL, whose server's CPU, like the broker's, is not counted), or in ingest (`--log-in-ingest`, its writer
    // thread told apart).
    let log_indexer = cpu.get("log_indexer").and_then(Value::as_f64).unwrap_or(0.0);
    // The log's share: its indexer process, or ingest's writer thread (then the in-ingest indexer's consumer and
    // folding stay on the delivery path's side of this split, which overstates that side), scaled by `log_scale`.
    let log_cpu = (log_indexer + c("ingest_log_writer")) * log_scale;
    let hookline_cpu = c("dispatcher") + (c("ingest") - c("ingest_log_writer")) + c("retry_scheduler") + log_cpu;
    let dispatcher_over_raw = c("dispatcher") / raw_cpu;
    let hookline_over_raw = hookline_cpu / raw_cpu;
    let log_over_raw = log_cpu / raw_cpu;
    let delivery_path_over_raw = hookline_over_raw - log_over_raw;
    let floor = fc(paced, "total");
    let dispatcher_bound = (raw_cpu + floor) / raw_cpu;
    let hookline_bound = (raw_cpu + 2.0 * floor) / raw_cpu;
    out.insert("dispatcher_over_raw".into(), json!(round(dispatcher_over_raw, 2)));
    out.insert("hookline_over_raw".into(), json!(round(hookline_over_raw, 2)));
    out.insert("log_over_raw".into(), json!(round(log_over_raw, 2)));
    out.insert("delivery_path_over_raw".into(), json!(round(delivery_path_over_raw, 2)));
    if paced.is_some() {
        out.insert("dispatcher_least_over_raw".into(), json!(round(dispatcher_bound, 2)));
        out.insert("hookline_least_over_raw".into(), json!(round(hookline_bound, 2)));
    }
    let met = ratio >= 0.5 && f.complete;
    let pair = |k: &str| format!("{:.4} / {:.4}", fc(paced, k), fc(batched, k));
    let floor_rows = [
        row("kafka floor, paced / batched:", "", "", None),
        row("  records/s", format!("{:.0} / {:.0}", paced.map_or(f64::NAN, |f| f.per_s), batched.map_or(f64::NAN, |f| f.per_s)), "", None),
        row("  cpu s/1k: client, total", pair("total"), "", None),
        row("    librdkafka threads", pair("librdkafka"), "", None),
        row("    rust-rdkafka polling thread", pair("client_other"), "", None),
        row("    the loop (bench-kfloor)", pair("loop"), "", None),
        row("  cpu s/1k: broker", pair("broker"), "", None),
        row("dispatcher ÷ paced floor", format!("{:.2}", c("dispatcher") / fc(paced, "total")), "", None),
        row("least dispatcher ÷ raw client (raw + floor)", format!("{dispatcher_bound:.2}"), "", None),
        row("least hookline ÷ raw client (raw + 2 floors)", format!("{hookline_bound:.2}"), "", None),
    ];
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
            row("  of which the delivery log's writer", format!("{:.3}", c("ingest_log_writer")), "", None),
            row("cpu s/1k: retry-scheduler", format!("{:.3}", c("retry_scheduler")), "", None),
            row("cpu s/1k: log indexer (own process)", format!("{log_indexer:.3}"), "", None),
            row("cpu s/1k: broker", format!("{:.3}", c("broker")), "", None),
            row("cpu s/1k: receiver", format!("{:.3}", c("receiver")), "", None),
            row("cpu s/1k: bench driver", format!("{:.3}", c("driver")), "", None),
            row(
                "raw cpu s/1k: client (mean of before / after)",
                format!(
                    "{:.4} ({:.4} / {:.4})",
                    raw.cpu.get("raw_client").and_then(Value::as_f64).unwrap_or(f64::NAN),
                    raw_before.cpu.get("raw_client").and_then(Value::as_f64).unwrap_or(f64::NAN),
                    raw_after.cpu.get("raw_client").and_then(Value::as_f64).unwrap_or(f64::NAN)
                ),
                "",
                None,
            ),
            row("dispatcher ÷ raw client", format!("{dispatcher_over_raw:.2}"), "≤ 2", Some(dispatcher_over_raw <= 2.0)),
            row(
                "hookline ÷ raw client",
                format!("{hookline_over_raw:.2}{}", if log_complete { String::new() } else { format!(" (log ×{log_scale:.2})") }),
                "≤ 3",
                Some(hookline_over_raw <= 3.0),
            ),
            row("  of which the delivery log", format!("{log_over_raw:.2}"), "", None),
            row("  the delivery path without the log", format!("{delivery_path_over_raw:.2}"), "", None),
            row("raw cpu s/1k: receiver", format!("{:.3}", raw.cpu.get("receiver").and_then(Value::as_f64).unwrap_or(f64::NAN)), "", None),
        ]
        .into_iter()
        .chain(floor_rows.into_iter().filter(|_| floors.is_some()))
        .collect::<Vec<_>>(),
    );
    Ok((out, met))
}

struct LogWait {
    caught_up: bool,
    seconds: f64,
    /// `hookline_log_indexed_total{kind="attempt"}` then.
    indexed_attempts: f64,
    /// `hookline_log_records_lost_total` then (every topic).
    lost: f64,
    /// Every process's CPU when the log had caught up (only ingest's is used).
    cpu: super::cluster::CpuSnapshot,
}

/// Waits (at most 5 minutes) until the delivery log has indexed everything: the indexer's (ingest's, or its own
/// process's) `hookline_log_indexed_total` unchanged for a second after the last delivery arrived.
async fn log_caught_up(cluster: &Cluster) -> LogWait {
    const NAME: &str = "hookline_log_indexed_total";
    let started = Instant::now();
    let at = cluster.log_indexer.as_ref().map_or(cluster.api, |(_, addr)| *addr);
    const ATTEMPTS: &str = "hookline_log_indexed_total{kind=\"attempt\"}";
    const LOST: &str = "hookline_log_records_lost_total";
    let (mut last, mut still) = (f64::NAN, 0);
    loop {
        let m = cluster.metrics_at(at, &[NAME, LOST]).await;
        let now = m.get(NAME).copied().unwrap_or(0.0);
        still = if now == last { still + 1 } else { 0 };
        last = now;
        if still >= 4 || started.elapsed() > Duration::from_secs(300) {
            let seconds = started.elapsed().as_secs_f64();
            if still < 4 {
                eprintln!("  the delivery log had not caught up after {seconds:.0} s: ingest's CPU leaves its backlog out");
            }
            let indexed_attempts = m.get(ATTEMPTS).copied().unwrap_or(0.0);
            let lost = m.get(LOST).copied().unwrap_or(0.0);
            return LogWait { caught_up: still >= 4, seconds, indexed_attempts, lost, cpu: cluster.cpu() };
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

pub struct Raw {
    pub per_s: f64,
    pub cpu: Value,
}

impl Raw {
    /// The mean of two baselines: the rate, and each thread group's CPU per 1k requests.
    pub fn mean(a: &Raw, b: &Raw) -> Raw {
        let mut cpu = Map::new();
        for k in ["raw_client", "receiver"] {
            let v = |r: &Raw| r.cpu.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
            cpu.insert(k.into(), json!(round((v(a) + v(b)) / 2.0, 4)));
        }
        Raw { per_s: (a.per_s + b.per_s) / 2.0, cpu: Value::Object(cpu) }
    }

    fn json(&self) -> Value {
        json!({"per_s": round(self.per_s, 1), "cpu_s_per_1k_requests": self.cpu})
    }
}

/// `concurrency` loops POSTing `body` to `/ok/{k}` with the dispatcher's pool settings, for `duration`.
pub fn raw_baseline(urls: Vec<String>, body: Bytes, concurrency: usize, duration: Duration) -> anyhow::Result<Raw> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name("bench-raw").enable_all().build()?;
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(30)).pool_max_idle_per_host(64).build(connector);
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

/// The Kafka floor on the run's broker: its topics (made by the broker child on the embedded broker, here on
/// `--brokers`, then deleted), `--kafka-floor-records` of them (on the embedded broker at most what keeps each
/// partition under 3 MiB, below the mock broker's ~5 MiB).
async fn run_floor(args: &BenchArgs, cluster: &Cluster, rate: f64) -> anyhow::Result<[Floor; 2]> {
    let kafka = cluster.config.kafka.clone();
    let topics: Vec<String> = FLOOR_MODES.iter().flat_map(|m| floor_topics(&kafka.topic_prefix, m)).collect();
    let (task, attempt) = floor_records()?;
    let mut records = args.kafka_floor_records;
    if args.brokers.is_some() {
        use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
        let admin = hookline_kafka::client::admin(&kafka, "hookline-bench-admin")?;
        let new: Vec<_> =
            topics.iter().map(|t| NewTopic::new(t, kafka.partitions, TopicReplication::Fixed(kafka.replication_factor))).collect();
        for r in admin.create_topics(&new, &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)))).await? {
            if let Err((name, code)) = r {
                anyhow::bail!("creating topic {name}: {code}");
            }
        }
    } else {
        let cap = (i64::from(kafka.partitions.max(1)) as u64).saturating_mul(3 << 20) / (task.len() as u64).max(1);
        if records > cap {
            eprintln!("  kafka floor: {records} records would overfill the embedded broker's partitions; {cap} instead");
            records = cap;
        }
    }
    let broker_pid = cluster.broker.as_ref().map(|b| b.pid);
    let mut floors = Vec::new();
    for (mode, pace) in FLOOR_MODES.into_iter().zip([None, Some(rate)]) {
        eprintln!(
            "  kafka floor ({mode}{}): {records} task records ({} bytes) consumed, one attempt record ({} bytes) produced each",
            pace.map(|r| format!(", {r:.0}/s")).unwrap_or_default(),
            task.len(),
            attempt.len()
        );
        let (k, t) = (kafka.clone(), floor_topics(&kafka.topic_prefix, mode));
        floors.push(tokio::task::spawn_blocking(move || kafka_floor(k, t, records, pace, broker_pid)).await??);
    }
    if args.brokers.is_some() {
        let admin = hookline_kafka::client::admin(&kafka, "hookline-bench-admin")?;
        let refs: Vec<&str> = topics.iter().map(String::as_str).collect();
        let _ = admin.delete_topics(&refs, &rdkafka::admin::AdminOptions::new()).await;
    }
    floors.try_into().map_err(|_| anyhow::anyhow!("two floors"))
}

/// The Kafka floor's topics, per mode (`batched`, `paced`): tasks in, attempt-sized records out (partitioned like
/// `deliveries`).
pub fn floor_topics(prefix: &str, mode: &str) -> [String; 2] {
    [format!("{prefix}bench-kfloor-{mode}-in"), format!("{prefix}bench-kfloor-{mode}-out")]
}

pub const FLOOR_MODES: [&str; 2] = ["batched", "paced"];

/// The floor's records: a delivery task of the bench's event, and the attempt record of its successful try
/// (the headers the dispatcher records, the signature redacted), encoded as the services encode them.
pub fn floor_records() -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    use hookline_core::model::{AttemptPhase, AttemptRecord, DeliveryTask, Header, TaskOrigin};
    use prost::Message as _;
    let event = hookline_core::event_decode::decode(&event_json("t0", "tp.0", 0), 1 << 20, false).map_err(|e| anyhow::anyhow!("{e}"))?;
    let sub = "sub_01JBENCHKFLOOR0000000000";
    let delivery_id = hookline_core::model::delivery_id(&event.id, sub);
    let header = |n: &str, v: &str| Header { name: n.into(), value: bytes::Bytes::copy_from_slice(v.as_bytes()) };
    let attempt = AttemptRecord {
        delivery_id: delivery_id.clone(),
        subscription_id: sub.into(),
        event_id: event.id.clone(),
        event_type: event.r#type.clone(),
        tenant: event.tenant.clone(),
        attempt: 1,
        r#try: 1,
        started_at_ms: 1_796_060_753_682,
        duration_ms: 1,
        outcome: "204".into(),
        http_status: 204,
        reason: "HTTP 204".into(),
        verdict: "success".into(),
        final_state: "succeeded".into(),
        status_word: "delivered".into(),
        phase: AttemptPhase::Finished as i32,
        policy: "standard".into(),
        concludes_attempt: 1,
        request_headers: vec![
            header("content-type", "application/json"),
            header("user-agent", "hookline/0.1"),
            header("webhook-id", &delivery_id),
            header("webhook-timestamp", "1796060753"),
            header("webhook-signature", "<redacted>"),
        ],
        response_headers: vec![header("date", "Wed, 02 Dec 2026 00:00:00 GMT"), header("content-length", "0")],
        decided_by: 1,
        rule: 1,
        rule_when: "2xx".into(),
        received_at_us: 1_796_060_753_681_000,
        started_at_us: 1_796_060_753_682_000,
        ..Default::default()
    };
    let task = DeliveryTask {
        delivery_id,
        subscription_id: sub.into(),
        event: Some(event),
        origin: TaskOrigin::Fanout as i32,
        fanout_received_at_us: 1_796_060_753_680_000,
        fanout_produced_at_us: 1_796_060_753_680_100,
        ..Default::default()
    };
    Ok((task.encode_to_vec(), attempt.encode_to_vec()))
}

/// What the Kafka floor measured.
pub struct Floor {
    pub records: u64,
    pub per_s: f64,
    /// From subscribing to the first record (the group join, the first fetch).
    pub join_s: f64,
    /// CPU s per 1k records: `librdkafka` (its `rdk:*` threads), `client_other` (rust-rdkafka's producer polling
    /// thread), `loop` (the `bench-kfloor` thread), `total` (those three) and `broker`.
    pub cpu: Map<String, Value>,
    pub task_bytes: usize,
    pub attempt_bytes: usize,
}

/// CPU seconds a thread ran (`/proc/.../task/<tid>/schedstat`, in ns: the floor is short, the 10 ms ticks of
/// `stat` too coarse for it).
fn run_s(task_dir: &std::path::Path) -> f64 {
    let text = std::fs::read_to_string(task_dir.join("schedstat")).unwrap_or_default();
    text.split_whitespace().next().and_then(|ns| ns.parse::<f64>().ok()).map_or(0.0, |ns| ns / 1e9)
}

/// CPU seconds of a process's threads (`/proc/<pid or self>/task`), by thread id, with their names.
fn threads_cpu_of(pid: &str) -> std::collections::HashMap<u32, (String, f64)> {
    let mut out = std::collections::HashMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return out };
    for e in dir.flatten() {
        let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default().trim_end().to_owned();
        out.insert(tid, (comm, run_s(&e.path())));
    }
    out
}

fn threads_cpu() -> std::collections::HashMap<u32, (String, f64)> {
    threads_cpu_of("self")
}

/// The floor's CPU now, by group: threads that did not exist in `before` (the floor's clients), and this thread.
fn floor_cpu(before: &std::collections::HashSet<u32>, broker_pid: Option<u32>) -> [f64; 4] {
    let me = std::thread::current().name().map(str::to_owned).unwrap_or_default();
    let (mut rdk, mut other, mut lp) = (0.0, 0.0, 0.0);
    for (tid, (comm, cpu)) in threads_cpu() {
        if comm == me {
            lp += cpu;
        } else if !before.contains(&tid) {
            if comm.starts_with("rdk:") {
                rdk += cpu;
            } else {
                other += cpu;
            }
        }
    }
    let broker = broker_pid.map_or(0.0, |pid| threads_cpu_of(&pid.to_string()).into_values().map(|(_, s)| s).sum());
    [rdk, other, lp, broker]
}

/// The Kafka-only floor under the services' CPU: on a thread of its own (`bench-kfloor`, a current-thread
/// runtime), a group consumer with the services' consumer settings reads `records` task-sized records and, per
/// record, produces one attempt-sized record with the services' producer settings (acks=all, idempotence) and
/// stores the partition's contiguous completed offset once it is acknowledged, as the consume loop does. What a
/// delivery costs in librdkafka and the broker with no hookline logic at all. The topic is filled first (not
/// measured); the CPU is measured from creating the clients to the last acknowledgement, the rate from the first
/// record received.
pub fn kafka_floor(
    kafka: hookline_kafka::KafkaSettings,
    topics: [String; 2],
    records: u64,
    rate: Option<f64>,
    broker_pid: Option<u32>,
) -> anyhow::Result<Floor> {
    std::thread::Builder::new()
        .name("bench-kfloor".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(floor_loop(kafka, topics, records, rate, broker_pid))
        })?
        .join()
        .map_err(|_| anyhow::anyhow!("the Kafka floor's thread panicked"))?
}

async fn floor_loop(
    kafka: hookline_kafka::KafkaSettings,
    [input, output]: [String; 2],
    records: u64,
    rate: Option<f64>,
    broker_pid: Option<u32>,
) -> anyhow::Result<Floor> {
    use futures::stream::{FuturesUnordered, StreamExt};
    use rdkafka::consumer::{Consumer, StreamConsumer};
    use rdkafka::producer::FutureRecord;
    use rdkafka::Message as _;
    use std::collections::HashSet;

    // One future type for a first produce and a produce again.
    async fn tracked(p: i32, o: i64, key: String, fut: hookline_kafka::producer::DeliveryFuture) -> (i32, i64, String, bool) {
        let acked = matches!(fut.await, Ok(Ok(_)));
        (p, o, key, acked)
    }
    let (task, attempt) = floor_records()?;
    // The input comes from a producer with the services' settings on a thread of its own (`bench-kfill`, not
    // measured): all of it first (batched), or one record, then the rest at `rate` once the first arrived (paced).
    let pre = if rate.is_some() { 1.min(records) } else { records };
    let (filled_tx, filled_rx) = std::sync::mpsc::channel::<anyhow::Result<()>>();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let fill = {
        let (kafka, input, task) = (kafka.clone(), input.clone(), task.clone());
        std::thread::Builder::new().name("bench-kfill".into()).spawn(move || -> anyhow::Result<()> {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(fill_input(kafka, input, task, records, pre, rate, filled_tx, go_rx))
        })?
    };
    filled_rx.recv().map_err(|_| anyhow::anyhow!("the Kafka floor's fill stopped"))??;
    // Every thread now is someone else's (the fill's included): what appears next is the floor's. Batched, measured
    // from here (the group join included: librdkafka fetches ahead, so the first record received comes after
    // much of the fetching); paced, from the first record. To the last acknowledgement.
    let before: HashSet<u32> = threads_cpu().into_keys().collect();
    let mut cpu0 = floor_cpu(&before, broker_pid);
    let mut t0 = std::time::Instant::now();
    let mut go = Some(go_tx);
    let consumer: StreamConsumer =
        hookline_kafka::client::group_consumer_config(&kafka, "hookline-bench-kfloor", "hookline-bench-kfloor")?.create()?;
    consumer.subscribe(&[input.as_str()])?;
    let producer = hookline_kafka::client::producer(&kafka, "hookline-bench-kfloor")?;
    // As the dispatcher's loop: a bound on records in flight, the contiguous completed offset stored per partition.
    const IN_FLIGHT: usize = 8_000;
    let mut acks = FuturesUnordered::new();
    let mut marks = hookline_kafka::watermark::Watermarks::new();
    let (mut received, mut done, mut resent) = (0u64, 0u64, 0u64);
    let mut first_at: Option<Duration> = None;
    let mut last_progress = std::time::Instant::now();
    while done < records {
        anyhow::ensure!(
            last_progress.elapsed() < Duration::from_secs(60),
            "the Kafka floor stalled: {done} of {records} records done ({received} received)"
        );
        tokio::select! {
            m = consumer.recv(), if acks.len() < IN_FLIGHT && received < records => {
                // A consumer error is logged by the client and the loop goes on, as the services' loop does.
                let Ok(m) = m else { continue };
                if first_at.is_none() {
                    first_at = Some(t0.elapsed());
                    if rate.is_some() {
                        (cpu0, t0) = (floor_cpu(&before, broker_pid), std::time::Instant::now());
                        first_at = Some(Duration::ZERO);
                    }
                    if let Some(go) = go.take() {
                        let _ = go.send(());
                    }
                }
                received += 1;
                last_progress = std::time::Instant::now();
                let (p, o) = (m.partition(), m.offset());
                let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
                marks.start(&input, p, o);
                let fut = producer.send_result(FutureRecord::to(&output).key(&key).payload(&attempt)).map_err(|(e, _)| anyhow::anyhow!("{e}"))?;
                acks.push(tracked(p, o, key, fut));
            }
            Some((p, o, key, r)) = acks.next(), if !acks.is_empty() => {
                last_progress = std::time::Instant::now();
                if !r {
                    // Not acknowledged: produced again, as the services do until it lands.
                    resent += 1;
                    let fut = producer.send_result(FutureRecord::to(&output).key(&key).payload(&attempt)).map_err(|(e, _)| anyhow::anyhow!("{e}"))?;
                    acks.push(tracked(p, o, key, fut));
                    continue;
                }
                done += 1;
                if let Some(mark) = marks.complete(&input, p, o) {
                    hookline_kafka::watermark::store_all(&consumer, &[(input.as_str(), p, mark)]);
                }
            }
        }
    }
    let after = floor_cpu(&before, broker_pid);
    let join_s = first_at.unwrap_or_default().as_secs_f64();
    // The rate from the first record on (the join is not the loop's pace).
    let secs = (t0.elapsed().as_secs_f64() - join_s).max(1e-9);
    let per_1k = |i: usize| round((after[i] - cpu0[i]) / records as f64 * 1000.0, 4);
    let mut cpu = Map::new();
    cpu.insert("librdkafka".into(), json!(per_1k(0)));
    cpu.insert("client_other".into(), json!(per_1k(1)));
    cpu.insert("loop".into(), json!(per_1k(2)));
    let total: f64 = (0..3).map(|i| after[i] - cpu0[i]).sum();
    cpu.insert("total".into(), json!(round(total / records as f64 * 1000.0, 4)));
    cpu.insert("broker".into(), json!(per_1k(3)));
    if resent > 0 {
        eprintln!("  kafka floor: {resent} records produced again (not acknowledged the first time)");
    }
    hookline_kafka::client::close_consumer(consumer, Duration::from_secs(5), "bench-kfloor").await;
    drop(producer);
    fill.join().map_err(|_| anyhow::anyhow!("the Kafka floor's fill panicked"))??;
    Ok(Floor { records, per_s: records as f64 / secs, join_s, cpu, task_bytes: task.len(), attempt_bytes: attempt.len() })
}

/// Produces the floor's input: `pre` records, says so on `filled`, then (after `go`) the rest at `rate` per second.
#[allow(clippy::too_many_arguments)]
async fn fill_input(
    kafka: hookline_kafka::KafkaSettings,
    input: String,
    task: Vec<u8>,
    records: u64,
    pre: u64,
    rate: Option<f64>,
    filled: std::sync::mpsc::Sender<anyhow::Result<()>>,
    go: tokio::sync::oneshot::Receiver<()>,
) -> anyhow::Result<()> {
    use futures::stream::{FuturesUnordered, StreamExt};
    use rdkafka::producer::FutureRecord;
    let producer = match hookline_kafka::client::producer(&kafka, "hookline-bench-kfloor-fill") {
        Ok(p) => p,
        Err(e) => {
            let _ = filled.send(Err(anyhow::anyhow!("the floor's fill producer: {e}")));
            return Ok(());
        }
    };
    let keys: Vec<String> = (0..64).map(|k| format!("sub_kfloor_{k:02}")).collect();
    let mut acks = FuturesUnordered::new();
    let mut failed = 0u64;
    let mut send = |i: u64, acks: &mut FuturesUnordered<_>| {
        let key = &keys[(i % keys.len() as u64) as usize];
        match producer.send_result(FutureRecord::to(&input).key(key).payload(&task)) {
            Ok(fut) => acks.push(fut),
            Err(_) => failed += 1,
        }
    };
    for i in 0..pre {
        send(i, &mut acks);
        while acks.len() >= 10_000 {
            acks.next().await;
        }
    }
    while acks.next().await.is_some() {}
    let _ = filled.send(Ok(()));
    if pre < records {
        let Ok(()) = go.await else { return Ok(()) };
        let rate = rate.unwrap_or(1.0).max(1.0);
        let start = std::time::Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        let mut sent = pre;
        while sent < records {
            tokio::select! {
                _ = tick.tick() => {
                    let due = ((start.elapsed().as_secs_f64() * rate) as u64).saturating_add(pre);
                    while sent < due.min(records) {
                        send(sent, &mut acks);
                        sent += 1;
                    }
                }
                Some(_) = acks.next(), if !acks.is_empty() => {}
            }
        }
        while acks.next().await.is_some() {}
    }
    anyhow::ensure!(failed == 0, "the Kafka floor's fill could not enqueue {failed} records");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_raw_baseline_is_the_mean_of_the_one_before_and_the_one_after() {
        let a = Raw { per_s: 60_000.0, cpu: json!({"raw_client": 0.0100, "receiver": 0.0090}) };
        let b = Raw { per_s: 80_000.0, cpu: json!({"raw_client": 0.0140, "receiver": 0.0110}) };
        let m = Raw::mean(&a, &b);
        assert_eq!(m.per_s, 70_000.0);
        assert_eq!(m.cpu, json!({"raw_client": 0.012, "receiver": 0.01}));
        assert_eq!(a.json()["cpu_s_per_1k_requests"]["raw_client"], 0.01);
    }
}
