//! `hookline bench log`: the delivery log's store. Writes `--log-attempts` attempts (two per delivery, one event per
//! delivery, spread over the last 7 days across 1,000 subscriptions, 100 tenants and 10 event types; ids in order,
//! or hashed with `--log-ids hashed`) in the
//! indexer's batches, then times the API's queries on the filled store and its reopening. SQLite always (a file in
//! a temporary directory); PostgreSQL when `--postgres-url` names a server (a scratch database is created there
//! and dropped afterwards). The store is written directly, as the indexer does after decoding: Kafka is not in
//! the measurement.

use std::time::{Duration, Instant};

use hookline_core::model::{AttemptRecord, Event};
use hookline_log::{Batch, DeliveryState, ListQuery, LogStore, Scope, Target};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};

use super::stats::{pct, sorted, Progress};
use super::{print_table, round, row, BenchArgs, LogIds};

const SUBSCRIPTIONS: u64 = 1_000;
const TENANTS: u64 = 100;
const TYPES: [&str; 10] = [
    "order.created",
    "order.paid",
    "order.shipped",
    "order.cancelled",
    "invoice.created",
    "invoice.paid",
    "customer.created",
    "customer.updated",
    "refund.created",
    "message.received",
];
const SPREAD_MS: i64 = 7 * 86_400_000;
const BATCH: u64 = 2_000;
const RETENTION_DAYS: u32 = 30;

/// The `i`-th delivery's event and delivery ids.
fn ids(i: u64, spread: LogIds) -> (String, String) {
    match spread {
        LogIds::Sequential => (format!("evt_{i:010}"), format!("dlv_{i:010}")),
        LogIds::Hashed => (format!("evt_{:016x}", mix(i)), format!("dlv_{:016x}", mix(!i))),
    }
}

/// splitmix64's finaliser: a bijection of u64, so distinct inputs give distinct ids, spread evenly.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn delivery(i: u64, of: u64, now: i64, spread: LogIds) -> (Event, [AttemptRecord; 2]) {
    let sub = i % SUBSCRIPTIONS;
    let (event_id, delivery_id) = ids(i, spread);
    let ty = TYPES[(i % TYPES.len() as u64) as usize];
    // Older first, so the newest deliveries are the last written (as in life).
    let step = SPREAD_MS / i64::try_from(of.max(1)).unwrap_or(i64::MAX);
    let at = now - SPREAD_MS + i64::try_from(i).unwrap_or(0).saturating_mul(step).min(SPREAD_MS - 60_000);
    let event = Event {
        id: event_id.clone(),
        r#type: ty.into(),
        tenant: format!("tenant_{}", sub % TENANTS),
        occurred_at_ms: at,
        accepted_at_ms: at,
        data_json: format!("{{\"order\":{i},\"amount\":1999,\"currency\":\"EUR\",\"note\":\"{}\"}}", "x".repeat(120)).into_bytes().into(),
        ..Default::default()
    };
    let (status, fin) = match i % 10 {
        0 => (503, "failed"),
        1 => (404, "dead"),
        _ => (200, "succeeded"),
    };
    let tenant = event.tenant.clone();
    let rec = |attempt: u32, started: i64, status: u32, fin: &str| AttemptRecord {
        delivery_id: delivery_id.clone(),
        subscription_id: format!("sub_{sub:04}"),
        event_id: event_id.clone(),
        tenant: tenant.clone(),
        event_type: ty.into(),
        attempt,
        r#try: 1,
        started_at_ms: started,
        duration_ms: 40,
        outcome: status.to_string(),
        http_status: status,
        reason: format!("HTTP {status}"),
        response_excerpt: "{\"ok\":false,\"error\":\"temporarily unavailable, try again later\"}".into(),
        verdict: if fin == "succeeded" {
            "success"
        } else if fin.is_empty() {
            "retry"
        } else {
            "terminal"
        }
        .into(),
        counts_toward_disable: status != 200,
        next_due_at_ms: if fin.is_empty() { started + 30_000 } else { 0 },
        final_state: fin.into(),
        status_word: fin.to_uppercase(),
        phase: 1,
        policy: "standard".into(),
        ..Default::default()
    };
    (event, [rec(1, at, 503, ""), rec(2, at + 30_000, status, fin)])
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1_000.0
}

