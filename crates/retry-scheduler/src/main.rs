//! `hookline-retry-scheduler`: parse arguments, load config, start telemetry, run until SIGTERM.

// jemalloc instead of glibc's malloc: the data plane allocates and frees on different threads (librdkafka's,
// tokio's), where glibc's arenas cost the most; see the allocator section of docs/benchmarks.md.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::path::PathBuf;

use clap::Parser;

/// What `--help` adds below the options: ports, what must be set, where the settings are described.
const SCHEDULER_HELP: &str = "\
Listens on retry_scheduler.health_addr (default 0.0.0.0:9092): /metrics, /healthz, /readyz.

Required settings (config file or HOOKLINE_<SECTION>__<KEY> variables):
  kafka.bootstrap_servers   the brokers (HOOKLINE_KAFKA__BOOTSTRAP_SERVERS)
It needs no master key (it never opens a signing secret). Every setting: docs/configuration.md.";

/// Holds retries on the tier topics until they are due, and held deliveries until their subscription resumes.
#[derive(Parser)]
#[command(name = "hookline-retry-scheduler", version, after_help = SCHEDULER_HELP)]
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
    hookline_service::telemetry::describe_metrics(&["retry-scheduler"]);
    let shutdown = hookline_service::shutdown::on_signals();
    if let Err(e) =
        hookline_retry_scheduler::run(config, shutdown, hookline_retry_scheduler::Options { serve_health: true, ..Default::default() })
            .await
    {
        eprintln!("error: {e}");
        return std::process::ExitCode::FAILURE;
    }
    std::process::ExitCode::SUCCESS
}
