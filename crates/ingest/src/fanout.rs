//! The fan-out: each accepted event becomes one delivery task per matching subscription. The event's offset is
//! stored only after every task (or its dead letter) is acknowledged.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hookline_core::model::{delivery_id, DeadLetter, DeliveryTask, Event, TaskOrigin};
use hookline_core::payload_filter::{Data, EventFields};
use hookline_kafka::client::Producer;
use hookline_kafka::rebalance::RebalanceEvent;
use hookline_kafka::state::{SubscriptionEntry, SubscriptionTable};
use hookline_kafka::worker::{self, Control, Done, Handler, Liveness, Worker};
use hookline_kafka::Topics;
use prost::Message as _;
use rdkafka::consumer::Consumer as _;
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, OwnedMessage};
use rdkafka::{Message, TopicPartitionList};
use tokio_util::sync::CancellationToken;

use crate::decode::{self, Decoded};

/// Delivery tasks being produced at once, over every event in flight: an event matching 10,000 subscriptions
/// counts 10,000 (bounding events instead let memory grow with the fan-out).
const MAX_TASKS_IN_FLIGHT: usize = 65_536;

pub struct Fanout {
    pub topics: Topics,
    pub producer: Producer,
    pub subs: SubscriptionTable,
    pub max_event_bytes: usize,
    pub shutdown: CancellationToken,
    pub tracer: hookline_service::traces::Tracer,
    /// Set at the first assignment: until the group has assigned the events topic, nothing is fanned out.
    pub readiness: hookline_service::Readiness,
    /// How dead letters of unreadable events are written (`dlq.format`, within the record size).
    pub dlq: hookline_kafka::dead_letters::DeadLetterWriter,
    /// Writes the tasks, settling each event where its last task's acknowledgement arrives.
    pub settler: hookline_kafka::produce::Settler,
    /// Unreadable events since the last warning about them (one warning at most every [`INVALID_WARN_EVERY`]).
    pub invalid: Mutex<InvalidSince>,
    /// Decodes Avro and Protobuf framed events (`[ingest.schema_registry]`); `None`: they are dead-lettered.
    pub registry: Option<Arc<hookline_schema_registry::Registry>>,
}

/// At most one warning about unreadable events this often: a producer stuck writing garbage fills no log.
pub const INVALID_WARN_EVERY: Duration = Duration::from_secs(10);

/// Unreadable events counted by reason between two warnings.
#[derive(Default)]
pub struct InvalidSince {
    counts: std::collections::BTreeMap<&'static str, u64>,
    last_warned: Option<std::time::Instant>,
}

impl InvalidSince {
    /// Counts one; when a warning is due, returns what to say (`3 invalid_json, 1 oversize`) and starts over.
    pub fn count(&mut self, reason: &'static str, now: std::time::Instant) -> Option<String> {
        *self.counts.entry(reason).or_default() += 1;
        if self.last_warned.is_some_and(|at| now.saturating_duration_since(at) < INVALID_WARN_EVERY) {
            return None;
        }
        self.last_warned = Some(now);
        let summary = self.counts.iter().map(|(r, n)| format!("{n} {r}")).collect::<Vec<_>>().join(", ");
        self.counts.clear();
        Some(summary)
    }
}

pub async fn run(f: Arc<Fanout>, config: &hookline_service::Config, client_id: &str) -> Result<(), KafkaError> {
    let settings = worker::Settings {
        name: "ingest",
        group_id: config.ingest.group_id.clone(),
        client_id: client_id.to_owned(),
        topics: vec![f.topics.events().to_owned()],
        // Spent, the fan-out pauses its partitions and keeps polling (see `Budget`).
        max_in_flight: Some(MAX_TASKS_IN_FLIGHT),
        paused_gauge: Some(metrics::gauge!("hookline_fanout_paused")),
        drain: Duration::from_secs(10),
        stall: None,
        prefetch_kbytes: None,
    };
    let liveness = Liveness::new(Duration::from_millis(config.kafka.max_poll_interval_ms));
    let worker = Worker::subscribe(&config.kafka, settings, liveness, None)?;
    let shutdown = f.shutdown.clone();
    let (resolved_tx, resolved) = tokio::sync::mpsc::unbounded_channel();
    let mut handler = FanoutHandler { f, held: HashMap::new(), fetching: HashSet::new(), resolved_tx, resolved };
    worker.run(&mut handler, &shutdown).await;
    metrics::gauge!("hookline_schema_registry_held_partitions").set(0.0);
    Ok(())
}

