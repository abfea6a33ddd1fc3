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
