//! The pipeline under test: the broker and the three services as child processes of this executable
//! (`hookline bench --serve ROLE`, config in `HOOKLINE_BENCH_CONFIG_TOML`), the ingest API for subscriptions, a producer for events,
//! and per-process CPU / RSS readings from `/proc`.
//!
//! A child stops when its stdin closes (the parent closed it, or died), so nothing outlives a bench run.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use hookline_kafka::client::Producer as FutureProducer;
use hookline_kafka::mock::DevBroker;
use hookline_kafka::topics::Cleanup;
use hookline_kafka::Topics;
use hookline_service::Config;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::receiver::Receiver;
use super::BenchArgs;

pub const TOKEN: &str = "bench-token-not-for-production";

/// The environment variable a child reads its config (TOML) from.
pub const CONFIG_ENV: &str = "HOOKLINE_BENCH_CONFIG_TOML";

/// Where the `log-indexer` child serves its health routes and `/metrics` (the config has no address for it).
const HEALTH_ENV: &str = "HOOKLINE_BENCH_HEALTH_ADDR";

/// Runs one service in this (child) process until stdin closes.
pub fn serve(role: &str, config_toml: &str) -> anyhow::Result<ExitCode> {
    let config: Config = toml::from_str(config_toml).context("the bench child's config")?;
    hookline_service::telemetry::init(&config.telemetry);
    if role == "broker" {
        let topics = Topics::new(config.kafka.topic_prefix.clone());
        let broker = DevBroker::start(&topics, config.kafka.partitions, config.kafka.event_partitions)?;
        for name in super::throughput::FLOOR_MODES.iter().flat_map(|m| super::throughput::floor_topics(&config.kafka.topic_prefix, m)) {
            broker.cluster().create_topic(&name, config.kafka.partitions, 1)?;
        }
        println!("{}", json!({"bootstrap_servers": broker.bootstrap_servers()}));
        wait_stdin_eof();
        drop(broker);
        return Ok(ExitCode::SUCCESS);
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let shutdown = CancellationToken::new();
    let s = shutdown.clone();
    std::thread::spawn(move || {
        wait_stdin_eof();
        s.cancel();
    });
    let result: anyhow::Result<()> = rt.block_on(async {
        match role {
            "ingest" => hookline_ingest::run(config, shutdown, Default::default()).await?,
            // Health routes on (the bench picked free ports), so the parent can read their /metrics.
            "dispatcher" => {
                let options = hookline_dispatcher::Options { serve_health: true, ..Default::default() };
                hookline_dispatcher::run(config, shutdown, options).await?
            }
            "retry-scheduler" => {
                let options = hookline_retry_scheduler::Options { serve_health: true, ..Default::default() };
                hookline_retry_scheduler::run(config, shutdown, options).await?
            }
            // As `hookline log index` runs it (PostgreSQL: the indexer as a process of its own).
            "log-indexer" => {
                let addr: SocketAddr = std::env::var(HEALTH_ENV).context(HEALTH_ENV)?.parse().context(HEALTH_ENV)?;
                let readiness = hookline_service::health::Readiness::default();
                let metrics = hookline_service::telemetry::metrics_handle();
                hookline_service::health::serve(addr, readiness.clone(), metrics, Default::default(), shutdown.clone()).await?;
                readiness.set(true);
                hookline_log::indexer::run(config, shutdown).await?
            }
            other => anyhow::bail!("unknown bench role {other}"),
        }
        Ok(())
    });
    rt.shutdown_timeout(Duration::from_secs(2));
    result?;
    Ok(ExitCode::SUCCESS)
}

/// The host name `--named-host` gives the receiver: this machine's own name (`/proc/sys/kernel/hostname`), when
/// the system resolver maps it to loopback only (as `/etc/hosts` usually does), so that the API's check and the
/// dispatcher resolve a real name through `getaddrinfo` like any endpoint's. `localhost` cannot stand in: the
/// egress guard refuses that name itself.
pub async fn named_host() -> anyhow::Result<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").context("--named-host: reading this machine's host name")?;
    let name = name.trim().to_owned();
    let addrs: Vec<std::net::IpAddr> = tokio::net::lookup_host((name.as_str(), 0))
        .await
        .with_context(|| format!("--named-host: this machine's name {name:?} does not resolve"))?
        .map(|a| a.ip())
        .collect();
    if addrs.is_empty() || !addrs.iter().all(|ip| ip.is_loopback() && ip.is_ipv4()) {
        anyhow::bail!("--named-host needs this machine's name {name:?} to resolve to 127.0.0.0/8 only (it resolves to {addrs:?})");
    }
    Ok(name)
}

