//! `hookline dev`: the whole pipeline in one process on the embedded broker, with a local receiver that prints
//! what it gets. `--demo N` also creates subscriptions on several profiles, publishes N events, shows progress
//! and ends with one JSON line of totals (`lost` must be 0).

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use bytes::Bytes;
use hookline_core::model::AttemptRecord;
use hookline_core::policy::SignatureScheme;
use hookline_core::sign;
use hookline_kafka::mock::DevBroker;
use hookline_kafka::Topics;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use prost::Message as _;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

const DEV_TOKEN: &str = "dev-token-not-for-production";
/// The secret the printed commands give their subscriptions, so the dev receiver can check every signature.
const DEV_SECRET: &str = "whsec_aG9va2xpbmUtZGV2LXNlY3JldC1ub3QtZm9yLXByb2Q=";
/// A tracing target the services log the egress allow-list warnings under; dev shows them in its banner instead.
const EGRESS_WARNINGS_TARGET: &str = "hookline::egress_allow";

#[derive(clap::Args)]
pub struct DevArgs {
    /// Create demo subscriptions, publish this many events, report totals and exit.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    demo: Option<u32>,
    /// Port of the HTTP API on 127.0.0.1 (0 picks a free one; `ingest.listen_addr` is not used in dev mode).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Run against an existing Kafka cluster (`HOST:PORT[,HOST:PORT…]`) instead of the embedded broker: its topics
    /// are created under a fresh prefix (`<kafka.topic_prefix>dev-<pid>-<random>.`) with consumer groups named after
    /// it, and left in place when dev mode stops. The config's `[kafka]` security settings apply.
    #[arg(long, value_name = "HOST:PORT")]
    brokers: Option<String>,
    /// Partitions of every topic on the embedded broker (sets `kafka.partitions` and `kafka.event_partitions`).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(i32).range(1..=256))]
    partitions: i32,
    /// Log filter (`warn`, `info`, `debug`, ...); default: the config's `telemetry.log_level` (`warn` in dev).
    #[arg(long)]
    log: Option<String>,
    /// Seconds the demo waits for every delivery to reach a final state.
    #[arg(long, default_value_t = 90, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    demo_timeout_s: u64,
    /// A config file (TOML), read as the services read it but over dev mode's defaults (embedded broker, dev token,
    /// loopback receivers allowed); `HOOKLINE_<SECTION>__<KEY>` variables override both. E.g. `[notify]` to try
    /// owner e-mail. `kafka.bootstrap_servers` is always the embedded broker, or `--brokers`.
    #[arg(long, env = "HOOKLINE_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
}

pub fn run(args: DevArgs) -> anyhow::Result<ExitCode> {
    // The same reading as the services, so what they would reject is rejected here too, before anything starts.
    let base = hookline_service::Config::dev("127.0.0.1:9092", args.partitions, DEV_TOKEN);
    let mut config = hookline_service::Config::load_over(Some(&base), args.config.as_deref(), std::env::vars())?;
    if let Some(level) = &args.log {
        config.telemetry.log_level = level.clone();
        config.validate()?;
    }
    // The delivery log's own temp file (unless the config file names one): removed with the broker below.
    let temp_log =
        (config.log.sqlite_path == base.log.sqlite_path).then(|| base.log.sqlite_path.parent().map(std::path::Path::to_path_buf)).flatten();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let broker = match &args.brokers {
        None => {
            let topics = Topics::new(config.kafka.topic_prefix.clone());
            let broker = DevBroker::start(&topics, config.kafka.partitions, config.kafka.event_partitions)?;
            config.kafka.bootstrap_servers = broker.bootstrap_servers();
            Some(broker)
        }
        Some(brokers) => {
            on_cluster(&mut config, brokers);
            config.validate()?;
            rt.block_on(create_topics(&mut config, base.kafka.replication_factor))?;
            None
        }
    };
    let result = rt.block_on(dev(args, config));
    // Every Kafka client lives in the runtime: stop them all before the broker goes away.
    rt.shutdown_timeout(Duration::from_secs(5));
    drop(broker);
    if let Some(dir) = temp_log {
        let _ = std::fs::remove_dir_all(dir);
    }
    result
}

