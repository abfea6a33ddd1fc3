//! `hookline dlq tail`: the dead-letter topic for a person (one readable line per dead letter) or a script
//! (`--json`: each record as its `hookline.dead_letter.v1` document, whatever format the topic holds).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use hookline_core::dead_letter::Document;
use hookline_core::model::DeadLetter;
use hookline_core::vocabulary::DeadLetterReason;
use hookline_kafka::table::QuietEof;
use hookline_kafka::Topics;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::{Message, Offset, TopicPartitionList};

use super::output::{Format, OutputArgs};

/// Most records `--lines` may ask for (they are held in memory until the end of the topic is reached).
const MAX_LINES: usize = 10_000;
/// Longest wait for the cluster's metadata and watermarks.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(clap::Subcommand)]
pub enum DlqCmd {
    /// Print the newest dead letters (`--lines`, default 10), or all of them (`--from-beginning`), then with
    /// `--follow` each new one as it arrives. Filters combine (all must match).
    Tail(TailArgs),
}

#[derive(clap::Args)]
pub struct TailArgs {
    /// The config file (TOML) whose `[kafka]` table names the cluster and the topic prefix;
    /// `HOOKLINE_KAFKA__*` variables override it.
    #[arg(long, env = "HOOKLINE_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// Read the whole topic from its first record instead of only the newest.
    #[arg(long, conflicts_with = "lines")]
    from_beginning: bool,
    /// How many of the newest matching dead letters to print before following (at most 10000).
    #[arg(short = 'n', long, value_parser = clap::value_parser!(u64).range(0..=MAX_LINES as u64))]
    lines: Option<u64>,
    /// Keep reading: print dead letters as they are written, until interrupted (Ctrl-C).
    #[arg(short = 'f', long)]
    follow: bool,
    /// Only dead letters with this reason.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(DeadLetterReason::words()))]
    reason: Option<String>,
    /// Only dead letters of this subscription id.
    #[arg(long)]
    subscription: Option<String>,
    /// Only dead letters whose event has this type.
    #[arg(long)]
    event_type: Option<String>,
    /// Only dead letters whose event belongs to this tenant.
    #[arg(long)]
    tenant: Option<String>,
    #[command(flatten)]
    output: OutputArgs,
}

pub fn run(cmd: DlqCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        DlqCmd::Tail(args) => {
            let config = hookline_service::Config::load(args.config.as_deref(), std::env::vars())?;
            let rt = tokio::runtime::Runtime::new()?;
            rt.block_on(tail(&config, &args))
        }
    }
}

