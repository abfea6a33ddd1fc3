//! Ingest: fans events out from the `events` topic to one delivery task per matching subscription, and hosts the
//! HTTP API and portal (`hookline-api`), the delivery log's indexer (`hookline-log`) and owner e-mail
//! (`hookline-notify`) beside it, plus /metrics /healthz /readyz. The fan-out never waits on the log.

/// The event decoder lives in core: the delivery log's indexer reads events with it too.
pub use hookline_core::event_decode as decode;
pub mod fanout;

use hookline_api as api;
use hookline_api::tenant_tables as tenants;
use hookline_notify as notify;

use std::net::SocketAddr;
use std::sync::Arc;

use hookline_kafka::client::delivery_path_producer;
use hookline_kafka::state::{SecretMode, StateTables};
use hookline_kafka::table::{self, TableError};
use hookline_kafka::Topics;
use hookline_service::{health, telemetry, Config, Readiness};
use rdkafka::error::KafkaError;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    #[error(transparent)]
    Table(#[from] TableError),
    #[error(transparent)]
    Config(#[from] hookline_service::config::ConfigError),
    #[error(transparent)]
    Secrets(#[from] hookline_kafka::state::SecretsUnreadable),
    #[error(transparent)]
    Permissions(#[from] hookline_kafka::acl_check::AclCheckError),
    #[error("the delivery log store ([log]): {0}")]
    Log(#[from] hookline_log::StoreError),
    #[error(transparent)]
    SchemaRegistry(#[from] hookline_schema_registry::SetupError),
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
    /// Receives the health listener's bound address (`ingest.health_addr`), when there is one.
    pub health_bound: Option<oneshot::Sender<SocketAddr>>,
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
    // One client and schema cache for the fan-out and the API's replays.
    let registry = hookline_schema_registry::Registry::from_settings(&config.ingest.schema_registry)?;
    if let Some(r) = &registry {
        tracing::info!(registry = r.url(), "Avro and Protobuf framed events are decoded through the schema registry");
    }
    let topics = Topics::new(config.kafka.topic_prefix.clone());
    // A principal without what ingest does stops it here, the lacking ACLs named.
    let notify_group = format!("{}-notify", config.ingest.group_id);
    let needs = hookline_kafka::acl_check::ingest_needs(
        &topics,
        &config.ingest.group_id,
        config.notify.smtp_addr.is_some().then_some(notify_group.as_str()),
        config.log.run_indexer.then_some(config.log.group_id.as_str()),
    );
    hookline_kafka::acl_check::at_start(&config.kafka, &instance, &needs).await?;
    let reader_stop = CancellationToken::new();

    // The master keys: sealed secrets are opened with them as the table is read, and new ones sealed.
    let keyring = Arc::new(config.secrets.keyring()?);
    let keyring_for_check = keyring.clone();
    let tables = StateTables::follow(&config.kafka, &topics, &instance, SecretMode::Open(keyring.clone()), reader_stop.clone()).await?;
    let tenant_table = tenants::TenantTable::default();
    let t = tenant_table.clone();
    let tenants_reader =
        table::spawn(&config.kafka, topics.tenants(), &format!("{instance}-tenants"), move |_, k, v| t.apply(k, v), reader_stop.clone())
            .await?;
    let key_table = tenants::KeyTable::default();
    let k = key_table.clone();
    let keys_reader =
        table::spawn(&config.kafka, topics.api_keys(), &format!("{instance}-keys"), move |_, key, v| k.apply(key, v), reader_stop.clone())
            .await?;
    let event_types = api::event_type_table::EventTypeTable::default();
    let et = event_types.clone();
    let event_types_reader = table::spawn(
        &config.kafka,
        topics.event_types(),
        &format!("{instance}-event-types"),
        move |_, k, v| et.apply(k, v),
        reader_stop.clone(),
    )
    .await?;
    // Every delivery waits on this producer twice (the accepted event, its delivery task): it lingers least.
    let producer = delivery_path_producer(&config.kafka, &instance)?;
    // The delivery log is a store (opened in constant time whatever its history) that an indexer fills from
    // Kafka; nothing here waits for it to catch up.
    let log = Arc::new(hookline_log::LogStore::open(&hookline_log::Target::from_settings(&config.log)?).await?);
    if !config.log.run_indexer {
        tracing::info!(backend = log.backend(), "delivery log: indexed by another process (log.run_indexer = false: `hookline log index`)");
    }
    let indexer = config.log.run_indexer.then(|| {
        let (config, store, stop, client_id) = (config.clone(), log.clone(), reader_stop.clone(), format!("{instance}-log-indexer"));
        tokio::spawn(async move {
            if let Err(e) = hookline_log::indexer::run_with_store(&config, store, &client_id, stop).await {
                tracing::error!(error = %e, "the delivery log indexer stopped: the log no longer follows Kafka");
            }
        })
    });

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
        tenants: tenant_table,
        tenants_reader: tenants_reader.clone(),
        keys: key_table,
        keys_reader: keys_reader.clone(),
        keyring,
        portal: config.ingest.portal.clone(),
        event_types,
        event_types_reader: event_types_reader.clone(),
        schema_validation: config.ingest.schema_validation,
        default_publish_quota: api::publish_quota::limit_of(config.ingest.publish_rate_per_s, config.ingest.publish_burst, None),
        publish_quotas: Default::default(),
        registry: registry.clone(),
    });
    // Dropped at once when there is no health listener: a caller waiting for its address learns there is none.
    let health_bound = options.health_bound;
    if let Some(addr) = config.ingest.health_addr {
        let bound = health::serve(addr, readiness.clone(), metrics.clone(), config.ingest.health_http, shutdown.clone())
            .await
            .map_err(|source| IngestError::Listen { addr, source })?;
        tracing::info!(%bound, "ingest health listening");
        if let Some(tx) = health_bound {
            let _ = tx.send(bound);
        }
    } else {
        drop(health_bound);
    }
    let app = api::router(state, config.ingest.max_request_bytes).merge(health::routes(readiness.clone(), metrics));
    let addr = config.ingest.listen_addr;
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| IngestError::Listen { addr, source })?;
    let bound = listener.local_addr().map_err(|source| IngestError::Listen { addr, source })?;
    tracing::info!(addr = %bound, "ingest API listening");
    if let Some(tx) = options.bound {
        let _ = tx.send(bound);
    }
    let server = tokio::spawn(hookline_service::http_server::serve(listener, app, config.ingest.http, shutdown.clone()));

    // Fan-out needs the whole subscription table, or early events would reach nobody.
    tokio::select! {
        _ = async {
            tables.caught_up().await;
            tenants_reader.wait_caught_up().await;
            keys_reader.wait_caught_up().await;
            event_types_reader.wait_caught_up().await;
        } => {}
        _ = shutdown.cancelled() => {
            reader_stop.cancel();
            if let Some(i) = indexer {
                let _ = i.await;
            }
            return Ok(());
        }
    }
    if let Err(e) = tables.check_secrets() {
        reader_stop.cancel();
        shutdown.cancel();
        let _ = server.await;
        return Err(e.into());
    }
    tracing::info!(subscriptions = tables.subs.len(), "ingest tables loaded");
    // Said once at start, so a rotation's last step (removing the old key) is not taken too early.
    let stale = tables.subs.all().iter().filter(|e| e.sub.needs_reseal(&keyring_for_check)).count();
    if stale > 0 {
        tracing::warn!(
            subscriptions = stale,
            write_key = keyring_for_check.write_key_id(),
            "some subscriptions' secrets are sealed with another key than secrets.write_key (or stored in the clear); \
             POST /v1/secrets/reseal (admin) seals them all with the write key: keep the old keys until it answers remaining = 0"
        );
    }
    let fan = Arc::new(fanout::Fanout {
        topics,
        producer: producer.clone(),
        subs: tables.subs.clone(),
        max_event_bytes: config.ingest.max_event_bytes,
        shutdown: shutdown.clone(),
        tracer: tracer.clone(),
        readiness: readiness.clone(),
        dlq: hookline_kafka::dead_letters::DeadLetterWriter::new(config.dlq.format, &config.kafka),
        settler: hookline_kafka::produce::Settler::new(&producer, shutdown.clone()),
        invalid: Default::default(),
        registry: registry.clone(),
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
    if let Some(i) = indexer {
        let _ = i.await;
    }
    tracer.flush().await;
    result?;
    tracing::info!("ingest stopped");
    Ok(())
}
