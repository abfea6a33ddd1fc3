//! `isolation`: 20 endpoints, every event to all of them. Run A: all 20 healthy. Run B: 2 of them (10%) hang
//! until the policy's 2 s timeout, on a second receiver port. Run C: 2 of them rate-limit, answering each
//! delivery's first try with 429 + `Retry-After: 1` (their policy's `[concurrency]` pauses the whole endpoint for
//! it). Same events, same healthy deliveries in every run; `isolation_ratio` = healthy deliveries/s in B ÷ in A,
//! `rate_limited_ratio` = C ÷ A. `--repeat N` runs A, B, C N times in turn and reports each ratio with its
//! minimum and median (each B and C divided by the A run just before it).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Map, Value};

use super::cluster::{cpu_per_1k, Cluster, Publisher};
use super::receiver::Receiver;
use super::throughput::{flood, window, Flood};
use super::{print_table, round, row, BenchArgs};

const ENDPOINTS: usize = 20;
const HANGING: usize = 2;
const HANG_TIMEOUT_MS: u64 = 2_000;

/// The processes whose CPU each run reports per 1,000 healthy deliveries.
const CPU_PROCS: &[&str] = &["dispatcher", "ingest", "retry_scheduler", "broker", "receiver", "driver"];

/// The dispatcher's counters each run reports (where the troubled endpoints' work went).
const DISPATCHER_COUNTERS: &[&str] = &[
    "hookline_attempts_total",
    "hookline_deliveries_spilled_total",
    "hookline_breaker_parked_total",
    "hookline_retries_scheduled_total",
    "hookline_endpoint_paused_by_retry_after_total",
    "hookline_retry_after_waits_total",
];

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

/// The `cause` labels of `hookline_deliveries_spilled_total` (see the dispatcher's `StuckCause`): `deep` is a lane
/// that kept pace with the others, i.e. a healthy one parked.
const SPILL_CAUSES: &[&str] = &["stalled", "slow", "deep"];

/// The spills a run B or C must make: every troubled task beyond what the troubled lanes hold in memory
/// (`max_queued` each) parks once. More means lanes were parked that did not need to be (a healthy one, or a
/// troubled one twice).
fn expected_spills(trouble: Trouble, events: u64, max_queued: usize) -> u64 {
    if trouble == Trouble::None {
        return 0;
    }
    let troubled = HANGING as u64;
    troubled.saturating_mul(events).saturating_sub(troubled.saturating_mul(max_queued as u64))
}

/// What the troubled 10% of the endpoints do.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Trouble {
    None,
    Hang,
    RateLimit,
}

impl Trouble {
    fn name(self) -> &'static str {
        match self {
            Trouble::None => "A",
            Trouble::Hang => "B",
            Trouble::RateLimit => "C",
        }
    }
}

/// One run's measurement and what it cost.
struct RunResult {
    flood: Flood,
    /// Healthy deliveries per second.
    rate: f64,
    /// CPU seconds per 1,000 healthy deliveries, by process; the dispatcher's counters at the end.
    detail: Value,
}

async fn one_run(args: &BenchArgs, trouble: Trouble, events: Option<u64>) -> anyhow::Result<RunResult> {
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
    let extra = match trouble {
        Trouble::None => String::new(),
        Trouble::Hang => format!(" + {HANGING} hanging until the {HANG_TIMEOUT_MS} ms timeout"),
        Trouble::RateLimit => format!(" + {HANGING} answering 429 + Retry-After: 1 first"),
    };
    eprintln!("  run {}: {healthy} healthy endpoints{extra}, {per_sub} concurrent per subscription", trouble.name());
    let f = flood(&cluster, &recv, &publisher, "i", &["iso".to_owned()], healthy as u64, events, args.isolation_s, window(args)).await;
    let counters = cluster.metrics("dispatcher", DISPATCHER_COUNTERS).await;
    let mut detail = Map::new();
    detail.insert("cpu_s_per_1k_healthy".into(), cpu_per_1k(&f.cpu_before, &f.cpu_after, f.deliveries as f64, CPU_PROCS));
    let mut c = Map::new();
    for name in DISPATCHER_COUNTERS {
        let short = name.trim_start_matches("hookline_").trim_end_matches("_total");
        c.insert(short.to_owned(), json!(counters.get(*name).copied().unwrap_or(0.0)));
    }
    detail.insert("dispatcher".into(), Value::Object(c));
    let mut by_cause = Map::new();
    for cause in SPILL_CAUSES {
        let series = format!("hookline_deliveries_spilled_total{{cause=\"{cause}\"}}");
        by_cause.insert((*cause).to_owned(), json!(counters.get(&series).copied().unwrap_or(0.0)));
    }
    detail.insert("spilled_by_cause".into(), Value::Object(by_cause));
    let expected = expected_spills(trouble, f.events, cluster.config.dispatcher.max_queued_per_subscription);
    detail.insert("spilled_expected".into(), json!(expected));
    let rate = f.deliveries as f64 / f.seconds;
    eprintln!("  run {}: {rate:.0} healthy deliveries/s; {}", trouble.name(), Value::Object(detail.clone()));
    let spilled = counters.get("hookline_deliveries_spilled_total").copied().unwrap_or(0.0);
    let causes: Vec<String> = SPILL_CAUSES.iter().map(|c| format!("{c} {}", detail["spilled_by_cause"][*c])).collect();
    eprintln!("  run {}: spilled {spilled:.0} (expected {expected}): {}", trouble.name(), causes.join(", "));
    let cluster = Arc::try_unwrap(cluster).map_err(|_| anyhow::anyhow!("cluster still shared"))?;
    cluster.stop().await;
    Ok(RunResult { flood: f, rate, detail: Value::Object(detail) })
}

