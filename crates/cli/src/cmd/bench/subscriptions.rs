//! `subscriptions`: what holding many subscriptions costs the real services, end to end on the broker. First 16
//! subscriptions, then `--fanout-subscriptions` (default 200,000) across 10,000 tenants, written straight to the
//! compacted `subscriptions` topic (as the API writes them: a record per id, secret in the clear, which every
//! service reads as is) instead of one API call each. Each subscription has two exact types and a `prefix.*` of its
//! own, so an event made for one random subscription fans out to exactly that one at both sizes.
//!
//! Per process (ingest with its API, dispatcher, retry-scheduler): RSS with 16 and with N, and the difference ÷ the
//! subscriptions added. The fan-out's CPU per event: ingest's process CPU while `--events` events (default 10,000
//! per round, 3 rounds per size) are published at `--rate` per second (default 1,000; the same pace at both sizes,
//! so the table is not charged with a slower round's costs per batch and per wake-up) and delivered, with 16 and
//! with N → `fanout_cpu_ratio`; `fanout_net_cpu_ratio` is the same less ingest's idle CPU (measured for 2 s before
//! each round, charged for the round's duration), which at a low rate is a large share of each event. The 16
//! rounds run again after the large table is deleted (tombstones), and the ratio's denominator is the median of
//! both: what grows with the run rather than the table (ingest's delivery-log store) is not charged to the table.
//!
//! A process has read the table when a sentinel subscription written last to each partition of the topic receives
//! (ingest fans out to it, the dispatcher delivers it); the retry-scheduler, which delivers nothing, when its RSS
//! stops growing.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hookline_core::model::{Secret, Subscription};
use prost::Message;
use rand::{Rng, SeedableRng};
use rdkafka::producer::FutureRecord;
use serde_json::{json, Map, Value};

use super::cluster::{event_json, Cluster, Publisher};
use super::receiver::Receiver;
use super::stats::{pct, sorted};
use super::{print_table, round, row, BenchArgs};

const SMALL: usize = 16;
const TENANTS: usize = 10_000;
const ROUNDS: usize = 3;
const DEFAULT_EVENTS: u64 = 10_000;
/// Receiver path numbers of the sentinels (above any subscription's).
const SENTINEL_PATH: u32 = 900_000_000;
/// The issue's targets.
const RATIO_TARGET: f64 = 1.5;
const BYTES_TARGET: f64 = 1024.0;