/// `--brokers`: the cluster, a fresh topic prefix under the config's, consumer groups named after it, and the
/// settings of a real broker (which answers a fetch as soon as records arrive, and offsets by time).
pub(crate) fn on_cluster(config: &mut hookline_service::Config, brokers: &str) {
    let prefix = format!("{}dev-{}-{:06x}.", config.kafka.topic_prefix, std::process::id(), rand::random::<u32>() >> 8);
    config.kafka.bootstrap_servers = brokers.to_owned();
    config.kafka.topic_prefix = prefix.clone();
    config.ingest.group_id = format!("{prefix}ingest");
    config.dispatcher.group_id = format!("{prefix}dispatcher");
    config.retry_scheduler.group_id = format!("{prefix}retry-scheduler");
    config.log.group_id = format!("{prefix}log-indexer");
    config.kafka.fetch_wait_max_ms = hookline_kafka::KafkaSettings::default().fetch_wait_max_ms;
    config.kafka.offsets_by_time = true;
    config.kafka.check_acls_at_start = true;
}

/// Creates the topics of `--brokers` and waits until the cluster shows every one with leaders: the services stop
/// at start on a topic their broker does not know yet. Unless the config set another replication factor than dev
/// mode's (`dev_replication`, 1), a cluster of three or more brokers gets 3: its `min.insync.replicas` may well be
/// 2, which a topic of one replica can never satisfy.
pub(crate) async fn create_topics(config: &mut hookline_service::Config, dev_replication: i32) -> anyhow::Result<()> {
    let limit = Duration::from_secs(30);
    let admin = hookline_kafka::client::admin(&config.kafka, "hookline-dev")?;
    if config.kafka.replication_factor == dev_replication {
        let md = tokio::task::block_in_place(|| admin.inner().fetch_metadata(None, Duration::from_secs(10)))
            .map_err(|e| anyhow::anyhow!("reaching the Kafka cluster at {}: {e}", config.kafka.bootstrap_servers))?;
        if md.brokers().len() >= 3 {
            config.kafka.replication_factor = 3;
        }
    }
    for (name, result) in super::topics::create_each(config, limit).await? {
        result.map_err(|e| anyhow::anyhow!("creating topic {name} on {}: {e}", config.kafka.bootstrap_servers))?;
    }
    super::topics::wait_for_leaders(config, limit).await
}

/// The warning box, sized to its longest line.
fn banner(warnings: &[String], cluster: Option<(&str, &str)>) -> String {
    let mut lines = match cluster {
        None => vec![
            "hookline dev: EMBEDDED IN-MEMORY BROKER (librdkafka mock cluster).".to_owned(),
            "For trying hookline only: nothing persists, no compaction, tiny partitions.".to_owned(),
            "Never run this in production.".to_owned(),
        ],
        Some((brokers, prefix)) => vec![
            format!("hookline dev: on the Kafka cluster at {brokers}, topics under {prefix}"),
            "(left in place when dev mode stops). Dev token, loopback receivers allowed:".to_owned(),
            "never run this in production.".to_owned(),
        ],
    };
    if !warnings.is_empty() {
        lines.push(String::new());
        lines.extend(warnings.iter().map(|w| format!("- {w}")));
    }
    // Long warnings are wrapped at word boundaries so the box stays readable in an 80-column terminal.
    let mut wrapped = Vec::new();
    for line in lines {
        let mut cur = String::new();
        for word in line.split(' ') {
            if !cur.is_empty() && cur.chars().count() + 1 + word.chars().count() > 76 {
                wrapped.push(std::mem::take(&mut cur));
                cur.push_str("  ");
            }
            if !cur.is_empty() && !cur.ends_with("  ") {
                cur.push(' ');
            }
            cur.push_str(word);
        }
        wrapped.push(cur);
    }
    let width = wrapped.iter().map(|l| l.chars().count()).max().unwrap_or(0);
    let mut out = format!("\n  ┌{}┐\n", "─".repeat(width + 2));
    for l in &wrapped {
        out.push_str(&format!("  │ {l}{} │\n", " ".repeat(width - l.chars().count())));
    }
    out.push_str(&format!("  └{}┘\n", "─".repeat(width + 2)));
    out
}

type Service = tokio::task::JoinHandle<anyhow::Result<()>>;

/// Why a service stopped before it was ready, in the user's words where we know them.
async fn start_failure(name: &str, handle: Service) -> anyhow::Error {
    match handle.await {
        Ok(Err(e)) => match e.downcast_ref::<hookline_ingest::IngestError>() {
            Some(hookline_ingest::IngestError::Listen { addr, source }) if source.kind() == std::io::ErrorKind::AddrInUse => {
                anyhow::anyhow!("{addr} is in use; pass --port 0 for any free port")
            }
            _ => e.context(format!("{name} failed to start")),
        },
        Ok(Ok(())) => anyhow::anyhow!("{name} stopped while starting"),
        Err(e) => anyhow::anyhow!("{name} failed to start: {e}"),
    }
}

