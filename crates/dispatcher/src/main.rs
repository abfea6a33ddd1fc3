//! `hookline-dispatcher`: parse arguments, load config, start telemetry, run until SIGTERM.

use std::path::PathBuf;

use clap::Parser;

/// Sends delivery tasks from Kafka to webhook endpoints under their policies.
#[derive(Parser)]
#[command(name = "hookline-dispatcher", version, about)]
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
    let options = hookline_dispatcher::Options { serve_health: true, ..Default::default() };
    hookline_dispatcher::run(config, shutdown, options).await?;
    Ok(())
}
