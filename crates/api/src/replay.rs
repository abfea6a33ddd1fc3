//! Replays and redrives: delivery tasks produced again for events that were already accepted. A replay keeps
//! the delivery id (receivers deduplicate on the event id, which is unchanged) and continues the attempt count
//! (`prior_attempts`), so Gauge's `Gauge-Delivery-Attempt` keeps increasing across redeliveries.

use std::collections::HashMap;
use std::time::Duration;

use futures::future::join_all;
use hookline_core::model::{delivery_id, DeadLetter, DeliveryTask, Event, TaskOrigin};
use hookline_kafka::scan::{scan, ScanError};
use hookline_kafka::state::SubscriptionEntry;
use prost::Message as _;
use rdkafka::producer::FutureRecord;
use rdkafka::Message;

use crate::ApiState;

/// Longest a replay or redrive request may read for.
const SCAN_LIMIT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Scan(#[from] ScanError),
    #[error("producing replayed tasks failed: {0}")]
    Produce(rdkafka::error::KafkaError),
    #[error("reading the delivery log: {0}")]
    Log(#[from] hookline_log::StoreError),
}

/// A new run of the delivery: its own `run_id`, so the dispatcher does not take its attempts for a redo of the
/// earlier run's (which it would skip).
pub fn task(event: Event, subscription_id: &str, prior_attempts: u32) -> DeliveryTask {
    DeliveryTask {
        run_id: format!("run_{:016x}", rand::random::<u64>()),
        delivery_id: delivery_id(&event.id, subscription_id),
        subscription_id: subscription_id.to_owned(),
        event: Some(event),
        origin: TaskOrigin::Replay as i32,
        prior_attempts,
        ..Default::default()
    }
}

/// Produces tasks and waits until every one is acknowledged.
pub async fn produce(s: &ApiState, tasks: Vec<DeliveryTask>) -> Result<usize, ReplayError> {
    let topic = s.topics.deliveries();
    let n = tasks.len();
    let sends = tasks.iter().map(|t| {
        let payload = t.encode_to_vec();
        async move {
            s.producer
                .send(FutureRecord::to(topic).key(&t.subscription_id).payload(&payload), Duration::from_secs(10))
                .await
                .map_err(|(e, _)| e)
        }
    });
    for r in join_all(sends).await {
        r.map_err(ReplayError::Produce)?;
    }
    metrics::counter!("hookline_replayed_total").increment(n as u64);
    Ok(n)
}

/// Every event accepted since `since_ms` (and up to `until_ms`) of the subscription's tenant that its filter
/// matches.
pub async fn since(s: &ApiState, entry: &SubscriptionEntry, since_ms: i64, until_ms: Option<i64>) -> Result<usize, ReplayError> {
    use hookline_core::event_decode::{DecodeError, Decoded};
    let mut events = Vec::new();
    // Framed records whose schema is not cached yet, kept (in order) until the scan is over: the scan's callback
    // cannot wait for a fetch.
    let mut pending: Vec<rdkafka::message::OwnedMessage> = Vec::new();
    let keep = |mut ev: Event, written: i64, events: &mut Vec<Event>| {
        // The fan-out's rule: only the subscription's own tenant's events.
        if !hookline_core::filter::delivers(&entry.sub.tenant, &entry.sub.event_types, &ev.tenant, &ev.r#type) {
            return;
        }
        // And its payload filter, as the fan-out applies it.
        if !matches!(entry.filter, Ok(None)) {
            let data = hookline_core::payload_filter::Data::parse(&ev.data_json);
            if !entry.filter_matches(&hookline_core::payload_filter::EventFields::of(&ev, &data)) {
                return;
            }
        }
        if ev.accepted_at_ms == 0 {
            ev.accepted_at_ms = written;
        }
        events.push(ev);
    };
    let no_registry = hookline_core::registry_framing::NoRegistry;
    let registry: &(dyn hookline_core::registry_framing::PayloadDecoder + Sync) = match &s.registry {
        Some(r) => r.as_ref(),
        None => &no_registry,
    };
    scan(&s.kafka, s.topics.events(), Some(since_ms), SCAN_LIMIT, |m| {
        let written = m.timestamp().to_millis().unwrap_or(0);
        if until_ms.is_some_and(|u| written > u) {
            return;
        }
        match hookline_kafka::event_record::decode_with(m, s.max_event_bytes, registry) {
            Ok(Decoded::Event(ev)) => keep(ev, written, &mut events),
            Err(DecodeError::SchemaPending(_)) => pending.push(m.detach()),
            Ok(Decoded::NoData) | Err(DecodeError::Invalid(_)) => {}
        }
    })
    .await?;
    if let (Some(r), false) = (&s.registry, pending.is_empty()) {
        // Bounded like the scan: a registry that does not answer within it leaves those events out of the replay.
        let stop = tokio_util::sync::CancellationToken::new();
        let _cancel = stop.clone().drop_guard();
        let _ = tokio::time::timeout(SCAN_LIMIT, async {
            for m in &pending {
                if let Some(Ok(f)) = hookline_core::registry_framing::split(m.payload().unwrap_or_default()) {
                    r.resolve(f.schema_id, &stop).await;
                }
                if let Ok(Decoded::Event(ev)) = hookline_kafka::event_record::decode_with(m, s.max_event_bytes, r.as_ref()) {
                    keep(ev, m.timestamp().to_millis().unwrap_or(0), &mut events);
                }
            }
        })
        .await;
        // Replays go in the order the events were accepted.
        events.sort_by_key(|e| e.accepted_at_ms);
    }
    let mut tasks = Vec::with_capacity(events.len());
    for ev in events {
        // The attempt count continues where the log has it (a delivery never made starts at 0).
        let prior = s.log.delivery(&delivery_id(&ev.id, &entry.sub.id)).await?.map_or(0, |d| d.delivery.attempts_made);
        tasks.push(task(ev, &entry.sub.id, prior));
    }
    produce(s, tasks).await
}

/// Filters for a dead-letter redrive.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedriveFilter {
    pub subscription_id: Option<String>,
    /// `terminal_outcome`, `retries_exhausted`, `oversize`, ...
    pub reason: Option<String>,
    /// `failed` or `dead`.
    pub final_state: Option<String>,
    pub since_ms: Option<i64>,
    /// Set from the credential, never from the body: only dead letters of this tenant's events.
    #[serde(skip)]
    pub tenant: Option<String>,
}

