//! `steady`: memory over a long run with nobody reading `/metrics` — a steady `--rate` for `--duration-s` (run it
//! for 600 s) to 8 healthy subscriptions and 2 whose first attempt fails (so every one of their deliveries goes
//! through a retry tier and the retry-scheduler), while a short-lived, rate-limited subscription is created, sent
//! to and deleted every 5 s (the dispatcher's per-endpoint maps must forget it). Each service's RSS is sampled every
//! 10 s. A leak is a slope that goes on: the target is the growth over the second half of the run (from the sample at
//! half-time to the end), per process; the growth from a quarter of the way in (after warm-up and the first
//! allocations) is printed beside it. A load peak (a shared machine) raises RSS once, and the allocator keeps the
//! pages, which the second half does not count against it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use super::cluster::{event_json, Cluster, Publisher};
use super::receiver::Receiver;
use super::stats::Progress;
use super::{print_table, round, row, BenchArgs};

const HEALTHY: usize = 8;
const RETRIED: usize = 2;
const SAMPLE_EVERY: Duration = Duration::from_secs(10);
const CHURN_EVERY: Duration = Duration::from_secs(5);
/// Growth over the second half of the run that still counts as flat.
const FLAT_PCT: f64 = 5.0;

fn retry_policy() -> anyhow::Result<String> {
    Ok(toml::to_string(&super::policies::one_retry("bench-steady-retry", 1.0))?)
}

pub async fn run(args: &BenchArgs) -> anyhow::Result<(Map<String, Value>, bool)> {
    let cluster = Arc::new(Cluster::start(args, |_| {}).await?);
    let recv = Receiver::start(Instant::now())?;
    let policy = retry_policy()?;
    let mut bodies: Vec<Value> = (0..HEALTHY)
        .map(|k| json!({"url": recv.url(&format!("ok/{k}")), "event_types": [format!("steady.{k}"), "bench.warm"], "policy": "standard"}))
        .collect();
    bodies.extend((0..RETRIED).map(|k| {
        let k = HEALTHY + k;
        json!({"url": recv.url(&format!("fail1/{k}")), "event_types": [format!("steady.{k}"), "bench.warm"], "policy_toml": policy})
    }));
    let subs = bodies.len();
    cluster.subscribe_all(bodies).await?;
    let publisher = Publisher::new(cluster.producer(cluster.config.kafka.delivery_path_linger_ms)?, cluster.topics().events().to_owned());
    cluster.warm_up(&publisher, &recv, subs).await?;

    let rate = args.rate.max(1);
    let total = rate.saturating_mul(args.duration_s);
    eprintln!(
        "  {HEALTHY} healthy + {RETRIED} retried subscriptions, one created and deleted every {} s; {rate} events/s for {} s; RSS every {} s; /metrics never read",
        CHURN_EVERY.as_secs(),
        args.duration_s,
        SAMPLE_EVERY.as_secs()
    );
    const NAMES: [&str; 3] = ["ingest", "dispatcher", "retry_scheduler"];
    let mut samples: Vec<(f64, [f64; 3])> = Vec::new();
    let sample = |c: &Cluster, at: f64| (at, [c.ingest.rss_mb().1, c.dispatcher.rss_mb().1, c.scheduler.rss_mb().1]);
    let mut progress = Progress::new();
    let start = Instant::now();
    let (mut next_sample, mut next_churn) = (Duration::ZERO, Duration::ZERO);
    let mut churned = 0u64;
    let mut churning: Option<String> = None;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    let mut sent: u64 = 0;
    while sent < total {
        tick.tick().await;
        let now = start.elapsed();
        let due = ((now.as_micros() * u128::from(rate)) / 1_000_000).min(u128::from(total)) as u64;
        while sent < due {
            let id = format!("s{sent}");
            publisher.send(&id, &event_json(&id, &format!("steady.{}", sent % subs as u64), sent));
            sent += 1;
        }
        if now >= next_sample {
            samples.push(sample(&cluster, now.as_secs_f64()));
            next_sample = now + SAMPLE_EVERY;
        }
        if now >= next_churn {
            // Each churned subscription lives one round: created, sent to, deleted the round after.
            next_churn = now + CHURN_EVERY;
            let body = json!({"url": recv.url(&format!("ok/{}", 1000 + churned % 1000)), "event_types": ["steady.churn"],
                "policy": "standard", "rate_limit_per_s": 100, "burst": 10});
            let id = cluster.subscribe(body).await?;
            if let Some(old) = churning.replace(id) {
                cluster.unsubscribe(&old).await?;
                churned += 1;
            }
            for n in 0..5 {
                let eid = format!("c{churned}_{n}");
                publisher.send(&eid, &event_json(&eid, "steady.churn", n));
            }
        }
        progress.tick(|_| format!("published {sent:>8} · delivered {:>8} · churned {churned}", recv.state.ok.load(Ordering::Relaxed)));
    }
    samples.push(sample(&cluster, start.elapsed().as_secs_f64()));
    let cluster = Arc::try_unwrap(cluster).map_err(|_| anyhow::anyhow!("cluster still shared"))?;
    cluster.stop().await;
    let delivered = recv.state.ok.load(Ordering::Relaxed);
    drop(recv);

    let at_fraction = |f: f64| samples.iter().find(|(at, _)| *at >= args.duration_s as f64 * f).copied().unwrap_or(samples[0]);
    let (quarter, half) = (at_fraction(0.25), at_fraction(0.5));
    let end = *samples.last().expect("sampled at least at the end");
    let mut out = Map::new();
    out.insert("events".into(), json!(total));
    out.insert("delivered".into(), json!(delivered));
    out.insert("subscriptions_churned".into(), json!(churned));
    out.insert("duration_s".into(), json!(args.duration_s));
    // Every sample, so a trend (a plateau, or a slope) can be told from noise.
    out.insert(
        "samples".into(),
        json!(samples.iter().map(|(at, mb)| json!([round(*at, 0), round(mb[0], 1), round(mb[1], 1), round(mb[2], 1)])).collect::<Vec<_>>()),
    );
    out.insert("samples_columns".into(), json!(["at_s", NAMES[0], NAMES[1], NAMES[2]]));
    let mut rows = vec![row("events", total, "", None), row("subscriptions created and deleted", churned, "", None)];
    let mut met = true;
    let pct = |from: f64, to: f64| if from > 0.0 { (to - from) / from * 100.0 } else { f64::NAN };
    for (i, name) in NAMES.iter().enumerate() {
        let (from, mid, to) = (quarter.1[i], half.1[i], end.1[i]);
        let (growth, second_half) = (pct(from, to), pct(mid, to));
        let flat = second_half <= FLAT_PCT;
        met &= flat;
        out.insert(
            (*name).into(),
            json!({"rss_mb_at_quarter": round(from, 1), "rss_mb_at_half": round(mid, 1), "rss_mb_at_end": round(to, 1),
                   "growth_pct": round(growth, 1), "second_half_growth_pct": round(second_half, 1),
                   "rss_mb_max": round(samples.iter().map(|s| s.1[i]).fold(0.0, f64::max), 1)}),
        );
        rows.push(row(
            name,
            format!("{mid:.1} → {to:.1} MB ({second_half:+.1} %; {growth:+.1} % from {from:.1})"),
            format!("≤ +{FLAT_PCT:.0} %"),
            Some(flat),
        ));
    }
    print_table(&format!("steady: RSS from {:.0} s to {:.0} s (from {:.0} s), no scrape", half.0, end.0, quarter.0), &rows);
    Ok((out, met))
}
