//! `retry-precision`: every delivery fails once — 503 under a policy whose one explicit wait is drawn from the
//! tier ladder (1 s … 5 min, capped by `--max-wait-s`), or 429 with a `Retry-After` — and succeeds on the retry.
//! Lateness = second arrival − the due time the dispatcher recorded (`next_due_at_ms` of the attempt record,
//! read from the `attempts` topic); `early` counts arrivals before it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hookline_core::model::AttemptRecord;
use prost::Message as _;
use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use super::cluster::{event_json, Cluster, Publisher};
use super::receiver::Receiver;
use super::stats::{pct, sorted, Progress};
use super::{print_table, round, row, BenchArgs};

/// Explicit waits on the ladder (s).
const WAITS: &[u64] = &[1, 2, 4, 7, 15, 30, 60, 90, 120, 240, 300];
/// Retry-After values (s), answered with 429 under a 1 s schedule (the clamp honours the longer wait).
const RETRY_AFTERS: &[u64] = &[3, 20, 45, 100, 200];

struct Case {
    label: String,
    wait_s: u64,
    retry_after: bool,
}

fn quick_policy(wait_s: u64) -> anyhow::Result<String> {
    Ok(toml::to_string(&super::policies::one_retry(&format!("bench-wait-{wait_s}s"), wait_s as f64))?)
}

