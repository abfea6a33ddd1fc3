//! `memory`: `--in-flight` (10k) deliveries held open at once — 100 subscriptions, the receiver keeps every
//! request open until released — while the dispatcher's RSS is sampled from `/proc/<pid>/status` (it is its own
//! process, so VmHWM is exactly its peak).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use super::cluster::{event_json, Cluster, Publisher};
use super::receiver::Receiver;
use super::stats::Progress;
use super::{print_table, round, row, BenchArgs};

const SUBS: usize = 100;
/// The goal for the dispatcher's peak RSS with 10,000 deliveries in flight.
const PEAK_RSS_GOAL_MB: f64 = 120.0;

fn hold_policy() -> anyhow::Result<String> {
    let mut p = hookline_core::policy::builtin("standard").expect("built-in profile");
    p.name = "bench-hold".into();
    // Long enough that no request times out while the others are still being opened.
    p.attempt.timeout_ms = 120_000;
    Ok(toml::to_string(&p)?)
}

pub async fn run(args: &BenchArgs) -> anyhow::Result<(Map<String, Value>, bool)> {
    let target = args.in_flight.max(1);
    let per_sub = target.div_ceil(SUBS);
    let cluster = Arc::new(
        Cluster::start(args, |c| {
            c.dispatcher.max_in_flight = c.dispatcher.max_in_flight.max(target);
            c.dispatcher.per_subscription_concurrency = per_sub;
            c.dispatcher.max_queued_per_subscription = c.dispatcher.max_queued_per_subscription.max(per_sub);
        })
        .await?,
    );
    let recv = Receiver::start(Instant::now())?;
    let policy = hold_policy()?;
    let bodies = (0..SUBS)
        .map(|k| json!({"url": recv.url2(&format!("hold/{k}")), "event_types": [format!("mem.{k}"), "bench.warm"], "policy_toml": policy}))
        .collect();
    cluster.subscribe_all(bodies).await?;
    let publisher = Publisher::new(cluster.producer(5)?, cluster.topics().events().to_owned());
    cluster.warm_up(&publisher, &recv, SUBS).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (_, idle_rss) = cluster.dispatcher.rss_mb();
    eprintln!("  {SUBS} subscriptions × {per_sub} concurrent; dispatcher idle RSS {idle_rss:.1} MiB; publishing {target} events");

    let start = Instant::now();
    for i in 0..target {
        let id = format!("m{i}");
        publisher.send(&id, &event_json(&id, &format!("mem.{}", i % SUBS), i as u64));
        if i % 256 == 0 {
            tokio::task::yield_now().await;
        }
    }
    let mut progress = Progress::new();
    let mut peak_rss: f64 = 0.0;
    let mut reached_at: Option<Instant> = None;
    let mut last_change = Instant::now();
    let mut last_holding = 0;
    loop {
        let (_, rss) = cluster.dispatcher.rss_mb();
        peak_rss = peak_rss.max(rss);
        let holding = recv.state.holding.load(Ordering::Relaxed);
        if holding != last_holding {
            last_holding = holding;
            last_change = Instant::now();
        }
        if holding as usize >= target && reached_at.is_none() {
            reached_at = Some(Instant::now());
        }
        if reached_at.is_some_and(|t| t.elapsed() > Duration::from_secs(3)) {
            break;
        }
        // A plateau below the target: report what was reached.
        if reached_at.is_none() && last_change.elapsed() > Duration::from_secs(15) {
            eprintln!("  in flight stalled at {holding}");
            break;
        }
        progress.tick(|_| format!("held open {holding:>6}/{target} · dispatcher RSS {rss:>7.1} MiB"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let reached = recv.state.max_holding.load(Ordering::Relaxed);
    let (hwm, rss_at_peak) = cluster.dispatcher.rss_mb();
    let fill_s = reached_at.map(|t| (t - start).as_secs_f64());
    recv.state.release_holds();
    let deadline = Instant::now() + Duration::from_secs(60);
    while (recv.state.ok.load(Ordering::Relaxed) as usize) < target && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let delivered = recv.state.ok.load(Ordering::Relaxed);
    let cluster = Arc::try_unwrap(cluster).map_err(|_| anyhow::anyhow!("cluster still shared"))?;
    cluster.stop().await;
    drop(recv);

    let peak = hwm.max(peak_rss);
    let mut out = Map::new();
    out.insert("in_flight_target".into(), json!(target));
    out.insert("in_flight_reached".into(), json!(reached));
    out.insert("seconds_to_fill".into(), json!(fill_s.map(|s| round(s, 1))));
    out.insert("dispatcher_idle_rss_mb".into(), json!(round(idle_rss, 1)));
    out.insert("dispatcher_rss_at_peak_mb".into(), json!(round(rss_at_peak, 1)));
    out.insert("dispatcher_peak_rss_mb".into(), json!(round(peak, 1)));
    out.insert("kib_per_in_flight".into(), json!(round((peak - idle_rss) * 1024.0 / reached.max(1) as f64, 1)));
    out.insert("delivered_after_release".into(), json!(delivered));
    let met = peak <= PEAK_RSS_GOAL_MB && reached as usize >= target;
    print_table(
        "memory",
        &[
            row("deliveries held in flight", reached, target, Some(reached as usize >= target)),
            row("dispatcher idle RSS (MiB)", format!("{idle_rss:.1}"), "", None),
            row("dispatcher_peak_rss_mb", format!("{peak:.1}"), format!("≤ {PEAK_RSS_GOAL_MB}"), Some(peak <= PEAK_RSS_GOAL_MB)),
            row("delivered after release", delivered, "", None),
        ],
    );
    Ok((out, met))
}
