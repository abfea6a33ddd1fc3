//! Cross-crate integration tests: the real ingest, dispatcher and retry-scheduler against the embedded broker,
//! with receivers on 127.0.0.1:0.

mod api;
mod dead_letters;
mod lifecycle;
mod pipeline;
mod support;
mod hostile;
mod faults;
mod redo;
mod panics;
mod fencing;
mod breaker;
mod concurrency;
mod hardening;
mod kafka_tls;
mod tansu;
mod apache_kafka;
mod rebalance;
mod zombie;
mod tenants;
mod sealed_headers;
mod credentials;
mod event_types;
mod tracing;
mod delivery_control;
mod delivery_log;
mod parking;
mod key_rotation;
mod ordering;
