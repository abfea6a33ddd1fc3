//! `bench list`: how long a page of `GET /v1/subscriptions` takes to find with 200,000 subscriptions across 10,000
//! tenants (`SubscriptionTable::page`, the ordered index the API lists through), in this process, no broker:
//! a tenant's first page, a tenant's page after a cursor, and a page of the whole table after a random cursor.
//! What listing did before (copy the whole table, sort it, filter) is timed on a few calls for scale.

use std::time::{Duration, Instant};

use hookline_core::model::Subscription;
use hookline_kafka::state::SubscriptionTable;
use prost::Message;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};

use super::{print_table, round, row, BenchArgs};

const TENANTS: usize = 10_000;
const PAGES: usize = 20_000;
const LIMIT: usize = 50;
/// The bound for one page.
const TARGET_MS: f64 = 20.0;

pub async fn run(args: &BenchArgs) -> anyhow::Result<(Map<String, Value>, bool)> {
    let n = args.fanout_subscriptions;
    Ok(tokio::task::spawn_blocking(move || measure(n)).await?)
}

fn table(n: usize, tenants: usize) -> SubscriptionTable {
    let t = SubscriptionTable::default();
    for i in 0..n {
        let sub = Subscription {
            id: format!("sub_{:016x}", (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            url: "http://127.0.0.1:9/hook".into(),
            tenant: format!("tenant_{}", i % tenants),
            event_types: vec![format!("e{i}.created")],
            policy: "standard".into(),
            enabled: true,
            ..Default::default()
        };
        t.apply(sub.id.as_bytes(), Some(&sub.encode_to_vec()));
    }
    t
}

/// Wall-clock microseconds of each call of `f`.
fn timed(count: usize, mut f: impl FnMut(usize) -> usize, found: &mut usize) -> Vec<f64> {
    (0..count)
        .map(|i| {
            let start = Instant::now();
            *found = found.saturating_add(f(i));
            start.elapsed().as_secs_f64() * 1e6
        })
        .collect()
}

fn measure(n: usize) -> (Map<String, Value>, bool) {
    let tenants = TENANTS.min(n.max(1));
    let built = Instant::now();
    let t = table(n, tenants);
    eprintln!("  built {n} subscriptions across {tenants} tenants in {:.1} s", built.elapsed().as_secs_f64());
    let mut rng = rand::rngs::StdRng::seed_from_u64(23);
    let picks: Vec<usize> = (0..PAGES).map(|_| rng.random_range(0..tenants)).collect();
    let cursors: Vec<String> = (0..PAGES).map(|_| format!("sub_{:016x}", rng.random::<u64>())).collect();
    let mut found = 0usize;
    let first = timed(PAGES, |i| t.page(Some(&format!("tenant_{}", picks[i])), None, LIMIT).items.len(), &mut found);
    // The second page of a tenant: after its first page's last id.
    let seconds: Vec<(String, String)> = picks
        .iter()
        .map(|p| {
            let tenant = format!("tenant_{p}");
            let after = t.page(Some(&tenant), None, 1).items.first().map(|e| e.sub.id.to_string()).unwrap_or_default();
            (tenant, after)
        })
        .collect();
    let next = timed(PAGES, |i| t.page(Some(&seconds[i].0), Some(&seconds[i].1), LIMIT).items.len(), &mut found);
    let whole = timed(PAGES, |i| t.page(None, Some(&cursors[i]), LIMIT).items.len(), &mut found);
    // Before: every list call copied and sorted the whole table (bounded to about two seconds).
    let start = Instant::now();
    let mut old = Vec::new();
    while old.len() < 20 && start.elapsed() < Duration::from_secs(2) {
        let s = Instant::now();
        let mut all = t.all();
        all.sort_by(|a, b| a.sub.id.cmp(&b.sub.id));
        let tenant = format!("tenant_{}", picks[old.len()]);
        let page: Vec<_> = all.iter().filter(|e| *e.sub.tenant == *tenant).take(LIMIT).collect();
        std::hint::black_box(page);
        old.push(s.elapsed().as_secs_f64() * 1e6);
    }
    let stats = |v: &[f64]| {
        let s = super::stats::sorted(v.to_vec());
        (super::stats::pct(&s, 50.0), super::stats::pct(&s, 99.0), s.last().copied().unwrap_or(0.0))
    };
    let (f50, f99, fmax) = stats(&first);
    let (n50, n99, nmax) = stats(&next);
    let (w50, w99, wmax) = stats(&whole);
    let (o50, _, _) = stats(&old);
    let worst_ms = fmax.max(nmax).max(wmax) / 1000.0;
    let met = worst_ms <= TARGET_MS && found > 0;
    let us = |p50: f64, p99: f64, max: f64| format!("p50 {p50:.1} µs, p99 {p99:.1} µs, max {max:.0} µs");
    print_table(
        &format!("subscription list page of {LIMIT} ({n} subscriptions, {tenants} tenants, wall clock)"),
        &[
            row("a tenant's first page", us(f50, f99, fmax), "", None),
            row("a tenant's next page (after a cursor)", us(n50, n99, nmax), "", None),
            row("all tenants, after a random cursor", us(w50, w99, wmax), "", None),
            row("slowest page", format!("{worst_ms:.2} ms"), format!("≤ {TARGET_MS} ms"), Some(worst_ms <= TARGET_MS)),
            row("before: copy + sort the table, p50", format!("{:.1} ms", o50 / 1000.0), "", None),
        ],
    );
    let mut o = Map::new();
    o.insert("subscriptions".into(), json!(n));
    o.insert("tenants".into(), json!(tenants));
    o.insert("page_limit".into(), json!(LIMIT));
    o.insert("pages_per_kind".into(), json!(PAGES));
    o.insert("tenant_first_page_us".into(), json!({"p50": round(f50, 1), "p99": round(f99, 1), "max": round(fmax, 1)}));
    o.insert("tenant_next_page_us".into(), json!({"p50": round(n50, 1), "p99": round(n99, 1), "max": round(nmax, 1)}));
    o.insert("all_page_us".into(), json!({"p50": round(w50, 1), "p99": round(w99, 1), "max": round(wmax, 1)}));
    o.insert("slowest_page_ms".into(), json!(round(worst_ms, 3)));
    o.insert("target_ms".into(), json!(TARGET_MS));
    o.insert("copy_and_sort_p50_ms".into(), json!(round(o50 / 1000.0, 2)));
    o.insert("items_found".into(), json!(found));
    (o, met)
}
