//! `latency`: a steady `--rate` events/s (default 1000) for `--duration-s`, each event to one of 8 subscriptions
//! on the `standard` profile; publish (just before the produce call) → receiver arrival.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use super::cluster::{cpu_per_1k, event_json, Cluster, Publisher};
use super::receiver::Receiver;
use super::stats::{pct, sorted, Progress};
use super::throughput::PROCS;
use super::{print_table, round, row, BenchArgs};

pub async fn run(args: &BenchArgs) -> anyhow::Result<(Map<String, Value>, bool)> {
    let subs = 8usize;
    let cluster = Arc::new(Cluster::start(args, |_| {}).await?);
    let recv = Receiver::start(Instant::now())?;
    let bodies = (0..subs)
        .map(|k| json!({"url": recv.url(&format!("ok/{k}")), "event_types": [format!("lat.{k}"), "bench.warm"], "policy": "standard"}))
        .collect();
    cluster.subscribe_all(bodies).await?;
    let publisher = Publisher::new(cluster.producer(cluster.config.kafka.delivery_path_linger_ms)?, cluster.topics().events().to_owned());
    cluster.warm_up(&publisher, &recv, subs).await?;
    let reader = if args.no_split { None } else { Some(super::split::Reader::start(&cluster, "l").await?) };
    // Let the warm-up traffic settle (and the split's reader take its assignment) before measuring.
    tokio::time::sleep(Duration::from_secs(1)).await;
    recv.state.take_arrivals();
    recv.state.record_ok.store(true, Ordering::Relaxed);

    let rate = args.rate.max(1);
    let total = rate * args.duration_s;
    eprintln!("  {subs} subscriptions (standard profile); {rate} events/s for {} s = {total} events", args.duration_s);
    let mut published_at: Vec<u64> = Vec::with_capacity(total as usize);
    let mut published_unix_us: Vec<i64> = Vec::with_capacity(total as usize);
    let mut progress = Progress::new();
    let cpu_before = cluster.cpu();
    let start = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    let mut sent: u64 = 0;
    while sent < total {
        tick.tick().await;
        let due = ((start.elapsed().as_micros() * rate as u128) / 1_000_000).min(total as u128) as u64;
        while sent < due {
            let id = format!("l{sent}");
            let body = event_json(&id, &format!("lat.{}", sent % subs as u64), sent);
            published_at.push(recv.state.mono_us());
            published_unix_us.push(super::split::now_unix_us());
            publisher.send(&id, &body);
            sent += 1;
        }
        progress.tick(|_| {
            let got = recv.state.ok.load(Ordering::Relaxed);
            format!("published {sent:>7} · delivered {got:>7}")
        });
    }
    let publish_s = start.elapsed().as_secs_f64();
    let deadline = Instant::now() + Duration::from_secs(30);
    while recv.state.ok.load(Ordering::Relaxed) < total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let cpu_after = cluster.cpu();
    let arrivals = recv.state.take_arrivals();
    let mut seen = HashSet::new();
    let mut lat = Vec::with_capacity(arrivals.len());
    for a in &arrivals {
        let Some(i) = a.id.strip_prefix('l').and_then(|s| s.parse::<usize>().ok()) else { continue };
        if i < published_at.len() && seen.insert(i) {
            lat.push((a.mono_us.saturating_sub(published_at[i])) as f64 / 1000.0);
        }
    }
    let delivered = lat.len() as u64;
    let lat = sorted(lat);
    let (p50, p99, max) = (pct(&lat, 50.0), pct(&lat, 99.0), lat.last().copied().unwrap_or(f64::NAN));
    let cpu = cpu_per_1k(&cpu_before, &cpu_after, delivered as f64, PROCS);
    let split = match reader {
        Some(p) => p.report("l", &published_unix_us, &arrivals).await,
        None => Map::new(),
    };
    let cluster = Arc::try_unwrap(cluster).map_err(|_| anyhow::anyhow!("cluster still shared"))?;
    cluster.stop().await;
    drop(recv);

    let lost = total - delivered;
    let mut out = Map::new();
    out.insert("events".into(), json!(total));
    out.insert("rate_per_s".into(), json!(round(total as f64 / publish_s, 1)));
    out.insert("delivered".into(), json!(delivered));
    out.insert("p50_ms".into(), json!(round(p50, 2)));
    out.insert("p90_ms".into(), json!(round(pct(&lat, 90.0), 2)));
    out.insert("p99_ms".into(), json!(round(p99, 2)));
    out.insert("p999_ms".into(), json!(round(pct(&lat, 99.9), 2)));
    out.insert("max_ms".into(), json!(round(max, 2)));
    out.insert("cpu_s_per_1k_deliveries".into(), cpu);
    let f = |k: &str, q: &str| split.get(k).and_then(|v| v.get(q)).and_then(Value::as_f64).unwrap_or(f64::NAN);
    let n = |k: &str| split.get(k).and_then(Value::as_u64).unwrap_or(0);
    // The goal for hookline's own time: p99 ≤ 2 ms per hop.
    let own_met = |k: &str| f(k, "p99") <= 2.0;
    let split_met = own_met("ingest_hookline_ms") && own_met("dispatcher_hookline_ms");
    let split_rows: Vec<_> = [
        ("  events: broker wait", "events_broker_ms"),
        ("  ingest: own (receive → produce)", "ingest_hookline_ms"),
        ("  deliveries: broker wait", "deliveries_broker_ms"),
        ("  dispatcher: own (receive → try)", "dispatcher_hookline_ms"),
        ("  HTTP (try → receiver)", "http_ms"),
        ("  broker waits, summed", "broker_ms"),
        ("  hookline's own, summed", "hookline_ms"),
    ]
    .into_iter()
    .map(|(label, k)| {
        let value = format!("{:.2} / {:.2} / {:.1}", f(k, "p50"), f(k, "p99"), f(k, "max"));
        let own = matches!(k, "ingest_hookline_ms" | "dispatcher_hookline_ms");
        row(label, value, if own { "p99 ≤ 2" } else { "" }, own.then(|| own_met(k)))
    })
    .chain([row("  events matched / missing stamps", format!("{} / {}", n("matched"), n("missing_stamps")), "", None)])
    .collect();
    if !args.no_split {
        out.insert("split_goal_met".into(), json!(split_met));
        out.insert("split".into(), Value::Object(split));
    }
    let met = p50 <= 5.0 && p99 <= 25.0 && lost == 0;
    print_table(
        "latency (publish → receiver)",
        &[
            row("events", total, "", None),
            row("delivered", delivered, "all", Some(lost == 0)),
            row("p50_ms", format!("{p50:.2}"), "≤ 5", Some(p50 <= 5.0)),
            row("p90_ms", format!("{:.2}", pct(&lat, 90.0)), "", None),
            row("p99_ms", format!("{p99:.2}"), "≤ 25", Some(p99 <= 25.0)),
            row("p99.9_ms", format!("{:.2}", pct(&lat, 99.9)), "", None),
            row("max_ms", format!("{max:.2}"), "", None),
            row("split (ms), p50 / p99 / max:", if args.no_split { "left out" } else { "" }, "", None),
        ]
        .into_iter()
        .chain(split_rows.into_iter().filter(|_| !args.no_split))
        .collect::<Vec<_>>(),
    );
    Ok((out, met))
}
