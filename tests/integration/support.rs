//! The test harness: an embedded broker, the three services in-process, a scripted receiver on 127.0.0.1:0, and
//! collectors that read the attempts and dead-letter topics. Waiting is on signals (Notify), with a deadline.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use hookline_core::model::{AttemptRecord, DeadLetter, OpsEvent};
use hookline_kafka::mock::DevBroker;
use hookline_kafka::Topics;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub const TOKEN: &str = "integration-test-token";

/// One request as the receiver saw it.
#[derive(Debug, Clone)]
pub struct Received {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub at: Instant,
}

/// What a path answers: the n-th request gets `script[n]`, the last entry repeating. `None` hangs.
pub type Script = Vec<Option<(u16, Option<&'static str>)>>;

#[derive(Default)]
pub struct ReceiverState {
    pub requests: Mutex<Vec<Received>>,
    scripts: Mutex<HashMap<String, Script>>,
    pub changed: Notify,
}

pub struct Pipeline {
    /// `None` after drop, or when the test runs the broker (a separate process). Never destroyed while clients are
    /// alive: librdkafka consumers closing against a vanished broker block the runtime's shutdown.
    broker: Option<DevBroker>,
    services: Vec<tokio::task::JoinHandle<()>>,
    pub api: SocketAddr,
    /// Ingest's health listener (`ingest.health_addr`), when the test configured one.
    pub ingest_health: Option<SocketAddr>,
    pub receiver: SocketAddr,
    pub seen: Arc<ReceiverState>,
    pub attempts: Arc<Collected<AttemptRecord>>,
    pub dlq: Arc<Collected<DeadLetter>>,
    pub ops: Arc<Collected<OpsEvent>>,
    pub config: hookline_service::Config,
    pub shutdown: CancellationToken,
    client: Client<HttpConnector, Full<Bytes>>,
    /// The delivery log's SQLite directory, removed on drop, unless the test chose the file itself.
    log_dir: Option<std::path::PathBuf>,
}

pub struct Collected<T> {
    pub items: Mutex<Vec<T>>,
    pub changed: Notify,
}

impl<T> Default for Collected<T> {
    fn default() -> Self {
        Self { items: Mutex::new(Vec::new()), changed: Notify::new() }
    }
}

/// Waits until `cond` holds, re-checking whenever `notify` fires; panics with `what` after `limit`.
pub async fn wait_for(notify: &Notify, limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    loop {
        let notified = notify.notified();
        tokio::pin!(notified);
        // Registered before the check, so a notification between the check and the wait is not lost.
        notified.as_mut().enable();
        if cond() {
            return;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || tokio::time::timeout(left, notified).await.is_err() && !cond() {
            panic!("timed out after {limit:?} waiting for {what}");
        }
    }
}

impl Pipeline {
    pub async fn start(partitions: i32) -> Pipeline {
        Self::start_with(partitions, |_| {}).await
    }

    pub fn script(&self, path: &str, script: Script) {
        self.seen.scripts.lock().unwrap().insert(path.to_owned(), script);
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}/{path}", self.receiver)
    }

    /// An admin call (a JSON content type even without a body).
    pub async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        self.request(Some(TOKEN), method, path, body, true).await
    }

    /// A call with another credential (or none); a content type only with a body.
    pub async fn call_as(&self, token: Option<&str>, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        self.request(token, method, path, body, false).await
    }

    /// An admin call with a body sent exactly as given (JSON a `Value` cannot hold, such as a repeated key).
    pub async fn call_raw(&self, method: &str, path: &str, body: &str) -> (u16, Value) {
        self.send(Some(TOKEN), method, path, Some(Bytes::from(body.to_owned())), true).await
    }

    async fn request(&self, token: Option<&str>, method: &str, path: &str, body: Option<Value>, always_json: bool) -> (u16, Value) {
        self.send(token, method, path, body.map(|b| Bytes::from(b.to_string())), always_json).await
    }

    async fn send(&self, token: Option<&str>, method: &str, path: &str, body: Option<Bytes>, always_json: bool) -> (u16, Value) {
        let mut req = http::Request::builder().method(method).uri(format!("http://{}{path}", self.api));
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        if always_json || body.is_some() {
            req = req.header("content-type", "application/json");
        }
        let req = req.body(Full::new(body.unwrap_or_default())).unwrap();
        let resp = self.client.request(req).await.expect("API answers");
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    /// The value of a counter on the API's `/metrics` with this label set (0 when absent).
    pub async fn counter(&self, name_and_labels: &str) -> f64 {
        let uri: http::Uri = format!("http://{}/metrics", self.api).parse().unwrap();
        let resp = self.client.get(uri).await.expect("/metrics answers");
        let text = String::from_utf8(resp.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
        text.lines().find_map(|l| l.strip_prefix(name_and_labels)?.trim().parse().ok()).unwrap_or(0.0)
    }

    /// Creates a tenant (its name: the id in capitals).
    pub async fn tenant(&self, id: &str) {
        let (status, v) = self.call("POST", "/v1/tenants", Some(serde_json::json!({"id": id, "name": id.to_uppercase()}))).await;
        assert_eq!(status, 201, "{v}");
    }

    /// A new API key of `tenant`: (key id, key).
    pub async fn api_key(&self, tenant: &str) -> (String, String) {
        let (status, v) = self.call("POST", &format!("/v1/tenants/{tenant}/api-keys"), Some(serde_json::json!({"name": "ci"}))).await;
        assert_eq!(status, 201, "{v}");
        (v["id"].as_str().unwrap().to_owned(), v["key"].as_str().unwrap().to_owned())
    }

    /// Creates a subscription and returns (id, secret).
    pub async fn subscribe(&self, body: Value) -> (String, String) {
        let (status, v) = self.call("POST", "/v1/subscriptions", Some(body)).await;
        assert_eq!(status, 201, "create subscription: {v}");
        (v["id"].as_str().unwrap().to_owned(), v["secret"].as_str().unwrap().to_owned())
    }

    pub async fn publish(&self, id: &str, event_type: &str) {
        let (status, v) = self.call("POST", "/v1/events", Some(serde_json::json!({"id": id, "type": event_type, "data": {"n": 1}}))).await;
        assert_eq!(status, 202, "publish: {v}");
    }

    /// How many requests to `path` carried the event `event_id`.
    pub fn requests_for(&self, path: &str, event_id: &str) -> usize {
        self.requests_to(path).iter().filter(|r| serde_json::from_slice::<Value>(&r.body).is_ok_and(|b| b["id"] == event_id)).count()
    }

    pub fn requests_to(&self, path: &str) -> Vec<Received> {
        self.seen.requests.lock().unwrap().iter().filter(|r| r.path == path).cloned().collect()
    }

    pub fn finals(&self) -> Vec<AttemptRecord> {
        self.attempts.items.lock().unwrap().iter().filter(|a| !a.final_state.is_empty()).cloned().collect()
    }

    pub async fn wait_finals(&self, n: usize, limit: Duration) {
        let attempts = self.attempts.clone();
        wait_for(&self.attempts.changed, limit, &format!("{n} final states"), || {
            attempts.items.lock().unwrap().iter().filter(|a| !a.final_state.is_empty()).count() >= n
        })
        .await;
    }
}

impl Pipeline {
    /// Waits for an ops event of `kind` and returns it.
    pub async fn wait_ops(&self, kind: &str) -> OpsEvent {
        let ops = self.ops.clone();
        wait_for(&self.ops.changed, Duration::from_secs(60), &format!("ops event {kind}"), || {
            ops.items.lock().unwrap().iter().any(|o| o.kind == kind)
        })
        .await;
        self.ops.items.lock().unwrap().iter().find(|o| o.kind == kind).cloned().unwrap()
    }

    /// GETs `path` until `done` holds. The API's tables follow Kafka topics, so what the dispatcher just
    /// produced reaches them one fetch later; the API has no signal to wait on, hence the short, bounded re-reads.
    pub async fn get_when(&self, path: &str, done: impl Fn(&Value) -> bool) -> Value {
        self.get_when_as(Some(TOKEN), path, done).await
    }

    /// [`Pipeline::get_when`] with another credential.
    pub async fn get_when_as(&self, token: Option<&str>, path: &str, done: impl Fn(&Value) -> bool) -> Value {
        let mut v = Value::Null;
        // The delivery log trails Kafka by an indexer batch (and, at first, the indexer's group join).
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            v = self.request(token, "GET", path, None, true).await.1;
            if done(&v) {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("GET {path} never reached the expected state: {v}");
    }

    /// Like [`Pipeline::get_when`], for a 200 answer: (status, body).
    pub async fn get_when_ok(&self, path: &str, done: impl Fn(&Value) -> bool) -> (u16, Value) {
        let v = self.get_when(path, |v| v.get("error").is_none() && done(v)).await;
        (200, v)
    }

    pub async fn subscription_when(&self, id: &str, done: impl Fn(&Value) -> bool) -> Value {
        self.get_when(&format!("/v1/subscriptions/{id}"), done).await
    }

    /// Stops the services (they drain and commit) while the broker is still up.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        for s in self.services.drain(..) {
            s.await.expect("service stops cleanly");
        }
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(dir) = self.log_dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
        // Leaked on purpose: clients still owned by the test's runtime must be able to close against it.
        std::mem::forget(self.broker.take());
    }
}

/// A new directory under the system's temp dir, unique in this process and across processes.
/// The token in a portal link's URL (`…/portal/#token=hlp_…`).
pub fn link_token(v: &Value) -> String {
    v["url"].as_str().unwrap().split("#token=").nth(1).expect("a token in the link").to_owned()
}

/// A fresh database on the server scripts/with-postgres starts, or None (the test then skips, saying so) unless
/// the run requires PostgreSQL (HOOKLINE_TEST_REQUIRE_POSTGRES, as scripts/test sets).
pub async fn postgres_url() -> Option<String> {
    let admin = match std::env::var("HOOKLINE_TEST_POSTGRES_URL") {
        Ok(u) if !u.trim().is_empty() => u,
        _ if std::env::var_os("HOOKLINE_TEST_REQUIRE_POSTGRES").is_some() => {
            panic!("HOOKLINE_TEST_POSTGRES_URL is not set and this run requires PostgreSQL: run through scripts/with-postgres")
        }
        _ => {
            eprintln!("skipped: needs HOOKLINE_TEST_POSTGRES_URL (scripts/with-postgres cargo test -p hookline-tests --test integration delivery_log)");
            return None;
        }
    };
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let name = format!("hl_it_{}_{}", std::process::id(), N.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    Some(hookline_log::postgres::create_database(&admin, &name).await.expect("the test server makes a database"))
}

pub fn temp_dir(what: &str) -> std::path::PathBuf {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("hookline-it-{what}-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

async fn collect<T: prost::Message + Default + Send + 'static>(
    config: &hookline_service::Config,
    topic: &str,
    stop: CancellationToken,
) -> Arc<Collected<T>> {
    collect_with(config, topic, stop, |v| T::decode(v).ok()).await
}

async fn collect_with<T: Send + 'static>(
    config: &hookline_service::Config,
    topic: &str,
    stop: CancellationToken,
    decode: fn(&[u8]) -> Option<T>,
) -> Arc<Collected<T>> {
    let c = Arc::new(Collected::<T>::default());
    let c2 = c.clone();
    hookline_kafka::table::spawn(
        &config.kafka,
        topic,
        "hookline-integration-collector",
        move |_, _, v| {
            if let Some(item) = v.and_then(decode) {
                c2.items.lock().unwrap().push(item);
                c2.changed.notify_waiters();
            }
        },
        stop,
    )
    .await
    .expect("collector");
    c
}

async fn receive(State(s): State<Arc<ReceiverState>>, Path(path): Path<String>, headers: HeaderMap, body: Bytes) -> Response {
    let nth = {
        let mut reqs = s.requests.lock().unwrap();
        let nth = reqs.iter().filter(|r| r.path == path).count();
        reqs.push(Received { path: path.clone(), headers, body, at: Instant::now() });
        nth
    };
    s.changed.notify_waiters();
    let step = {
        let scripts = s.scripts.lock().unwrap();
        scripts.get(&path).and_then(|sc| sc.get(nth).or(sc.last()).cloned()).unwrap_or(Some((204, None)))
    };
    match step {
        None => {
            // Hang until the client gives up.
            std::future::pending::<()>().await;
            unreachable!()
        }
        Some((status, retry_after)) => {
            let mut resp = (StatusCode::from_u16(status).unwrap(), "scripted").into_response();
            if let Some(ra) = retry_after {
                resp.headers_mut().insert("retry-after", ra.parse().unwrap());
            }
            resp
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Added for the reliability suite (hostile.rs, faults.rs).

impl Pipeline {
    /// The pipeline's topics (under its prefix: `hookline.`, or a fresh one on a shared cluster).
    pub fn topics(&self) -> Topics {
        Topics::new(self.config.kafka.topic_prefix.clone())
    }

    /// What a pipeline started after this one needs to take over from it: the same cluster connection, topics,
    /// consumer groups and master keys.
    pub fn successor_config(&self) -> impl FnOnce(&mut hookline_service::Config) {
        let prior = self.config.clone();
        move |c| {
            c.kafka = prior.kafka;
            c.ingest.group_id = prior.ingest.group_id;
            c.dispatcher.group_id = prior.dispatcher.group_id;
            c.retry_scheduler.group_id = prior.retry_scheduler.group_id;
            c.log.group_id = prior.log.group_id;
            c.secrets = prior.secrets;
        }
    }

    /// The embedded broker, for fault injection (`broker().cluster()` is librdkafka's mock cluster). Tests that
    /// use it skip under `HOOKLINE_TEST_BROKER=kafka` first ([`on_the_mock_only`]).
    pub fn broker(&self) -> &DevBroker {
        self.broker.as_ref().expect("the embedded broker: this test injects faults through it (see on_the_mock_only)")
    }

    /// Like [`Pipeline::start`], with `edit` applied to the config before any service starts (e.g. a small
    /// `ingest.max_event_bytes`).
    pub async fn start_with(partitions: i32, edit: impl FnOnce(&mut hookline_service::Config)) -> Pipeline {
        Self::start_services(partitions, edit, true).await
    }

    /// Like [`Pipeline::start_with`], without a dispatcher: the test runs its own (`hookline_dispatcher::run`).
    pub async fn start_without_dispatcher(partitions: i32, edit: impl FnOnce(&mut hookline_service::Config)) -> Pipeline {
        Self::start_services(partitions, edit, false).await
    }

    async fn start_services(partitions: i32, edit: impl FnOnce(&mut hookline_service::Config), dispatcher: bool) -> Pipeline {
        if let Some(k) = ExternalKafka::for_the_whole_suite() {
            return k.pipeline_with(partitions, edit, dispatcher, true).await;
        }
        let topics = Topics::new("hookline.");
        let broker = DevBroker::start(&topics, partitions, partitions).expect("mock broker");
        let bootstrap = broker.bootstrap_servers();
        Self::start_at(Some(broker), &bootstrap, partitions, edit, dispatcher).await
    }

    /// Like [`Pipeline::start_with`], without a retry-scheduler: the test runs its own (`hookline_retry_scheduler::run`).
    pub async fn start_without_scheduler(partitions: i32, edit: impl FnOnce(&mut hookline_service::Config)) -> Pipeline {
        if let Some(k) = ExternalKafka::for_the_whole_suite() {
            return k.pipeline_with(partitions, edit, true, false).await;
        }
        let topics = Topics::new("hookline.");
        let broker = DevBroker::start(&topics, partitions, partitions).expect("mock broker");
        let bootstrap = broker.bootstrap_servers();
        Self::start_at_with(Some(broker), &bootstrap, partitions, edit, true, false).await
    }

    /// Like [`Pipeline::start_with`] on a broker the test made: an embedded one (e.g. behind a TLS terminator, whose
    /// address `edit` puts in the config), or with `None` a broker process at `bootstrap` with the topics created.
    pub async fn start_at(
        broker: Option<DevBroker>,
        bootstrap: &str,
        partitions: i32,
        edit: impl FnOnce(&mut hookline_service::Config),
        dispatcher: bool,
    ) -> Pipeline {
        Self::start_at_with(broker, bootstrap, partitions, edit, dispatcher, true).await
    }

    async fn start_at_with(
        broker: Option<DevBroker>,
        bootstrap: &str,
        partitions: i32,
        edit: impl FnOnce(&mut hookline_service::Config),
        dispatcher: bool,
        scheduler: bool,
    ) -> Pipeline {
        let mut config = hookline_service::Config::dev(bootstrap, partitions, TOKEN);
        config.telemetry.log_level = "warn".into();
        config.ingest.max_request_bytes = 16 << 10;
        let log_dir = temp_dir("log");
        config.log.sqlite_path = log_dir.join("delivery-log.sqlite3");
        let default_log = config.log.sqlite_path.clone();
        edit(&mut config);
        let log_dir = if config.log.sqlite_path == default_log {
            Some(log_dir)
        } else {
            let _ = std::fs::remove_dir(&log_dir);
            None
        };
        if std::env::var_os("RUST_LOG").is_some() {
            hookline_service::telemetry::init(&config.telemetry);
        }
        let shutdown = CancellationToken::new();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (health_tx, health_rx) = tokio::sync::oneshot::channel();
        let options = hookline_ingest::Options { bound: Some(tx), health_bound: Some(health_tx), ..Default::default() };
        let mut services = vec![tokio::spawn({
            let f = hookline_ingest::run(config.clone(), shutdown.clone(), options);
            async move { f.await.expect("ingest runs") }
        })];
        if scheduler {
            services.push(tokio::spawn({
                let f = hookline_retry_scheduler::run(config.clone(), shutdown.clone(), Default::default());
                async move { f.await.expect("retry-scheduler runs") }
            }));
        }
        if dispatcher {
            services.push(tokio::spawn({
                let f = hookline_dispatcher::run(config.clone(), shutdown.clone(), Default::default());
                async move { f.await.expect("dispatcher runs") }
            }));
        }
        let api = rx.await.expect("ingest starts");
        // Bound before the API's listener, when configured.
        let ingest_health = health_rx.await.ok();

        let seen = Arc::new(ReceiverState::default());
        let app = axum::Router::new().route("/{path}", axum::routing::post(receive)).with_state(seen.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind receiver");
        let receiver = listener.local_addr().expect("receiver address");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });

        // `edit` may have put the topics under another prefix (a test on a shared external broker).
        let topics = Topics::new(config.kafka.topic_prefix.clone());
        let attempts = collect::<AttemptRecord>(&config, topics.attempts(), shutdown.clone()).await;
        // Either `dlq.format`.
        let dlq =
            collect_with::<DeadLetter>(&config, topics.dlq(), shutdown.clone(), |v| hookline_core::dead_letter::decode(v, None).ok()).await;
        let ops = collect::<OpsEvent>(&config, topics.ops(), shutdown.clone()).await;
        Pipeline {
            broker,
            services,
            api,
            ingest_health,
            receiver,
            seen,
            attempts,
            dlq,
            ops,
            config,
            shutdown,
            client: Client::builder(TokioExecutor::new()).build_http(),
            log_dir,
        }
    }

    /// Every attempt record of one subscription, in the order they were read.
    pub fn attempts_of(&self, subscription_id: &str) -> Vec<AttemptRecord> {
        self.attempts.items.lock().unwrap().iter().filter(|a| a.subscription_id == subscription_id).cloned().collect()
    }

    /// Waits until the subscription has `n` final attempt records and returns all its attempt records.
    pub async fn wait_final_of(&self, subscription_id: &str, n: usize, limit: Duration) -> Vec<AttemptRecord> {
        let attempts = self.attempts.clone();
        let id = subscription_id.to_owned();
        wait_for(&self.attempts.changed, limit, &format!("{n} final states of {subscription_id}"), || {
            attempts.items.lock().unwrap().iter().filter(|a| a.subscription_id == id && !a.final_state.is_empty()).count() >= n
        })
        .await;
        self.attempts_of(subscription_id)
    }
}

// ---------------------------------------------------------------------------------------------------------
// An external broker: the real-Kafka suite (apache_kafka.rs) runs against a cluster the run provides.

/// `kafka` runs every pipeline a test does not build on a broker of its own (`Pipeline::start*`) on the cluster
/// `HOOKLINE_TEST_KAFKA` names, each under a fresh topic prefix; `mock` (the default) on the embedded broker.
pub const BROKER_ENV: &str = "HOOKLINE_TEST_BROKER";

/// True (after saying so) when the suite runs on Apache Kafka (`HOOKLINE_TEST_BROKER=kafka`): the caller injects
/// faults through the embedded broker, so it skips.
pub fn on_the_mock_only() -> bool {
    let elsewhere = matches!(std::env::var(BROKER_ENV).as_deref(), Ok("kafka"));
    if elsewhere {
        eprintln!("skipped under {BROKER_ENV}=kafka: this test injects faults through the embedded broker");
    }
    elsewhere
}

/// The variable naming the external cluster: the JSON line `scripts/kafka start` prints, the path of a file holding
/// it (`DIR/cluster.json`), or plain bootstrap servers (PLAINTEXT only: the secured-listener tests then skip).
pub const KAFKA_ENV: &str = "HOOKLINE_TEST_KAFKA";

/// An Apache Kafka cluster shared by the tests of a run. Each test works under a fresh topic prefix with group ids
/// of its own, so tests running side by side (or runs reusing a cluster) never see each other's records.
pub struct ExternalKafka {
    /// The PLAINTEXT listener(s): a super user there, which creates the topics.
    pub bootstrap: String,
    /// What `scripts/kafka start` printed (listeners, users, certificates, pids), or `Null`.
    pub info: Value,
}

impl ExternalKafka {
    /// The cluster `HOOKLINE_TEST_KAFKA` names, or `None` (the caller skips, saying so) unless the run requires one
    /// (`HOOKLINE_TEST_REQUIRE_KAFKA`, as scripts/test sets).
    pub fn from_env() -> Option<ExternalKafka> {
        let raw = match std::env::var(KAFKA_ENV) {
            Ok(v) if !v.trim().is_empty() => v.trim().to_owned(),
            _ if std::env::var_os("HOOKLINE_TEST_REQUIRE_KAFKA").is_some() => {
                panic!("{KAFKA_ENV} is not set and this run requires Apache Kafka: start one with scripts/kafka start")
            }
            _ => {
                eprintln!("skipped: {KAFKA_ENV} is not set (scripts/kafka start prints what to set it to)");
                return None;
            }
        };
        let text = if raw.starts_with('{') || !std::path::Path::new(&raw).is_file() {
            raw
        } else {
            std::fs::read_to_string(&raw).unwrap_or_else(|e| panic!("{KAFKA_ENV}: reading {raw}: {e}"))
        };
        if text.trim_start().starts_with('{') {
            let info: Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{KAFKA_ENV}: not JSON: {e}"));
            let bootstrap = info["bootstrap_servers"].as_str().expect("bootstrap_servers in the cluster's JSON").to_owned();
            Some(ExternalKafka { bootstrap, info })
        } else {
            Some(ExternalKafka { bootstrap: text.trim().to_owned(), info: Value::Null })
        }
    }

    /// The cluster every `Pipeline::start*` runs on under `HOOKLINE_TEST_BROKER=kafka`, else `None`.
    pub fn for_the_whole_suite() -> Option<ExternalKafka> {
        match std::env::var(BROKER_ENV).as_deref() {
            Ok("kafka") => {
                let k = ExternalKafka::from_env();
                Some(k.unwrap_or_else(|| panic!("{BROKER_ENV}=kafka needs {KAFKA_ENV} (scripts/kafka start prints it)")))
            }
            Ok("mock" | "") | Err(_) => None,
            Ok(other) => panic!("{BROKER_ENV}={other}: expected `mock` or `kafka`"),
        }
    }

    /// Replicas per partition: three on a cluster of three or more nodes (or bootstrap servers), else one.
    pub fn replication(&self) -> i32 {
        let nodes = self.info["nodes"].as_array().map_or_else(|| self.bootstrap.split(',').count(), Vec::len);
        if nodes >= 3 {
            3
        } else {
            1
        }
    }

    /// A topic prefix no other test or run uses. It starts with `hookline`: the ACLs scripts/kafka grants
    /// `User:hookline` are prefixed with that.
    pub fn fresh_prefix() -> String {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("hookline.it-{}-{n}-{:08x}.", std::process::id(), rand::random::<u32>())
    }

    /// PLAINTEXT client settings (the super user of scripts/kafka's clusters).
    pub fn admin_settings(&self) -> hookline_kafka::KafkaSettings {
        hookline_kafka::KafkaSettings { bootstrap_servers: self.bootstrap.clone(), ..Default::default() }
    }

    /// Creates every hookline topic under `prefix`; `compacted` is added to the configs of the compacted ones.
    pub async fn create_topics(&self, prefix: &str, partitions: i32, compacted: &[(&str, &str)]) {
        create_topics(&self.admin_settings(), prefix, partitions, self.replication(), compacted).await;
    }

    /// The pipeline (ingest, a dispatcher, the retry-scheduler) on this cluster under a fresh prefix, its topics
    /// created first; `edit` may change the connection (another listener) and anything else.
    pub async fn pipeline(&self, partitions: i32, edit: impl FnOnce(&mut hookline_service::Config)) -> Pipeline {
        self.pipeline_with(partitions, edit, true, true).await
    }

    /// Like [`ExternalKafka::pipeline`] on topics that exist: a restarted pipeline reads what the one before left.
    pub async fn pipeline_on(&self, prefix: &str, partitions: i32, edit: impl FnOnce(&mut hookline_service::Config)) -> Pipeline {
        self.start_on(prefix, partitions, edit, true).await
    }

    /// Like [`ExternalKafka::pipeline`], without a dispatcher: the test runs its own (`hookline_dispatcher::run`).
    pub async fn pipeline_without_dispatcher(&self, partitions: i32, edit: impl FnOnce(&mut hookline_service::Config)) -> Pipeline {
        self.pipeline_with(partitions, edit, false, true).await
    }

    /// The pipeline on topics that exist under `prefix`, with a dispatcher or without one (the test runs its own).
    pub async fn start_on(
        &self,
        prefix: &str,
        partitions: i32,
        edit: impl FnOnce(&mut hookline_service::Config),
        dispatcher: bool,
    ) -> Pipeline {
        self.start_on_with(prefix, partitions, edit, dispatcher, true).await
    }

    /// A pipeline under a fresh prefix, its topics created, with or without a dispatcher and a retry-scheduler.
    async fn pipeline_with(
        &self,
        partitions: i32,
        edit: impl FnOnce(&mut hookline_service::Config),
        dispatcher: bool,
        scheduler: bool,
    ) -> Pipeline {
        let prefix = Self::fresh_prefix();
        self.create_topics(&prefix, partitions, &[]).await;
        self.start_on_with(&prefix, partitions, edit, dispatcher, scheduler).await
    }

    async fn start_on_with(
        &self,
        prefix: &str,
        partitions: i32,
        edit: impl FnOnce(&mut hookline_service::Config),
        dispatcher: bool,
        scheduler: bool,
    ) -> Pipeline {
        let replication = self.replication();
        Pipeline::start_at_with(
            None,
            &self.bootstrap,
            partitions,
            |c| {
                use_prefix(c, prefix);
                c.kafka.replication_factor = replication;
                // A real broker answers a fetch as soon as records arrive; the wait bounds only idle polls.
                c.kafka.fetch_wait_max_ms = 100;
                c.kafka.offsets_by_time = true;
                c.kafka.check_acls_at_start = true;
                edit(c);
                // Tuned for the mock broker, a test may ask less than Apache Kafka's group.min.session.timeout.ms.
                c.kafka.session_timeout_ms = c.kafka.session_timeout_ms.max(6_000);
            },
            dispatcher,
            scheduler,
        )
        .await
    }
}

/// Puts a config's topics under `prefix` and its consumer groups under names made from it.
pub fn use_prefix(c: &mut hookline_service::Config, prefix: &str) {
    c.kafka.topic_prefix = prefix.to_owned();
    c.ingest.group_id = format!("{prefix}ingest");
    c.dispatcher.group_id = format!("{prefix}dispatcher");
    c.retry_scheduler.group_id = format!("{prefix}retry-scheduler");
    c.log.group_id = format!("{prefix}log-indexer");
}

/// Creates every hookline topic under `prefix` through the admin API (CreateTopics) with `settings`; `compacted` is
/// added to the configs of the compacted topics.
pub async fn create_topics(
    settings: &hookline_kafka::KafkaSettings,
    prefix: &str,
    partitions: i32,
    replication: i32,
    compacted: &[(&str, &str)],
) {
    use hookline_kafka::topics::Cleanup;
    use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
    let admin = hookline_kafka::client::admin(settings, "integration-admin").expect("admin client");
    let specs = Topics::new(prefix).all();
    let new: Vec<NewTopic<'_>> = specs
        .iter()
        .map(|s| {
            let mut t = NewTopic::new(&s.name, partitions, TopicReplication::Fixed(replication));
            match s.cleanup {
                Cleanup::Compact => {
                    t = t.set("cleanup.policy", "compact");
                    for (k, v) in compacted {
                        t = t.set(k, v);
                    }
                }
                Cleanup::Delete => t = t.set("cleanup.policy", "delete"),
            }
            t
        })
        .collect();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(20)));
    let results = tokio::time::timeout(Duration::from_secs(30), admin.create_topics(&new, &options))
        .await
        .expect("CreateTopics answered in time")
        .expect("CreateTopics request");
    for r in results {
        r.unwrap_or_else(|(name, code)| panic!("creating {name}: {code}"));
    }
    // The controller answered; each broker learns of the topics (and their leaders) a moment later, and a service
    // whose first metadata request a broker answers before that fails at start (`MissingTopic`). Every broker is
    // asked through a client of its own, whose only known broker (its bootstrap) answers its first request.
    let names: Vec<String> = specs.into_iter().map(|s| s.name).collect();
    for broker in settings.bootstrap_servers.split(',') {
        let one = hookline_kafka::KafkaSettings { bootstrap_servers: broker.to_owned(), ..settings.clone() };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !topics_known(&one, &names, partitions) {
            assert!(Instant::now() < deadline, "{broker} did not know the topics under {prefix} with leaders after 30 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Whether the broker a new client with `settings` asks first knows every topic of `names`, with leaders.
fn topics_known(settings: &hookline_kafka::KafkaSettings, names: &[String], partitions: i32) -> bool {
    let admin = hookline_kafka::client::admin(settings, "integration-metadata").expect("admin client");
    let md = tokio::task::block_in_place(|| admin.inner().fetch_metadata(None, Duration::from_secs(10))).expect("metadata");
    names.iter().all(|name| {
        md.topics().iter().any(|t| {
            t.name() == name
                && t.error().is_none()
                && t.partitions().len() == partitions as usize
                && t.partitions().iter().all(|p| p.leader() >= 0)
        })
    })
}

/// The Python interpreter with the interoperability libraries (`scripts/python-test-deps`), or `None` (the caller
/// skips, saying so) unless the run requires it (`HOOKLINE_TEST_REQUIRE_PYTHON`, as scripts/test sets).
pub fn python() -> Option<String> {
    match std::env::var("HOOKLINE_TEST_PYTHON") {
        Ok(v) if !v.trim().is_empty() => Some(v.trim().to_owned()),
        _ if std::env::var_os("HOOKLINE_TEST_REQUIRE_PYTHON").is_some() => {
            panic!("HOOKLINE_TEST_PYTHON is not set and this run requires it: scripts/python-test-deps prints the interpreter")
        }
        _ => {
            eprintln!("skipped: HOOKLINE_TEST_PYTHON is not set (scripts/python-test-deps prints what to set it to)");
            None
        }
    }
}

/// Runs a script of tests/integration/interop with `python` and returns its standard output; a failing script
/// fails the test with its standard error.
pub async fn run_python(python: &str, script: &str, args: &[&str]) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/integration/interop").join(script);
    let mut cmd = std::process::Command::new(python);
    cmd.arg(&path).args(args);
    let out = tokio::task::spawn_blocking(move || cmd.output()).await.expect("join").expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{script} {args:?} failed ({}):\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    stdout
}
