//! `hookline bench SCENARIO`: runs the real ingest, dispatcher and retry-scheduler against a broker reached over
//! TCP (the embedded mock cluster, or `--brokers`), with a local receiver, and reports what the issue asks for.
//!
//! Process layout (see docs/benchmarks.md): the broker, ingest, dispatcher and retry-scheduler each run as a
//! child process (`hookline bench --serve ROLE`, this same executable), so CPU and RSS are exact per process.
//! The parent holds the driver (event producer, Kafka readers) and the receiver; the receiver runs on its own
//! runtime whose threads are named `bench-recv`, the raw baseline client on one named `bench-raw`, so their CPU
//! is read per thread from `/proc/self/task`. Progress and tables go to stderr, one JSON line to stdout.

mod cluster;
mod fanout;
mod isolation;
mod latency;
mod list;
mod log;
mod memory;
mod policies;
mod quota;
mod receiver;
mod repeat;
mod retry_precision;
mod scale;
mod split;
mod stats;
mod steady;
mod subscriptions;
mod throughput;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

/// Where the pipeline's delivery log is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogStore {
    /// A SQLite file written by the ingest process (the default store).
    Sqlite,
    /// A scratch database on `--postgres-url`'s server (created, then dropped): the database's CPU is its own
    /// process's, as the broker's is.
    Postgres,
}

/// `bench log`: how the written ids are spread over the key space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogIds {
    Sequential,
    Hashed,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    Throughput,
    Latency,
    RetryPrecision,
    Isolation,
    Memory,
    Fanout,
    List,
    /// The delivery log's store (not part of `all`).
    Log,
    ScaleOut,
    /// RSS over a long run with no `/metrics` scrape (not part of `all`).
    Steady,
    /// RSS per subscription held and the fan-out's CPU per event, 16 vs 200,000 subscriptions (not part of `all`).
    Subscriptions,
    /// A quiet tenant's publish latency while another floods, with and without a publish quota (not part of `all`).
    PublishQuota,
    All,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Throughput => "throughput",
            Scenario::Latency => "latency",
            Scenario::RetryPrecision => "retry-precision",
            Scenario::Isolation => "isolation",
            Scenario::Memory => "memory",
            Scenario::Fanout => "fanout",
            Scenario::List => "list",
            Scenario::Log => "log",
            Scenario::ScaleOut => "scale-out",
            Scenario::Steady => "steady",
            Scenario::Subscriptions => "subscriptions",
            Scenario::PublishQuota => "publish-quota",
            Scenario::All => "all",
        }
    }
}