fn wait_stdin_eof() {
    let mut buf = [0u8; 64];
    let mut stdin = std::io::stdin();
    while let Ok(n) = stdin.read(&mut buf) {
        if n == 0 {
            break;
        }
    }
}

/// A command prefix (split at whitespace) the dispatcher child is started under, e.g. `heaptrack -o /tmp/d` to
/// see where its heap goes (`heaptrack` preloads itself into glibc's malloc, so only what goes through glibc is
/// seen: a build whose `#[global_allocator]` is jemalloc shows librdkafka's allocations only). The pid the bench
/// reads `/proc` of (RSS, CPU) is then the wrapper's, unless it `exec`s the dispatcher.
pub const DISPATCHER_WRAPPER_ENV: &str = "HOOKLINE_BENCH_DISPATCHER_WRAPPER";

/// The program and its arguments of a command prefix; `None` if it is blank.
fn wrapped(prefix: &str) -> Option<(&str, impl Iterator<Item = &str>)> {
    let mut words = prefix.split_whitespace();
    words.next().map(|program| (program, words))
}

/// A child process; stopped (stdin closed, then killed if it lingers) when dropped.
pub struct Proc {
    pub pid: u32,
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Proc {
    pub(super) fn spawn(role: &'static str, config: &Config, capture_stdout: bool) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("locating the hookline executable")?;
        Self::spawn_from(&exe, role, config, capture_stdout)
    }

    /// Like [`Proc::spawn`], from the executable `exe` (`--against`: another build's services). The dispatcher
    /// starts under the command prefix in [`DISPATCHER_WRAPPER_ENV`] when it is set.
    pub(super) fn spawn_from(exe: &Path, role: &'static str, config: &Config, capture_stdout: bool) -> anyhow::Result<Self> {
        Self::spawn_from_env(exe, role, config, capture_stdout, &[])
    }

    /// [`Proc::spawn_from`] with more variables in the child's environment.
    fn spawn_from_env(
        exe: &Path,
        role: &'static str,
        config: &Config,
        capture_stdout: bool,
        env: &[(&str, String)],
    ) -> anyhow::Result<Self> {
        let toml = toml_beside_defaults(config)?;
        let wrapper = match role {
            "dispatcher" => std::env::var(DISPATCHER_WRAPPER_ENV).ok(),
            _ => None,
        };
        let mut command = match wrapper.as_deref().map(wrapped) {
            Some(Some((program, args))) => {
                let mut c = Command::new(program);
                c.args(args).arg(exe);
                c
            }
            Some(None) => anyhow::bail!("{DISPATCHER_WRAPPER_ENV} is set but names no command"),
            None => Command::new(exe),
        };
        let mut child = command
            .args(["bench", "--serve", role])
            .env(CONFIG_ENV, &toml)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::piped())
            .stdout(if capture_stdout { Stdio::piped() } else { Stdio::null() })
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting the {role} child ({})", exe.display()))?;
        let stdin = child.stdin.take();
        Ok(Self { pid: child.id(), child, stdin })
    }

    /// Closes stdin: the child drains and exits on its own (`stop` then waits for it).
    pub fn close_stdin(&mut self) {
        drop(self.stdin.take());
    }

