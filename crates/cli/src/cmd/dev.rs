//! `hookline dev`: the whole pipeline in one process on the embedded broker, with a local receiver that prints
//! what it gets. `--demo N` also creates subscriptions on several profiles, publishes N events, shows progress
//! and ends with one JSON line of totals (`lost` must be 0).

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use bytes::Bytes;
use hookline_core::model::AttemptRecord;
use hookline_kafka::mock::DevBroker;
use hookline_kafka::Topics;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use prost::Message as _;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

const DEV_TOKEN: &str = "dev-token-not-for-production";

#[derive(clap::Args)]
pub struct DevArgs {
    /// Create demo subscriptions, publish this many events, report totals and exit.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    demo: Option<u32>,
    /// Port of the HTTP API (0 picks a free one).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Partitions of every topic on the embedded broker.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(i32).range(1..=256))]
    partitions: i32,
    /// Log level (`warn`, `info`, `debug`).
    #[arg(long, default_value = "warn")]
    log: String,
    /// Seconds the demo waits for every delivery to reach a final state.
    #[arg(long, default_value_t = 90, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    demo_timeout_s: u64,
}

pub fn run(args: DevArgs) -> anyhow::Result<ExitCode> {
    let topics = Topics::new("hookline.");
    let broker = DevBroker::start(&topics, args.partitions, args.partitions)?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let result = rt.block_on(dev(args, &broker));
    // Every Kafka client lives in the runtime: stop them all before the broker goes away.
    rt.shutdown_timeout(Duration::from_secs(5));
    drop(broker);
    result
}

async fn dev(args: DevArgs, broker: &DevBroker) -> anyhow::Result<ExitCode> {
    eprintln!("\n  ┌────────────────────────────────────────────────────────────────────────────┐");
    eprintln!("  │ hookline dev: EMBEDDED IN-MEMORY BROKER (librdkafka mock cluster).         │");
    eprintln!("  │ For trying hookline only: nothing persists, no compaction, tiny partitions, │");
    eprintln!("  │ and loopback http receivers are allowed. Never run this in production.     │");
    eprintln!("  └────────────────────────────────────────────────────────────────────────────┘\n");
    let mut config = hookline_service::Config::dev(&broker.bootstrap_servers(), args.partitions, DEV_TOKEN);
    config.ingest.listen_addr = SocketAddr::from(([127, 0, 0, 1], if args.demo.is_some() { 0 } else { args.port }));
    config.telemetry.log_level = args.log.clone();
    hookline_service::telemetry::init(&config.telemetry);

    let shutdown = CancellationToken::new();
    let (bound_tx, bound_rx) = tokio::sync::oneshot::channel();
    let ingest = tokio::spawn(hookline_ingest::run(
        config.clone(),
        shutdown.clone(),
        hookline_ingest::Options { bound: Some(bound_tx), ..Default::default() },
    ));
    let dispatcher = tokio::spawn(hookline_dispatcher::run(config.clone(), shutdown.clone(), Default::default()));
    let scheduler = tokio::spawn(hookline_retry_scheduler::run(config.clone(), shutdown.clone(), Default::default()));
    let api = bound_rx.await.map_err(|_| anyhow::anyhow!("ingest failed to start (see the log above)"))?;
    let receiver = Receiver::start(args.demo.is_none()).await?;

    let code = match args.demo {
        Some(n) => demo(n, api, &receiver, &config, Duration::from_secs(args.demo_timeout_s)).await?,
        None => {
            print_welcome(api, &broker.bootstrap_servers(), receiver.addr);
            let _ = tokio::signal::ctrl_c().await;
            ExitCode::SUCCESS
        }
    };
    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        let _ = ingest.await;
        let _ = dispatcher.await;
        let _ = scheduler.await;
    })
    .await;
    Ok(code)
}

