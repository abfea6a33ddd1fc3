//! `hookline topics`: list or create hookline's topics on a real Kafka cluster.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use hookline_kafka::topics::Cleanup;
use hookline_kafka::Topics;
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::types::RDKafkaErrorCode;

#[derive(clap::Subcommand)]
pub enum TopicsCmd {
    /// Print every topic with its partitions and cleanup policy, without touching a cluster.
    List {
        #[arg(long, env = "HOOKLINE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Create every topic (existing ones are left as they are). Uses the config's `[kafka]` table.
    Create {
        #[arg(long, env = "HOOKLINE_CONFIG")]
        config: Option<PathBuf>,
        /// Seconds to wait for the cluster.
        #[arg(long, default_value_t = 30)]
        timeout_s: u64,
    },
}

pub fn run(cmd: TopicsCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        TopicsCmd::List { config } => {
            let config = hookline_service::Config::load(config.as_deref(), std::env::vars())?;
            for spec in Topics::new(config.kafka.topic_prefix.clone()).all() {
                let partitions = if spec.co_partitioned { config.kafka.partitions } else { config.kafka.event_partitions };
                println!(
                    "{}",
                    serde_json::json!({
                        "topic": spec.name,
                        "partitions": partitions,
                        "cleanup.policy": match spec.cleanup { Cleanup::Compact => "compact", Cleanup::Delete => "delete" },
                        "retention.ms": spec.retention_ms,
                        "co_partitioned": spec.co_partitioned,
                    })
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        TopicsCmd::Create { config, timeout_s } => {
            let config = hookline_service::Config::load(config.as_deref(), std::env::vars())?;
            let rt = tokio::runtime::Runtime::new()?;
            rt.block_on(create(&config, Duration::from_secs(timeout_s)))
        }
    }
}

async fn create(config: &hookline_service::Config, timeout: Duration) -> anyhow::Result<ExitCode> {
    let admin = hookline_kafka::client::admin(&config.kafka, "hookline-topics").context("creating the Kafka admin client")?;
    let specs = Topics::new(config.kafka.topic_prefix.clone()).all();
    let retention: Vec<Option<String>> = specs.iter().map(|s| s.retention_ms.map(|r| r.to_string())).collect();
    let new_topics: Vec<NewTopic<'_>> = specs
        .iter()
        .zip(&retention)
        .map(|(s, r)| {
            let partitions = if s.co_partitioned { config.kafka.partitions } else { config.kafka.event_partitions };
            let mut t = NewTopic::new(&s.name, partitions, TopicReplication::Fixed(config.kafka.replication_factor));
            t = t.set("cleanup.policy", match s.cleanup { Cleanup::Compact => "compact", Cleanup::Delete => "delete" });
            if let Some(r) = r {
                t = t.set("retention.ms", r);
            }
            if config.kafka.replication_factor >= 3 {
                t = t.set("min.insync.replicas", "2");
            }
            t
        })
        .collect();
    let results = admin
        .create_topics(&new_topics, &AdminOptions::new().operation_timeout(Some(timeout)))
        .await
        .context("CreateTopics request")?;
    let mut failed = false;
    for r in results {
        match r {
            Ok(name) => println!("{}", serde_json::json!({"topic": name, "result": "created"})),
            Err((name, RDKafkaErrorCode::TopicAlreadyExists)) => {
                println!("{}", serde_json::json!({"topic": name, "result": "exists"}))
            }
            Err((name, code)) => {
                failed = true;
                println!("{}", serde_json::json!({"topic": name, "result": "error", "error": code.to_string()}));
            }
        }
    }
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}
