//! Cross-crate integration tests: the real ingest, dispatcher and retry-scheduler against the embedded broker,
//! with receivers on 127.0.0.1:0.

mod api;
mod lifecycle;
mod pipeline;
mod support;
mod hostile;
mod faults;
mod redo;
mod hardening;
mod kafka_tls;
mod tansu;
mod rebalance;
mod tenants;
mod tracing;
