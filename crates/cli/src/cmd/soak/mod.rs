//! `hookline soak`: the reliability harness. It runs the broker (`hookline dev-broker --control`, or an existing
//! cluster: `--brokers`, or an Apache Kafka cluster of `scripts/kafka` whose nodes it can kill: `--kafka-cluster`),
//! ingest, two dispatchers and the retry-scheduler as separate processes, a receiver whose endpoints succeed, fail, hang and
//! go away, publishes a bounded stream of events through the API while injecting faults, waits until every
//! accepted delivery has a final state, and reports `accepted`, `final_states`, `missing` (must be 0),
//! `duplicates` and the fault schedule as one JSON line; then checks the delivery log store holds every accepted
//! delivery with its final state (`log_missing`, must be 0; `log_lag_s`: how long the indexer took to get
//! there). The exit code is 0 only when nothing is missing, from the deliveries or the log, and every delivery
//! ended in the state its endpoint implies.

mod cluster;
mod faults;
mod ledger;
mod log_check;
mod procs;
mod publish;
mod receiver;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use hookline_kafka::Topics;
use hookline_service::Config;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

pub use faults::FaultKind;
use faults::{Brokers, Fleet, Target};
use ledger::Ledger;
use procs::{Broker, Role, Service};
use publish::Publisher;
use receiver::{Endpoint, Receiver, ATTEMPT_HEADER};

const TOKEN: &str = "soak-token-not-for-production";
/// Every soak policy times an attempt out after this long; the `hang` endpoint holds its first attempt longer.
const ATTEMPT_TIMEOUT_MS: u64 = 2_000;
const HANG: Duration = Duration::from_secs(5);
const MAX_ATTEMPTS: u32 = 3;
/// The longest the log check waits for the indexer to catch up (it trails Kafka by a batch, ~0.2 s, when healthy).
const LOG_LAG_LIMIT: Duration = Duration::from_secs(30);

#[derive(clap::Args, Clone)]
pub struct SoakArgs {
    /// Events to publish through the API. Each goes to 1-3 endpoints (1.62 deliveries per event on average).
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub events: u64,
    /// Publishing rate, events per second.
    #[arg(long, default_value_t = 400, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub rate: u64,
    /// A fault to inject; repeat the flag for several. They are applied in turn, one every --fault-every-s, for as
    /// long as events are being published, and each at least once.
    #[arg(long = "fault", value_enum)]
    pub faults: Vec<FaultKind>,
    /// Every fault the broker can take, in turn: hookline's processes always; the injected errors on the embedded
    /// broker; the node faults with --kafka-cluster.
    #[arg(long, conflicts_with = "faults")]
    pub all_faults: bool,
    /// Run on this Kafka cluster (HOST:PORT,...) instead of the embedded broker, under a fresh topic prefix; only
    /// hookline's processes take faults.
    #[arg(long, conflicts_with = "kafka_cluster")]
    pub brokers: Option<String>,
    /// Run on the Apache Kafka cluster that `scripts/kafka start` describes in this file (its JSON line, also in
    /// DIR/cluster.json), under a fresh topic prefix, with its nodes as fault targets (kill-broker, stop-broker,
    /// kill-controller, restart-cluster).
    #[arg(long, value_name = "FILE")]
    pub kafka_cluster: Option<PathBuf>,
    /// Seconds from the end of one fault to the start of the next (and before the first).
    #[arg(long, default_value = "3", value_parser = crate::cmd::numbers::seconds_up_to(3600.0))]
    pub fault_every_s: Duration,
    /// Dispatcher processes sharing the work.
    #[arg(long, default_value_t = 2, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=16))]
    pub dispatchers: usize,
    /// `dispatcher.max_in_flight` of each dispatcher: the window a crash may redo.
    #[arg(long, default_value_t = 1_000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub max_in_flight: usize,
    /// Partitions of every topic.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(i32).range(1..=256))]
    pub partitions: i32,
    /// The services' consumer-group session timeout (`kafka.session_timeout_ms`).
    #[arg(long, default_value_t = 6_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub session_timeout_ms: u64,
    /// Give up waiting for final states this long after the last event is published.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub settle_timeout_s: u64,
    /// Where hookline-ingest, hookline-dispatcher and hookline-retry-scheduler are (default: next to `hookline`).
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    /// Pass the services' logs through (info level).
    #[arg(long)]
    pub verbose: bool,
}

