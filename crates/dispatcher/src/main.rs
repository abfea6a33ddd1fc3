//! `hookline-dispatcher`: parse arguments, load config, start telemetry, run until SIGTERM.

// jemalloc instead of glibc's malloc: the data plane allocates and frees on different threads (librdkafka's,
// tokio's), where glibc's arenas cost the most; see the allocator section of docs/benchmarks.md.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::path::PathBuf;

use clap::Parser;

/// What `--help` adds below the options: ports, what must be set, where the settings are described.
const DISPATCHER_HELP: &str = "\
Listens on dispatcher.health_addr (default 0.0.0.0:9091): /metrics, /healthz, /readyz.

Required settings (config file or HOOKLINE_<SECTION>__<KEY> variables):
  kafka.bootstrap_servers   the brokers (HOOKLINE_KAFKA__BOOTSTRAP_SERVERS)
  secrets.keys or secrets.keys_file   the master keys ingest seals signing secrets with (the same ones)
Run one per `deliveries` partition at most (kafka.partitions). Every setting: docs/configuration.md.";

/// Sends delivery tasks from Kafka to webhook endpoints under their policies.
#[derive(Parser)]
#[command(name = "hookline-dispatcher", version, after_help = DISPATCHER_HELP)]
struct Args {
    /// The config file (TOML). `HOOKLINE_<SECTION>__<KEY>` environment variables override it.
    #[arg(long, env = "HOOKLINE_CONFIG")]
    config: Option<PathBuf>,
}

fn main() -> std::process::ExitCode {
    hookline_service::shutdown::run_main(serve())
}

async fn serve() -> std::process::ExitCode {
    let args = Args::parse();
    // Printed as one `error: …` line (no backtrace, whatever RUST_BACKTRACE says): these are the user's mistakes.
    let config = match hookline_service::Config::load(args.config.as_deref(), std::env::vars()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    hookline_service::telemetry::init(&config.telemetry);
    hookline_service::telemetry::describe_metrics(&["dispatcher"]);
    let shutdown = hookline_service::shutdown::on_signals();
    let options = hookline_dispatcher::Options { serve_health: true, ..Default::default() };
    if let Err(e) = hookline_dispatcher::run(config, shutdown, options).await {
        eprintln!("error: {e}");
        return std::process::ExitCode::FAILURE;
    }
    std::process::ExitCode::SUCCESS
}
