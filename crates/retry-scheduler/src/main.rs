//! `hookline-retry-scheduler`: parse arguments, load config, start telemetry, run until SIGTERM.

use std::path::PathBuf;

use clap::Parser;

/// Holds retries on the tier topics until they are due, and held deliveries until their subscription resumes.
#[derive(Parser)]
#[command(name = "hookline-retry-scheduler", version, about)]
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
    hookline_retry_scheduler::run(config, shutdown, hookline_retry_scheduler::Options { serve_health: true, ..Default::default() }).await?;
    Ok(())
}