struct Measured {
    attempts_per_s: f64,
    p99: [(&'static str, f64); 3],
    api_start_s: f64,
}

async fn measure(target: &Target, attempts: u64, queries: usize, spread: LogIds) -> anyhow::Result<Measured> {
    let store = std::sync::Arc::new(LogStore::open(target).await?);
    let deliveries = attempts.div_ceil(2);
    let now = hookline_service::now_ms();
    let mut progress = Progress::new();
    let started = Instant::now();
    let mut written = 0u64;
    let mut i = 0u64;
    // As the indexer does: the next batch is read (here: made) while the previous ones are written, as many side by
    // side as the store writes.
    let concurrency = store.write_concurrency();
    let mut pending: std::collections::VecDeque<tokio::task::JoinHandle<Result<hookline_log::IndexSummary, hookline_log::StoreError>>> =
        std::collections::VecDeque::new();
    while i < deliveries {
        let mut batch = Batch::default();
        // A batch of the indexer's size: BATCH records of all three topics.
        while i < deliveries && (batch.len() as u64) < BATCH {
            let (event, recs) = delivery(i, deliveries, now, spread);
            batch.events.push((event, 0));
            batch.attempts.extend(recs);
            i += 1;
        }
        while pending.len() >= concurrency {
            pending.pop_front().expect("non-empty").await??;
        }
        written += batch.attempts.len() as u64;
        let s = store.clone();
        pending.push_back(tokio::spawn(async move { s.index(batch, RETENTION_DAYS, now).await }));
        progress.tick(|t| format!("{written} attempts, {:.0}/s", written as f64 / t));
    }
    while let Some(p) = pending.pop_front() {
        p.await??;
    }
    let attempts_per_s = written as f64 / started.elapsed().as_secs_f64();
    eprintln!("  {written} attempts written in {:.1} s", started.elapsed().as_secs_f64());
    drop(store);

    // A restarted API: open the filled store and answer a first query.
    let t = Instant::now();
    let store = LogStore::open(target).await?;
    store.list(&ListQuery::new(Scope::Subscription("sub_0001".into()))).await?;
    let api_start_s = t.elapsed().as_secs_f64();

    let mut rng = StdRng::seed_from_u64(7);
    let (mut by_sub, mut by_event, mut filtered) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..queries {
        let sub = format!("sub_{:04}", rng.random_range(0..SUBSCRIPTIONS.min(deliveries)));
        let q = ListQuery { limit: 50, ..ListQuery::new(Scope::Subscription(sub.clone())) };
        let t = Instant::now();
        store.list(&q).await?;
        by_sub.push(ms(t.elapsed()));

        let (id, _) = ids(rng.random_range(0..deliveries), spread);
        let t = Instant::now();
        let found = store.by_event_id(&id, None, 10).await?;
        by_event.push(ms(t.elapsed()));
        anyhow::ensure!(!found.is_empty(), "event {id} was written but is not found");

        let q = ListQuery {
            state: Some(DeliveryState::Failed),
            event_type: Some(TYPES[0].into()),
            since_ms: Some(now - 3 * 86_400_000),
            until_ms: Some(now),
            limit: 50,
            ..ListQuery::new(Scope::Subscription(sub))
        };
        let t = Instant::now();
        store.list(&q).await?;
        filtered.push(ms(t.elapsed()));
    }
    let p = |v: Vec<f64>| round(pct(&sorted(v), 99.0), 2);
    Ok(Measured {
        attempts_per_s,
        p99: [("list_by_subscription", p(by_sub)), ("search_by_event_id", p(by_event)), ("filtered_list", p(filtered))],
        api_start_s,
    })
}

/// A scratch database on the server, dropped afterwards; the server's own database is only used to create it.
pub(super) async fn scratch(url: &str) -> anyhow::Result<(String, String)> {
    let name = format!("hookline_bench_{}", std::process::id());
    let db_url = hookline_log::postgres::create_database(url, &name).await.map_err(|e| anyhow::anyhow!("--postgres-url: {e}"))?;
    Ok((db_url, name))
}

pub(super) async fn drop_scratch(url: &str, name: &str) {
    hookline_log::postgres::drop_database(url, name).await;
}

pub async fn run(args: &BenchArgs) -> anyhow::Result<(Map<String, Value>, bool)> {
    let n = args.log_attempts;
    let queries = args.log_queries;
    let mut out = Map::new();
    out.insert("attempts".into(), json!(n));
    out.insert("ids".into(), json!(format!("{:?}", args.log_ids).to_lowercase()));
    let mut met_all = true;
    let dir = std::env::temp_dir().join(format!("hookline-bench-log-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let only = args.log_only.as_deref();
    if only == Some("postgres") && args.postgres_url.is_none() {
        anyhow::bail!("--log-only postgres: needs --postgres-url");
    }
    // (name, store, the server URL and scratch database to drop afterwards)
    type Backend = (&'static str, Target, Option<(String, String)>);
    let mut backends: Vec<Backend> = Vec::new();
    if only != Some("postgres") {
        backends.push(("sqlite", Target::Sqlite(dir.join("log.sqlite3")), None));
    }
    if let Some(url) = args.postgres_url.as_ref().filter(|_| only != Some("sqlite")) {
        let (db_url, name) = scratch(url).await?;
        backends.push(("postgres", Target::Postgres(db_url), Some((url.clone(), name))));
    }
    for (name, target, cleanup) in backends {
        eprintln!("\n  {name}: writing {n} attempts…");
        let result = measure(&target, n, queries, args.log_ids).await;
        if let Some((url, db)) = cleanup {
            drop_scratch(&url, &db).await;
        }
        let m = result?;
        // The targets: PostgreSQL at 10M attempts stored, SQLite at 1M.
        let at = if name == "postgres" { 10_000_000 } else { 1_000_000 };
        let mut rows = vec![row(
            "attempts_per_s",
            format!("{:.0}", m.attempts_per_s),
            if name == "postgres" { "≥ 20000" } else { "—" },
            (name == "postgres").then_some(m.attempts_per_s >= 20_000.0),
        )];
        let mut p99 = Map::new();
        for (q, v) in m.p99 {
            let key: &'static str = match q {
                "list_by_subscription" => "query_p99_ms list_by_subscription",
                "search_by_event_id" => "query_p99_ms search_by_event_id",
                _ => "query_p99_ms filtered_list",
            };
            rows.push(row(key, v, "≤ 50", Some(v <= 50.0)));
            p99.insert(q.into(), json!(v));
        }
        rows.push(row("api_start_s", round(m.api_start_s, 3), "≤ 2", Some(m.api_start_s <= 2.0)));
        let title = format!("{name}, {n} attempts (targets are for {at})");
        print_table(&title, &rows);
        met_all &= rows.iter().all(|r| r.met != Some(false));
        out.insert(
            name.into(),
            json!({
                "attempts_per_s": round(m.attempts_per_s, 0),
                "query_p99_ms": p99,
                "api_start_s": round(m.api_start_s, 3),
            }),
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok((out, met_all))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashed_ids_are_distinct_and_not_in_writing_order() {
        let n = 10_000u64;
        let hashed: Vec<_> = (0..n).map(|i| ids(i, LogIds::Hashed)).collect();
        let events: std::collections::HashSet<_> = hashed.iter().map(|(e, _)| e.clone()).collect();
        let deliveries: std::collections::HashSet<_> = hashed.iter().map(|(_, d)| d.clone()).collect();
        assert_eq!((events.len(), deliveries.len()), (n as usize, n as usize));
        // Written in order, about half of the next keys sort below the previous one (sequential ids: none).
        let descents = hashed.windows(2).filter(|w| w[1].0 < w[0].0).count();
        assert!((4_000..6_000).contains(&descents), "{descents} descents");
        let seq: Vec<_> = (0..n).map(|i| ids(i, LogIds::Sequential)).collect();
        assert!(seq.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1));
        assert_eq!(ids(7, LogIds::Hashed), ids(7, LogIds::Hashed), "a lookup finds what was written");
    }
}
