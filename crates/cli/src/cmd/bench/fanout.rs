//! `bench fanout`: the cost of finding an event's subscriptions (`SubscriptionTable::matching`, the fan-out
//! index) with 16 subscriptions and with 200,000 across 10,000 tenants, in this process, no broker. Each
//! subscription has two exact types and a `prefix.*` of its own, and each event is made for one random
//! subscription, so every lookup finds exactly one: the result is the same size at both scales and only the
//! table grows. The linear filter the index replaced is measured on a few events of the large table for scale.

use std::time::{Duration, Instant};

use hookline_core::model::Subscription;
use hookline_kafka::state::SubscriptionTable;
use prost::Message;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};

use super::{print_table, round, row, BenchArgs};

const SMALL: usize = 16;
const TENANTS: usize = 10_000;
/// Lookups timed per table per round.
const LOOKUPS: usize = 100_000;
const ROUNDS: usize = 3;

/// CPU time of the calling thread: unaffected by the other processes sharing the cores.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(u64::try_from(ts.tv_sec).unwrap_or(0), u32::try_from(ts.tv_nsec).unwrap_or(0))
}

fn tenant(i: usize, tenants: usize) -> String {
    format!("tenant_{}", i % tenants)
}

fn table(n: usize, tenants: usize) -> SubscriptionTable {
    let t = SubscriptionTable::default();
    for i in 0..n {
        let sub = Subscription {
            id: format!("sub_{i:07}"),
            url: "http://127.0.0.1:9/hook".into(),
            tenant: tenant(i, tenants),
            event_types: vec![format!("e{i}.created"), format!("e{i}.updated"), format!("p{i}.*")],
            policy: "standard".into(),
            enabled: true,
            ..Default::default()
        };
        t.apply(sub.id.as_bytes(), Some(&sub.encode_to_vec()));
    }
    t
}

/// (tenant, event type) pairs, each matching exactly subscription `i` of the table.
fn events(n: usize, tenants: usize, count: usize, rng: &mut impl Rng) -> Vec<(String, String)> {
    (0..count)
        .map(|_| {
            let i = rng.random_range(0..n);
            let ty = match rng.random_range(0..3) {
                0 => format!("e{i}.created"),
                1 => format!("e{i}.updated"),
                _ => format!("p{i}.item.shipped"),
            };
            (tenant(i, tenants), ty)
        })
        .collect()
}

/// Thread-CPU nanoseconds per lookup; a lookup that does not find its one subscription is counted in `misses`.
fn time(t: &SubscriptionTable, evs: &[(String, String)], misses: &mut usize) -> f64 {
    let start = thread_cpu();
    for (tenant, ty) in evs {
        let found = t.matching(tenant, ty);
        if found.len() != 1 {
            *misses = misses.saturating_add(1);
        }
        std::hint::black_box(found);
    }
    let spent = thread_cpu().saturating_sub(start);
    spent.as_nanos() as f64 / evs.len().max(1) as f64
}

pub async fn run(args: &BenchArgs) -> anyhow::Result<(Map<String, Value>, bool)> {
    let large = args.fanout_subscriptions;
    let tenants = TENANTS.min(large.max(1));
    // CPU-bound and synchronous: off the runtime's workers.
    let out = tokio::task::spawn_blocking(move || measure(large, tenants)).await?;
    Ok(out)
}

fn measure(large: usize, tenants: usize) -> (Map<String, Value>, bool) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    let small_t = table(SMALL, SMALL);
    let built = Instant::now();
    let large_t = table(large, tenants);
    let build_s = built.elapsed().as_secs_f64();
    eprintln!("  built {large} subscriptions across {tenants} tenants in {build_s:.1} s");
    let small_ev = events(SMALL, SMALL, LOOKUPS, &mut rng);
    let large_ev = events(large, tenants, LOOKUPS, &mut rng);
    let mut misses = 0usize;
    // Warm both (first-touch page faults, branch predictors).
    time(&small_t, &small_ev[..LOOKUPS / 10], &mut misses);
    time(&large_t, &large_ev[..LOOKUPS / 10], &mut misses);
    let (mut small_ns, mut large_ns, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let s = time(&small_t, &small_ev, &mut misses);
        let l = time(&large_t, &large_ev, &mut misses);
        small_ns.push(s);
        large_ns.push(l);
        ratios.push(if s > 0.0 { l / s } else { f64::NAN });
    }
    let median = |v: &[f64]| super::stats::pct(&super::stats::sorted(v.to_vec()), 50.0);
    // The linear filter, for scale: a few events, bounded to about a second.
    let (mut linear_n, mut disagree) = (0usize, 0usize);
    let start = thread_cpu();
    for (tenant, ty) in large_ev.iter().take(1_000) {
        let linear = large_t.matching_linear(tenant, ty);
        let ids =
            |v: &[std::sync::Arc<hookline_kafka::state::SubscriptionEntry>]| v.iter().map(|e| e.sub.id.to_string()).collect::<Vec<_>>();
        if ids(&linear) != ids(&large_t.matching(tenant, ty)) {
            disagree = disagree.saturating_add(1);
        }
        linear_n += 1;
        if thread_cpu().saturating_sub(start) > Duration::from_secs(1) {
            break;
        }
    }
    let linear_ns = thread_cpu().saturating_sub(start).as_nanos() as f64 / linear_n.max(1) as f64;
    let ratio = median(&ratios);
    // The issue's ≤ 1.5 is for the whole fan-out's CPU per event (decode, lookup, encode, produce), which this does
    // not run; the lookup alone is reported without a target. Wrong answers are a failure.
    let met = misses == 0 && disagree == 0;
    print_table(
        "fan-out lookup (thread CPU per event)",
        &[
            row("16 subscriptions", format!("{:.0} ns", median(&small_ns)), "", None),
            row("large table", format!("{:.0} ns", median(&large_ns)), "", None),
            row("ratio large ÷ 16 (lookup, median)", format!("{ratio:.2}"), "", None),
            row("linear filter, large table", format!("{:.0} µs", linear_ns / 1000.0), "", None),
            row("lookups not finding their one", misses + disagree, "0", Some(misses == 0 && disagree == 0)),
        ],
    );
    let mut o = Map::new();
    o.insert("subscriptions".into(), json!([SMALL, large]));
    o.insert("tenants".into(), json!([SMALL, tenants]));
    o.insert("lookups_per_round".into(), json!(LOOKUPS));
    o.insert("rounds".into(), json!(ROUNDS));
    o.insert("ns_per_event_small".into(), json!(small_ns.iter().map(|v| round(*v, 0)).collect::<Vec<_>>()));
    o.insert("ns_per_event_large".into(), json!(large_ns.iter().map(|v| round(*v, 0)).collect::<Vec<_>>()));
    o.insert("ratio".into(), json!(round(ratio, 3)));
    o.insert("ratios".into(), json!(ratios.iter().map(|v| round(*v, 3)).collect::<Vec<_>>()));
    o.insert("linear_ns_per_event_large".into(), json!(round(linear_ns, 0)));
    o.insert("linear_events".into(), json!(linear_n));
    o.insert("index_speedup_over_linear".into(), json!(round(linear_ns / median(&large_ns).max(1.0), 1)));
    o.insert("build_s".into(), json!(round(build_s, 2)));
    o.insert("wrong_results".into(), json!(misses + disagree));
    (o, met)
}