/// The smallest and the median of `v` (the lower middle one for an even count).
fn min_median(v: &[f64]) -> (f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    (s.first().copied().unwrap_or(0.0), s.get(s.len().saturating_sub(1) / 2).copied().unwrap_or(0.0))
}

pub async fn run(args: &BenchArgs) -> anyhow::Result<(Map<String, Value>, bool)> {
    let repeat = args.repeat.max(1);
    let mut runs = Vec::new();
    let (mut ratios_b, mut ratios_c) = (Vec::new(), Vec::new());
    let mut events = None;
    let mut complete = true;
    let mut first: Option<(u64, u64)> = None;
    for i in 0..repeat {
        if repeat > 1 {
            eprintln!("  ── repeat {} of {repeat}", i + 1);
        }
        // Every run publishes the events the first A run published, so all deliver the same work.
        let a = one_run(args, Trouble::None, events).await?;
        events.get_or_insert(a.flood.events);
        let b = one_run(args, Trouble::Hang, events).await?;
        let c = one_run(args, Trouble::RateLimit, events).await?;
        complete &= a.flood.complete && b.flood.complete && c.flood.complete;
        first.get_or_insert((a.flood.events, a.flood.deliveries));
        let (rb, rc) = (b.rate / a.rate, c.rate / a.rate);
        eprintln!("  repeat {}: isolation_ratio {rb:.3}, rate_limited_ratio {rc:.3}", i + 1);
        ratios_b.push(rb);
        ratios_c.push(rc);
        runs.push(json!({
            "all_healthy_per_s": round(a.rate, 1),
            "with_hanging_per_s": round(b.rate, 1),
            "with_rate_limited_per_s": round(c.rate, 1),
            "isolation_ratio": round(rb, 3),
            "rate_limited_ratio": round(rc, 3),
            "complete": a.flood.complete && b.flood.complete && c.flood.complete,
            "A": a.detail, "B": b.detail, "C": c.detail,
        }));
    }
    let (events, deliveries) = first.unwrap_or_default();
    let (min_b, median_b) = min_median(&ratios_b);
    let (min_c, median_c) = min_median(&ratios_c);
    let met_b = ratios_b.iter().filter(|r| **r >= 0.9).count();
    let met_c = ratios_c.iter().filter(|r| **r >= 0.9).count();
    let mut out = Map::new();
    out.insert("endpoints".into(), json!(ENDPOINTS));
    out.insert("hanging".into(), json!(HANGING));
    out.insert("events".into(), json!(events));
    out.insert("healthy_deliveries".into(), json!(deliveries));
    out.insert("repeat".into(), json!(repeat));
    // The first repeat's figures under the names a single run always reported.
    let r0 = &runs[0];
    for k in ["all_healthy_per_s", "with_hanging_per_s", "isolation_ratio", "with_rate_limited_per_s", "rate_limited_ratio"] {
        out.insert(k.into(), r0[k].clone());
    }
    out.insert("isolation_ratio_min".into(), json!(round(min_b, 3)));
    out.insert("isolation_ratio_median".into(), json!(round(median_b, 3)));
    out.insert("rate_limited_ratio_min".into(), json!(round(min_c, 3)));
    out.insert("rate_limited_ratio_median".into(), json!(round(median_c, 3)));
    out.insert("runs".into(), Value::Array(runs));
    out.insert("complete".into(), json!(complete));
    let met = met_b == repeat && met_c == repeat && complete;
    let list = |v: &[f64]| v.iter().map(|r| format!("{r:.3}")).collect::<Vec<_>>().join(" ");
    eprintln!("  isolation_ratio per repeat: {}", list(&ratios_b));
    eprintln!("  rate_limited_ratio per repeat: {}", list(&ratios_c));
    print_table(
        "isolation",
        &[
            row("events (each to every endpoint)", events, "", None),
            row("healthy deliveries per run", deliveries, "", Some(complete)),
            row("repeats (A, B, C each)", repeat, "", None),
            row("isolation_ratio: min / median", format!("{min_b:.3} / {median_b:.3}"), "≥ 0.9", Some(met_b == repeat)),
            row("  repeats ≥ 0.9", format!("{met_b} of {repeat}"), "all", Some(met_b == repeat)),
            row("rate_limited_ratio: min / median", format!("{min_c:.3} / {median_c:.3}"), "≥ 0.9", Some(met_c == repeat)),
            row("  repeats ≥ 0.9", format!("{met_c} of {repeat}"), "all", Some(met_c == repeat)),
        ],
    );
    Ok((out, met))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn min_and_median_of_the_repeats() {
        assert_eq!(min_median(&[0.95, 0.88, 1.02, 0.91, 0.97]), (0.88, 0.95));
        assert_eq!(min_median(&[0.9, 0.8]), (0.8, 0.8), "the lower middle one");
        assert_eq!(min_median(&[0.93]), (0.93, 0.93));
    }

    #[test]
    fn every_troubled_task_beyond_what_the_troubled_lanes_hold_spills_once() {
        assert_eq!(expected_spills(Trouble::Hang, 5_069, 256), 9_626, "session 6's base run B spilled exactly this");
        assert_eq!(expected_spills(Trouble::RateLimit, 6_333, 256), 12_154);
        assert_eq!(expected_spills(Trouble::None, 6_333, 256), 0);
        assert_eq!(expected_spills(Trouble::Hang, 100, 256), 0, "all held in the lanes");
    }
}
