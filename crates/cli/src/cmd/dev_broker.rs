//! `hookline dev-broker`: the embedded broker alone, so the three binaries can run as separate processes.

use std::process::ExitCode;

use hookline_kafka::mock::DevBroker;
use hookline_kafka::Topics;

#[derive(clap::Args)]
pub struct DevBrokerArgs {
    /// Partitions of every topic.
    #[arg(long, default_value_t = 4)]
    partitions: i32,
    /// Topic name prefix.
    #[arg(long, default_value = "hookline.")]
    topic_prefix: String,
}

pub fn run(args: DevBrokerArgs) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Runtime::new()?;
    let broker = DevBroker::start(&Topics::new(args.topic_prefix), args.partitions, args.partitions)?;
    // The first line is machine-readable, for scripts and the crash tests.
    println!("{}", serde_json::json!({"bootstrap_servers": broker.bootstrap_servers()}));
    eprintln!(
        "hookline dev-broker: librdkafka's IN-MEMORY mock cluster at {}. For trying hookline only: no persistence, \
         no compaction, ~5 MiB per partition. Point the binaries at it with HOOKLINE_KAFKA__BOOTSTRAP_SERVERS={} \
         HOOKLINE_KAFKA__PARTITIONS={} HOOKLINE_KAFKA__EVENT_PARTITIONS={} HOOKLINE_KAFKA__REPLICATION_FACTOR=1. Ctrl-C stops it.",
        broker.bootstrap_servers(),
        broker.bootstrap_servers(),
        args.partitions,
        args.partitions
    );
    rt.block_on(async {
        let _ = tokio::signal::ctrl_c().await;
    });
    drop(broker);
    Ok(ExitCode::SUCCESS)
}
