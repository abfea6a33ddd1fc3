//! `hookline`: the operator CLI. Each subcommand lives in its own file under `cmd/`.

// jemalloc instead of glibc's malloc: the data plane allocates and frees on different threads (librdkafka's,
// tokio's), where glibc's arenas cost the most; see the allocator section of docs/benchmarks.md.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd;

/// hookline — Kafka-native webhook delivery. Operator commands: dev mode and its broker, topics, policies, payload
/// filters, dead letters, signatures, egress, master keys, the delivery log, benchmarks and the soak.
#[derive(Parser)]
#[command(name = "hookline", version, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
// Parsed once per run.
#[allow(clippy::large_enum_variant)]
enum Command {
    /// Run the whole pipeline in one process on an embedded, in-memory broker (for trying hookline only).
    Dev(cmd::dev::DevArgs),
    /// Run librdkafka's mock cluster alone and print its bootstrap servers.
    DevBroker(cmd::dev_broker::DevBrokerArgs),
    /// List or create hookline's Kafka topics.
    #[command(subcommand)]
    Topics(cmd::topics::TopicsCmd),
    /// List, show, check and simulate delivery policies.
    #[command(subcommand)]
    Policy(cmd::policy::PolicyCmd),
    /// Test a subscription's payload filter against an event, without a network.
    #[command(subcommand)]
    Filter(cmd::filter::FilterCmd),
    /// Read the dead-letter topic: the newest dead letters, filtered, readable or as JSON documents.
    #[command(subcommand)]
    Dlq(cmd::dlq::DlqCmd),
    /// Check a captured webhook request's signature and say exactly why it fails.
    Verify(cmd::verify::VerifyArgs),
    /// Ask the egress guard about URLs without sending anything.
    #[command(subcommand)]
    Egress(cmd::egress::EgressCmd),
    /// Make and check the master keys that seal signing secrets at rest.
    #[command(subcommand)]
    Secrets(cmd::secrets::SecretsCmd),
    /// The delivery log: apply its store's schema migrations (`migrate`), or run its indexer on its own (`index`).
    #[command(subcommand)]
    Log(cmd::log::LogCmd),
    /// Benchmark the pipeline (throughput, latency, retry-precision, isolation, memory, fanout, list, log, or all).
    Bench(cmd::bench::BenchArgs),
    /// Reliability soak: the broker and the three services as separate processes, a stream of events, faults
    /// (kill -9, SIGSTOP, SIGTERM, broker down, request errors); reports missing and duplicate deliveries.
    Soak(cmd::soak::SoakArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Dev(args) => cmd::dev::run(args),
        Command::DevBroker(args) => cmd::dev_broker::run(args),
        Command::Topics(c) => cmd::topics::run(c),
        Command::Policy(c) => cmd::policy::run(c),
        Command::Filter(c) => cmd::filter::run(c),
        Command::Dlq(c) => cmd::dlq::run(c),
        Command::Verify(args) => cmd::verify::run(args),
        Command::Egress(c) => cmd::egress::run(c),
        Command::Secrets(c) => cmd::secrets::run(c),
        Command::Log(c) => cmd::log::run(c),
        Command::Bench(args) => cmd::bench::run(args),
        Command::Soak(args) => cmd::soak::run(args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(2)
        }
    }
}
