//! `hookline-ingest`: parse arguments, load config, start telemetry, run until SIGTERM.

// jemalloc instead of glibc's malloc: the data plane allocates and frees on different threads (librdkafka's,
// tokio's), where glibc's arenas cost the most; see the allocator section of docs/benchmarks.md.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::path::PathBuf;

use clap::Parser;

/// What `--help` adds below the options: ports, what must be set, where the settings are described.
const INGEST_HELP: &str = "\
Listens on ingest.listen_addr (default 0.0.0.0:8080): the HTTP API (/v1, the portal, /openapi.json) and
/metrics, /healthz, /readyz.

Required settings (config file or HOOKLINE_<SECTION>__<KEY> variables):
  kafka.bootstrap_servers   the brokers (HOOKLINE_KAFKA__BOOTSTRAP_SERVERS)
  ingest.api_tokens         admin tokens, 16 characters or more (HOOKLINE_INGEST__API_TOKENS='[\"...\"]')
  secrets.keys or secrets.keys_file   master keys from `hookline secrets generate-key`
The topics must exist (`hookline topics create`). Every setting: docs/configuration.md.";

/// Accepts events (Kafka topic and HTTP API), fans them out to subscriptions, serves the management API.
#[derive(Parser)]
#[command(name = "hookline-ingest", version, after_help = INGEST_HELP)]
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
    hookline_service::telemetry::describe_metrics(&["ingest", "delivery log indexer"]);
    let shutdown = hookline_service::shutdown::on_signals();
    if let Err(e) = hookline_ingest::run(config, shutdown, Default::default()).await {
        eprintln!("error: {e}");
        return std::process::ExitCode::FAILURE;
    }
    std::process::ExitCode::SUCCESS
}
