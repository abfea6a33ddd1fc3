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
}

pub fn run(cmd: LogCmd) -> anyhow::Result<ExitCode> {
    match cmd {
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
