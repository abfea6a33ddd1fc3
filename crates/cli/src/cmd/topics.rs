//! `hookline topics`: list or create hookline's topics on a real Kafka cluster.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use hookline_kafka::topics::Cleanup;
use hookline_kafka::Topics;
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::types::RDKafkaErrorCode;

use super::output::{duration_ms, table, Format};

#[derive(clap::Subcommand)]
pub enum TopicsCmd {
    /// Print every topic with its partitions and cleanup policy, without touching a cluster: a table on a
    /// terminal, else JSON lines.
    List {
        /// The config file (TOML) whose `[kafka]` table sets the topic prefix and partition counts;
        /// `HOOKLINE_KAFKA__*` variables override it.
        #[arg(long, env = "HOOKLINE_CONFIG", value_name = "FILE")]
        config: Option<PathBuf>,
        #[command(flatten)]
        output: super::output::OutputArgs,
    },
    /// Create every topic (existing ones are left as they are). Uses the config's `[kafka]` table. Not needed with
    /// `hookline dev` or `hookline dev-broker`: their embedded broker creates the topics itself.
    Create {
        /// The config file (TOML) whose `[kafka]` table names the cluster, its security settings and the topics'
        /// prefix and partition counts; `HOOKLINE_KAFKA__*` variables override it.
        #[arg(long, env = "HOOKLINE_CONFIG", value_name = "FILE")]
        config: Option<PathBuf>,
        /// Seconds to wait for the cluster's answer (the whole command takes at most about this long).
        #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
        timeout_s: u64,
    },
}