    /// Closes stdin and waits up to `grace` for the child to exit; kills it (by its pid) after that.
    pub fn stop(&mut self, grace: Duration) {
        drop(self.stdin.take());
        let deadline = Instant::now() + grace;
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) if Instant::now() >= deadline => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// The child's exit status, if it has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    pub fn cpu_s(&self) -> f64 {
        proc_cpu_s(&format!("/proc/{}/stat", self.pid))
    }

    /// CPU seconds of the child's threads: (librdkafka `rdk:*` threads, all others).
    pub fn split_cpu_s(&self) -> (f64, f64) {
        let (mut rdk, mut other) = (0.0, 0.0);
        if let Ok(dir) = std::fs::read_dir(format!("/proc/{}/task", self.pid)) {
            for e in dir.flatten() {
                let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
                let cpu = proc_cpu_s(&e.path().join("stat").to_string_lossy());
                if comm.starts_with("rdk:") {
                    rdk += cpu;
                } else {
                    other += cpu;
                }
            }
        }
        (rdk, other)
    }

    /// CPU seconds of the child's threads named `name` (as `/proc/<pid>/task/*/comm` shows it).
    pub fn thread_cpu_s(&self, name: &str) -> f64 {
        let Ok(dir) = std::fs::read_dir(format!("/proc/{}/task", self.pid)) else { return 0.0 };
        dir.flatten()
            .filter(|e| std::fs::read_to_string(e.path().join("comm")).unwrap_or_default().trim_end() == name)
            .map(|e| proc_cpu_s(&e.path().join("stat").to_string_lossy()))
            .sum()
    }

    /// (VmHWM, VmRSS) in MiB.
    pub fn rss_mb(&self) -> (f64, f64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap_or_default();
        let kb = |key: &str| -> f64 {
            status
                .lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        (kb("VmHWM:") / 1024.0, kb("VmRSS:") / 1024.0)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(10));
    }
}

/// utime + stime of a `/proc/.../stat` file, in seconds (USER_HZ is 100 on Linux).
fn proc_cpu_s(path: &str) -> f64 {
    let Ok(stat) = std::fs::read_to_string(path) else { return 0.0 };
    let Some((_, rest)) = stat.rsplit_once(')') else { return 0.0 };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // After "pid (comm)": state=0 ... utime=11 stime=12.
    (ticks(11) + ticks(12)) / 100.0
}

/// CPU seconds of this process's threads, grouped: `receiver` (bench-recv*), `raw_client` (bench-raw*), and
/// `driver` (everything else: the event producer, Kafka readers, the bench's own runtime).
pub fn own_threads_cpu() -> HashMap<&'static str, f64> {
    let mut out: HashMap<&'static str, f64> = HashMap::from([("receiver", 0.0), ("raw_client", 0.0), ("driver", 0.0)]);
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return out };
    for e in dir.flatten() {
        let p = e.path();
        let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        let cpu = proc_cpu_s(&p.join("stat").to_string_lossy());
        let group = if comm.starts_with("bench-recv") {
            "receiver"
        } else if comm.starts_with("bench-raw") {
            "raw_client"
        } else {
            "driver"
        };
        *out.entry(group).or_default() += cpu;
    }
    out
}