/// The fan-out's handler, and the partitions it holds for a schema being fetched.
///
/// Ordering: a partition's events must be fanned out in offset order (ordered subscriptions rely on it), so a
/// record whose schema is not cached yet is not skipped: it and every later record of its partition are held
/// here, in order, and the partition is paused, until the schema is fetched (by a task, with capped backoff while
/// the registry does not answer). The loop keeps polling meanwhile: other partitions go on, and the group never
/// takes the member for dead, however long the registry is down (a `block_in_place` in `record` would stop the
/// polls, and past `max.poll.interval.ms` lose the partitions). A record held here keeps its budget unit and its
/// offset uncommitted; a revoked partition's held records are dropped uncommitted, for its next owner.
struct FanoutHandler {
    f: Arc<Fanout>,
    /// Per partition of `events`: the records waiting for a schema, oldest first. Present only while non-empty.
    held: HashMap<i32, VecDeque<Held>>,
    /// Schema ids being fetched (one task each).
    fetching: HashSet<u32>,
    resolved_tx: tokio::sync::mpsc::UnboundedSender<u32>,
    resolved: tokio::sync::mpsc::UnboundedReceiver<u32>,
}

struct Held {
    m: OwnedMessage,
    done: Done,
    received_us: i64,
}

impl FanoutHandler {
    /// Pauses `partition` of `events` (and again after the budget's resume-all, which would lift it).
    fn pause(&self, ctl: &Control<'_>, partition: i32, pause: bool) {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(self.f.topics.events(), partition);
        let r = if pause { ctl.consumer().pause(&tpl) } else { ctl.consumer().resume(&tpl) };
        if let Err(e) = r {
            tracing::warn!(partition, pause, error = %e, "pausing or resuming a partition held for a schema failed");
        }
        metrics::gauge!("hookline_schema_registry_held_partitions").set(self.held.len() as f64);
    }

    /// Starts fetching `id` unless a fetch is under way; its end wakes the loop ([`Handler::wake`]).
    fn fetch(&mut self, id: u32) {
        let Some(registry) = self.f.registry.clone() else { return };
        if !self.fetching.insert(id) {
            return;
        }
        let (tx, shutdown) = (self.resolved_tx.clone(), self.f.shutdown.clone());
        tokio::spawn(async move {
            if registry.resolve(id, &shutdown).await.is_some() {
                let _ = tx.send(id);
            }
        });
    }

    /// Handles the records held on `partition` from the oldest, up to one that still waits for a schema.
    fn release(&mut self, partition: i32, ctl: &Control<'_>) {
        let Some(mut queue) = self.held.remove(&partition) else { return };
        while let Some(h) = queue.pop_front() {
            if let Err((done, id)) = self.handle(&h.m, h.done, h.received_us) {
                queue.push_front(Held { done, ..h });
                self.fetch(id);
                break;
            }
        }
        if queue.is_empty() {
            self.pause(ctl, partition, false);
        } else {
            self.held.insert(partition, queue);
        }
    }
}

impl Handler for FanoutHandler {
    type Wake = Option<u32>;

    fn rebalance(&mut self, ev: RebalanceEvent, ctl: &Control<'_>) {
        let f = &self.f;
        match &ev {
            RebalanceEvent::Assigned(_) if !f.readiness.is_ready() => {
                f.readiness.set(true);
                tracing::info!("ingest ready");
            }
            RebalanceEvent::Revoked(parts) => {
                // Their next owner reads them again from the last commit.
                for (topic, p) in parts {
                    if topic == f.topics.events() {
                        self.held.remove(p);
                    }
                }
                metrics::gauge!("hookline_schema_registry_held_partitions").set(self.held.len() as f64);
            }
            _ => {}
        }
        let _ = ctl;
    }