pub struct Redrive {
    pub redriven: usize,
    /// Matching dead letters left alone: their subscription is gone or inactive, their event is of another tenant,
    /// or the delivery succeeded since.
    pub skipped: usize,
}

/// Sends dead-lettered deliveries again: the newest dead letter of each delivery that matches the filter.
pub async fn redrive(s: &ApiState, f: &RedriveFilter) -> Result<Redrive, ReplayError> {
    let mut latest: HashMap<String, DeadLetter> = HashMap::new();
    scan(&s.kafka, s.topics.dlq(), f.since_ms, SCAN_LIMIT, |m| {
        // Either format (`dlq.format`; it may have changed over the topic's life).
        let Ok(dl) = hookline_kafka::dead_letters::decode(m) else { return };
        let wanted = !dl.delivery_id.is_empty()
            && dl.event.is_some()
            && f.subscription_id.as_ref().is_none_or(|x| *x == dl.subscription_id)
            && f.reason.as_ref().is_none_or(|x| *x == dl.reason)
            && f.final_state.as_ref().is_none_or(|x| *x == dl.final_state)
            && f.tenant.as_ref().is_none_or(|t| dl.event.as_ref().is_some_and(|e| e.tenant == *t));
        if wanted {
            latest.insert(dl.delivery_id.clone(), dl);
        }
    })
    .await?;
    let mut tasks = Vec::new();
    let mut skipped = 0;
    for (_, dl) in latest {
        let logged = s.log.delivery(&dl.delivery_id).await?.map(|d| d.delivery);
        let succeeded_since = logged.as_ref().is_some_and(|d| d.state == hookline_log::DeliveryState::Succeeded);
        // A dead letter of another tenant's event (fanned out before tenant isolation) is never sent again.
        let active = s.subs.get(&dl.subscription_id).is_some_and(|e| {
            dl.event.as_ref().is_some_and(|ev| *ev.tenant == *e.sub.tenant) && e.sub.activity(s.states.get(&e.sub.id).as_ref()).is_active()
        });
        if succeeded_since || !active {
            skipped += 1;
            continue;
        }
        let prior = logged.map_or(dl.attempts, |d| d.attempts_made.max(dl.attempts));
        tasks.push(task(dl.event.unwrap_or_default(), &dl.subscription_id, prior));
    }
    let redriven = produce(s, tasks).await?;
    Ok(Redrive { redriven, skipped })
}
