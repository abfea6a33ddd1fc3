//! Ingest: fans events out from the `events` topic to one delivery task per matching subscription, and serves
//! the HTTP API (events in, subscriptions managed, /metrics /healthz /readyz).

pub mod api;
pub mod decode;
pub mod delivery_log;
pub mod fanout;
pub mod notify;
pub mod replay;

use std::net::SocketAddr;
use std::sync::Arc;

use hookline_kafka::client::producer;
use hookline_kafka::state::StateTables;
use hookline_core::model::AttemptRecord;
use hookline_kafka::table::{self, TableError};
use prost::Message as _;
use hookline_kafka::Topics;
use hookline_service::{health, telemetry, Config, Readiness};
use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    #[error(transparent)]
    Table(#[from] TableError),
    #[error("listening on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Default)]
pub struct Options {
    /// Receives the API's bound address once it listens (tests bind port 0).
    pub bound: Option<oneshot::Sender<SocketAddr>>,
    pub instance: Option<String>,
    /// Shared with the caller (dev mode waits on it): set once the tables are read and the fan-out's consumer
    /// has its assignment, when an event published now is fanned out at once.
    pub readiness: Readiness,
}

pub(crate) use hookline_service::now_ms;

/// Runs ingest until `shutdown`: reads the subscription table to its end, then serves the API and fans out.
pub async fn run(config: Config, shutdown: CancellationToken, options: Options) -> Result<(), IngestError> {
    let instance = options.instance.unwrap_or_else(|| "hookline-ingest".into());
    let metrics = telemetry::metrics_handle();
    let readiness = options.readiness.clone();
    let topics = Topics::new(config.kafka.topic_prefix.clone());
    let reader_stop = CancellationToken::new();

    let tables = StateTables::follow(&config.kafka, &topics, &instance, reader_stop.clone()).await?;
    let producer = producer(&config.kafka, &instance)?;
    let log = Arc::new(delivery_log::DeliveryLog::new(
        config.ingest.delivery_log_retention_ms,
        config.ingest.delivery_log_max_deliveries,
    ));
    let l = log.clone();
    let attempts_reader = table::spawn(
        &config.kafka,
        topics.attempts(),
        &format!("{instance}-log"),
        move |_, _, v| {
            if let Some(rec) = v.and_then(|v| AttemptRecord::decode(v).ok()) {
                l.apply_attempt(rec, now_ms());
            }
        },
        reader_stop.clone(),
    )
    .await?;
    let l = log.clone();
    let dlq_reader = table::spawn(
        &config.kafka,
        topics.dlq(),
        &format!("{instance}-dlq"),
        move |_, _, v| {
            // Either format (`dlq.format`), told apart by content: the table reader passes no headers.
            if let Some(dl) = v.and_then(|v| hookline_core::dead_letter::decode(v, None).ok()) {
                l.apply_dead_letter(dl);
            }
        },
        reader_stop.clone(),
    )
    .await?;

    // Loudly, at start: an allow-list makes non-public addresses acceptable as subscription URLs.
    if let Ok(guard) = hookline_core::egress::EgressGuard::new(&config.egress, &Default::default()) {
        for w in guard.startup_warnings() {
            tracing::warn!(target: "hookline::egress_allow", "{w}");
        }
    }
    if config.ingest.api_tokens.is_empty() {
        tracing::warn!("ingest.api_tokens is empty: every API request will be refused with 401");
    }
    let tracer = hookline_service::traces::Tracer::new(&config.telemetry, "ingest");
    let state = Arc::new(api::ApiState {
        topics: topics.clone(),
        producer: producer.clone(),
        subs: tables.subs.clone(),
        subs_reader: tables.subs_reader.clone(),
        states: tables.states.clone(),
        tokens: config.ingest.api_tokens.clone(),
        max_event_bytes: config.ingest.max_event_bytes,
        egress: config.egress.clone(),
        challenger: api::verify::Challenger::new(config.egress.clone()),
        log,
        kafka: config.kafka.clone(),
        tracer: tracer.clone(),
    });
    let app = api::router(state, config.ingest.max_request_bytes).merge(health::routes(readiness.clone(), metrics));
    let addr = config.ingest.listen_addr;
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| IngestError::Listen { addr, source })?;
    let bound = listener.local_addr().map_err(|source| IngestError::Listen { addr, source })?;
    tracing::info!(%bound, "ingest API listening");
    if let Some(tx) = options.bound {
        let _ = tx.send(bound);
    }
    let server = tokio::spawn(hookline_service::http_server::serve(listener, app, config.ingest.http, shutdown.clone()));

    // Fan-out needs the whole subscription table, or early events would reach nobody.
    tokio::select! {
        _ = async { tables.caught_up().await; attempts_reader.wait_caught_up().await; dlq_reader.wait_caught_up().await } => {}
        _ = shutdown.cancelled() => { reader_stop.cancel(); return Ok(()) }
    }
    tracing::info!(subscriptions = tables.subs.len(), "ingest tables loaded");
    let fan = Arc::new(fanout::Fanout {
        topics,
        producer: producer.clone(),
        subs: tables.subs.clone(),
        max_event_bytes: config.ingest.max_event_bytes,
        shutdown: shutdown.clone(),
        tracer: tracer.clone(),
        readiness: readiness.clone(),
        dlq: hookline_kafka::dead_letters::DeadLetterWriter::new(config.dlq.format, &config.kafka),
    });
    // Owner e-mail for the ops topic, when `notify.smtp_addr` is set.
    let notifier = config.notify.smtp_addr.is_some().then(|| {
        let (config, shutdown) = (config.clone(), shutdown.clone());
        tokio::spawn(async move {
            if let Err(e) = notify::run(&config, shutdown).await {
                tracing::error!(error = %e, "owner e-mail notifications stopped");
            }
        })
    });
    let result = fanout::run(fan, &config, &instance).await;
    if let Some(n) = notifier {
        let _ = n.await;
    }
    readiness.set(false);
    let _ = server.await;
    let _ = producer.flush(std::time::Duration::from_secs(10));
    reader_stop.cancel();
    tracer.flush().await;
    result?;
    tracing::info!("ingest stopped");
    Ok(())
}