    fn wake(&mut self) -> impl std::future::Future<Output = Self::Wake> + Send + '_ {
        self.resolved.recv()
    }

    fn woken(&mut self, id: Option<u32>, ctl: &Control<'_>) {
        let Some(id) = id else { return };
        self.fetching.remove(&id);
        let partitions: Vec<i32> = self.held.keys().copied().collect();
        for p in partitions {
            self.release(p, ctl);
        }
    }

    fn record(&mut self, m: &BorrowedMessage<'_>, done: Done, ctl: &Control<'_>) {
        // The latency split's receive stamp (proto: DeliveryTask.fanout_received_at_us).
        let received_us = hookline_service::now_us();
        metrics::counter!("hookline_events_consumed_total").increment(1);
        let p = done.partition();
        if let Some(queue) = self.held.get_mut(&p) {
            // Behind a record waiting for its schema: its turn comes after it.
            queue.push_back(Held { m: m.detach(), done, received_us });
            self.pause(ctl, p, true);
            return;
        }
        if let Err((done, id)) = self.handle(m, done, received_us) {
            tracing::debug!(partition = p, offset = done.offset(), schema_id = id, "partition held until the schema is fetched");
            self.held.insert(p, VecDeque::from([Held { m: m.detach(), done, received_us }]));
            self.pause(ctl, p, true);
            self.fetch(id);
        }
    }
}

impl FanoutHandler {
    /// Decodes and fans out one record, or hands its `done` back with the schema id it waits for.
    fn handle<M: Message>(&mut self, m: &M, done: Done, received_us: i64) -> Result<(), (Done, u32)> {
        let f = &self.f;
        let events = f.topics.events();
        let (p, o) = (done.partition(), done.offset());
        let accepted_at = m.timestamp().to_millis().unwrap_or_else(crate::now_ms);
        let decoded = match &f.registry {
            Some(r) => hookline_kafka::event_record::decode_with(m, f.max_event_bytes, r.as_ref()),
            None => hookline_kafka::event_record::decode_with(m, f.max_event_bytes, &hookline_core::registry_framing::NoRegistry),
        };
        let mut ev = match decoded {
            Ok(Decoded::Event(ev)) => ev,
            Ok(Decoded::NoData) => {
                // A CloudEvent without data (a tombstone, in the Kafka binding): nothing to deliver.
                metrics::counter!("hookline_events_ignored_total", "reason" => "cloudevent_without_data").increment(1);
                done.complete();
                return Ok(());
            }
            Err(decode::DecodeError::SchemaPending(id)) => return Err((done, id)),
            Err(decode::DecodeError::Invalid(invalid)) => {
                metrics::counter!("hookline_events_invalid_total", "reason" => invalid.reason).increment(1);
                tracing::debug!(partition = p, offset = o, %invalid, "invalid event dead-lettered");
                if let Some(summary) = f.invalid.lock().unwrap_or_else(|e| e.into_inner()).count(invalid.reason, std::time::Instant::now())
                {
                    tracing::warn!(
                        partition = p,
                        offset = o,
                        last = %invalid,
                        "{summary} unreadable event(s) on {events} dead-lettered to the dlq topic since the last warning (hookline_events_invalid_total has each reason)"
                    );
                }
                // The raw record is kept whole when it fits the event limit (it always fits a Kafka record
                // then); an oversize one keeps its first bytes, and the source offset points at all of it.
                let payload = m.payload().unwrap_or_default();
                let keep = payload.len().min(f.max_event_bytes);
                let mut detail = invalid.detail;
                if keep < payload.len() {
                    detail.push_str(&format!("; raw truncated to its first {keep} of {} bytes", payload.len()));
                }
                let dl = DeadLetter {
                    reason: invalid.reason.into(),
                    detail,
                    raw: payload[..keep].to_vec().into(),
                    source_topic: events.to_owned(),
                    source_partition: p,
                    source_offset: o,
                    at_ms: crate::now_ms(),
                    raw_headers: raw_headers(m),
                    ..Default::default()
                };
                if f.tracer.is_on() {
                    let (tp, ts) = trace_headers(m);
                    f.tracer.dead_letter_of_record(&dl, tp, ts);
                }
                let (value, headers) = f.dlq.record(&dl);
                let f = f.clone();
                tokio::spawn(async move {
                    let sent =
                        hookline_kafka::produce::send_until_acked(&f.producer, f.topics.dlq(), "", &value, Some(&headers), &f.shutdown)
                            .await;
                    if sent.is_ok() {
                        done.complete();
                    }
                });
                return Ok(());
            }
        };
        if ev.accepted_at_ms == 0 {
            ev.accepted_at_ms = accepted_at;
        }
        // Headers are looked at only when tracing is on.
        let (tp, ts) = if f.tracer.is_on() { trace_headers(m) } else { (None, None) };
        let span = f.tracer.fanout(&mut ev, tp, ts);
        fan_out(f, ev, received_us, done, span);
        Ok(())
    }
}

