//! What every hookline binary shares: the config file with `HOOKLINE_*` overrides, telemetry (logs and the
//! Prometheus recorder), the `/metrics` `/healthz` `/readyz` endpoints, and the shutdown signal.

pub mod config;
pub mod health;
pub mod http_body_guard;
pub mod http_server;
pub mod shutdown;
pub mod telemetry;
pub mod traces;

pub use config::Config;

/// Wall-clock milliseconds since the Unix epoch: the time base of every record's `*_at_ms` field.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Wall-clock microseconds since the Unix epoch: the `*_at_us` receive stamps of the latency split.
pub fn now_us() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}
pub use health::Readiness;
