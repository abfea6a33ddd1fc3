//! `scale-out`: a steady `--rate` events/s (each to one of 8 subscriptions) for `--duration-s`; a quarter of the way
//! in a second dispatcher joins the group, two thirds of the way in the first one stops (drains and leaves). What an
//! SRE scaling on lag sees: how long until the new member delivers, how deep and how long the throughput dips at
//! each step, and whether anything is delivered twice or not at all.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use super::cluster::{event_json, Cluster, Proc, Publisher};
use super::receiver::Receiver;
use super::stats::{sorted, Progress};
use super::{print_table, round, row, BenchArgs};

const SUBS: usize = 8;
/// Throughput is measured in buckets of this many ms.
const BUCKET_MS: u64 = 500;
/// A bucket below this share of the steady rate counts as part of a dip.
const DIP_BELOW: f64 = 0.5;
const SESSION_TIMEOUT_MS: u64 = 6_000;

pub async fn run(args: &BenchArgs) -> anyhow::Result<(Map<String, Value>, bool)> {
    // The soak's session timeout: the embedded broker holds each join round open for the session timeout less 1 s.
    let cluster = Arc::new(Cluster::start(args, |c| c.kafka.session_timeout_ms = SESSION_TIMEOUT_MS).await?);
    let session_timeout_ms = cluster.config.kafka.session_timeout_ms;
    let recv = Receiver::start(Instant::now())?;
    let bodies = (0..SUBS)
        .map(|k| json!({"url": recv.url(&format!("ok/{k}")), "event_types": [format!("scale.{k}"), "bench.warm"], "policy": "standard"}))
        .collect();
    cluster.subscribe_all(bodies).await?;
    let publisher = Publisher::new(cluster.producer(cluster.config.kafka.delivery_path_linger_ms)?, cluster.topics().events().to_owned());
    let mut cluster = Arc::try_unwrap(cluster).map_err(|_| anyhow::anyhow!("cluster still shared"))?;
    cluster.warm_up(&publisher, &recv, SUBS).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    recv.state.take_arrivals();
    recv.state.record_ok.store(true, Ordering::Relaxed);

    let rate = args.rate.max(1);
    let duration = Duration::from_secs(args.duration_s.max(3));
    let total = rate * duration.as_secs();
    let (join_at, leave_at) = (duration / 4, duration * 2 / 3);
    eprintln!(
        "  {SUBS} subscriptions; {rate} events/s for {} s = {total} events; a dispatcher joins at {} s, the first leaves at {} s (session timeout {} ms)",
        duration.as_secs(),
        join_at.as_secs(),
        leave_at.as_secs(),
        cluster.config.kafka.session_timeout_ms
    );
    let mut second_config = cluster.config.clone();
    second_config.dispatcher.health_addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let second_metrics = second_config.dispatcher.health_addr;
    let mut second: Option<Proc> = None;
    let mut joined_us = None;
    let mut first_attempt_us = None;
    let mut left_us = None;
    let first = cluster.dispatcher.pid;

    let mut progress = Progress::new();
    let start_us = recv.state.mono_us();
    let start = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    let mut next_probe = Instant::now();
    let mut sent: u64 = 0;
    while sent < total {
        tick.tick().await;
        let due = ((start.elapsed().as_micros() * rate as u128) / 1_000_000).min(total as u128) as u64;
        while sent < due {
            let id = format!("s{sent}");
            publisher.send(&id, &event_json(&id, &format!("scale.{}", sent % SUBS as u64), sent));
            sent += 1;
        }
        if second.is_none() && start.elapsed() >= join_at {
            second = Some(Proc::spawn_from(&cluster.exe, "dispatcher", &second_config, false)?);
            joined_us = Some(recv.state.mono_us());
            eprintln!("  [{:>6.1}s] second dispatcher started", start.elapsed().as_secs_f64());
        }
        if second.is_some() && first_attempt_us.is_none() && Instant::now() >= next_probe {
            next_probe = Instant::now() + Duration::from_millis(100);
            if attempts(&cluster, second_metrics).await > 0.0 {
                first_attempt_us = Some(recv.state.mono_us());
                eprintln!("  [{:>6.1}s] second dispatcher delivers", start.elapsed().as_secs_f64());
            }
        }
        if left_us.is_none() && start.elapsed() >= leave_at {
            // The first dispatcher drains and leaves the group, as on a scale-in's SIGTERM.
            cluster.dispatcher.close_stdin();
            left_us = Some(recv.state.mono_us());
            eprintln!("  [{:>6.1}s] first dispatcher (pid {first}) stopping", start.elapsed().as_secs_f64());
        }
        progress.tick(|_| format!("published {sent:>7} · delivered {:>7}", recv.state.ok.load(Ordering::Relaxed)));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while recv.state.ok.load(Ordering::Relaxed) < total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Late copies still count.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let arrivals = recv.state.take_arrivals();
    if let Some(mut s) = second.take() {
        tokio::task::spawn_blocking(move || s.stop(Duration::from_secs(10))).await?;
    }
    cluster.stop().await;
    drop(recv);

    let mut copies: HashMap<&str, u64> = HashMap::new();
    for a in &arrivals {
        *copies.entry(a.id.as_str()).or_default() += 1;
    }
    let delivered = copies.len() as u64;
    let duplicates: u64 = copies.values().map(|n| n - 1).sum();
    let lost = total.saturating_sub(delivered);

    // Deliveries per bucket, from the first publish on.
    let buckets = ((duration.as_millis() as u64 + 20_000) / BUCKET_MS) as usize;
    let mut per = vec![0u64; buckets];
    for a in &arrivals {
        let i = (a.mono_us.saturating_sub(start_us) / 1000 / BUCKET_MS) as usize;
        if i < per.len() {
            per[i] += 1;
        }
    }
    let at = |us: Option<u64>| us.map(|u| (u.saturating_sub(start_us) / 1000 / BUCKET_MS) as usize);
    let (join_b, leave_b) = (at(joined_us).unwrap_or(0), at(left_us).unwrap_or(0));
    // The steady rate: the median bucket of the second before the join (after a warm-up second).
    let steady = sorted(per[2.min(join_b)..join_b].iter().map(|&n| n as f64).collect());
    let steady = steady.get(steady.len() / 2).copied().unwrap_or(0.0);
    let end_b = at(Some(start_us + duration.as_micros() as u64)).unwrap_or(per.len()).min(per.len());
    let dip = |from: usize, to: usize| -> (f64, f64) {
        let window = &per[from.min(to)..to];
        let min = window.iter().copied().min().unwrap_or(0) as f64;
        let low = window.iter().filter(|&&n| (n as f64) < steady * DIP_BELOW).count();
        (if steady > 0.0 { min / steady } else { 0.0 }, (low as u64 * BUCKET_MS) as f64 / 1000.0)
    };
    let (join_min, join_low_s) = dip(join_b, leave_b);
    let (leave_min, leave_low_s) = dip(leave_b, end_b);
    let to_deliver_s = match (joined_us, first_attempt_us) {
        (Some(j), Some(f)) => Some((f.saturating_sub(j)) as f64 / 1e6),
        _ => None,
    };
    let per_s = |n: f64| n * 1000.0 / BUCKET_MS as f64;

    let mut out = Map::new();
    out.insert("events".into(), json!(total));
    out.insert("rate_per_s".into(), json!(rate));
    out.insert("session_timeout_ms".into(), json!(session_timeout_ms));
    out.insert("delivered".into(), json!(delivered));
    out.insert("lost".into(), json!(lost));
    out.insert("duplicates".into(), json!(duplicates));
    out.insert("steady_deliveries_per_s".into(), json!(round(per_s(steady), 0)));
    out.insert("new_member_first_delivery_s".into(), json!(to_deliver_s.map(|s| round(s, 2))));
    out.insert("join_min_throughput_ratio".into(), json!(round(join_min, 2)));
    out.insert("join_below_half_s".into(), json!(join_low_s));
    out.insert("leave_min_throughput_ratio".into(), json!(round(leave_min, 2)));
    out.insert("leave_below_half_s".into(), json!(leave_low_s));
    out.insert(
        "deliveries_per_s_timeline".into(),
        json!(per[..end_b.saturating_add(4).min(per.len())].iter().map(|&n| per_s(n as f64)).collect::<Vec<_>>()),
    );
    let met = lost == 0;
    print_table(
        "scale-out (one dispatcher joins, then one leaves)",
        &[
            row("events", total, "", None),
            row("delivered", delivered, "all", Some(lost == 0)),
            row("duplicates", duplicates, "", None),
            row("steady deliveries/s", round(per_s(steady), 0), "", None),
            row("new member delivers after s", to_deliver_s.map_or("never".into(), |s| format!("{s:.2}")), "", None),
            row("join: lowest 500 ms vs steady", format!("{join_min:.2}"), "", None),
            row("join: s below half", join_low_s, "", None),
            row("leave: lowest 500 ms vs steady", format!("{leave_min:.2}"), "", None),
            row("leave: s below half", leave_low_s, "", None),
        ],
    );
    Ok((out, met))
}

/// `hookline_attempts_total` of the dispatcher serving /metrics at `addr` (0 until it has attempted a delivery).
async fn attempts(cluster: &Cluster, addr: SocketAddr) -> f64 {
    cluster.metrics_at(addr, &["hookline_attempts_total"]).await.get("hookline_attempts_total").copied().unwrap_or(0.0)
}