fn print_welcome(api: SocketAddr, bootstrap: &str, receiver: SocketAddr) {
    println!("hookline is running.");
    println!("  API:              http://{api}   (token: {DEV_TOKEN})");
    println!("  portal:           http://{api}/portal   (sign in with the token above)");
    println!("  broker:           {bootstrap}");
    println!("  demo receiver:    http://{receiver}/ok  (prints every webhook it gets)");
    println!("                    also /slow /flaky /ratelimited /gone /failing, and /switch: 500 or 204 as set by");
    println!("                    `curl -X POST http://{receiver}/switch/control -d fail` (or `-d ok`)");
    println!();
    println!("Create a subscription:");
    println!(
        "  curl -s -X POST http://{api}/v1/subscriptions -H 'Authorization: Bearer {DEV_TOKEN}' -H 'Content-Type: application/json' \\\n    -d '{{\"url\":\"http://{receiver}/ok\",\"event_types\":[\"order.*\"],\"policy\":\"standard\"}}'"
    );
    println!("Publish an event:");
    println!(
        "  curl -s -X POST http://{api}/v1/events -H 'Authorization: Bearer {DEV_TOKEN}' -H 'Content-Type: application/json' \\\n    -d '{{\"id\":\"evt_1\",\"type\":\"order.created\",\"data\":{{\"total\":42}}}}'"
    );
    println!("Then watch this terminal (the receiver prints the delivery) or the portal. Ctrl-C stops everything.");
}

/// The local receiver. Behaviour per path: `ok` 204; `slow` 200 after 200 ms; `flaky` 503 on the first try of
/// each event, then 200; `ratelimited` 429 with `Retry-After: 1` first, then 200; `gone` 410; `failing` 500;
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

async fn receive(State(s): State<Arc<ReceiverState>>, Path(b): Path<String>, headers: HeaderMap, body: Bytes) -> impl IntoResponse {
    let id = headers
        .get("webhook-id")
        .or_else(|| headers.get("gauge-event-id"))
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    if s.print {
        println!("webhook received on /{b}: webhook-id={id} {}", String::from_utf8_lossy(&body));
    }
    let first = s.seen.lock().expect("receiver lock").insert((b.clone(), id));
    match b.as_str() {
        "ok" => StatusCode::NO_CONTENT.into_response(),
        "slow" => {
            tokio::time::sleep(Duration::from_millis(200)).await;
            StatusCode::OK.into_response()
        }
        "flaky" if first => (StatusCode::SERVICE_UNAVAILABLE, "warming up").into_response(),
        "ratelimited" if first => (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1")], "slow down").into_response(),
        "gone" => (StatusCode::GONE, "unsubscribed").into_response(),
        "failing" => (StatusCode::INTERNAL_SERVER_ERROR, "broken").into_response(),
        "switch" if s.switch_failing.load(std::sync::atomic::Ordering::SeqCst) => {
            (StatusCode::INTERNAL_SERVER_ERROR, "switched to fail").into_response()
        }
        "switch" => StatusCode::NO_CONTENT.into_response(),
        _ => StatusCode::OK.into_response(),
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

async fn demo(n: u32, api: SocketAddr, receiver: &Receiver, config: &hookline_service::Config, timeout: Duration) -> anyhow::Result<ExitCode> {
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
        json!({"url": format!("http://{r}/gone"), "event_types": ["order.*"], "policy": "fynapse", "description": "410: DEAD_LETTER at once"}),
        json!({"url": format!("http://{r}/failing"), "event_types": ["order.*"], "policy_toml": quick_toml, "description": "500 always: failed after 3 attempts"}),
    ];
    for s in &subs {
        let (status, body) = call(&client, api, "/v1/subscriptions", s).await?;
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
        publishes.push(tokio::spawn(async move {
            let ev = json!({"id": format!("evt_demo_{i}"), "type": "order.created", "data": {"order": i, "total_cents": 1299}});
            let r = call(&client, api, "/v1/events", &ev).await;
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
    println!(
        "{}",
        json!({
            "events": n,
            "deliveries": expected,
            "delivered": count("succeeded"),
            "retried": t.retried.len(),
            "dead_lettered": count("dead"),
            "failed": count("failed"),
            "cancelled": count("cancelled"),
            "lost": lost,
            "seconds": (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
        })
    );
    Ok(if lost == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

async fn call(client: &Client<HttpConnector, Full<Bytes>>, api: SocketAddr, path: &str, body: &Value) -> anyhow::Result<(u16, Value)> {
    let req = http::Request::post(format!("http://{api}{path}"))
        .header("authorization", format!("Bearer {DEV_TOKEN}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(body)?)))?;
    let resp = client.request(req).await?;
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await?.to_bytes();
    Ok((status, serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
}