impl TailArgs {
    fn matches(&self, dl: &DeadLetter) -> bool {
        let event = dl.event.as_ref();
        self.reason.as_ref().is_none_or(|r| *r == dl.reason)
            && self.subscription.as_ref().is_none_or(|s| *s == dl.subscription_id)
            && self.event_type.as_ref().is_none_or(|t| event.is_some_and(|e| e.r#type == *t))
            && self.tenant.as_ref().is_none_or(|t| event.is_some_and(|e| e.tenant == *t))
    }

    fn filtered(&self) -> bool {
        self.reason.is_some() || self.subscription.is_some() || self.event_type.is_some() || self.tenant.is_some()
    }
}

/// A dead letter read, with where it was.
struct Read {
    timestamp_ms: i64,
    partition: i32,
    offset: i64,
    dl: DeadLetter,
}

async fn tail(config: &hookline_service::Config, args: &TailArgs) -> anyhow::Result<ExitCode> {
    let topics = Topics::new(config.kafka.topic_prefix.clone());
    let topic = topics.dlq().to_owned();
    let mut cc = hookline_kafka::client::table_consumer_config(&config.kafka, "hookline-dlq-tail").context("Kafka client settings")?;
    cc.set("enable.partition.eof", "false");
    let consumer: StreamConsumer<QuietEof> = cc.create_with_context(QuietEof::default()).context("creating the Kafka consumer")?;
    let consumer = std::sync::Arc::new(consumer);
    let lines = args.lines.map_or(10, |n| n as usize);

    // Where each partition starts and where it ends now (blocking calls, off the runtime's threads).
    let plan = {
        let (c, t) = (consumer.clone(), topic.clone());
        let (from_beginning, filtered) = (args.from_beginning, args.filtered());
        tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<(i32, i64, i64)>> {
            let md = c.fetch_metadata(Some(&t), METADATA_TIMEOUT).with_context(|| format!("reading the metadata of {t}"))?;
            let parts: Vec<i32> =
                md.topics().iter().filter(|x| x.name() == t).flat_map(|x| x.partitions().iter().map(|p| p.id())).collect();
            if parts.is_empty() {
                anyhow::bail!("topic {t} does not exist (kafka.topic_prefix = {:?}?)", t.strip_suffix("dlq").unwrap_or(""));
            }
            let mut plan = Vec::new();
            for p in parts {
                let (low, high) = c.fetch_watermarks(&t, p, METADATA_TIMEOUT).with_context(|| format!("reading the offsets of {t}/{p}"))?;
                // Unfiltered, the newest `lines` of all partitions are among each partition's last `lines`.
                let start = if from_beginning || filtered { low } else { high.saturating_sub(lines as i64).max(low) };
                plan.push((p, start, high));
            }
            Ok(plan)
        })
        .await
        .context("planning the read")??
    };
    let mut tpl = TopicPartitionList::new();
    for (p, start, _) in &plan {
        tpl.add_partition_offset(&topic, *p, Offset::Offset(*start))?;
    }
    consumer.assign(&tpl).context("assigning the dlq partitions")?;

    let format = args.output.format();
    let mut out = std::io::stdout().lock();
    let mut remaining: HashMap<i32, i64> = plan.iter().filter(|(_, s, e)| s < e).map(|(p, _, e)| (*p, *e)).collect();
    // The newest `lines` matches, smallest first out (by write time, then partition and offset).
    let mut newest: BinaryHeap<Reverse<(i64, i32, i64, Wrapped)>> = BinaryHeap::new();
    let mut interrupted = std::pin::pin!(tokio::signal::ctrl_c());
    let mut caught_up = remaining.is_empty();
    loop {
        if caught_up && !args.follow {
            break;
        }
        let m = tokio::select! {
            _ = &mut interrupted => break,
            m = consumer.recv() => m,
        };
        let m = match m {
            Ok(m) => m,
            Err(e) => {
                if let Some(reason) = consumer.context().security_failure() {
                    anyhow::bail!("reading {topic}: {reason}");
                }
                eprintln!("warning: reading {topic}: {e}");
                continue;
            }
        };
        let (p, o) = (m.partition(), m.offset());
        let read = match hookline_kafka::dead_letters::decode(&m) {
            Ok(dl) => Some(Read { timestamp_ms: m.timestamp().to_millis().unwrap_or(0), partition: p, offset: o, dl }),
            Err(e) => {
                eprintln!("warning: {topic}/{p}@{o} is not a dead letter: {e}");
                None
            }
        };
        if let Some(r) = read.filter(|r| args.matches(&r.dl)) {
            if caught_up || args.from_beginning {
                print(&mut out, format, &r)?;
            } else if lines > 0 {
                newest.push(Reverse((r.timestamp_ms, r.partition, r.offset, Wrapped(r))));
                if newest.len() > lines {
                    newest.pop();
                }
            }
        }
        if !caught_up && remaining.get(&p).is_some_and(|end| o + 1 >= *end) {
            remaining.remove(&p);
            if remaining.is_empty() {
                caught_up = true;
                for Reverse((.., Wrapped(r))) in std::mem::take(&mut newest).into_sorted_vec().into_iter().rev() {
                    print(&mut out, format, &r)?;
                }
            }
        }
    }
    if !caught_up {
        // Interrupted before the end: print what was gathered.
        for Reverse((.., Wrapped(r))) in newest.into_sorted_vec().into_iter().rev() {
            print(&mut out, format, &r)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Orders by the key before it in the heap tuple only (a dead letter has no order of its own).
struct Wrapped(Read);

impl PartialEq for Wrapped {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for Wrapped {}
impl PartialOrd for Wrapped {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Wrapped {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

fn print(out: &mut impl Write, format: Format, r: &Read) -> anyhow::Result<()> {
    match format {
        Format::Json => writeln!(out, "{}", serde_json::to_string(&Document::from(&r.dl))?)?,
        Format::Human => writeln!(out, "{}", human(r))?,
    }
    out.flush()?;
    Ok(())
}

/// `2026-01-01T00:01:00.123Z  retries_exhausted  sub=sub_1  type=order.paid  event=evt_1  attempts=3  last=503  HTTP 503`
fn human(r: &Read) -> String {
    let dl = &r.dl;
    let at = if dl.at_ms != 0 { dl.at_ms } else { r.timestamp_ms };
    let mut parts = vec![hookline_core::time::rfc3339_ms(at).unwrap_or_else(|| "-".into()), dl.reason.clone()];
    let event = dl.event.as_ref();
    let mut field = |k: &str, v: &str| {
        if !v.is_empty() {
            parts.push(format!("{k}={}", one_line(v)));
        }
    };
    field("sub", &dl.subscription_id);
    field("tenant", event.map_or("", |e| e.tenant.as_str()));
    field("type", event.map_or("", |e| e.r#type.as_str()));
    field("event", event.map_or("", |e| e.id.as_str()));
    if !dl.delivery_id.is_empty() {
        field("attempts", &dl.attempts.to_string());
    }
    field("last", &dl.last_outcome);
    if dl.event.is_none() && !dl.source_topic.is_empty() {
        field("source", &format!("{}/{}@{}", dl.source_topic, dl.source_partition, dl.source_offset));
    }
    if !dl.detail.is_empty() {
        parts.push(one_line(&dl.detail));
    }
    parts.join("  ")
}

/// Control characters (a CR or LF from an endpoint's reason) as spaces, so one dead letter stays one line.
fn one_line(s: &str) -> String {
    s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hookline_core::model::Event;

    #[test]
    fn a_human_line_names_what_is_known() {
        let dl = DeadLetter {
            reason: "retries_exhausted".into(),
            detail: "HTTP 503\r\nforged".into(),
            subscription_id: "sub_1".into(),
            delivery_id: "dlv_1".into(),
            event: Some(Event { id: "evt_1".into(), r#type: "order.paid".into(), tenant: "acme".into(), ..Default::default() }),
            attempts: 3,
            last_outcome: "503".into(),
            at_ms: 1_767_225_660_123,
            ..Default::default()
        };
        let line = human(&Read { timestamp_ms: 0, partition: 0, offset: 0, dl });
        assert_eq!(line, "2026-01-01T00:01:00.123Z  retries_exhausted  sub=sub_1  tenant=acme  type=order.paid  event=evt_1  attempts=3  last=503  HTTP 503  forged");
        let input = DeadLetter {
            reason: "invalid_json".into(),
            source_topic: "hookline.events".into(),
            source_partition: 1,
            source_offset: 7,
            ..Default::default()
        };
        let line = human(&Read { timestamp_ms: 1_767_225_600_000, partition: 0, offset: 0, dl: input });
        assert_eq!(line, "2026-01-01T00:00:00.000Z  invalid_json  source=hookline.events/1@7");
    }
}