pub fn run(cmd: TopicsCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        TopicsCmd::List { config, output } => {
            let config = hookline_service::Config::load(config.as_deref(), std::env::vars())?;
            let rows: Vec<TopicRow> = Topics::new(config.kafka.topic_prefix.clone())
                .all()
                .into_iter()
                .map(|spec| TopicRow {
                    partitions: if spec.co_partitioned { config.kafka.partitions } else { config.kafka.event_partitions },
                    cleanup: match spec.cleanup {
                        Cleanup::Compact => "compact",
                        Cleanup::Delete => "delete",
                    },
                    retention_ms: spec.retention_ms,
                    min_compaction_lag_ms: spec.min_compaction_lag_ms,
                    co_partitioned: spec.co_partitioned,
                    topic: spec.name,
                })
                .collect();
            match output.format() {
                Format::Json => {
                    for r in &rows {
                        println!("{}", serde_json::to_string(r)?);
                    }
                }
                Format::Human => print!("{}", topics_table(&rows)),
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

/// One topic, in the order the JSON lines print it.
#[derive(serde::Serialize)]
struct TopicRow {
    topic: String,
    partitions: i32,
    #[serde(rename = "cleanup.policy")]
    cleanup: &'static str,
    #[serde(rename = "retention.ms")]
    retention_ms: Option<u64>,
    #[serde(rename = "min.compaction.lag.ms", skip_serializing_if = "Option::is_none")]
    min_compaction_lag_ms: Option<u64>,
    co_partitioned: bool,
}

fn topics_table(rows: &[TopicRow]) -> String {
    let mut cells = vec![["topic", "partitions", "cleanup.policy", "retention", "co-partitioned"].map(String::from).to_vec()];
    for r in rows {
        cells.push(vec![
            r.topic.clone(),
            r.partitions.to_string(),
            r.cleanup.to_owned(),
            r.retention_ms.map_or_else(|| "broker default".into(), duration_ms),
            if r.co_partitioned { "yes (by subscription id)" } else { "no" }.to_owned(),
        ]);
    }
    table(&cells)
}

async fn create(config: &hookline_service::Config, timeout: Duration) -> anyhow::Result<ExitCode> {
    let mut failed = false;
    for (name, result) in create_each(config, timeout).await? {
        match result {
            Ok(true) => println!("{}", serde_json::json!({"topic": name, "result": "created"})),
            Ok(false) => println!("{}", serde_json::json!({"topic": name, "result": "exists"})),
            Err(error) => {
                failed = true;
                println!("{}", serde_json::json!({"topic": name, "result": "error", "error": error}));
            }
        }
    }
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// Waits until the cluster shows every topic of `config` with a leader for each partition: the services stop at
/// start on a topic their broker does not know yet, and a new topic takes a moment to reach every broker.
pub(crate) async fn wait_for_leaders(config: &hookline_service::Config, limit: Duration) -> anyhow::Result<()> {
    let admin = hookline_kafka::client::admin(&config.kafka, "hookline-topics")?;
    let names: Vec<String> = Topics::new(config.kafka.topic_prefix.clone()).all().into_iter().map(|t| t.name).collect();
    let deadline = std::time::Instant::now() + limit;
    loop {
        let md = tokio::task::block_in_place(|| admin.inner().fetch_metadata(None, Duration::from_secs(10)))?;
        let ready = names.iter().all(|name| {
            md.topics().iter().any(|t| {
                t.name() == name && t.error().is_none() && !t.partitions().is_empty() && t.partitions().iter().all(|p| p.leader() >= 0)
            })
        });
        if ready {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            anyhow::bail!("the topics under {} had no leaders after {limit:?}", config.kafka.topic_prefix);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Creates every topic of `config` (CreateTopics): per topic, `Ok(true)` created, `Ok(false)` it existed, or the
/// error. Also `hookline dev --brokers`'s.
pub(crate) async fn create_each(
    config: &hookline_service::Config,
    timeout: Duration,
) -> anyhow::Result<Vec<(String, Result<bool, String>)>> {
    let admin = hookline_kafka::client::admin(&config.kafka, "hookline-topics").context("creating the Kafka admin client")?;
    let specs = Topics::new(config.kafka.topic_prefix.clone()).all();
    let retention: Vec<Option<String>> = specs.iter().map(|s| s.retention_ms.map(|r| r.to_string())).collect();
    let lag: Vec<Option<String>> = specs.iter().map(|s| s.min_compaction_lag_ms.map(|l| l.to_string())).collect();
    let new_topics: Vec<NewTopic<'_>> = specs
        .iter()
        .zip(retention.iter().zip(&lag))
        .map(|(s, (r, lag))| {
            let partitions = if s.co_partitioned { config.kafka.partitions } else { config.kafka.event_partitions };
            let mut t = NewTopic::new(&s.name, partitions, TopicReplication::Fixed(config.kafka.replication_factor));
            t = t.set(
                "cleanup.policy",
                match s.cleanup {
                    Cleanup::Compact => "compact",
                    Cleanup::Delete => "delete",
                },
            );
            if let Some(r) = r {
                t = t.set("retention.ms", r);
            }
            if let Some(lag) = lag {
                t = t.set("min.compaction.lag.ms", lag);
            }
            if config.kafka.replication_factor >= 3 {
                t = t.set("min.insync.replicas", "2");
            }
            t
        })
        .collect();
    // Both the request and the brokers' operation within `--timeout-s` (librdkafka's own request timeout is 60 s),
    // and the whole exchange bounded by it too.
    let options = AdminOptions::new().request_timeout(Some(timeout)).operation_timeout(Some(timeout));
    let no_answer = || {
        anyhow::anyhow!(
            "no answer from the cluster at {} within {} s (--timeout-s). If it is `hookline dev-broker` or the broker of \
             `hookline dev`: that embedded broker creates hookline's topics itself when it starts, so there is nothing \
             to create. Otherwise check kafka.bootstrap_servers and the security settings ([kafka.tls], [kafka.sasl]).",
            config.kafka.bootstrap_servers,
            timeout.as_secs()
        )
    };
    let results = match tokio::time::timeout(timeout + Duration::from_secs(1), admin.create_topics(&new_topics, &options)).await {
        Err(_) | Ok(Err(rdkafka::error::KafkaError::AdminOp(RDKafkaErrorCode::OperationTimedOut))) => return Err(no_answer()),
        Ok(r) => r.context("CreateTopics request")?,
    };
    let mut out: Vec<(String, Result<bool, String>)> = Vec::with_capacity(results.len());
    for r in results {
        out.push(match r {
            Ok(name) => (name, Ok(true)),
            Err((name, RDKafkaErrorCode::TopicAlreadyExists)) => (name, Ok(false)),
            // Every topic timed out: the cluster did not answer at all.
            Err((_, RDKafkaErrorCode::OperationTimedOut | RDKafkaErrorCode::RequestTimedOut)) if out.iter().all(|(_, r)| r.is_err()) => {
                return Err(no_answer())
            }
            Err((name, code)) => (name, Err(code.to_string())),
        });
    }
    Ok(out)
}