#[derive(clap::Args, Clone)]
pub struct BenchArgs {
    /// throughput, latency, retry-precision, isolation, memory, fanout, list, or all (each in turn, one JSON line at
    /// the end); log (the delivery log's store), scale-out (a dispatcher joins under load, then one leaves) and steady
    /// (each service's RSS over a long run with no /metrics scrape; use --duration-s 600) are not part of all, nor is
    /// subscriptions (RSS per subscription and the fan-out's CPU per event through the services, 16 vs 200,000), nor
    /// publish-quota (a quiet tenant's publish latency while another floods, with and without a quota).
    #[arg(value_enum, required_unless_present = "serve")]
    scenario: Option<Scenario>,
    /// A real Kafka cluster (`host:port,...`) instead of the embedded mock broker. The topics are created under a
    /// fresh prefix and deleted afterwards.
    #[arg(long)]
    brokers: Option<String>,
    /// Replication factor of the topics created on `--brokers`.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i32).range(1..=16))]
    replication_factor: i32,
    /// Partitions of every topic.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(i32).range(1..=256))]
    partitions: i32,
    /// throughput: events to publish (default: as many as the pipeline takes in --duration-s).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    events: Option<u64>,
    /// throughput, latency, scale-out and steady: seconds of publishing.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    duration_s: u64,
    /// throughput: subscriptions each event fans out to.
    #[arg(long, default_value_t = 4, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1000))]
    fanout: usize,
    /// throughput, isolation: concurrent requests in total (split across the subscriptions' lanes); the raw
    /// baseline uses the same number.
    #[arg(long, default_value_t = 64, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=10_000))]
    concurrency: usize,
    /// throughput: the receiver's URLs name this machine's host name (which must resolve to loopback) instead of
    /// the IP literal 127.0.0.1, so the dispatcher resolves it (DNS cache, then the system resolver).
    #[arg(long)]
    named_host: bool,
    /// throughput: the dispatcher's `egress.dns_cache_ttl_s` (0 resolves on every attempt; default: the config's).
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=86_400))]
    dns_cache_ttl_s: Option<u64>,
    /// latency: leave out the split (its readers of `deliveries` and `attempts` fetch from the same broker, which loads it).
    #[arg(long)]
    no_split: bool,
    /// throughput: seconds the raw HTTP baseline runs.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    raw_s: u64,
    /// throughput: records of the Kafka floor (a consumer and producer with the services' settings, no hookline
    /// logic) after the raw baseline; 0 leaves it out.
    #[arg(long, default_value_t = 16_000, value_parser = clap::value_parser!(u64).range(0..=10_000_000))]
    kafka_floor_records: u64,
    /// throughput, isolation: deliveries published but not yet received, at most (keeps the mock broker's
    /// ~5 MiB partitions from evicting unread records).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    window: Option<u64>,
    /// latency, scale-out, steady: events per second.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    rate: u64,
    /// retry-precision: the longest wait exercised (the ladder goes 1 s … 5 min; `all` keeps it short).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    max_wait_s: u64,
    /// retry-precision: events per wait value.
    #[arg(long, default_value_t = 60, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100_000))]
    per_wait: usize,
    /// isolation: seconds of publishing in the first all-healthy run (the other four runs of A B A C A publish the
    /// same events).
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    isolation_s: u64,
    /// Every scenario: runs it this many times and reports each figure with its min / median / max (the target is
    /// met only if every repeat meets it). With --against: this many pairs.
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100))]
    repeat: usize,
    /// A/B: another hookline executable whose services (ingest, dispatcher, retry-scheduler; the broker stays this
    /// build's) run the same scenario, interleaved with this build's (this, other, other, this, …, --repeat pairs);
    /// each figure is reported for both builds with its ratio (this ÷ other) per pair, min and median. Not for the
    /// in-process scenarios (fanout, list, log); `all` runs those once per repeat, unpaired.
    #[arg(long, value_name = "PATH")]
    against: Option<std::path::PathBuf>,
    /// Set by the --against driver: the executable the services of a run start from (default: this one).
    #[arg(skip)]
    services_exe: Option<std::path::PathBuf>,
    /// memory: deliveries held in flight.
    #[arg(long, default_value_t = 10_000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    in_flight: usize,
    /// fanout, list, subscriptions: subscriptions in the large table (across up to 10,000 tenants; fanout compares with 16).
    #[arg(long, default_value_t = 200_000)]
    fanout_subscriptions: usize,
    /// log: attempts written to each store (two per delivery).
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(2..=100_000_000))]
    log_attempts: u64,
    /// log: queries of each kind timed on the filled store.
    #[arg(long, default_value_t = 300, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100_000))]
    log_queries: usize,
    /// log: also measure PostgreSQL on this server (`postgresql://user@host:port/postgres`); a scratch database is
    /// created there and dropped afterwards.
    #[arg(long, value_name = "URL")]
    postgres_url: Option<String>,
    /// The pipeline scenarios' delivery log: `sqlite` (a file of the ingest process, the default store) or
    /// `postgres` (a scratch database on --postgres-url, created and dropped).
    #[arg(long, value_enum, default_value_t = LogStore::Sqlite)]
    log_store: LogStore,
    /// The pipeline scenarios, SQLite: run the delivery log's indexer inside ingest (`log.run_indexer = true`, as
    /// `hookline dev` and a default install do) instead of as a process of its own (`hookline log index` beside
    /// ingest, on the same file). Apart, all the log's CPU (its Kafka reading too) is the log's, and ingest's is the
    /// fan-out's and the API's. Older figures in docs/benchmarks.md were measured with the indexer in ingest.
    #[arg(long)]
    log_in_ingest: bool,
    /// log: measure only this backend (`sqlite`, or `postgres`, which needs --postgres-url).
    #[arg(long, value_parser = ["sqlite", "postgres"])]
    log_only: Option<String>,
    /// log: the ids written: `sequential` (`evt_0000000001`…, each key appended at its index's end) or `hashed`
    /// (spread over the key space, as the delivery ids hookline makes and most event ids are).
    #[arg(long, value_enum, default_value_t = LogIds::Sequential)]
    log_ids: LogIds,
    /// A librdkafka property for every client of the run (the services', the driver's, the Kafka floor's), as
    /// `kafka.properties` takes it: `--kafka-property compression.type=none`. Repeatable; hookline's protected
    /// properties are refused as the config refuses them.
    #[arg(long = "kafka-property", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    kafka_property: Vec<(String, String)>,
    /// A key of the services' config for this run, as the config file names it (dotted) with a TOML value:
    /// `--set log.batch_max_records=10000`, `--set 'dispatcher.name="x"'` (a value that is not TOML is taken as a
    /// string). Applied after the scenario's own settings, so it wins; with `--against`, the other build gets it too.
    /// Repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    set: Vec<(String, String)>,
    /// Internal: run one service as a child process (`broker`, `ingest`, `dispatcher`, `retry-scheduler`).
    #[arg(long, hide = true)]
    serve: Option<String>,
    /// Internal: the child's configuration (TOML).
    #[arg(long, hide = true)]
    config_toml: Option<String>,
}

