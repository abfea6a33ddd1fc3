//! `hookline dev-broker`: the embedded broker alone, so the three binaries can run as separate processes.

use std::process::ExitCode;

use hookline_kafka::mock::DevBroker;
use hookline_kafka::Topics;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

#[derive(clap::Args)]
pub struct DevBrokerArgs {
    /// Partitions of every topic.
    #[arg(long, default_value_t = 4)]
    partitions: i32,
    /// Topic name prefix.
    #[arg(long, default_value = "hookline.")]
    topic_prefix: String,
    /// Read fault commands from stdin, one per line, and stop when stdin closes (for test harnesses such as
    /// `hookline soak`): `down` / `up` (broker 1 unreachable / back), `rtt MS` (every answer MS ms late; 0 ends it),
    /// `errors API` (every API request fails until cleared; API is produce, fetch, commit, or group for the
    /// consumer-group requests JoinGroup, SyncGroup and Heartbeat), `clear API`. Each applied command is acknowledged
    /// on stdout as `ok <command>`; a bad one as `error <message>`.
    #[arg(long)]
    control: bool,
}

pub fn run(args: DevBrokerArgs) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Runtime::new()?;
    let broker = DevBroker::start(&Topics::new(args.topic_prefix), args.partitions, args.partitions)?;
    // The first line is machine-readable, for scripts and the crash tests.
    println!("{}", serde_json::json!({"bootstrap_servers": broker.bootstrap_servers()}));
    eprintln!(
        "hookline dev-broker: librdkafka's IN-MEMORY mock cluster at {}. For trying hookline only: no persistence, \
         no compaction, ~5 MiB per partition. hookline's topics exist already (no `hookline topics create`). Point the \
         binaries at it with HOOKLINE_KAFKA__BOOTSTRAP_SERVERS={} HOOKLINE_KAFKA__PARTITIONS={} \
         HOOKLINE_KAFKA__EVENT_PARTITIONS={} HOOKLINE_KAFKA__REPLICATION_FACTOR=1 HOOKLINE_KAFKA__OFFSETS_BY_TIME=false. \
         Ctrl-C stops it.",
        broker.bootstrap_servers(),
        broker.bootstrap_servers(),
        args.partitions,
        args.partitions
    );
    if args.control {
        // The broker's own threads serve Kafka; this one only reads commands.
        for line in std::io::stdin().lines() {
            let line = line?;
            let cmd = line.trim();
            if cmd.is_empty() {
                continue;
            }
            match apply(&broker, cmd) {
                Ok(()) => println!("ok {cmd}"),
                Err(e) => println!("error {e}"),
            }
        }
    } else {
        rt.block_on(async {
            let _ = tokio::signal::ctrl_c().await;
        });
    }
    drop(broker);
    Ok(ExitCode::SUCCESS)
}

/// Far more than any fault lasts: the errors stay until `clear`.
const MANY_ERRORS: usize = 100_000;

fn apply(broker: &DevBroker, cmd: &str) -> Result<(), String> {
    let c = broker.cluster();
    use RDKafkaRespErr::{RD_KAFKA_RESP_ERR_NOT_COORDINATOR as NOT_COORDINATOR, RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION as NOT_LEADER};
    let api = |name: &str| match name {
        "produce" => Ok(vec![(RDKafkaApiKey::Produce, NOT_LEADER)]),
        "fetch" => Ok(vec![(RDKafkaApiKey::Fetch, NOT_LEADER)]),
        "commit" => Ok(vec![(RDKafkaApiKey::OffsetCommit, NOT_COORDINATOR)]),
        "group" => Ok(vec![
            (RDKafkaApiKey::JoinGroup, NOT_COORDINATOR),
            (RDKafkaApiKey::SyncGroup, NOT_COORDINATOR),
            (RDKafkaApiKey::Heartbeat, NOT_COORDINATOR),
        ]),
        other => Err(format!("unknown API {other:?}: expected produce, fetch, commit or group")),
    };
    let words: Vec<&str> = cmd.split_whitespace().collect();
    match words.as_slice() {
        ["down"] => c.broker_down(1).map_err(|e| e.to_string()),
        ["up"] => c.broker_up(1).map_err(|e| e.to_string()),
        ["rtt", ms] => {
            let ms: u64 = ms.parse().map_err(|_| format!("rtt {ms:?}: expected milliseconds"))?;
            c.broker_round_trip_time(1, std::time::Duration::from_millis(ms)).map_err(|e| e.to_string())
        }
        ["errors", name] => {
            for (key, err) in api(name)? {
                c.request_errors(key, &vec![err; MANY_ERRORS]);
            }
            Ok(())
        }
        ["clear", name] => {
            for (key, _) in api(name)? {
                c.clear_request_errors(key);
            }
            Ok(())
        }
        _ => Err(format!("unknown command {cmd:?}: expected down, up, rtt MS, errors API or clear API")),
    }
}
