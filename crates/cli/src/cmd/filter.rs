//! `hookline filter test`: evaluates a subscription's payload filter against an event, without a network, with
//! the same code the fan-out runs (`hookline_core::payload_filter`), and says which conditions held.

use std::io::{Read, Write};
use std::process::ExitCode;

use anyhow::{bail, Context};
use hookline_core::payload_filter::{Data, EventFields, Filter, MAX_FILTER_BYTES};
use serde_json::{json, Value};

use super::output::{self, Format};

const TEST_ABOUT: &str = "\
Evaluate a payload filter against an event the way the fan-out does, and say why it matches or not.

The filter is the subscription's `filter` field; the event is the JSON a producer publishes (`id`, `type`,
`tenant`, `entity_id`, `data`). Paths start at the event: `type`, `id`, `tenant`, `entity_id`, or `data.<field>...`
(a segment of digits also indexes an array). Operators: eq, exists, prefix, gt, gte, lt, lte; combine with
{\"all\": [...]} and {\"any\": [...]}. Only the filter is tested, not the subscription's event types.

On a terminal, prints `match` or `no match` and one line per condition and combinator. When stdout is not a
terminal, or with --json, one JSON line:
  {\"matched\":false,\"steps\":[{\"location\":\"filter\",\"test\":\"data.amount gte 100\",\"actual\":20,\"matched\":false}]}
Exit status: 0 match, 1 no match, 2 bad arguments (an invalid filter names its place, e.g. filter.all[1].path).

Examples:
  hookline filter test --filter '{\"path\":\"data.amount\",\"gte\":100}' --event '{\"id\":\"e1\",\"type\":\"order.created\",\"data\":{\"amount\":250}}'
  hookline filter test --filter @filter.json --event @event.json --json";

#[derive(clap::Subcommand)]
pub enum FilterCmd {
    /// Evaluate a payload filter against an event (dry run): match / no match, and why.
    #[command(long_about = TEST_ABOUT)]
    Test(TestArgs),
}

#[derive(clap::Args)]
pub struct TestArgs {
    /// The filter as JSON, or @FILE to read it from a file (@- for stdin).
    #[arg(long, value_name = "JSON|@FILE")]
    filter: String,

    /// The event as JSON, or @FILE to read it from a file (@- for stdin).
    #[arg(long, value_name = "JSON|@FILE")]
    event: String,

    #[command(flatten)]
    output: output::OutputArgs,
}

pub fn run(cmd: FilterCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        FilterCmd::Test(args) => test(args),
    }
}

/// Most bytes read for --event (the API's default request limit is far smaller).
const MAX_EVENT_BYTES: u64 = 16 << 20;

fn text_of(flag: &str, arg: &str, max: u64) -> anyhow::Result<String> {
    let Some(path) = arg.strip_prefix('@') else { return Ok(arg.to_owned()) };
    let mut text = String::new();
    let read = if path == "-" {
        std::io::stdin().take(max + 1).read_to_string(&mut text)
    } else {
        std::fs::File::open(path).and_then(|f| f.take(max + 1).read_to_string(&mut text))
    };
    read.with_context(|| format!("--{flag}: reading {path}"))?;
    if text.len() as u64 > max {
        bail!("--{flag}: {path} is larger than {max} bytes");
    }
    Ok(text)
}

fn test(args: TestArgs) -> anyhow::Result<ExitCode> {
    let filter_text = text_of("filter", &args.filter, MAX_FILTER_BYTES as u64)?;
    let filter = Filter::parse_str(&filter_text).map_err(|e| anyhow::anyhow!("--filter: {e}"))?;
    let event_text = text_of("event", &args.event, MAX_EVENT_BYTES)?;
    let event: Value = serde_json::from_str(&event_text).map_err(|e| anyhow::anyhow!("--event: not JSON: {e}"))?;
    let Value::Object(obj) = &event else {
        bail!("--event: expected a JSON object such as {{\"type\":\"order.created\",\"data\":{{...}}}}")
    };
    let string = |key: &str| -> anyhow::Result<&str> {
        match obj.get(key) {
            None | Some(Value::Null) => Ok(""),
            Some(Value::String(s)) => Ok(s),
            Some(_) => bail!("--event: `{key}` must be a string"),
        }
    };
    // CloudEvents extension attributes, as `{"extensions": {"region": "eu"}}`.
    let extensions: Option<std::collections::HashMap<String, String>> = match obj.get("extensions") {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => {
            Some(m.iter().map(|(k, v)| (k.clone(), v.as_str().map_or_else(|| v.to_string(), str::to_owned))).collect())
        }
        Some(_) => bail!("--event: `extensions` must be an object such as {{\"region\":\"eu\"}}"),
    };
    let data = match obj.get("data") {
        None | Some(Value::Null) => Data::Absent,
        Some(v) => Data::Json(v.clone()),
    };
    let fields = EventFields {
        id: string("id")?,
        event_type: string("type")?,
        tenant: string("tenant")?,
        entity_id: string("entity_id")?,
        source: string("source")?,
        subject: string("subject")?,
        extensions: extensions.as_ref(),
        data: &data,
    };
    let why = filter.explain(&fields);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match args.output.format() {
        Format::Json => {
            let steps: Vec<Value> = why
                .steps
                .iter()
                .map(|s| json!({"location": s.location, "test": s.test, "actual": s.actual, "matched": s.matched}))
                .collect();
            writeln!(out, "{}", json!({"matched": why.matched, "steps": steps}))?;
        }
        Format::Human => {
            writeln!(out, "{}", if why.matched { "match" } else { "no match" })?;
            let rows: Vec<Vec<String>> = why
                .steps
                .iter()
                .map(|s| {
                    let actual = match &s.actual {
                        Some(v) => format!("event has {v}"),
                        None if s.test.contains(" of ") => String::new(),
                        None => "absent in the event".into(),
                    };
                    vec![format!("  {}", if s.matched { "yes" } else { "no" }), s.location.clone(), s.test.clone(), actual]
                })
                .collect();
            write!(out, "{}", output::table(&rows))?;
        }
    }
    Ok(if why.matched { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
