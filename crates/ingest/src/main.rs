//! `hookline-ingest`: parse arguments, load config, start telemetry, run until SIGTERM.

use std::path::PathBuf;

use clap::Parser;

/// Accepts events (Kafka topic and HTTP API), fans them out to subscriptions, serves the management API.
#[derive(Parser)]
#[command(name = "hookline-ingest", version, about)]
struct Args {
    /// The config file (TOML). `HOOKLINE_<SECTION>__<KEY>` environment variables override it.
    #[arg(long, env = "HOOKLINE_CONFIG")]
    config: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let config = hookline_service::Config::load(args.config.as_deref(), std::env::vars())?;
    hookline_service::telemetry::init(&config.telemetry);
    let shutdown = hookline_service::shutdown::on_signals();
    hookline_ingest::run(config, shutdown, Default::default()).await?;
    Ok(())
}