/// The services whose RSS is read: (JSON name, process).
fn procs(c: &Cluster) -> [(&'static str, &super::cluster::Proc); 3] {
    [("ingest", &c.ingest), ("dispatcher", &c.dispatcher), ("retry_scheduler", &c.scheduler)]
}

fn tenant(i: usize, tenants: usize) -> String {
    format!("t{}", i % tenants)
}

fn subscription(i: usize, tenants: usize, recv: &Receiver, secret: &str) -> Subscription {
    let now = hookline_service::now_ms();
    Subscription {
        id: format!("sub_{i:07}"),
        url: recv.url(&format!("ok/{i}")),
        tenant: tenant(i, tenants),
        event_types: vec![format!("e{i}.created"), format!("e{i}.updated"), format!("p{i}.*")],
        policy: "standard".into(),
        secrets: vec![Secret { value: secret.to_owned(), expires_at_ms: 0, ..Default::default() }],
        enabled: true,
        created_at_ms: now,
        updated_at_ms: now,
        ..Default::default()
    }
}

/// Writes subscriptions `from..to` (keyed by id, so each lands on its id's partition), or their tombstones if
/// `delete`, then one sentinel per partition (placed there explicitly, so it is read after everything written
/// before it to that partition). Returns the records written.
async fn load(
    cluster: &Cluster,
    recv: &Receiver,
    from: usize,
    to: usize,
    tenants: usize,
    stage: u32,
    delete: bool,
) -> anyhow::Result<usize> {
    let producer = cluster.producer(20)?;
    let topic = cluster.topics().subscriptions().to_owned();
    let secret = hookline_core::sign::generate_secret(&mut rand::rng());
    let mut written = 0usize;
    let mut pending = Vec::with_capacity(20_000);
    let flush = |pending: &mut Vec<hookline_kafka::producer::DeliveryFuture>| {
        let batch = std::mem::take(pending);
        async move {
            // Already in flight in librdkafka: awaiting them in turn waits for the slowest.
            for f in batch {
                let r = f.await;
                anyhow::ensure!(matches!(r, Ok(Ok(_))), "writing a subscription record failed: {r:?}");
            }
            anyhow::Ok(())
        }
    };
    for i in from..to {
        let sub = subscription(i, tenants, recv, &secret);
        let bytes = if delete { Vec::new() } else { sub.encode_to_vec() };
        let record = FutureRecord::to(&topic).key(&sub.id);
        // A record without a value is a tombstone: the subscription is deleted.
        let record = if delete { record } else { record.payload(&bytes) };
        pending.push(producer.send_result(record).map_err(|(e, _)| anyhow::anyhow!("queueing a subscription record: {e}"))?);
        written += 1;
        if pending.len() >= 20_000 {
            flush(&mut pending).await?;
        }
    }
    for p in 0..cluster.config.kafka.partitions {
        let path = SENTINEL_PATH + stage * 1000 + u32::try_from(p).unwrap_or(0);
        let now = hookline_service::now_ms();
        let sub = Subscription {
            id: format!("sentinel-{stage}-{p}"),
            url: recv.url(&format!("ok/{path}")),
            event_types: vec![format!("bench.sentinel.{stage}")],
            policy: "standard".into(),
            secrets: vec![Secret { value: secret.clone(), expires_at_ms: 0, ..Default::default() }],
            enabled: true,
            created_at_ms: now,
            updated_at_ms: now,
            ..Default::default()
        };
        let bytes = sub.encode_to_vec();
        let record = FutureRecord::to(&topic).key(&sub.id).payload(&bytes).partition(p);
        pending.push(producer.send_result(record).map_err(|(e, _)| anyhow::anyhow!("queueing a sentinel: {e}"))?);
        written += 1;
    }
    flush(&mut pending).await?;
    Ok(written)
}

/// Publishes sentinel events until every sentinel of `stage` received one: ingest and the dispatcher then hold
/// every record written before them. `expected` counts the sentinels of this stage and of every earlier one.
async fn wait_sentinels(publisher: &Publisher, recv: &Receiver, stage: u32, expected: usize, limit: Duration) -> anyhow::Result<f64> {
    let t = Instant::now();
    let mut n = 0u64;
    while recv.state.warm_count() < expected {
        anyhow::ensure!(
            t.elapsed() < limit,
            "the services did not read the subscriptions within {} s ({} of {expected} sentinels reached)",
            limit.as_secs(),
            recv.state.warm_count()
        );
        let id = format!("warm-s{stage}-{n}");
        let body = format!(r#"{{"id":"{id}","type":"bench.sentinel.{stage}","data":{{}}}}"#);
        publisher.send(&id, body.as_bytes());
        n += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(t.elapsed().as_secs_f64())
}

/// Waits (bounded) until the process's RSS has not grown for `quiet`.
async fn wait_rss_settled(p: &super::cluster::Proc, quiet: Duration, limit: Duration) -> f64 {
    let t = Instant::now();
    let mut last = p.rss_mb().1;
    let mut since = Instant::now();
    while since.elapsed() < quiet && t.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = p.rss_mb().1;
        if now > last + 0.05 {
            last = now;
            since = Instant::now();
        }
    }
    last
}

/// Ingest's CPU per event in one round, µs, by part of the process.
#[derive(Clone, Copy, Default)]
struct RoundCpu {
    /// The whole process.
    all: f64,
    /// librdkafka's threads (`rdk:*`).
    rdk: f64,
    /// The delivery log's SQLite writes (its `log-writer` thread): the log, not the fan-out.
    log_writer: f64,
    /// Everything else.
    other: f64,
    /// The whole process without the log's writes: the fan-out (with the log indexer's reading and folding of
    /// the records, which do not depend on the table).
    fanout: f64,
    /// `fanout` less what ingest spends when no event flows (its consumers' fetch loops, timers), measured for
    /// [`IDLE`] before the round and charged for the round's duration: the per-event work alone.
    fanout_net: f64,
    /// Ingest's CPU without the log's writes while idle, as a share of one core.
    idle_cores: f64,
    events_per_s: f64,
}

/// How long ingest's idle CPU is measured before each round.
const IDLE: Duration = Duration::from_secs(2);

/// One round: `count` events, each for one random subscription of `0..n`, published at `rate` per second; ingest's CPU seconds
/// (whole process, librdkafka threads, the log writer, the others) from the first publish until the receiver has
/// them all.
#[allow(clippy::too_many_arguments)]
async fn round_cpu(
    cluster: &Cluster,
    publisher: &Publisher,
    recv: &Receiver,
    n: usize,
    tenants: usize,
    count: u64,
    rate: u64,
    tag: &str,
    rng: &mut impl Rng,
) -> anyhow::Result<RoundCpu> {
    let ok_before = recv.state.ok.load(Ordering::Relaxed);
    let cpu = |c: &Cluster| {
        let (rdk, _) = c.ingest.split_cpu_s();
        (c.ingest.cpu_s(), rdk, c.ingest.thread_cpu_s(hookline_log::sqlite::WRITER_THREAD))
    };
    let (i0, _, i0_log) = cpu(cluster);
    let idle_start = Instant::now();
    tokio::time::sleep(IDLE).await;
    let (a, a_rdk, a_log) = cpu(cluster);
    let idle_cores = ((a - a_log) - (i0 - i0_log)).max(0.0) / idle_start.elapsed().as_secs_f64();
    let start = Instant::now();
    let pace = Duration::from_secs(1).checked_div(u32::try_from(rate.max(1)).unwrap_or(u32::MAX)).unwrap_or(Duration::ZERO);
    for k in 0..count {
        // At the same pace at both sizes: ingest's cost per event also depends on how many arrive per fetch, per
        // produce request and per wake-up, and the large rounds run slower (the dispatcher meets ~10,000 new
        // subscriptions a round), which would be charged to the table.
        if k % 64 == 0 {
            let due = start + pace.saturating_mul(u32::try_from(k).unwrap_or(u32::MAX));
            tokio::time::sleep_until(due.into()).await;
        }
        let i = rng.random_range(0..n);
        let ty = match rng.random_range(0..3) {
            0 => format!("e{i}.created"),
            1 => format!("e{i}.updated"),
            _ => format!("p{i}.item.shipped"),
        };
        let id = format!("{tag}-{k}");
        let mut body = event_json(&id, &ty, k);
        // `{"id":…` → `{"tenant":"tN","id":…`: the event is the subscription's tenant's.
        let prefix = format!(r#"{{"tenant":"{}","#, tenant(i, tenants));
        body.splice(0..1, prefix.into_bytes());
        publisher.send(&id, &body);
    }
    let deadline = Instant::now() + Duration::from_secs(180);
    while recv.state.ok.load(Ordering::Relaxed) < ok_before + count {
        anyhow::ensure!(
            Instant::now() < deadline,
            "round {tag}: only {} of {count} deliveries arrived within 180 s",
            recv.state.ok.load(Ordering::Relaxed) - ok_before
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let wall = start.elapsed().as_secs_f64();
    let (b, b_rdk, b_log) = cpu(cluster);
    let per = |x: f64| x / count as f64 * 1e6;
    let (all, rdk, log_writer) = (per(b - a), per(b_rdk - a_rdk), per(b_log - a_log));
    Ok(RoundCpu {
        all,
        rdk,
        log_writer,
        other: all - rdk - log_writer,
        fanout: all - log_writer,
        fanout_net: all - log_writer - per(idle_cores * wall),
        idle_cores,
        events_per_s: count as f64 / wall,
    })
}

pub async fn run(args: &BenchArgs) -> anyhow::Result<(Map<String, Value>, bool)> {
    let large = args.fanout_subscriptions.max(SMALL + 1);
    let tenants = TENANTS.min(large);
    let per_round = args.events.unwrap_or(DEFAULT_EVENTS);
    let rate = args.rate.max(1);
    let cluster = Arc::new(Cluster::start(args, |_| {}).await?);
    let recv = Receiver::start(Instant::now())?;
    let publisher = Publisher::new(cluster.producer(5)?, cluster.topics().events().to_owned());
    let partitions = usize::try_from(cluster.config.kafka.partitions).unwrap_or(1);
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    let idle: Vec<f64> = procs(&cluster).iter().map(|(_, p)| p.rss_mb().1).collect();

    // 16 subscriptions.
    let small_written = load(&cluster, &recv, 0, SMALL, tenants, 1, false).await?;
    wait_sentinels(&publisher, &recv, 1, partitions, Duration::from_secs(90)).await?;
    let mut small: Vec<RoundCpu> = Vec::new();
    // A first round warms every path (connections, allocator pools) and is not counted.
    round_cpu(&cluster, &publisher, &recv, SMALL, tenants, per_round.min(2_000), rate, "w1", &mut rng).await?;
    for r in 0..ROUNDS {
        let c = round_cpu(&cluster, &publisher, &recv, SMALL, tenants, per_round, rate, &format!("s{r}"), &mut rng).await?;
        eprintln!(
            "  16 subscriptions, round {r}: ingest {:.1} µs CPU per event, {:.1} without the log's writes ({:.0} events/s)",
            c.all, c.fanout, c.events_per_s
        );
        small.push(c);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut rss_small = Vec::new();
    for (_, p) in procs(&cluster) {
        rss_small.push(wait_rss_settled(p, Duration::from_secs(2), Duration::from_secs(20)).await);
    }

    // The large table.
    let t = Instant::now();
    let large_written = load(&cluster, &recv, SMALL, large, tenants, 2, false).await?;
    let write_s = t.elapsed().as_secs_f64();
    eprintln!("  wrote {large_written} subscription records ({large} subscriptions, {tenants} tenants) in {write_s:.1} s");
    let read_s = wait_sentinels(&publisher, &recv, 2, 2 * partitions, Duration::from_secs(600)).await?;
    eprintln!("  ingest and the dispatcher hold them {read_s:.1} s later");
    let mut rss_large = Vec::new();
    for (_, p) in procs(&cluster) {
        rss_large.push(wait_rss_settled(p, Duration::from_secs(3), Duration::from_secs(120)).await);
    }
    let mut large_rounds: Vec<RoundCpu> = Vec::new();
    round_cpu(&cluster, &publisher, &recv, large, tenants, per_round.min(2_000), rate, "w2", &mut rng).await?;
    for r in 0..ROUNDS {
        let c = round_cpu(&cluster, &publisher, &recv, large, tenants, per_round, rate, &format!("l{r}"), &mut rng).await?;
        eprintln!(
            "  {large} subscriptions, round {r}: ingest {:.1} µs CPU per event, {:.1} without the log's writes ({:.0} events/s)",
            c.all, c.fanout, c.events_per_s
        );
        large_rounds.push(c);
    }
    // After traffic to ~`ROUNDS × --events` distinct subscriptions: what the services keep per subscription that
    // has had deliveries (lanes, limits, endpoint states), beside the table. Reported, no target.
    let rss_traffic: Vec<f64> = procs(&cluster).iter().map(|(_, p)| p.rss_mb().1).collect();

    // Back to 16 (the others deleted) and the small rounds again: a cost that comes from the run having gone on
    // (the delivery log's store in ingest has grown, caches are warmer) shows here, not as the table's.
    load(&cluster, &recv, SMALL, large, tenants, 3, true).await?;
    wait_sentinels(&publisher, &recv, 3, 3 * partitions, Duration::from_secs(600)).await?;
    let mut after: Vec<RoundCpu> = Vec::new();
    for r in 0..ROUNDS {
        let c = round_cpu(&cluster, &publisher, &recv, SMALL, tenants, per_round, rate, &format!("a{r}"), &mut rng).await?;
        eprintln!(
            "  16 subscriptions again, round {r}: ingest {:.1} µs CPU per event, {:.1} without the log's writes ({:.0} events/s)",
            c.all, c.fanout, c.events_per_s
        );
        after.push(c);
    }
    let failures = publisher.failed.load(Ordering::Relaxed);
    let cluster = Arc::try_unwrap(cluster).map_err(|_| anyhow::anyhow!("cluster still shared"))?;
    cluster.stop().await;
    drop(recv);

    let median = |v: &[f64]| pct(&sorted(v.to_vec()), 50.0);
    let part = |v: &[RoundCpu], f: fn(&RoundCpu) -> f64| v.iter().map(f).collect::<Vec<f64>>();
    // The ratio of one part: the large rounds' median ÷ the median of both 16 sets; and per round, ÷ the first 16.
    let ratio_of = |f: fn(&RoundCpu) -> f64| {
        let both: Vec<f64> = part(&small, f).into_iter().chain(part(&after, f)).collect();
        let per_round: Vec<f64> = small.iter().zip(&large_rounds).map(|(s, l)| if f(s) > 0.0 { f(l) / f(s) } else { f64::NAN }).collect();
        (median(&part(&large_rounds, f)) / median(&both).max(f64::MIN_POSITIVE), per_round, median(&both))
    };
    let (ratio, ratios, fanout_small) = ratio_of(|c| c.fanout);
    let (ingest_ratio, ingest_ratios, ingest_small) = ratio_of(|c| c.all);
    let (log_ratio, _, _) = ratio_of(|c| c.log_writer);
    let (net_ratio, net_ratios, net_small) = ratio_of(|c| c.fanout_net);
    let added = large_written as f64;
    let mut rss = Map::new();
    let mut per_sub = Map::new();
    let mut worst: f64 = 0.0;
    let names: Vec<&str> = ["ingest", "dispatcher", "retry_scheduler"].to_vec();
    for (k, name) in names.iter().enumerate() {
        let bytes = (rss_large[k] - rss_small[k]) * 1024.0 * 1024.0 / added;
        worst = worst.max(bytes);
        rss.insert((*name).into(), json!({"idle_mb": round(idle[k], 1), "small_mb": round(rss_small[k], 1), "large_mb": round(rss_large[k], 1), "large_after_traffic_mb": round(rss_traffic[k], 1)}));
        per_sub.insert((*name).into(), json!(round(bytes, 0)));
    }
    let ratio_met = ratio <= RATIO_TARGET;
    let rss_met = worst <= BYTES_TARGET;
    let mut rows = vec![
        row("ingest CPU/event, 16 (median)", format!("{ingest_small:.1} µs"), "", None),
        row("ingest CPU/event, large (median)", format!("{:.1} µs", median(&part(&large_rounds, |c| c.all))), "", None),
        row("ingest_cpu_ratio (with the log's writes)", format!("{ingest_ratio:.2}"), "", None),
        row("fan-out CPU/event, 16 (median)", format!("{fanout_small:.1} µs"), "", None),
        row("fan-out CPU/event, large (median)", format!("{:.1} µs", median(&part(&large_rounds, |c| c.fanout))), "", None),
        row("fanout_cpu_ratio", format!("{ratio:.2}"), format!("≤ {RATIO_TARGET}"), Some(ratio_met)),
        row("fan-out CPU/event less idle, 16 (median)", format!("{net_small:.1} µs"), "", None),
        row("fan-out CPU/event less idle, large (median)", format!("{:.1} µs", median(&part(&large_rounds, |c| c.fanout_net))), "", None),
        row("fanout_net_cpu_ratio (idle subtracted)", format!("{net_ratio:.2}"), "", None),
    ];
    for (k, name) in
        ["RSS/subscription, ingest (B)", "RSS/subscription, dispatcher (B)", "RSS/subscription, retry-sch. (B)"].into_iter().enumerate()
    {
        let bytes = (rss_large[k] - rss_small[k]) * 1024.0 * 1024.0 / added;
        rows.push(row(name, format!("{bytes:.0}"), format!("≤ {BYTES_TARGET:.0}"), Some(bytes <= BYTES_TARGET)));
    }
    rows.push(row("publish failures", failures, "0", Some(failures == 0)));
    print_table("subscriptions (end to end)", &rows);
    let r1 = |v: &[f64]| v.iter().map(|x| round(*x, 1)).collect::<Vec<_>>();
    let mut o = Map::new();
    o.insert("subscriptions".into(), json!([SMALL, large]));
    o.insert("tenants".into(), json!([SMALL, tenants]));
    o.insert("records_written".into(), json!([small_written, large_written]));
    o.insert("events_per_round".into(), json!(per_round));
    o.insert("publish_rate_per_s".into(), json!(rate));
    o.insert("rounds".into(), json!(ROUNDS));
    o.insert("fanout_cpu_ratio".into(), json!(round(ratio, 3)));
    o.insert("fanout_cpu_ratios".into(), json!(ratios.iter().map(|v| round(*v, 3)).collect::<Vec<_>>()));
    o.insert("ingest_cpu_ratio".into(), json!(round(ingest_ratio, 3)));
    o.insert("ingest_cpu_ratios".into(), json!(ingest_ratios.iter().map(|v| round(*v, 3)).collect::<Vec<_>>()));
    o.insert("log_writer_cpu_ratio".into(), json!(round(log_ratio, 3)));
    let by_size = |f: fn(&RoundCpu) -> f64| json!({"small": r1(&part(&small, f)), "large": r1(&part(&large_rounds, f)), "small_again": r1(&part(&after, f))});
    o.insert("fanout_cpu_us_per_event".into(), by_size(|c| c.fanout));
    o.insert("fanout_net_cpu_ratio".into(), json!(round(net_ratio, 3)));
    o.insert("fanout_net_cpu_ratios".into(), json!(net_ratios.iter().map(|v| round(*v, 3)).collect::<Vec<_>>()));
    o.insert("fanout_net_cpu_us_per_event".into(), by_size(|c| c.fanout_net));
    o.insert("ingest_idle_pct_of_a_core".into(), by_size(|c| c.idle_cores * 100.0));
    o.insert("ingest_cpu_us_per_event_small".into(), json!(r1(&part(&small, |c| c.all))));
    o.insert("ingest_cpu_us_per_event_large".into(), json!(r1(&part(&large_rounds, |c| c.all))));
    o.insert("ingest_cpu_us_per_event_small_again".into(), json!(r1(&part(&after, |c| c.all))));
    o.insert("ingest_librdkafka_us_per_event".into(), by_size(|c| c.rdk));
    o.insert("ingest_log_writer_us_per_event".into(), by_size(|c| c.log_writer));
    o.insert("ingest_other_us_per_event".into(), by_size(|c| c.other));
    o.insert("events_per_s".into(), by_size(|c| c.events_per_s));
    o.insert("rss_mb".into(), Value::Object(rss));
    o.insert("rss_bytes_per_subscription".into(), Value::Object(per_sub));
    o.insert("rss_bytes_per_subscription_max".into(), json!(round(worst, 0)));
    o.insert("load_write_s".into(), json!(round(write_s, 1)));
    o.insert("load_read_s".into(), json!(round(read_s, 1)));
    o.insert("publish_failures".into(), json!(failures));
    Ok((o, ratio_met && rss_met && failures == 0))
}