pub fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    if let Some(role) = &args.serve {
        // The parent passes the config in the environment (a multi-line argument trips up tools that read
        // `/proc/PID/cmdline`, heaptrack among them); `--config-toml` still works.
        let toml = args.config_toml.clone().or_else(|| std::env::var(cluster::CONFIG_ENV).ok()).unwrap_or_default();
        return cluster::serve(role, &toml);
    }
    let scenario = args.scenario.expect("clap requires a scenario");
    if scenario != Scenario::All && !repeat::supports_against(scenario) && args.against.is_some() {
        anyhow::bail!(
            "--against: {} runs in-process (no services to swap between builds); use it with throughput, latency, \
             retry-precision, isolation, memory, scale-out, steady, subscriptions or all",
            scenario.name()
        );
    }
    if !args.kafka_property.is_empty() {
        let settings = hookline_kafka::KafkaSettings { properties: args.kafka_property.iter().cloned().collect(), ..Default::default() };
        settings.validate().map_err(|e| anyhow::anyhow!("--kafka-property: {e}"))?;
    }
    cluster::apply_sets(&mut hookline_service::Config::default(), &args.set)?;
    // Before anything starts: the other build must exist and answer as hookline.
    let other = args.against.as_deref().map(repeat::check_against).transpose()?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name("bench-main").enable_all().build()?;
    let started = Instant::now();
    let result = rt.block_on(async {
        let machine = machine(&args);
        let list: Vec<Scenario> = match scenario {
            Scenario::All => vec![
                Scenario::Throughput,
                Scenario::Latency,
                Scenario::RetryPrecision,
                Scenario::Isolation,
                Scenario::Memory,
                Scenario::Fanout,
                Scenario::List,
            ],
            s => vec![s],
        };
        let mut all: Vec<(String, Value)> = Vec::new();
        let mut met_all = true;
        for s in list {
            eprintln!("\n━━ hookline bench {} ━━", s.name());
            let t = Instant::now();
            let (mut obj, met) = repeat::run(&args, s, other.as_ref()).await?;
            met_all &= met;
            obj.insert("seconds".into(), json!(round(t.elapsed().as_secs_f64(), 1)));
            let mut o = Map::new();
            o.insert("scenario".into(), json!(s.name()));
            o.extend(obj);
            all.push((s.name().into(), Value::Object(o)));
        }
        // Keys in the order the issue gives them: scenario first, machine last (serde_json's map would sort them).
        let line = if scenario == Scenario::All {
            let mut pairs = vec![("scenario".to_owned(), json!("all").to_string())];
            pairs.extend(all.into_iter().map(|(k, v)| (k, ordered(v))));
            pairs.push(("seconds".into(), json!(round(started.elapsed().as_secs_f64(), 1)).to_string()));
            pairs.push(("machine".into(), machine.to_string()));
            object(pairs)
        } else {
            let mut o = all.into_iter().next().map(|(_, v)| v).unwrap_or(Value::Null);
            if let Value::Object(m) = &mut o {
                m.insert("machine".into(), machine);
            }
            ordered(o)
        };
        eprintln!("\nall targets met: {}  ({:.0} s)", if met_all { "yes" } else { "no" }, started.elapsed().as_secs_f64());
        println!("{line}");
        anyhow::Ok(())
    });
    rt.shutdown_timeout(Duration::from_secs(5));
    result?;
    Ok(ExitCode::SUCCESS)
}

