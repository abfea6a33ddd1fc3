//! Cross-crate integration tests: the real ingest, dispatcher and retry-scheduler against the embedded broker,
//! with receivers on 127.0.0.1:0.

mod apache_kafka;
mod api;
mod breaker;
mod cloudevents;
mod cloudevents_out;
mod concurrency;
mod credentials;
mod dead_letters;
mod delivery_control;
mod delivery_log;
mod event_types;
mod faults;
mod fencing;
mod hardening;
mod hostile;
mod kafka_tls;
mod key_rotation;
mod lifecycle;
mod ordering;
mod panics;
mod parking;
mod pipeline;
mod rebalance;
mod redo;
mod schema_registry;
mod sealed_headers;
mod support;
mod tansu;
mod tenants;
mod tracing;
mod zombie;