async fn dev(args: DevArgs, mut config: hookline_service::Config) -> anyhow::Result<ExitCode> {
    let warnings =
        hookline_core::egress::EgressGuard::new(&config.egress, &Default::default()).map(|g| g.startup_warnings()).unwrap_or_default();
    let cluster = args.brokers.is_some().then_some((config.kafka.bootstrap_servers.as_str(), config.kafka.topic_prefix.as_str()));
    eprint!("{}", banner(&warnings, cluster));
    eprintln!();
    config.ingest.listen_addr = SocketAddr::from(([127, 0, 0, 1], if args.demo.is_some() { 0 } else { args.port }));
    let token = config
        .ingest
        .api_tokens
        .first()
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("ingest.api_tokens is empty: dev mode needs a token for its commands"))?;
    // The banner has shown the allow-list warnings once; the services would log them again, each.
    let mut telemetry = config.telemetry.clone();
    telemetry.log_level = format!("{},{EGRESS_WARNINGS_TARGET}=off", telemetry.log_level);
    hookline_service::telemetry::init(&telemetry);
    hookline_service::telemetry::describe_metrics(&["ingest", "dispatcher", "retry-scheduler", "delivery log indexer"]);

    let started = Instant::now();
    let shutdown = CancellationToken::new();
    let (bound_tx, bound_rx) = tokio::sync::oneshot::channel();
    let ready = [hookline_service::Readiness::default(), Default::default(), Default::default()];
    let ingest: Service = tokio::spawn({
        let options = hookline_ingest::Options { bound: Some(bound_tx), readiness: ready[0].clone(), ..Default::default() };
        let run = hookline_ingest::run(config.clone(), shutdown.clone(), options);
        async move { Ok(run.await?) }
    });
    let dispatcher: Service = tokio::spawn({
        let options = hookline_dispatcher::Options { readiness: ready[1].clone(), ..Default::default() };
        let run = hookline_dispatcher::run(config.clone(), shutdown.clone(), options);
        async move { Ok(run.await?) }
    });
    let scheduler: Service = tokio::spawn({
        let options = hookline_retry_scheduler::Options { readiness: ready[2].clone(), ..Default::default() };
        let run = hookline_retry_scheduler::run(config.clone(), shutdown.clone(), options);
        async move { Ok(run.await?) }
    });
    let api = match bound_rx.await {
        Ok(api) => api,
        Err(_) => {
            shutdown.cancel();
            return Err(start_failure("ingest", ingest).await);
        }
    };
    // "Running" means an event published now is delivered now: every consumer group has its partitions and every
    // table is read (joining a group alone takes the mock broker about 3 s).
    let names = ["ingest", "dispatcher", "retry-scheduler"];
    let mut handles = [Some(ingest), Some(dispatcher), Some(scheduler)];
    loop {
        if ready.iter().all(hookline_service::Readiness::is_ready) {
            break;
        }
        for (i, h) in handles.iter_mut().enumerate() {
            if h.as_ref().is_some_and(|h| h.is_finished()) {
                shutdown.cancel();
                let h = h.take().expect("checked");
                return Err(start_failure(names[i], h).await);
            }
        }
        if started.elapsed() > Duration::from_secs(120) {
            let waiting: Vec<&str> = names.iter().zip(&ready).filter(|(_, r)| !r.is_ready()).map(|(n, _)| *n).collect();
            shutdown.cancel();
            anyhow::bail!("not ready after 120 s: {} still waiting for its consumer group or tables", waiting.join(", "));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let receiver = Receiver::start(args.demo.is_none()).await?;

    let code = match args.demo {
        Some(n) => demo(n, api, &token, &receiver, &config, Duration::from_secs(args.demo_timeout_s)).await?,
        None => {
            print_welcome(&Welcome {
                api,
                token: &token,
                bootstrap: &config.kafka.bootstrap_servers,
                receiver: receiver.addr,
                ready_s: started.elapsed().as_secs_f64(),
                since_ms: hookline_service::now_ms(),
            });
            let _ = tokio::signal::ctrl_c().await;
            ExitCode::SUCCESS
        }
    };
    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        for h in handles.into_iter().flatten() {
            let _ = h.await;
        }
    })
    .await;
    Ok(code)
}

