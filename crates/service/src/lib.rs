//! What every hookline binary shares: the config file with `HOOKLINE_*` overrides, telemetry (logs and the
//! Prometheus recorder), the `/metrics` `/healthz` `/readyz` endpoints, and the shutdown signal.

pub mod config;
pub mod health;
pub mod shutdown;
pub mod telemetry;

pub use config::Config;
pub use health::Readiness;