/// One run of one scenario (`All` is expanded by the caller).
async fn one(args: &BenchArgs, s: Scenario) -> anyhow::Result<(Map<String, Value>, bool)> {
    match s {
        Scenario::Throughput => throughput::run(args).await,
        Scenario::Latency => latency::run(args).await,
        Scenario::RetryPrecision => retry_precision::run(args).await,
        Scenario::Isolation => isolation::run(args).await,
        Scenario::Memory => memory::run(args).await,
        Scenario::Fanout => fanout::run(args).await,
        Scenario::List => list::run(args).await,
        Scenario::Log => log::run(args).await,
        Scenario::ScaleOut => scale::run(args).await,
        Scenario::Steady => steady::run(args).await,
        Scenario::Subscriptions => subscriptions::run(args).await,
        Scenario::PublishQuota => quota::run(args).await,
        Scenario::All => anyhow::bail!("`all` is expanded into its scenarios before they run"),
    }
}

/// A scenario object as JSON text with `scenario` first and `machine` last.
fn ordered(v: Value) -> String {
    let Value::Object(mut m) = v else { return v.to_string() };
    let mut pairs = Vec::new();
    if let Some(s) = m.remove("scenario") {
        pairs.push(("scenario".to_owned(), s.to_string()));
    }
    let machine = m.remove("machine");
    pairs.extend(m.into_iter().map(|(k, v)| (k, v.to_string())));
    if let Some(mc) = machine {
        pairs.push(("machine".to_owned(), mc.to_string()));
    }
    object(pairs)
}

fn object(pairs: Vec<(String, String)>) -> String {
    let body: Vec<String> = pairs.into_iter().map(|(k, v)| format!("{}:{v}", Value::String(k))).collect();
    format!("{{{}}}", body.join(","))
}

pub(crate) fn round(v: f64, digits: i32) -> f64 {
    let m = 10f64.powi(digits);
    (v * m).round() / m
}

/// What the numbers were measured on.
fn machine(args: &BenchArgs) -> Value {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_owned())
        .unwrap_or_default();
    let mem_kb: u64 = read("/proc/meminfo")
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let os = read("/etc/os-release")
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim_matches('"').to_owned())
        .unwrap_or_default();
    json!({
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu_model": model,
        "mem_gb": round(mem_kb as f64 / 1024.0 / 1024.0, 1),
        "os": os,
        "kernel": read("/proc/sys/kernel/osrelease").trim(),
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
        "hookline": env!("CARGO_PKG_VERSION"),
        "broker": match &args.brokers {
            Some(b) => format!("kafka {b}"),
            None => "embedded mock cluster (librdkafka), over TCP".into(),
        },
        "partitions": args.partitions,
        "kafka_properties": args.kafka_property.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
        "set": args.set.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
    })
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.trim().to_owned())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}

/// One row of a result table: name, value, target text, whether met (None: no target).
pub(crate) struct Row {
    pub name: &'static str,
    pub value: String,
    pub target: String,
    pub met: Option<bool>,
}

pub(crate) fn row(name: &'static str, value: impl std::fmt::Display, target: impl std::fmt::Display, met: Option<bool>) -> Row {
    Row { name, value: value.to_string(), target: target.to_string(), met }
}

pub(crate) fn print_table(title: &str, rows: &[Row]) {
    eprintln!("\n  {title:<34} {:>14}  {:<14} ", "value", "target");
    eprintln!("  {}", "─".repeat(70));
    for r in rows {
        let verdict = match r.met {
            Some(true) => "met",
            Some(false) => "MISSED",
            None => "",
        };
        eprintln!("  {:<34} {:>14}  {:<14} {}", r.name, r.value, r.target, verdict);
    }
}