struct Welcome<'a> {
    api: SocketAddr,
    token: &'a str,
    bootstrap: &'a str,
    receiver: SocketAddr,
    ready_s: f64,
    since_ms: i64,
}

/// What a newcomer needs: addresses, and commands to paste in order (tests/dev_tour.rs runs every `curl` line).
fn print_welcome(w: &Welcome<'_>) {
    let Welcome { api, token, bootstrap, receiver, ready_s, since_ms } = *w;
    let sub = hookline_core::model::keyed_subscription_id("dev-tour-ok");
    let gone = hookline_core::model::keyed_subscription_id("dev-tour-gone");
    let dead = hookline_core::model::delivery_id("evt_2", &gone);
    println!("hookline is running (ready in {ready_s:.1} s).");
    println!();
    println!("  API       http://{api}   token: {token}");
    println!("  portal    http://{api}/portal/#token={token}   (signs you in; dev mode only)");
    println!("  broker    {bootstrap}");
    println!("  receiver  http://{receiver}/ok answers 204 and prints each webhook, the status it answered and whether");
    println!("            the signature verified with the dev secret; also /slow /flaky /ratelimited /throttled /gone");
    println!("            /failing and /switch (500 or 204, set with: curl -s -X POST $RECEIVER/switch/control -d fail");
    println!("            or -d ok)");
    println!();
    println!("In another terminal, paste these (all at once or one by one; docs/api.md explains each call):");
    println!();
    println!("export HL=http://{api} AUTH='Authorization: Bearer {token}' JSON='Content-Type: application/json' RECEIVER=http://{receiver} SECRET={DEV_SECRET}");
    println!("export SUB={sub} GONE={gone} DEAD={dead}");
    println!("# a subscription (its endpoint answers 204), and an event for it");
    println!(
        r#"curl -s -X POST $HL/v1/subscriptions -H "$AUTH" -H "$JSON" -H 'Idempotency-Key: dev-tour-ok' -d '{{"url":"'$RECEIVER'/ok","event_types":["order.*"],"policy":"standard","secret":"'$SECRET'"}}'"#
    );
    println!(r#"curl -s -X POST $HL/v1/events -H "$AUTH" -H "$JSON" -d '{{"id":"evt_1","type":"order.created","data":{{"total":42}}}}'"#);
    println!("# its delivery log (the log trails Kafka by ~200 ms: wait_ms waits up to 5 s for the delivery to be in it)");
    println!(r#"curl -s "$HL/v1/subscriptions/$SUB/deliveries?wait_ms=5000" -H "$AUTH""#);
    println!("# a subscription whose endpoint answers 410 (fynapse: dead at once), an event for it, that delivery, replay it");
    println!(
        r#"curl -s -X POST $HL/v1/subscriptions -H "$AUTH" -H "$JSON" -H 'Idempotency-Key: dev-tour-gone' -d '{{"url":"'$RECEIVER'/gone","event_types":["invoice.*"],"policy":"fynapse","secret":"'$SECRET'"}}'"#
    );
    println!(r#"curl -s -X POST $HL/v1/events -H "$AUTH" -H "$JSON" -d '{{"id":"evt_2","type":"invoice.created","data":{{"total":7}}}}'"#);
    println!(r#"curl -s "$HL/v1/deliveries/$DEAD?wait_ms=5000" -H "$AUTH""#);
    println!(r#"curl -s -X POST "$HL/v1/deliveries/$DEAD/replay?wait_ms=5000" -H "$AUTH""#);
    println!("# replay everything sent to $SUB since hookline started");
    println!(r#"curl -s -X POST $HL/v1/subscriptions/$SUB/replay -H "$AUTH" -H "$JSON" -d '{{"since_ms":{since_ms}}}'"#);
    println!("# pause and resume it");
    println!(r#"curl -s -X POST $HL/v1/subscriptions/$SUB/pause -H "$AUTH""#);
    println!(r#"curl -s -X POST $HL/v1/subscriptions/$SUB/resume -H "$AUTH""#);
    println!();
    println!("Watch this terminal (the receiver prints each delivery) or the portal. Ctrl-C stops everything.");
}

/// The local receiver. Behaviour per path: `ok` 204; `slow` 200 after 200 ms; `flaky` 503 on the first try of
/// each event, then 200; `ratelimited` 429 with `Retry-After: 1` first, then 200; `throttled` 429 with
/// `Retry-After: 60` always; `gone` 410; `failing` 500;
/// `switch` 500 or 204 as set by a `POST /switch/control` with body `fail` or `ok` (204 until then).
struct Receiver {
    addr: SocketAddr,
}

#[derive(Default)]
struct ReceiverState {
    seen: Mutex<HashSet<(String, String)>>,
    print: bool,
    switch_failing: std::sync::atomic::AtomicBool,
}

impl Receiver {
    async fn start(print: bool) -> anyhow::Result<Self> {
        let state = Arc::new(ReceiverState { print, ..Default::default() });
        let app = axum::Router::new().route("/{behaviour}", post(receive)).route("/switch/control", post(switch_control)).with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { addr })
    }
}

async fn receive(State(s): State<Arc<ReceiverState>>, Path(b): Path<String>, headers: HeaderMap, body: Bytes) -> axum::response::Response {
    let id = headers.get("webhook-id").or_else(|| headers.get("gauge-event-id")).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let first = s.seen.lock().expect("receiver lock").insert((b.clone(), id.clone()));
    let response = match b.as_str() {
        "ok" => StatusCode::NO_CONTENT.into_response(),
        "slow" => {
            tokio::time::sleep(Duration::from_millis(200)).await;
            StatusCode::OK.into_response()
        }
        "flaky" if first => (StatusCode::SERVICE_UNAVAILABLE, "warming up").into_response(),
        "ratelimited" if first => (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1")], "slow down").into_response(),
        "throttled" => (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "60")], "slow down").into_response(),
        "gone" => (StatusCode::GONE, "unsubscribed").into_response(),
        "failing" => (StatusCode::INTERNAL_SERVER_ERROR, "broken").into_response(),
        "switch" if s.switch_failing.load(std::sync::atomic::Ordering::SeqCst) => {
            (StatusCode::INTERNAL_SERVER_ERROR, "switched to fail").into_response()
        }
        "switch" => StatusCode::NO_CONTENT.into_response(),
        _ => StatusCode::OK.into_response(),
    };
    if s.print {
        println!(
            "webhook on /{b} → answered {}, {}: webhook-id={id} {}",
            response.status().as_u16(),
            signature_check(&headers, &body),
            String::from_utf8_lossy(&body)
        );
    }
    response
}

/// `✓ signature`, or `✗ signature: <why>` (checked with the dev secret, as a receiver would, by `hookline_core::sign`).
fn signature_check(headers: &HeaderMap, body: &[u8]) -> String {
    let list: Vec<(String, String)> =
        headers.iter().filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned()))).collect();
    let secrets = [DEV_SECRET];
    let now = hookline_service::now_ms();
    let result = match sign::detect_scheme(list.as_slice()) {
        Some(SignatureScheme::StandardWebhooks) => sign::verify_standard(&secrets, list.as_slice(), body, now, 300),
        Some(SignatureScheme::Gauge) => sign::verify_gauge(&secrets, list.as_slice(), body, now, 300),
        _ => return "✗ signature: none sent".into(),
    };
    match result {
        Ok(_) => "✓ signature".into(),
        Err(e) => format!("✗ signature: {e} (with the dev secret; was the subscription created with another?)"),
    }
}

async fn switch_control(State(s): State<Arc<ReceiverState>>, body: String) -> impl IntoResponse {
    let fail = match body.trim() {
        "fail" => true,
        "ok" => false,
        _ => return (StatusCode::UNPROCESSABLE_ENTITY, "send `fail` or `ok`").into_response(),
    };
    s.switch_failing.store(fail, std::sync::atomic::Ordering::SeqCst);
    StatusCode::NO_CONTENT.into_response()
}

#[derive(Default)]
struct Totals {
    finals: HashMap<String, String>,
    retried: HashSet<String>,
}

async fn demo(
    n: u32,
    api: SocketAddr,
    token: &str,
    receiver: &Receiver,
    config: &hookline_service::Config,
    timeout: Duration,
) -> anyhow::Result<ExitCode> {
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let r = receiver.addr;
    // A policy with one-second waits, so the demo's failing endpoint reaches its final state quickly.
    let mut quick = hookline_core::policy::builtin("standard").expect("built-in profile");
    quick.name = "demo-quick".into();
    quick.schedule.waits_s = Some(vec![1.0, 1.0]);
    quick.schedule.exponential = None;
    quick.schedule.max_attempts = Some(3);
    quick.schedule.jitter = None;
    quick.schedule.max_window_s = None;
    let quick_toml = toml::to_string(&quick)?;
    let subs = [
        json!({"url": format!("http://{r}/ok"), "event_types": ["order.*"], "policy": "standard", "description": "answers 204"}),
        json!({"url": format!("http://{r}/slow"), "event_types": ["order.*"], "policy": "gauge", "description": "answers after 200 ms"}),
        json!({"url": format!("http://{r}/flaky"), "event_types": ["order.*"], "policy": "relay", "description": "503 first, retried after 2 s"}),
        json!({"url": format!("http://{r}/ratelimited"), "event_types": ["order.*"], "policy": "standard", "description": "429 Retry-After: 1 first"}),
        json!({"url": format!("http://{r}/gone"), "event_types": ["order.*"], "policy": "fynapse", "description": "410: dead at once (Fynapse calls it DEAD_LETTER)"}),
        json!({"url": format!("http://{r}/failing"), "event_types": ["order.*"], "policy_toml": quick_toml, "description": "500 always: failed after 3 attempts"}),
    ];
    for s in &subs {
        let (status, body) = call(&client, api, token, "/v1/subscriptions", s).await?;
        anyhow::ensure!(status == 201, "creating a demo subscription failed: {status} {body}");
        eprintln!("subscription {} → {}", body["id"].as_str().unwrap_or("?"), s["description"].as_str().unwrap_or(""));
    }
    let expected = n as usize * subs.len();

    // Count final states from the attempts topic, as an analyst would.
    let totals = Arc::new(Mutex::new(Totals::default()));
    let t = totals.clone();
    let stop = CancellationToken::new();
    let _reader = hookline_kafka::table::spawn(
        &config.kafka,
        Topics::new(config.kafka.topic_prefix.clone()).attempts(),
        "hookline-dev-demo",
        move |_, _, v| {
            if let Some(rec) = v.and_then(|v| AttemptRecord::decode(v).ok()) {
                let mut t = t.lock().expect("totals lock");
                if rec.verdict == "retry" {
                    t.retried.insert(rec.delivery_id.clone());
                }
                if !rec.final_state.is_empty() {
                    t.finals.insert(rec.delivery_id, rec.final_state);
                }
            }
        },
        stop.clone(),
    )
    .await?;

    let started = Instant::now();
    let sem = Arc::new(tokio::sync::Semaphore::new(32));
    let mut publishes = Vec::new();
    for i in 0..n {
        let permit = sem.clone().acquire_owned().await?;
        let client = client.clone();
        let token = token.to_owned();
        publishes.push(tokio::spawn(async move {
            let ev = json!({"id": format!("evt_demo_{i}"), "type": "order.created", "data": {"order": i, "total_cents": 1299}});
            let r = call(&client, api, &token, "/v1/events", &ev).await;
            drop(permit);
            r
        }));
    }
    let mut accepted = 0usize;
    for p in publishes {
        if let Ok(Ok((202, _))) = p.await {
            accepted += 1;
        }
    }
    anyhow::ensure!(accepted == n as usize, "only {accepted} of {n} events were accepted");
    eprintln!("published {n} events; {expected} deliveries expected");

    let deadline = started + timeout;
    loop {
        let done = totals.lock().expect("totals lock").finals.len();
        eprintln!("  [{:>5.1}s] final states: {done}/{expected}", started.elapsed().as_secs_f64());
        if done >= expected || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    stop.cancel();
    let t = totals.lock().expect("totals lock");
    let count = |s: &str| t.finals.values().filter(|v| v.as_str() == s).count();
    let lost = expected.saturating_sub(t.finals.len());
    // Keys in the README's order (serde_json would sort them); the final states in the API's words.
    println!(
        "{{\"events\":{n},\"deliveries\":{expected},\"succeeded\":{},\"retried\":{},\"failed\":{},\"dead\":{},\"cancelled\":{},\"lost\":{lost},\"seconds\":{:.1}}}",
        count("succeeded"),
        t.retried.len(),
        count("failed"),
        count("dead"),
        count("cancelled"),
        started.elapsed().as_secs_f64(),
    );
    Ok(if lost == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

async fn call(
    client: &Client<HttpConnector, Full<Bytes>>,
    api: SocketAddr,
    token: &str,
    path: &str,
    body: &Value,
) -> anyhow::Result<(u16, Value)> {
    let req = http::Request::post(format!("http://{api}{path}"))
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(body)?)))?;
    let resp = client.request(req).await?;
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await?.to_bytes();
    Ok((status, serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
}