/// A snapshot of every process's CPU, to take differences over a measured window.
pub struct CpuSnapshot(pub HashMap<&'static str, f64>);

/// The running pipeline.
pub struct Cluster {
    pub config: Config,
    pub api: SocketAddr,
    pub broker: Option<Proc>,
    pub ingest: Proc,
    pub dispatcher: Proc,
    pub scheduler: Proc,
    /// The executable the services run from: this one, or `--against`'s (the broker is always this one's).
    pub exe: PathBuf,
    http: Client<HttpConnector, Full<Bytes>>,
    /// Set when the topics live on a real cluster (deleted on stop).
    real_topics: bool,
    /// `--log-store postgres`: (server URL, scratch database), dropped on stop.
    scratch_db: Option<(String, String)>,
    /// The delivery log's indexer as a process of its own (ingest runs none), and where it serves `/metrics`: with
    /// PostgreSQL, and with SQLite unless `--log-in-ingest`.
    pub log_indexer: Option<(Proc, SocketAddr)>,
}

impl Cluster {
    /// Starts the broker (unless `--brokers`) and the three services; `tune` adjusts the config first.
    pub async fn start(args: &BenchArgs, tune: impl FnOnce(&mut Config)) -> anyhow::Result<Self> {
        let t = Instant::now();
        let mut config = Config::dev("127.0.0.1:1", args.partitions, TOKEN);
        config.telemetry.log_level = "error".into();
        // The producers batch as shipped, not as dev mode's 1 ms: fewer, larger produce requests are what a
        // deployment gets, and they set much of the broker's and librdkafka's CPU per delivery.
        config.kafka.linger_ms = hookline_kafka::KafkaSettings::default().linger_ms;
        // Checked by `bench::run` before anything started.
        config.kafka.properties.extend(args.kafka_property.iter().cloned());
        let (broker, real_topics) = match &args.brokers {
            None => {
                let mut proc = Proc::spawn("broker", &config, true)?;
                let stdout = proc.child.stdout.take().context("broker stdout")?;
                let line = tokio::task::spawn_blocking(move || {
                    let mut line = String::new();
                    let _ = BufReader::new(stdout).read_line(&mut line);
                    line
                })
                .await?;
                let v: Value = serde_json::from_str(line.trim()).context("the broker child did not start")?;
                config.kafka.bootstrap_servers = v["bootstrap_servers"].as_str().unwrap_or_default().to_owned();
                (Some(proc), false)
            }
            Some(b) => {
                config.kafka.bootstrap_servers = b.clone();
                config.kafka.replication_factor = args.replication_factor;
                config.kafka.topic_prefix = format!("hookline-bench-{}.", hookline_service::now_ms());
                create_topics(&config).await?;
                (None, true)
            }
        };
        // A free port for the ingest API (bound, read, released: the child binds it right after).
        let api = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        config.ingest.listen_addr = api;
        config.dispatcher.health_addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        config.retry_scheduler.health_addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let scratch_db = match args.log_store {
            // The indexer beside ingest on the same file, unless `--log-in-ingest`: the log's CPU is then read whole.
            super::LogStore::Sqlite => {
                config.log.run_indexer = args.log_in_ingest;
                None
            }
            super::LogStore::Postgres => {
                let server = args.postgres_url.clone().context("--log-store postgres: needs --postgres-url")?;
                let (url, name) = super::log::scratch(&server).await?;
                config.log.store = hookline_service::config::LogStoreKind::Postgres;
                config.log.postgres_url = Some(url);
                // The topology operations.md gives big installs: ingest serves the API and fans out; the indexer
                // runs apart (`hookline log index`), so its CPU is read apart.
                config.log.run_indexer = false;
                Some((server, name))
            }
        };
        tune(&mut config);
        apply_sets(&mut config, &args.set)?;
        config.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
        let exe = match &args.services_exe {
            Some(p) => p.clone(),
            None => std::env::current_exe().context("locating the hookline executable")?,
        };
        let ingest = Proc::spawn_from(&exe, "ingest", &config, false)?;
        let dispatcher = Proc::spawn_from(&exe, "dispatcher", &config, false)?;
        let scheduler = Proc::spawn_from(&exe, "retry-scheduler", &config, false)?;
        let log_indexer = match config.log.run_indexer {
            true => None,
            false => {
                let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
                Some((Proc::spawn_from_env(&exe, "log-indexer", &config, false, &[(HEALTH_ENV, addr.to_string())])?, addr))
            }
        };
        let http = Client::builder(TokioExecutor::new()).build_http();
        let mut cluster = Self { config, api, broker, ingest, dispatcher, scheduler, exe, http, real_topics, scratch_db, log_indexer };
        // Ready when the API answers /readyz (its tables are read).
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let req = http::Request::get(format!("http://{api}/readyz")).body(Full::new(Bytes::new()))?;
            if let Ok(Ok(r)) = tokio::time::timeout(Duration::from_secs(2), cluster.http.request(req)).await {
                if r.status().is_success() {
                    break;
                }
            }
            // A child that exited (e.g. another build refusing this build's config: its error is on stderr above).
            let indexer = cluster.log_indexer.as_mut().map(|(p, _)| ("log-indexer", p));
            let children =
                [("ingest", &mut cluster.ingest), ("dispatcher", &mut cluster.dispatcher), ("retry-scheduler", &mut cluster.scheduler)];
            for (role, p) in children.into_iter().chain(indexer) {
                if let Some(status) = p.exited() {
                    anyhow::bail!("the {role} child ({}) exited before the pipeline was ready: {status}", cluster.exe.display());
                }
            }
            anyhow::ensure!(Instant::now() < deadline, "ingest did not become ready within 60 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        eprintln!(
            "  pipeline up in {:.1} s: broker {} · ingest pid {} · dispatcher pid {} · retry-scheduler pid {}",
            t.elapsed().as_secs_f64(),
            cluster.config.kafka.bootstrap_servers,
            cluster.ingest.pid,
            cluster.dispatcher.pid,
            cluster.scheduler.pid
        );
        Ok(cluster)
    }

    pub fn topics(&self) -> Topics {
        Topics::new(self.config.kafka.topic_prefix.clone())
    }

    /// Creates a subscription through the API; returns its id.
    pub async fn subscribe(&self, body: Value) -> anyhow::Result<String> {
        let req = http::Request::post(format!("http://{}/v1/subscriptions", self.api))
            .header("authorization", format!("Bearer {TOKEN}"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(serde_json::to_vec(&body)?)))?;
        let resp = self.http.request(req).await?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes();
        let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        anyhow::ensure!(status.as_u16() == 201, "creating a subscription failed: {status} {v}");
        Ok(v["id"].as_str().unwrap_or_default().to_owned())
    }

    /// Deletes a subscription through the API.
    pub async fn unsubscribe(&self, id: &str) -> anyhow::Result<()> {
        let req = http::Request::delete(format!("http://{}/v1/subscriptions/{id}", self.api))
            .header("authorization", format!("Bearer {TOKEN}"))
            .body(Full::new(Bytes::new()))?;
        let status = self.http.request(req).await?.status();
        anyhow::ensure!(status.is_success(), "deleting subscription {id} failed: {status}");
        Ok(())
    }

    /// Creates many subscriptions, a few at a time.
    pub async fn subscribe_all(self: &Arc<Self>, bodies: Vec<Value>) -> anyhow::Result<Vec<String>> {
        let sem = Arc::new(tokio::sync::Semaphore::new(8));
        let mut handles = Vec::new();
        for b in bodies {
            let (me, sem) = (self.clone(), sem.clone());
            handles.push(tokio::spawn(async move {
                let _p = sem.acquire_owned().await;
                me.subscribe(b).await
            }));
        }
        let mut ids = Vec::new();
        for h in handles {
            ids.push(h.await??);
        }
        Ok(ids)
    }

    /// A producer for the `events` topic with hookline's own client settings and the given linger.
    pub fn producer(&self, linger_ms: u64) -> anyhow::Result<FutureProducer> {
        let mut c = hookline_kafka::client::producer_config(&self.config.kafka, "hookline-bench")?;
        c.set("linger.ms", linger_ms.to_string());
        c.set("queue.buffering.max.messages", "1000000");
        Ok(FutureProducer::from_config(&c)?)
    }

    /// Publishes a warm-up event (type `bench.warm`, which every bench subscription also matches) every 500 ms
    /// until every one of `subs` subscription paths got one: then ingest and the dispatcher know them all.
    pub async fn warm_up(&self, publisher: &Publisher, receiver: &Receiver, subs: usize) -> anyhow::Result<()> {
        let t = Instant::now();
        let mut n = 0;
        while receiver.state.warm_count() < subs {
            anyhow::ensure!(
                t.elapsed() < Duration::from_secs(90),
                "warm-up: only {} of {subs} subscriptions reached",
                receiver.state.warm_count()
            );
            let id = format!("warm-{n}");
            let body = format!(r#"{{"id":"{id}","type":"bench.warm","data":{{}}}}"#);
            publisher.send(&id, body.as_bytes());
            n += 1;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        eprintln!("  warmed up in {:.1} s: {subs} subscriptions receive", t.elapsed().as_secs_f64());
        Ok(())
    }

    /// The sum of every series of each named counter/gauge on a service's `/metrics` (`dispatcher` or
    /// `retry-scheduler`); names that are absent are left out.
    pub async fn metrics(&self, role: &str, names: &[&str]) -> HashMap<String, f64> {
        let addr = if role == "dispatcher" { self.config.dispatcher.health_addr } else { self.config.retry_scheduler.health_addr };
        self.metrics_at(addr, names).await
    }

    /// Like [`Cluster::metrics`], from the `/metrics` at `addr` (e.g. a second dispatcher's).
    pub async fn metrics_at(&self, addr: SocketAddr, names: &[&str]) -> HashMap<String, f64> {
        let mut out = HashMap::new();
        let Ok(req) = http::Request::get(format!("http://{addr}/metrics")).body(Full::new(Bytes::new())) else { return out };
        let Ok(Ok(resp)) = tokio::time::timeout(Duration::from_secs(2), self.http.request(req)).await else { return out };
        let Ok(body) = resp.into_body().collect().await else { return out };
        for line in String::from_utf8_lossy(&body.to_bytes()).lines() {
            if line.starts_with('#') {
                continue;
            }
            let Some((series, value)) = line.rsplit_once(' ') else { continue };
            let name = series.split('{').next().unwrap_or(series);
            if let (true, Ok(v)) = (names.contains(&name), value.parse::<f64>()) {
                *out.entry(name.to_owned()).or_default() += v;
                if series.len() > name.len() {
                    *out.entry(series.to_owned()).or_default() += v;
                }
            }
        }
        out
    }

    /// A one-line summary of what the dispatcher and the retry-scheduler did (spills, retries, timeouts).
    pub async fn metrics_line(&self) -> String {
        let d = self
            .metrics(
                "dispatcher",
                &[
                    "hookline_deliveries_spilled_total",
                    "hookline_deliveries_retried_total",
                    "hookline_attempts_total",
                    "hookline_dispatcher_in_flight",
                    "hookline_dispatcher_stalls_total",
                ],
            )
            .await;
        let s = self.metrics("retry-scheduler", &["hookline_retry_held", "hookline_retry_rerouted_total"]).await;
        let g = |m: &HashMap<String, f64>, k: &str| m.get(k).copied().unwrap_or(0.0);
        format!(
            "dispatcher: attempts {:.0} ({:.0} timed out), retried {:.0}, spilled {:.0}, in flight {:.0}, stalls {:.0} · retry-scheduler: holding {:.0}, re-routed {:.0}",
            g(&d, "hookline_attempts_total"),
            g(&d, "hookline_attempts_total{outcome=\"timeout\"}"),
            g(&d, "hookline_deliveries_retried_total"),
            g(&d, "hookline_deliveries_spilled_total"),
            g(&d, "hookline_dispatcher_in_flight"),
            g(&d, "hookline_dispatcher_stalls_total"),
            g(&s, "hookline_retry_held"),
            g(&s, "hookline_retry_rerouted_total"),
        )
    }

    /// CPU seconds of every process of the run, by name.
    pub fn cpu(&self) -> CpuSnapshot {
        let mut m = own_threads_cpu();
        if let Some(b) = &self.broker {
            m.insert("broker", b.cpu_s());
        }
        m.insert("ingest", self.ingest.cpu_s());
        m.insert("dispatcher", self.dispatcher.cpu_s());
        let (rdk, other) = self.dispatcher.split_cpu_s();
        m.insert("dispatcher_librdkafka", rdk);
        m.insert("dispatcher_tokio", other);
        let (rdk, other) = self.ingest.split_cpu_s();
        m.insert("ingest_librdkafka", rdk);
        m.insert("ingest_tokio", other);
        // The delivery log's SQLite writes (its own thread): the store's share of ingest, told apart from the fan-out.
        m.insert("ingest_log_writer", self.ingest.thread_cpu_s(hookline_log::sqlite::WRITER_THREAD));
        m.insert("retry_scheduler", self.scheduler.cpu_s());
        if let Some((p, _)) = &self.log_indexer {
            m.insert("log_indexer", p.cpu_s());
        }
        CpuSnapshot(m)
    }

    pub async fn stop(mut self) {
        let real = self.real_topics;
        let config = self.config.clone();
        let scratch = self.scratch_db.take();
        tokio::task::spawn_blocking(move || {
            self.ingest.stop(Duration::from_secs(8));
            self.dispatcher.stop(Duration::from_secs(8));
            self.scheduler.stop(Duration::from_secs(8));
            if let Some((p, _)) = &mut self.log_indexer {
                p.stop(Duration::from_secs(8));
            }
            if let Some(b) = &mut self.broker {
                b.stop(Duration::from_secs(5));
            }
        })
        .await
        .ok();
        if real {
            let _ = delete_topics(&config).await;
        }
        if let Some((server, name)) = scratch {
            super::log::drop_scratch(&server, &name).await;
        }
    }
}

/// CPU seconds per 1000 units of work, per process, between two snapshots.
pub fn cpu_per_1k(a: &CpuSnapshot, b: &CpuSnapshot, units: f64, keys: &[&str]) -> Value {
    let mut m = serde_json::Map::new();
    for k in keys {
        let d = b.0.get(k).copied().unwrap_or(0.0) - a.0.get(k).copied().unwrap_or(0.0);
        if units > 0.0 {
            m.insert((*k).to_owned(), json!(super::round(d / units * 1000.0, 4)));
        }
    }
    Value::Object(m)
}

fn admin(config: &Config) -> anyhow::Result<rdkafka::admin::AdminClient<hookline_kafka::client::KafkaContext>> {
    Ok(hookline_kafka::client::admin(&config.kafka, "hookline-bench-admin")?)
}

async fn create_topics(config: &Config) -> anyhow::Result<()> {
    use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
    let admin = admin(config)?;
    let specs = Topics::new(config.kafka.topic_prefix.clone()).all();
    let topics: Vec<NewTopic<'_>> = specs
        .iter()
        .map(|s| {
            let n = if s.co_partitioned { config.kafka.partitions } else { config.kafka.event_partitions };
            NewTopic::new(&s.name, n, TopicReplication::Fixed(config.kafka.replication_factor)).set(
                "cleanup.policy",
                match s.cleanup {
                    Cleanup::Compact => "compact",
                    Cleanup::Delete => "delete",
                },
            )
        })
        .collect();
    for r in admin.create_topics(&topics, &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)))).await? {
        if let Err((name, code)) = r {
            anyhow::bail!("creating topic {name}: {code}");
        }
    }
    crate::cmd::topics::wait_for_leaders(config, Duration::from_secs(30)).await
}