pub async fn run(args: &BenchArgs) -> anyhow::Result<(Map<String, Value>, bool)> {
    let max_wait = args.max_wait_s.max(1);
    let mut cases: Vec<Case> = WAITS
        .iter()
        .filter(|w| **w <= max_wait)
        .map(|w| Case { label: format!("503, wait {w} s"), wait_s: *w, retry_after: false })
        .collect();
    cases.extend(RETRY_AFTERS.iter().filter(|w| **w <= max_wait).map(|w| Case {
        label: format!("429, Retry-After {w}"),
        wait_s: *w,
        retry_after: true,
    }));
    let cluster = Arc::new(Cluster::start(args, |_| {}).await?);
    let recv = Receiver::start(Instant::now())?;
    let mut bodies = Vec::new();
    for (k, c) in cases.iter().enumerate() {
        let (url, policy) = if c.retry_after {
            (recv.url(&format!("ra/{}/{k}", c.wait_s)), quick_policy(1)?)
        } else {
            (recv.url(&format!("fail1/{k}")), quick_policy(c.wait_s)?)
        };
        bodies.push(json!({"url": url, "event_types": [format!("rp.{k}"), "bench.warm"], "policy_toml": policy}));
    }
    cluster.subscribe_all(bodies).await?;

    // The due time of every scheduled retry, as the dispatcher recorded it.
    let dues: Arc<Mutex<HashMap<String, i64>>> = Default::default();
    let d = dues.clone();
    let stop = CancellationToken::new();
    let _reader = hookline_kafka::table::spawn(
        &cluster.config.kafka,
        cluster.topics().attempts(),
        "hookline-bench-attempts",
        move |_, _, v| {
            if let Some(rec) = v.and_then(|v| AttemptRecord::decode(v).ok()) {
                if rec.verdict == "retry" && rec.event_id.starts_with('r') && rec.next_due_at_ms > 0 {
                    d.lock().expect("dues lock").insert(rec.event_id, rec.next_due_at_ms);
                }
            }
        },
        stop.clone(),
    )
    .await?;

    let publisher = Publisher::new(cluster.producer(cluster.config.kafka.delivery_path_linger_ms)?, cluster.topics().events().to_owned());
    cluster.warm_up(&publisher, &recv, cases.len()).await?;
    let total = cases.len() * args.per_wait.max(1);
    let spread = Duration::from_secs(10);
    eprintln!(
        "  {} cases × {} events = {total} deliveries failing once, published over {} s; longest wait {max_wait} s",
        cases.len(),
        args.per_wait,
        spread.as_secs()
    );
    let start = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    let mut sent = 0usize;
    while sent < total {
        tick.tick().await;
        let due = ((start.elapsed().as_secs_f64() / spread.as_secs_f64()) * total as f64).ceil() as usize;
        while sent < due.min(total) {
            let id = format!("r{sent}");
            let k = sent % cases.len();
            publisher.send(&id, &event_json(&id, &format!("rp.{k}"), sent as u64));
            sent += 1;
        }
    }
    let longest = cases.iter().map(|c| c.wait_s).max().unwrap_or(1);
    let deadline = Instant::now() + Duration::from_secs(longest + 60);
    let mut progress = Progress::new();
    let seconds_of = |recv: &Receiver| recv.state.arrivals.lock().expect("arrivals lock").iter().filter(|a| !a.first).count();
    loop {
        let retried = seconds_of(&recv);
        if retried >= total || Instant::now() > deadline {
            break;
        }
        progress.tick(|_| {
            let firsts = recv.state.arrivals.lock().expect("arrivals lock").iter().filter(|a| a.first).count();
            format!(
                "first attempts {firsts:>5}/{total} · retries arrived {retried:>5}/{total} · due times read {}",
                dues.lock().expect("dues lock").len()
            )
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The attempts reader may trail the receiver by a moment.
    let settle = Instant::now();
    while dues.lock().expect("dues lock").len() < total && settle.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    let arrivals = recv.state.take_arrivals();
    let dues = dues.lock().expect("dues lock").clone();
    let mut all = Vec::new();
    let mut per_case: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    let mut early = 0u64;
    let mut no_due = 0u64;
    let mut seen = std::collections::HashSet::new();
    for a in arrivals.iter().filter(|a| !a.first) {
        if !seen.insert(a.id.clone()) {
            continue;
        }
        let Some(due) = dues.get(&a.id) else {
            no_due += 1;
            continue;
        };
        let late_ms = a.unix_us as f64 / 1000.0 - *due as f64;
        if late_ms < 0.0 {
            early += 1;
        }
        all.push(late_ms);
        if let Some(v) = per_case.get_mut(a.sub as usize) {
            v.push(late_ms);
        }
    }
    let cluster = Arc::try_unwrap(cluster).map_err(|_| anyhow::anyhow!("cluster still shared"))?;
    cluster.stop().await;
    drop(recv);

    let measured = all.len();
    let all = sorted(all);
    let (p50, p99, max) = (pct(&all, 50.0), pct(&all, 99.0), all.last().copied().unwrap_or(f64::NAN));
    let mut by_case = Map::new();
    let mut rows = vec![
        row("deliveries failing once", total, "", None),
        row("retries measured", measured, "all", Some(measured == total)),
        row("early", early, "= 0", Some(early == 0)),
        row("lateness p50_ms", format!("{p50:.1}"), "", None),
        row("lateness p99_ms", format!("{p99:.1}"), "≤ 250", Some(p99 <= 250.0)),
        row("lateness max_ms", format!("{max:.1}"), "", None),
    ];
    let mut case_rows = Vec::new();
    for (c, v) in cases.iter().zip(per_case) {
        let v = sorted(v);
        by_case.insert(
            c.label.clone(),
            json!({"n": v.len(), "p50_ms": round(pct(&v, 50.0), 1), "p99_ms": round(pct(&v, 99.0), 1), "max_ms": round(v.last().copied().unwrap_or(f64::NAN), 1)}),
        );
        case_rows
            .push((c.label.clone(), format!("{:.1} / {:.1} / {:.1}", pct(&v, 50.0), pct(&v, 99.0), v.last().copied().unwrap_or(f64::NAN))));
    }
    rows.push(row("per case: p50 / p99 / max ms", "", "", None));
    print_table("retry precision", &rows);
    for (label, v) in case_rows {
        eprintln!("    {label:<32} {v:>22}");
    }
    let mut out = Map::new();
    out.insert("deliveries".into(), json!(total));
    out.insert("measured".into(), json!(measured));
    out.insert("max_wait_s".into(), json!(longest));
    out.insert("early".into(), json!(early));
    out.insert("p50_ms".into(), json!(round(p50, 1)));
    out.insert("p99_ms".into(), json!(round(p99, 1)));
    out.insert("max_ms".into(), json!(round(max, 1)));
    out.insert("missing_due_times".into(), json!(no_due));
    out.insert("by_case".into(), Value::Object(by_case));
    let met = early == 0 && p99 <= 250.0 && measured == total;
    Ok((out, met))
}
