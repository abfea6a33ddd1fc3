//! Logs (tracing) and the Prometheus recorder.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, TelemetrySettings};

static RECORDER: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the log subscriber (once per process; later calls are no-ops, so dev mode can run every service in
/// one process) and returns the Prometheus handle that renders `/metrics`.
pub fn init(settings: &TelemetrySettings) -> PrometheusHandle {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&settings.log_level));
    let _ = match settings.log_format {
        // Logs go to stderr: stdout belongs to command output (the CLI's JSON lines).
        LogFormat::Json => tracing_subscriber::fmt().json().with_writer(std::io::stderr).with_env_filter(filter).try_init(),
        // Colour only for a person at a terminal: escapes in a file or a pipe are noise.
        LogFormat::Pretty => tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_env_filter(filter)
            .try_init(),
    };
    metrics_handle()
}

/// How often histogram samples are folded into their buckets. The recorder queues every recorded value until then
/// (or until `/metrics` is rendered): without it, a process nobody scrapes grows by every sample it records.
pub const METRICS_UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// The process's Prometheus handle, installing the recorder (and its upkeep thread) on first use.
pub fn metrics_handle() -> PrometheusHandle {
    RECORDER
        .get_or_init(|| {
            let ms = [1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 30000.0];
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_ms".into()), &ms)
                .expect("bucket list is not empty")
                .build_recorder();
            let handle = recorder.handle();
            // Another recorder may already be installed (an embedding application); then ours only renders zeros.
            let _ = metrics::set_global_recorder(recorder);
            // A thread, not a task: the recorder may be made outside a runtime, and it outlives any one runtime.
            let upkeep = handle.clone();
            let spawned = std::thread::Builder::new().name("metrics-upkeep".into()).spawn(move || loop {
                std::thread::sleep(METRICS_UPKEEP_INTERVAL);
                upkeep.run_upkeep();
            });
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "could not start the metrics upkeep thread; histograms are folded only when /metrics is read");
            }
            handle
        })
        .clone()
}

/// docs/metrics.md, whose catalogue is every metric hookline emits: read at start so that `/metrics` describes them
/// (`# HELP`, `# TYPE`) from the first scrape, before anything happened.
const CATALOGUE: &str = include_str!("../../../docs/metrics.md");

/// Describes the metrics of `sections` (headings of docs/metrics.md's catalogue: `ingest`, `dispatcher`,
/// `retry-scheduler`, `delivery log indexer`; the shared section always) and starts their counters at 0: with no
/// label, and with each documented value of a single label. An idle service then shows what it counts, at 0, rather
/// than nothing until its first event. Gauges and histograms appear with their first value.
pub fn describe_metrics(sections: &[&str]) {
    let _ = metrics_handle();
    let mut section = "";
    for line in CATALOGUE.lines() {
        if let Some(h) = line.strip_prefix("### ") {
            section = h.trim();
            continue;
        }
        let wanted = sections.contains(&section) || section == "Emitted by more than one service";
        let Some(row) = line.strip_prefix("| `hookline_").filter(|_| wanted) else { continue };
        let cells: Vec<&str> = row.split(" | ").collect();
        let (Some(name), Some(kind), Some(labels), Some(meaning)) = (cells.first(), cells.get(1), cells.get(2), cells.last()) else {
            continue;
        };
        let name = format!("hookline_{}", name.trim_end_matches('`'));
        // The first sentence is the help line.
        let help = meaning.trim_end_matches('|').trim().split(". ").next().unwrap_or("").trim_end_matches('.').replace('`', "");
        match kind.trim() {
            "counter" => {
                metrics::describe_counter!(name.clone(), help);
                for labels in label_sets(labels) {
                    metrics::counter!(name.clone(), &labels).increment(0);
                }
            }
            "gauge" => metrics::describe_gauge!(name, help),
            "histogram" => metrics::describe_histogram!(name, help),
            _ => {}
        }
    }
}

/// `—` → one empty set; "`outcome` = `a`, `b`" → one set per value; several labels, or values not listed → none.
fn label_sets(cell: &str) -> Vec<Vec<(String, String)>> {
    let cell = cell.trim();
    if cell == "—" {
        return vec![Vec::new()];
    }
    let Some((label, values)) = cell.split_once(" = ").filter(|(_, v)| !v.contains(" = ") && !v.contains(';') && !v.contains('(')) else {
        return Vec::new();
    };
    let label = label.trim_matches('`').to_owned();
    values
        .split(", ")
        .map(|v| v.trim())
        .filter(|v| v.starts_with('`') && v.ends_with('`') && v.len() > 2)
        .map(|v| vec![(label.clone(), v.trim_matches('`').to_owned())])
        .collect()
}

#[cfg(test)]
mod catalogue_tests {
    #[test]
    fn an_idle_service_describes_its_metrics_and_counts_from_zero() {
        super::describe_metrics(&["dispatcher"]);
        let text = super::metrics_handle().render();
        assert!(text.contains("# HELP hookline_deliveries_total "), "{text}");
        assert!(text.contains("# TYPE hookline_deliveries_total counter"), "{text}");
        assert!(text.contains("hookline_deliveries_total{outcome=\"succeeded\"} 0"), "{text}");
        assert!(text.contains("hookline_rate_limit_waits_total 0"), "{text}");
        assert!(!text.contains("hookline_events_accepted_total"), "another service's metric: {text}");
    }

    #[test]
    fn label_cells_become_label_sets() {
        assert_eq!(super::label_sets("—"), vec![Vec::new()]);
        assert_eq!(super::label_sets("`source` = `http`").len(), 1);
        assert_eq!(super::label_sets("`outcome` = `2xx`, `3xx`").len(), 2);
        assert!(super::label_sets("`group` = `a`; `topic` = `b`").is_empty());
    }
}
