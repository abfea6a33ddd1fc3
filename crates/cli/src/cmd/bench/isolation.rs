//! `isolation`: 20 endpoints, every event to all of them. Run A: all 20 healthy. Run B: 2 of them (10%) hang
//! until the policy's 2 s timeout, on a second receiver port. Run C: 2 of them rate-limit, answering each
//! delivery's first try with 429 + `Retry-After: 1` (their policy's `[concurrency]` pauses the whole endpoint for
//! it). Same events, same healthy deliveries in every run; `isolation_ratio` = healthy deliveries/s in B ÷ in A,
//! `rate_limited_ratio` = C ÷ A.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Map, Value};

use super::cluster::{Cluster, Publisher};
use super::receiver::Receiver;
use super::throughput::{flood, window, Flood};
use super::{print_table, round, row, BenchArgs};

const ENDPOINTS: usize = 20;
const HANGING: usize = 2;
const HANG_TIMEOUT_MS: u64 = 2_000;

fn hang_policy() -> anyhow::Result<String> {
    let mut p = super::policies::one_retry("bench-hang", 1.0);
    p.attempt.timeout_ms = HANG_TIMEOUT_MS;
    Ok(toml::to_string(&p)?)
}

/// The 429 + Retry-After endpoints' policy: one retry, and adaptive concurrency that pauses on Retry-After.
fn rate_limited_policy(per_sub: usize) -> anyhow::Result<String> {
    let mut p = super::policies::one_retry("bench-rate-limited", 1.0);
    p.concurrency = Some(hookline_core::policy::ConcurrencyRule {
        min: 1,
        max: u32::try_from(per_sub).unwrap_or(u32::MAX).max(1),
        slow_ms: None,
        pause_on_retry_after: true,
    });
    Ok(toml::to_string(&p)?)
}

/// What the troubled 10% of the endpoints do.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Trouble {
    None,
    Hang,
    RateLimit,
}

async fn one_run(args: &BenchArgs, trouble: Trouble, events: Option<u64>) -> anyhow::Result<(Flood, u64)> {
    let healthy = ENDPOINTS - HANGING;
    let per_sub = (args.concurrency / ENDPOINTS).max(1);
    let cluster = Arc::new(
        Cluster::start(args, |c| {
            c.dispatcher.per_subscription_concurrency = per_sub;
            c.dispatcher.max_queued_per_subscription = c.dispatcher.max_queued_per_subscription.max(per_sub);
        })
        .await?,
    );
    let recv = Receiver::start(Instant::now())?;
    recv.state.hang_ms.store(30_000, Ordering::Relaxed);
    let mut bodies: Vec<Value> = (0..healthy)
        .map(|k| json!({"url": recv.url(&format!("ok/{k}")), "event_types": ["iso", "bench.warm"], "policy": "standard"}))
        .collect();
    match trouble {
        Trouble::None => {}
        Trouble::Hang => {
            let policy = hang_policy()?;
            for k in healthy..ENDPOINTS {
                bodies.push(json!({"url": recv.url2(&format!("hang/{k}")), "event_types": ["iso", "bench.warm"], "policy_toml": policy}));
            }
        }
        Trouble::RateLimit => {
            let policy = rate_limited_policy(per_sub)?;
            for k in healthy..ENDPOINTS {
                bodies.push(json!({"url": recv.url2(&format!("ra/1/{k}")), "event_types": ["iso", "bench.warm"], "policy_toml": policy}));
            }
        }
    }
    let subs = bodies.len();
    cluster.subscribe_all(bodies).await?;
    let publisher = Publisher::new(cluster.producer(5)?, cluster.topics().events().to_owned());
    cluster.warm_up(&publisher, &recv, subs).await?;
    let (name, extra) = match trouble {
        Trouble::None => ("A", String::new()),
        Trouble::Hang => ("B", format!(" + {HANGING} hanging until the {HANG_TIMEOUT_MS} ms timeout")),
        Trouble::RateLimit => ("C", format!(" + {HANGING} answering 429 + Retry-After: 1 first")),
    };
    eprintln!("  run {name}: {healthy} healthy endpoints{extra}, {per_sub} concurrent per subscription");
    let f = flood(&cluster, &recv, &publisher, "i", &["iso".to_owned()], healthy as u64, events, args.isolation_s, window(args)).await;
    let cluster = Arc::try_unwrap(cluster).map_err(|_| anyhow::anyhow!("cluster still shared"))?;
    cluster.stop().await;
    Ok((f, healthy as u64))
}

pub async fn run(args: &BenchArgs) -> anyhow::Result<(Map<String, Value>, bool)> {
    let (a, _) = one_run(args, Trouble::None, None).await?;
    let (b, _) = one_run(args, Trouble::Hang, Some(a.events)).await?;
    let (c, _) = one_run(args, Trouble::RateLimit, Some(a.events)).await?;
    let rate_a = a.deliveries as f64 / a.seconds;
    let rate_b = b.deliveries as f64 / b.seconds;
    let rate_c = c.deliveries as f64 / c.seconds;
    let ratio = rate_b / rate_a;
    let ratio_c = rate_c / rate_a;
    let mut out = Map::new();
    out.insert("endpoints".into(), json!(ENDPOINTS));
    out.insert("hanging".into(), json!(HANGING));
    out.insert("events".into(), json!(a.events));
    out.insert("healthy_deliveries".into(), json!(a.deliveries));
    out.insert("all_healthy_per_s".into(), json!(round(rate_a, 1)));
    out.insert("with_hanging_per_s".into(), json!(round(rate_b, 1)));
    out.insert("isolation_ratio".into(), json!(round(ratio, 3)));
    out.insert("with_rate_limited_per_s".into(), json!(round(rate_c, 1)));
    out.insert("rate_limited_ratio".into(), json!(round(ratio_c, 3)));
    let complete = a.complete && b.complete && c.complete;
    out.insert("complete".into(), json!(complete));
    let met = ratio >= 0.9 && ratio_c >= 0.9 && complete;
    print_table(
        "isolation",
        &[
            row("events (each to every endpoint)", a.events, "", None),
            row("healthy deliveries per run", a.deliveries, "", Some(complete)),
            row("all healthy: deliveries/s", format!("{rate_a:.0}"), "", None),
            row("10% hanging: healthy deliveries/s", format!("{rate_b:.0}"), "", None),
            row("isolation_ratio", format!("{ratio:.3}"), "≥ 0.9", Some(ratio >= 0.9)),
            row("10% 429 + Retry-After: healthy/s", format!("{rate_c:.0}"), "", None),
            row("rate_limited_ratio", format!("{ratio_c:.3}"), "≥ 0.9", Some(ratio_c >= 0.9)),
        ],
    );
    Ok((out, met))
}