pub fn run(args: SoakArgs) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let report = rt.block_on(soak(args))?;
    let passed = report["passed"] == json!(true);
    println!("{report}");
    rt.shutdown_timeout(Duration::from_secs(2));
    Ok(if passed { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// The endpoints an event of type index `t` (0..50) goes to. Every event reaches `ok`; 20% also `slow`, 20%
/// `flaky`, 10% `failing`, 10% `gone` and 2% `hang`.
fn endpoints_for(t: u64) -> Vec<Endpoint> {
    let mut v = vec![Endpoint::Ok];
    v.push(match t {
        0..=9 => Endpoint::Slow,
        10..=19 => Endpoint::Flaky,
        20..=24 => Endpoint::Failing,
        25..=29 => Endpoint::Gone,
        30 => Endpoint::Hang,
        _ => return v,
    });
    v
}

fn event_type(i: u64) -> String {
    format!("soak.t{}", i % 50)
}

/// Standard, with short waits so retries happen within the run, and the attempt number in a header so the
/// receiver can tell a redelivered attempt from the next one.
fn soak_policy() -> anyhow::Result<String> {
    let mut p = hookline_core::policy::builtin("standard").expect("built-in profile");
    p.name = "soak".into();
    p.attempt.timeout_ms = ATTEMPT_TIMEOUT_MS;
    p.schedule.waits_s = Some(vec![1.0; MAX_ATTEMPTS as usize - 1]);
    p.schedule.max_attempts = Some(MAX_ATTEMPTS);
    p.schedule.exponential = None;
    p.schedule.jitter = None;
    p.schedule.max_window_s = None;
    p.request.attempt_header = Some(ATTEMPT_HEADER.into());
    Ok(toml::to_string(&p)?)
}

fn free_port() -> anyhow::Result<u16> {
    // The port is handed to ingest, which binds it with SO_REUSEADDR; it is reused across ingest restarts.
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The faults of the run: `--all-faults` keeps those the broker can take; a `--fault` it cannot take is an error
/// naming the flag.
fn chosen_faults(args: &SoakArgs, broker: &Brokers) -> anyhow::Result<Vec<FaultKind>> {
    let all = <FaultKind as clap::ValueEnum>::value_variants();
    if args.all_faults {
        return Ok(all.iter().copied().filter(|f| broker.takes(f.target())).collect());
    }
    for f in &args.faults {
        match f.target() {
            t if broker.takes(t) => {}
            Target::Cluster => anyhow::bail!("--fault {}: needs --kafka-cluster (an Apache Kafka cluster of scripts/kafka)", f.name()),
            _ => anyhow::bail!(
                "--fault {}: needs the embedded broker (it is injected there; not with --brokers or --kafka-cluster)",
                f.name()
            ),
        }
    }
    Ok(args.faults.clone())
}

async fn soak(args: SoakArgs) -> anyhow::Result<Value> {
    anyhow::ensure!(args.dispatchers >= 1, "--dispatchers: at least 1");
    anyhow::ensure!(args.rate >= 1, "--rate: at least 1 event per second");
    let t0 = Instant::now();
    let hookline = std::env::current_exe().context("locating the hookline executable")?;
    let bin_dir = procs::bin_dir(args.bin_dir.as_deref())?;

    let broker = match (&args.kafka_cluster, &args.brokers) {
        (Some(file), _) => Brokers::Cluster(cluster::Cluster::from_file(file)?),
        (None, Some(_)) => Brokers::External,
        (None, None) => Brokers::Embedded(None),
    };
    let faults = chosen_faults(&args, &broker)?;
    let broker = match broker {
        Brokers::Embedded(None) => Brokers::Embedded(Some(Broker::start(&hookline, args.partitions, args.verbose)?)),
        other => other,
    };
    let bootstrap = match (&broker, &args.brokers) {
        (Brokers::Embedded(b), _) => b.as_ref().map(|b| b.bootstrap_servers.clone()).unwrap_or_default(),
        (Brokers::Cluster(c), _) => c.bootstrap_servers.clone(),
        (Brokers::External, brokers) => brokers.clone().unwrap_or_default(),
    };
    let mut config = Config::dev(&bootstrap, args.partitions, TOKEN);
    if !matches!(broker, Brokers::Embedded(_)) {
        // Topics under a fresh prefix, groups of their own, and a real broker's settings, as `hookline dev --brokers`.
        crate::cmd::dev::on_cluster(&mut config, &bootstrap);
        crate::cmd::dev::create_topics(&mut config, 1).await?;
    }
    config.kafka.session_timeout_ms = args.session_timeout_ms;
    config.dispatcher.max_in_flight = args.max_in_flight;
    config.ingest.listen_addr = format!("127.0.0.1:{}", free_port()?).parse()?;
    // Lifecycle lines only at info (nothing per delivery): to the terminal with --verbose, else to a file per service.
    config.telemetry.log_level = "info".into();
    let dir = std::env::temp_dir().join(format!("hookline-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    // The delivery log beside the config: it outlives ingest's restarts (kill-ingest), not the run.
    config.log.sqlite_path = dir.join("delivery-log.sqlite3");
    let config_path = dir.join("config.toml");
    std::fs::write(&config_path, toml::to_string(&config)?)?;
    let service = |role: Role, name: String| Service::new(role, name, &bin_dir, &config_path, args.verbose);

    let receiver = Receiver::start(HANG).await?;
    let topics = Topics::new(config.kafka.topic_prefix.clone());
    let mut fleet = Fleet {
        broker,
        deliveries_topic: topics.deliveries().to_owned(),
        kafka: config.kafka.clone(),
        ingest: service(Role::Ingest, "ingest".into())?,
        dispatchers: (0..args.dispatchers).map(|k| service(Role::Dispatcher, format!("dispatcher-{k}"))).collect::<Result<_, _>>()?,
        scheduler: service(Role::RetryScheduler, "retry-scheduler".into())?,
        session_timeout: Duration::from_millis(args.session_timeout_ms),
        term_limit: Duration::from_millis(config.dispatcher.drain_timeout_ms.max(config.retry_scheduler.drain_timeout_ms))
            + Duration::from_secs(10),
        unexpected_exits: Vec::new(),
    };
    fleet.ingest.start()?;
    let publisher = Publisher::new(config.ingest.listen_addr, TOKEN);
    publisher.wait_ready(Duration::from_secs(60)).await?;

    let policy = soak_policy()?;
    let mut endpoint_of = std::collections::HashMap::new();
    for e in Endpoint::ALL {
        let types: Vec<String> = (0..50).filter(|t| endpoints_for(*t).contains(&e)).map(|t| format!("soak.t{t}")).collect();
        let body =
            json!({"url": receiver.url(e), "event_types": types, "policy_toml": policy, "description": format!("soak {}", e.path())});
        let id = publisher.subscribe(body).await?;
        endpoint_of.insert(id, e);
    }
    fleet.scheduler.start()?;
    for d in &mut fleet.dispatchers {
        d.start()?;
    }

    let stop = CancellationToken::new();
    let ledger = Ledger::start(&config, &topics, endpoint_of, receiver.recorded.clone(), stop.clone()).await?;

    let run_tag = format!("soak{}", std::process::id());
    let publishing = tokio::spawn(publisher.clone().publish_all(args.events, args.rate, run_tag.clone(), ledger.clone()));
    let progress = tokio::spawn(progress(ledger.clone(), t0, stop.clone()));

    // Faults hit a running pipeline: the first one waits until deliveries are flowing (the group has formed).
    anyhow::ensure!(ledger.wait_requests(1, Duration::from_secs(60)).await, "no delivery reached the receiver within 60 s of publishing");
    // Faults, in turn, while events are being published; each kind at least once.
    let mut schedule = Vec::new();
    let every = args.fault_every_s;
    let mut turn = 0usize;
    while !faults.is_empty() && (turn < faults.len() || !publishing.is_finished()) {
        tokio::time::sleep(every).await;
        fleet.revive()?;
        let fault = faults[turn % faults.len()];
        schedule.push(fleet.apply(fault, turn / faults.len(), t0, &ledger).await?);
        turn += 1;
    }
    let published = publishing.await.context("the publisher")?;
    let publish_done_s = t0.elapsed().as_secs_f64();

    // Settle: every accepted delivery reaches a final state, or the limit passes.
    let settle_deadline = Instant::now() + Duration::from_secs(args.settle_timeout_s);
    loop {
        fleet.revive()?;
        if ledger.missing() == 0 || Instant::now() >= settle_deadline {
            break;
        }
        ledger.wait_change(Duration::from_millis(500)).await;
    }
    let settled_s = t0.elapsed().as_secs_f64();
    // Then quiet: late copies (a thawed zombie, a redelivery) still count as duplicates.
    ledger.wait_quiet(Duration::from_secs(2), Duration::from_secs(30)).await;
    // The delivery log, while ingest (and its indexer) still runs: every finished delivery, in its final state.
    fleet.revive()?;
    let log = log_check::check(&config.log, ledger.finished_deliveries(), LOG_LAG_LIMIT).await.context("reading the delivery log store")?;

    let mut final_exits = Vec::new();
    for s in fleet.services() {
        if s.pid().is_some() {
            let code = s.terminate(Duration::from_secs(20)).await.map(|st| st.code()).unwrap_or(None);
            final_exits.push(json!({"service": s.name, "exit_code": code}));
        }
    }
    stop.cancel();
    progress.abort();
    let t = ledger.tally();
    let rebalances: u64 = schedule.iter().filter_map(|l| faults.iter().find(|f| l["fault"] == f.name())).map(|f| f.rebalances()).sum();
    // What a crash may redo: per rebalance (which revokes every member's partitions), each dispatcher's window of
    // work taken and not yet committed, `max_in_flight`. Work finished but not yet committed counts against the
    // same window in practice; a redone attempt also redoes the retry it scheduled, which a later window covers.
    let duplicate_bound = rebalances * (args.dispatchers * args.max_in_flight) as u64;
    let term_exits_ok = schedule.iter().chain(final_exits.iter()).all(|l| l.get("exit_code").is_none_or(|c| c == &json!(0)));
    let passed = t.missing == 0
        && log.missing == 0
        && t.unexpected_final == 0
        && t.missing_dead_letters == 0
        && term_exits_ok
        && fleet.unexpected_exits.is_empty()
        && t.duplicates <= duplicate_bound;
    let _ = std::fs::remove_dir_all(&dir);
    let report = json!({
        "test": "soak",
        "passed": passed,
        "events_published": args.events,
        "events_accepted": published.accepted,
        "events_rejected": published.rejected,
        "publish_retries": published.retries,
        "accepted": t.expected,
        "final_states": t.final_states,
        "missing": t.missing,
        "log_missing": log.missing,
        "log_lag_s": round1(log.lag.as_secs_f64()),
        "examples_log_missing": log.examples,
        "unexpected_final": t.unexpected_final,
        "duplicates": t.duplicates,
        "duplicate_finals": t.duplicate_finals,
        "duplicates_by_attempt": t.duplicates_by_attempt,
        "requests": t.requests,
        "dead_letters": t.dead_letters,
        "missing_dead_letters": t.missing_dead_letters,
        "faults": schedule,
        "unexpected_exits": fleet.unexpected_exits.iter().map(|(n, s)| json!({"service": n, "status": s})).collect::<Vec<_>>(),
        "final_exits": final_exits,
        "restarts": fleet.services().map(|s| (s.name.clone(), json!(s.starts.saturating_sub(1)))).collect::<serde_json::Map<_, _>>(),
        "rebalances": rebalances,
        "duplicate_bound": duplicate_bound,
        "max_copies_of_an_attempt": t.max_copies,
        "dispatchers": args.dispatchers,
        "max_in_flight": args.max_in_flight,
        "partitions": args.partitions,
        "session_timeout_ms": args.session_timeout_ms,
        "broker": match &fleet.broker {
            Brokers::Embedded(_) => "embedded",
            Brokers::Cluster(_) => "apache-kafka",
            Brokers::External => "external",
        },
        "replication_factor": config.kafka.replication_factor,
        "seconds_publish": round1(publish_done_s),
        "seconds_to_settle": round1(settled_s - publish_done_s),
        "seconds_total": round1(t0.elapsed().as_secs_f64()),
        "examples_missing": t.examples_missing,
    });
    Ok(report)
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

async fn progress(ledger: Arc<Ledger>, t0: Instant, stop: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let t = ledger.tally();
        eprintln!(
            "soak: {:>5.1}s  accepted {} events  deliveries final {}/{}  requests {}  attempts {}  pending {}",
            t0.elapsed().as_secs_f64(),
            ledger.accepted_events.load(Ordering::Relaxed),
            t.expected - t.missing,
            t.expected,
            t.requests,
            ledger.attempt_records.load(Ordering::Relaxed),
            ledger.pending_by_endpoint(),
        );
    }
}