async fn delete_topics(config: &Config) -> anyhow::Result<()> {
    let admin = admin(config)?;
    let names: Vec<String> = Topics::new(config.kafka.topic_prefix.clone()).all().into_iter().map(|s| s.name).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    admin.delete_topics(&refs, &rdkafka::admin::AdminOptions::new()).await?;
    Ok(())
}

/// A ~1 KiB JSON `data` object for event `seq`: some structure plus random hex, so it neither compresses to
/// nothing on the broker nor costs the producer much.
pub fn event_json(id: &str, event_type: &str, seq: u64) -> Vec<u8> {
    use rand::RngCore;
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut raw = [0u8; 400];
    rand::rng().fill_bytes(&mut raw);
    let mut blob = String::with_capacity(800);
    for b in raw {
        blob.push(HEX[(b >> 4) as usize] as char);
        blob.push(HEX[(b & 15) as usize] as char);
    }
    let body = format!(
        r#"{{"id":"{id}","type":"{event_type}","data":{{"seq":{seq},"customer":{{"id":"cus_{}","email":"buyer{seq}@example.com","country":"NL"}},"total_cents":{},"currency":"EUR","items":[{{"sku":"sku_1001","qty":2,"price_cents":1299}},{{"sku":"sku_2002","qty":1,"price_cents":4550}}],"note":"{blob}"}}}}"#,
        &blob[..16],
        1299 + seq % 1000
    );
    body.into_bytes()
}