/// An unreadable record's headers, kept in its dead letter (a CloudEvent's attributes are there).
fn raw_headers<M: Message>(m: &M) -> Vec<hookline_core::model::RecordHeader> {
    use rdkafka::message::Headers;
    // The dead letter must fit a record beside the raw value: headers past this many bytes are left out.
    const MAX_KEPT_HEADER_BYTES: usize = 16 << 10;
    let Some(headers) = m.headers() else { return Vec::new() };
    let mut kept = 0usize;
    headers
        .iter()
        .take_while(|h| {
            kept = kept.saturating_add(h.key.len()).saturating_add(h.value.map_or(0, <[u8]>::len));
            kept <= MAX_KEPT_HEADER_BYTES
        })
        .map(|h| hookline_core::model::RecordHeader {
            key: h.key.to_owned(),
            value: h.value.map(|v| v.to_vec().into()).unwrap_or_default(),
        })
        .collect()
}

/// The W3C trace context record headers, when present.
fn trace_headers<M: Message>(m: &M) -> (Option<&[u8]>, Option<&[u8]>) {
    use rdkafka::message::Headers;
    let (mut tp, mut ts) = (None, None);
    if let Some(headers) = m.headers() {
        for h in headers.iter() {
            if h.key.eq_ignore_ascii_case("traceparent") {
                tp = tp.or(h.value);
            } else if h.key.eq_ignore_ascii_case("tracestate") {
                ts = ts.or(h.value);
            }
        }
    }
    (tp, ts)
}

/// Enqueues one task per matching subscription. Their acknowledgements arrive on the producer's polling thread,
/// where the last one completes the event's offset ([`EventSettle`]); an event that matches nothing completes now.
fn fan_out(f: &Fanout, ev: Event, received_us: i64, mut done: Done, mut span: Option<hookline_service::traces::Span>) {
    // Only the event's own tenant's subscriptions (none of another tenant's, even for the same type).
    let mut targets = f.subs.matching(&ev.tenant, &ev.r#type);
    if !ev.only_subscription_id.is_empty() {
        // A test event: the one subscription it was sent for, if it still matches; its filter is not asked.
        targets.retain(|e| *e.sub.id == *ev.only_subscription_id);
    } else if targets.iter().any(|e| !matches!(e.filter, Ok(None))) {
        // Payload filters after the type match; the data is parsed once per event, and only if some target filters.
        let data = Data::parse(&ev.data_json);
        let fields = EventFields::of(&ev, &data);
        let before = targets.len();
        targets.retain(|e| e.filter_matches(&fields));
        metrics::counter!("hookline_deliveries_filtered_total").increment((before - targets.len()) as u64);
    }
    metrics::counter!("hookline_deliveries_fanned_out_total").increment(targets.len() as u64);
    if let Some(s) = &mut span {
        s.set_i64("hookline.deliveries", targets.len() as i64);
    }
    if targets.is_empty() {
        done.complete();
        if let Some(s) = span {
            s.end();
        }
        return;
    }
    // Weighs its tasks whatever is left (the event is in hand); the partitions pause once the budget is spent.
    done.add_units(targets.len() - 1);
    enqueue_tasks(f, &ev, &targets, received_us, (done, span));
}

/// Enqueues `ev`'s task for each of `targets` (at least one); `settled` runs once every one is acknowledged.
fn enqueue_tasks<S: Settled>(f: &Fanout, ev: &Event, targets: &[Arc<SubscriptionEntry>], received_us: i64, settled: S) {
    let settle = Arc::new(EventSettle { remaining: AtomicUsize::new(targets.len()), settled: Mutex::new(Some(settled)) });
    let deliveries = f.topics.deliveries();
    let event = EncodedEvent::new(ev);
    for entry in targets {
        let task = DeliveryTask {
            delivery_id: delivery_id(&ev.id, &entry.sub.id),
            subscription_id: entry.sub.id.to_string(),
            origin: TaskOrigin::Fanout as i32,
            fanout_received_at_us: received_us,
            fanout_produced_at_us: hookline_service::now_us(),
            ..Default::default()
        };
        let settle = settle.clone();
        f.settler.send(deliveries, &task.subscription_id, &event.task_bytes(&task), move || settle.acked_one());
    }
}

/// What is done once all of an event's tasks are acknowledged.
trait Settled: Send + Sync + 'static {
    fn settled(self);
}

