//! `isolation`: 20 endpoints, every event to all of them. Run A: all 20 healthy (the 2 on the second receiver
//! port are not counted: the figure is the other 18's in every run). Run B: 2 of them (10%) hang
//! until the policy's 2 s timeout, on a second receiver port. Run C: 2 of them rate-limit, answering each
//! delivery's first try with 429 + `Retry-After: 1` (their policy's `[concurrency]` pauses the whole endpoint for
//! it). Same events, same healthy deliveries in every run. One measurement runs A B A C A: `isolation_ratio` =
//! healthy deliveries/s in B ÷ the mean of the A runs either side of it, `rate_limited_ratio` = C ÷ the mean of
//! its neighbouring A's, so a steady drift of the host's speed cancels. `--repeat N` repeats the measurement.

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
        // The same 20 endpoints, the 2 on the second port healthy too (answering 204, not counted): B and C then
        // differ from A only in what those 2 do, not in how many tasks each event fans out to.
        Trouble::None => {
            for k in healthy..ENDPOINTS {
                bodies.push(json!({"url": recv.url2(&format!("ok/{k}")), "event_types": ["iso", "bench.warm"], "policy": "standard"}));
            }
        }
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
        Trouble::None => format!(" + {HANGING} healthy (not counted) on the second port"),
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

/// The order of one measurement's runs: each troubled run between two all-healthy ones.
const ORDER: [Trouble; 5] = [Trouble::None, Trouble::Hang, Trouble::None, Trouble::RateLimit, Trouble::None];

/// Each troubled run's rate ÷ the mean of the all-healthy runs just before and just after it: a host whose speed
/// drifts steadily over the measurement moves both sides alike, where one A before the B did not.
/// `rates` are in [`ORDER`]; returns (B's ratio, C's ratio).
fn ratios_between_neighbours(rates: &[f64; 5]) -> (f64, f64) {
    let mean = |a: f64, b: f64| (a + b) / 2.0;
    (rates[1] / mean(rates[0], rates[2]), rates[3] / mean(rates[2], rates[4]))
}

/// One measurement: runs A B A C A (see [`ORDER`]); `--repeat` (see `repeat.rs`) repeats it.
pub async fn run(args: &BenchArgs) -> anyhow::Result<(Map<String, Value>, bool)> {
    // Every run publishes the events the first A run published, so all deliver the same work.
    let mut events = None;
    let mut results = Vec::with_capacity(ORDER.len());
    for (i, trouble) in ORDER.into_iter().enumerate() {
        eprintln!("  ── run {} of {}: {}", i + 1, ORDER.len(), trouble.name());
        let r = one_run(args, trouble, events).await?;
        events.get_or_insert(r.flood.events);
        results.push(r);
    }
    let rates: [f64; 5] = std::array::from_fn(|i| results[i].rate);
    let (rb, rc) = ratios_between_neighbours(&rates);
    let complete = results.iter().all(|r| r.flood.complete);
    let (events, deliveries) = (results[0].flood.events, results[0].flood.deliveries);
    let a_mean = (rates[0] + rates[2] + rates[4]) / 3.0;
    let mut out = Map::new();
    out.insert("endpoints".into(), json!(ENDPOINTS));
    out.insert("hanging".into(), json!(HANGING));
    out.insert("events".into(), json!(events));
    out.insert("healthy_deliveries".into(), json!(deliveries));
    out.insert("order".into(), json!(ORDER.iter().map(|t| t.name()).collect::<Vec<_>>()));
    out.insert("all_healthy_per_s".into(), json!(round(a_mean, 1)));
    out.insert("all_healthy_per_s_each".into(), json!([round(rates[0], 1), round(rates[2], 1), round(rates[4], 1)]));
    out.insert("with_hanging_per_s".into(), json!(round(rates[1], 1)));
    out.insert("isolation_ratio".into(), json!(round(rb, 3)));
    // B against each neighbour alone: how far the host drifted between the runs the ratio averages over.
    out.insert("isolation_ratio_vs_a_before".into(), json!(round(rates[1] / rates[0], 3)));
    out.insert("isolation_ratio_vs_a_after".into(), json!(round(rates[1] / rates[2], 3)));
    out.insert("with_rate_limited_per_s".into(), json!(round(rates[3], 1)));
    out.insert("rate_limited_ratio".into(), json!(round(rc, 3)));
    let (b, c) = (&results[1].detail, &results[3].detail);
    let excess = |d: &Value| d["dispatcher"]["deliveries_spilled"].as_f64().unwrap_or(0.0) - d["spilled_expected"].as_f64().unwrap_or(0.0);
    out.insert("spilled_over_expected_b".into(), json!(excess(b)));
    out.insert("spilled_over_expected_c".into(), json!(excess(c)));
    out.insert("spilled_deep_b".into(), b["spilled_by_cause"]["deep"].clone());
    for (k, r) in ["A1", "B", "A2", "C", "A3"].into_iter().zip(&results) {
        out.insert(k.into(), r.detail.clone());
    }
    out.insert("complete".into(), json!(complete));
    let (met_b, met_c) = (rb >= 0.9, rc >= 0.9);
    print_table(
        "isolation (runs A B A C A)",
        &[
            row("events (each to every endpoint)", events, "", None),
            row("healthy deliveries per run", deliveries, "", Some(complete)),
            row("all healthy /s: A1, A2, A3", format!("{:.0} {:.0} {:.0}", rates[0], rates[2], rates[4]), "", None),
            row("10% hanging /s (B)", format!("{:.0}", rates[1]), "", None),
            row("10% 429 + Retry-After /s (C)", format!("{:.0}", rates[3]), "", None),
            row("isolation_ratio: B ÷ mean(A1, A2)", format!("{rb:.3}"), "≥ 0.9", Some(met_b)),
            row("rate_limited_ratio: C ÷ mean(A2, A3)", format!("{rc:.3}"), "≥ 0.9", Some(met_c)),
            row("spilled over expected: B / C", format!("{} / {}", excess(b), excess(c)), "0", None),
        ],
    );
    Ok((out, met_b && met_c && complete))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_steady_drift_of_the_host_cancels_out_of_the_ratios() {
        // The host slows by 10% of A1's speed per run; the troubled runs deliver 95% of what A would at their time.
        let at = |i: usize| 6_000.0 * (1.0 - 0.1 * i as f64);
        let rates = [at(0), 0.95 * at(1), at(2), 0.95 * at(3), at(4)];
        let (b, c) = ratios_between_neighbours(&rates);
        assert!((b - 0.95).abs() < 1e-9 && (c - 0.95).abs() < 1e-9, "{b} {c}");
        // Against A1 alone, B looked like 0.855 and C like 0.665.
        assert!(rates[1] / rates[0] < 0.86 && rates[3] / rates[0] < 0.75);
        assert_eq!(ORDER.map(Trouble::name), ["A", "B", "A", "C", "A"]);
    }

    #[test]
    fn every_troubled_task_beyond_what_the_troubled_lanes_hold_spills_once() {
        assert_eq!(expected_spills(Trouble::Hang, 5_069, 256), 9_626, "a recorded base run B spilled exactly this");
        assert_eq!(expected_spills(Trouble::RateLimit, 6_333, 256), 12_154);
        assert_eq!(expected_spills(Trouble::None, 6_333, 256), 0);
        assert_eq!(expected_spills(Trouble::Hang, 100, 256), 0, "all held in the lanes");
    }
}