/// Publishes events with send_result (order kept, nothing awaited inline); failures are counted.
pub struct Publisher {
    producer: FutureProducer,
    topic: String,
    pub failed: Arc<std::sync::atomic::AtomicU64>,
}

impl Publisher {
    pub fn new(producer: FutureProducer, topic: String) -> Self {
        Self { producer, topic, failed: Default::default() }
    }

    pub fn send(&self, id: &str, payload: &[u8]) {
        let record = rdkafka::producer::FutureRecord::to(&self.topic).key(id).payload(payload);
        match self.producer.send_result(record) {
            Ok(fut) => {
                let failed = self.failed.clone();
                tokio::spawn(async move {
                    if !matches!(fut.await, Ok(Ok(_))) {
                        failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                });
            }
            Err(_) => {
                self.failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }
}

/// `--set KEY=VALUE`: each dotted key of the config file set to a TOML value (one that does not parse as TOML is a
/// string), through the config's own deserializer, so an unknown key or a wrong type is refused naming the flag.
pub fn apply_sets(config: &mut Config, sets: &[(String, String)]) -> anyhow::Result<()> {
    if sets.is_empty() {
        return Ok(());
    }
    let mut root = toml::Value::try_from(&*config)?;
    for (key, raw) in sets {
        let value = toml::from_str::<toml::Table>(&format!("v = {raw}"))
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(raw.clone()));
        let mut at = &mut root;
        let mut parts = key.split('.').peekable();
        while let Some(part) = parts.next() {
            let toml::Value::Table(table) = at else { anyhow::bail!("--set {key}: {part:?} is inside a value, not a table") };
            if parts.peek().is_none() {
                table.insert(part.to_owned(), value.clone());
                break;
            }
            at = table.entry(part.to_owned()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        }
        // Checked one key at a time, so the error names the one at fault.
        root.clone().try_into::<Config>().map_err(|e| anyhow::anyhow!("--set {key}={raw}: {}", e.to_string().trim()))?;
    }
    *config = root.try_into()?;
    Ok(())
}

/// The child's config: only what differs from the defaults. Every build reads its own defaults for the rest, so
/// an `--against` build that predates a key (its config refuses unknown keys) still runs this build's
/// scenarios, as long as the bench leaves that key at its default.
fn toml_beside_defaults(config: &Config) -> anyhow::Result<String> {
    fn prune(value: &mut toml::Value, default: &toml::Value) {
        let (toml::Value::Table(table), toml::Value::Table(defaults)) = (value, default) else { return };
        table.retain(|k, v| {
            let Some(d) = defaults.get(k) else { return true };
            prune(v, d);
            v != d && !matches!(v, toml::Value::Table(t) if t.is_empty())
        });
    }
    let mut value = toml::Value::try_from(config)?;
    prune(&mut value, &toml::Value::try_from(Config::default())?);
    Ok(toml::to_string(&value)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_changes_one_key_and_refuses_an_unknown_key_or_a_wrong_type() {
        let mut c = Config::default();
        let sets = |v: &[(&str, &str)]| v.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect::<Vec<_>>();
        apply_sets(&mut c, &sets(&[("log.batch_max_records", "10000"), ("kafka.topic_prefix", "pfx.")])).unwrap();
        assert_eq!(c.log.batch_max_records, 10_000);
        assert_eq!(c.kafka.topic_prefix, "pfx.", "a value that is not TOML is a string");
        let before = c.log.batch_max_wait_ms;
        let e = apply_sets(&mut c, &sets(&[("log.batch_max_wait_ms", "1"), ("log.no_such_key", "1")])).unwrap_err().to_string();
        assert!(e.starts_with("--set log.no_such_key=1:") && e.contains("no_such_key"), "{e}");
        assert_eq!(c.log.batch_max_wait_ms, before, "nothing is applied when a key is refused");
        let e = apply_sets(&mut c, &sets(&[("log.batch_max_records", "\"many\"")])).unwrap_err().to_string();
        assert!(e.starts_with("--set log.batch_max_records=\"many\":"), "{e}");
        let e = apply_sets(&mut c, &sets(&[("log.batch_max_records.x", "1")])).unwrap_err().to_string();
        assert!(e.contains("inside a value"), "{e}");
    }

    #[test]
    fn a_wrapper_prefix_is_split_into_its_program_and_arguments() {
        let (program, args) = wrapped("  heaptrack  -o /tmp/dispatcher ").expect("a command");
        assert_eq!((program, args.collect::<Vec<_>>()), ("heaptrack", vec!["-o", "/tmp/dispatcher"]));
        assert!(wrapped(" \t ").is_none(), "a blank prefix names no command");
    }

    #[test]
    fn a_childs_config_names_only_what_differs_from_the_defaults() {
        let mut c = Config::default();
        c.dispatcher.max_in_flight = 7;
        c.log.sqlite_path = "/tmp/bench/log.sqlite3".into();
        let text = toml_beside_defaults(&c).unwrap();
        assert!(text.contains("max_in_flight = 7") && text.contains("/tmp/bench/log.sqlite3"), "{text}");
        assert!(!text.contains("sqlite_writer_nice"), "a key at its default is left to the child's own: {text}");
        assert!(!text.contains("[egress]"), "so is a section all at its defaults: {text}");
        let back: Config = toml::from_str(&text).unwrap();
        assert_eq!(toml::Value::try_from(&back).unwrap(), toml::Value::try_from(&c).unwrap(), "the child reads the same config");
    }
}
