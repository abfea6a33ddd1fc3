//! `hookline log`: the delivery log's store (docs/delivery-log.md).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use hookline_log::Target;

use super::output::{Format, OutputArgs};

#[derive(clap::Subcommand)]
pub enum LogCmd {
    /// Apply the delivery log's schema migrations that the store lacks, and print its schema version. Services
    /// apply them at start too; this lets a deploy migrate first (e.g. a Kubernetes Job before the rollout).
    Migrate {
        /// The store: `postgres://user@host:port/db`, `sqlite:PATH` or a SQLite file path. Default: the config's
        /// `[log]` table.
        #[arg(long, env = "HOOKLINE_LOG_URL", value_name = "URL")]
        url: Option<String>,
        /// The config file (TOML) whose `[log]` table names the store when `--url` is not given;
        /// `HOOKLINE_LOG__*` variables override it.
        #[arg(long, env = "HOOKLINE_CONFIG", value_name = "FILE")]
        config: Option<PathBuf>,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Run the delivery log's indexer on its own, until SIGTERM or Ctrl-C, beside API replicas (hookline-ingest)
    /// that run with `log.run_indexer = false`: for PostgreSQL anywhere; for SQLite on the same host as ingest, with
    /// the same `log.sqlite_path` (the file takes one writer and any number of readers; not on a network
    /// filesystem), so that the log's CPU can have cores or a priority of its own. It reads `attempts`, `dlq` and
    /// `events` in the consumer group `log.group_id` (shared by every indexer of the one store) and serves
    /// `/metrics`, `/healthz` and `/readyz` on --health-addr.
    Index {
        /// The config file (TOML): `[kafka]` and `[log]`; `HOOKLINE_<SECTION>__<KEY>` variables override it.
        #[arg(long, env = "HOOKLINE_CONFIG", value_name = "FILE")]
        config: Option<PathBuf>,
        /// Where `/metrics`, `/healthz` and `/readyz` listen (port 0 picks one, printed at start).
        #[arg(long, default_value = "0.0.0.0:9093", value_name = "ADDR")]
        health_addr: std::net::SocketAddr,
    },
}

fn index(config: Option<PathBuf>, health_addr: std::net::SocketAddr) -> anyhow::Result<ExitCode> {
    let config = hookline_service::Config::load(config.as_deref(), std::env::vars())?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let metrics = hookline_service::telemetry::init(&config.telemetry);
        hookline_service::telemetry::describe_metrics(&["delivery log indexer"]);
        let shutdown = hookline_service::shutdown::on_signals();
        let readiness = hookline_service::health::Readiness::default();
        let addr = hookline_service::health::serve(health_addr, readiness.clone(), metrics, Default::default(), shutdown.clone())
            .await
            .with_context(|| format!("--health-addr {health_addr}"))?;
        eprintln!("hookline log index: health and metrics on http://{addr}");
        // Ready once the store is open and the consumer starts (run_with_store opens nothing else that can fail late).
        let store = std::sync::Arc::new(
            hookline_log::LogStore::open(&Target::from_settings(&config.log)?).await.context("opening the delivery log store")?,
        );
        readiness.set(true);
        hookline_log::indexer::run_with_store(&config, store, "hookline-log-indexer", shutdown)
            .await
            .context("the delivery log indexer")?;
        anyhow::Ok(ExitCode::SUCCESS)
    })
}

pub fn run(cmd: LogCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        LogCmd::Index { config, health_addr } => index(config, health_addr),
        LogCmd::Migrate { url, config, output } => {
            let target = match url {
                Some(u) => Target::parse(&u).map_err(|e| anyhow::anyhow!("--url: {e}"))?,
                None => {
                    let config = hookline_service::Config::load(config.as_deref(), std::env::vars())?;
                    Target::from_settings(&config.log)?
                }
            };
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let (applied, version) = rt.block_on(hookline_log::migrate(&target)).context("migrating the delivery log")?;
            let (backend, location) = match &target {
                Target::Sqlite(p) => ("sqlite", p.display().to_string()),
                // The URL may hold a password: only say where.
                Target::Postgres(_) => ("postgres", "(from the URL)".to_owned()),
            };
            match output.format() {
                Format::Json => println!(
                    "{}",
                    serde_json::json!({"backend": backend, "location": location, "applied": applied, "schema_version": version})
                ),
                Format::Human if applied.is_empty() => {
                    println!("delivery log ({backend} {location}): schema version {version}, nothing to apply")
                }
                Format::Human => {
                    let list: Vec<String> = applied.iter().map(u32::to_string).collect();
                    println!("delivery log ({backend} {location}): applied migration {}; schema version {version}", list.join(", "))
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