/// The event's offset is completed, and its fan-out span ends.
impl Settled for (Done, Option<hookline_service::traces::Span>) {
    fn settled(self) {
        let (done, span) = self;
        done.complete();
        if let Some(s) = span {
            s.end();
        }
    }
}

/// An event's tasks on their way to the broker; the last acknowledgement settles the event. A shutdown before then
/// drops what `settled` holds unrun (the event's `Done`: the next owner fans it out again).
struct EventSettle<S> {
    remaining: AtomicUsize,
    settled: Mutex<Option<S>>,
}

impl<S: Settled> EventSettle<S> {
    fn acked_one(&self) {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let settled = self.settled.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(s) = settled {
            s.settled();
        }
    }
}

/// The event encoded once per fan-out; each task's record is its own fields followed by these bytes as field
/// `event`, instead of a copy of the `Event` per subscription, each encoded again.
struct EncodedEvent {
    bytes: Vec<u8>,
}

/// `DeliveryTask.event`'s field number (proto/hookline/v1/hookline.proto).
const TASK_EVENT_FIELD: u32 = 3;

impl EncodedEvent {
    fn new(ev: &Event) -> Self {
        Self { bytes: ev.encode_to_vec() }
    }

    /// `task` (whose `event` is unset) encoded with the event: protobuf fields may come in any order, and a
    /// message field is its key, its length and its bytes, so appending decodes as `event: Some(ev)`.
    fn task_bytes(&self, task: &DeliveryTask) -> Vec<u8> {
        use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};
        debug_assert!(task.event.is_none());
        let len = self.bytes.len() as u64;
        let mut out = task.encode_to_vec();
        out.reserve_exact(key_len(TASK_EVENT_FIELD) + encoded_len_varint(len) + self.bytes.len());
        encode_key(TASK_EVENT_FIELD, WireType::LengthDelimited, &mut out);
        encode_varint(len, &mut out);
        out.extend_from_slice(&self.bytes);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spliced_task_decodes_as_the_task_with_its_event() {
        let ev = Event {
            id: "evt_1".into(),
            r#type: "invoice.paid".into(),
            tenant: "acme".into(),
            data_json: bytes::Bytes::from_static(br#"{"n":1}"#),
            accepted_at_ms: 42,
            traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
            ..Default::default()
        };
        let encoded = EncodedEvent::new(&ev);
        for sub in ["sub_a", "sub_b"] {
            let task = DeliveryTask {
                delivery_id: delivery_id(&ev.id, sub),
                subscription_id: sub.into(),
                origin: TaskOrigin::Fanout as i32,
                ..Default::default()
            };
            let want = DeliveryTask { event: Some(ev.clone()), ..task.clone() };
            let bytes = encoded.task_bytes(&task);
            assert_eq!(DeliveryTask::decode(bytes.as_slice()).unwrap(), want);
            assert_eq!(bytes.len(), want.encoded_len());
        }
        // An empty event still makes an `event: Some(..)`, as `Some(Event::default())` does.
        let empty = EncodedEvent::new(&Event::default()).task_bytes(&DeliveryTask::default());
        assert_eq!(DeliveryTask::decode(empty.as_slice()).unwrap().event, Some(Event::default()));
    }

    /// A producer stuck writing garbage gets one warning per interval, which counts every reason since the last.
    #[test]
    fn unreadable_events_are_warned_about_at_most_once_an_interval_with_their_counts() {
        let mut w = InvalidSince::default();
        let t0 = std::time::Instant::now();
        assert_eq!(w.count("invalid_json", t0).as_deref(), Some("1 invalid_json"));
        for _ in 0..5 {
            assert_eq!(w.count("invalid_json", t0 + Duration::from_secs(1)), None);
        }
        assert_eq!(w.count("oversize", t0 + Duration::from_secs(2)), None);
        assert_eq!(w.count("oversize", t0 + INVALID_WARN_EVERY).as_deref(), Some("5 invalid_json, 2 oversize"));
        assert_eq!(w.count("empty", t0 + INVALID_WARN_EVERY + Duration::from_secs(1)), None);
    }

    impl Settled for tokio::sync::oneshot::Sender<()> {
        fn settled(self) {
            let _ = self.send(());
        }
    }

    /// Tasks librdkafka gives up on (the broker down past `delivery_timeout_ms`) are produced again until
    /// acknowledged; the event is settled only once every task is written, each exactly once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tasks_the_producer_gave_up_on_are_produced_again_and_the_event_settles_once_all_are_written() {
        use hookline_kafka::mock::DevBroker;
        let topics = Topics::new("fo.");
        let broker = DevBroker::start(&topics, 2, 1).unwrap();
        let kafka = hookline_kafka::KafkaSettings {
            bootstrap_servers: broker.bootstrap_servers(),
            delivery_timeout_ms: 1_000,
            ..Default::default()
        };
        let producer = hookline_kafka::client::producer(&kafka, "fanout-test").unwrap();
        let f = Arc::new(Fanout {
            topics: topics.clone(),
            producer: producer.clone(),
            subs: SubscriptionTable::default(),
            max_event_bytes: 1 << 20,
            shutdown: CancellationToken::new(),
            tracer: hookline_service::traces::Tracer::new(&Default::default(), "ingest"),
            readiness: Default::default(),
            dlq: hookline_kafka::dead_letters::DeadLetterWriter::new(Default::default(), &kafka),
            settler: hookline_kafka::produce::Settler::new(&producer, CancellationToken::new()),
            invalid: Default::default(),
            registry: None,
        });
        // An established producer, then the outage.
        hookline_kafka::produce::send_until_acked(&f.producer, topics.events(), "k", b"warm", None, &f.shutdown).await.unwrap();
        broker.cluster().broker_down(1).unwrap();
        let targets: Vec<_> = ["sub_a", "sub_b"]
            .map(|id| Arc::new(SubscriptionEntry::new(hookline_core::model::Subscription { id: id.into(), ..Default::default() })))
            .into();
        let ev = Event { id: "evt_1".into(), r#type: "t".into(), ..Default::default() };
        let (tx, mut settled) = tokio::sync::oneshot::channel();
        enqueue_tasks(&f, &ev, &targets, 0, tx);
        // Three delivery timeouts: librdkafka has given up on both tasks at least twice.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(settled.try_recv().is_err(), "not settled while its tasks are unwritten");
        broker.cluster().broker_up(1).unwrap();
        tokio::time::timeout(Duration::from_secs(30), settled).await.expect("settled once the broker is back").unwrap();
        let mut written = Vec::new();
        hookline_kafka::scan::scan_partitions(&kafka, topics.deliveries(), None, None, Duration::from_secs(20), |m| {
            written.push(DeliveryTask::decode(m.payload().unwrap_or_default()).unwrap().subscription_id);
        })
        .await
        .unwrap();
        written.sort();
        assert_eq!(written, ["sub_a", "sub_b"], "each task written once");
    }
}
