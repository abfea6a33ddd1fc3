//! What the store keeps and answers, independent of the backend: rows, query shapes, the typed delivery state,
//! the keyset cursor, and the pure folding of a batch of Kafka records into row upserts.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use hookline_core::model::{AttemptRecord, DeadLetter, Event};
use serde::Serialize;

/// A delivery's state in the log. Parsed strictly: an unknown word is an error, never an empty result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    /// Attempted (or dead-lettered without a final word yet) and not finished.
    #[default]
    Pending,
    Succeeded,
    Failed,
    Dead,
    Cancelled,
    /// Not sent: the subscription's policy skipped it (e.g. while paused with `on_pause = "skip"`).
    Skipped,
}

impl DeliveryState {
    pub const ALL: [DeliveryState; 6] = [Self::Pending, Self::Succeeded, Self::Failed, Self::Dead, Self::Cancelled, Self::Skipped];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Dead => "dead",
            Self::Cancelled => "cancelled",
            Self::Skipped => "skipped",
        }
    }

    /// The state after an attempt record: its `final_state`, or pending while the delivery goes on. A final word
    /// this version does not know is kept as pending rather than invented.
    pub fn from_final(final_state: &str) -> Self {
        if final_state.is_empty() {
            Self::Pending
        } else {
            final_state.parse().unwrap_or(Self::Pending)
        }
    }
}

impl fmt::Display for DeliveryState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown delivery state {got:?}: expected one of pending, succeeded, failed, dead, cancelled, skipped")]
pub struct UnknownState {
    pub got: String,
}

impl FromStr for DeliveryState {
    type Err = UnknownState;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL.into_iter().find(|st| st.as_str() == s).ok_or_else(|| UnknownState { got: s.to_owned() })
    }
}

/// What a redacted header value is replaced with.
pub use hookline_core::request::REDACTED;

/// Headers as stored: secret values replaced by [`REDACTED`] (names kept, so a reader sees a signature was sent),
/// by the one rule the dispatcher applies before writing a record (`hookline_core::request::is_secret_header`);
/// applied again here so a record written by other means cannot put a secret in the log.
pub fn redact_headers(headers: &[(String, String)]) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|(name, value)| {
            let secret = hookline_core::request::is_secret_header(name);
            (name.clone(), if secret { REDACTED.to_owned() } else { value.clone() })
        })
        .collect()
}

/// One HTTP try (or a refused one) as stored. Keyed by (delivery, run, attempt, try, start time): indexing the same
/// record twice changes nothing, and a try redone after a rebalance (a second request) is a second row.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct AttemptRow {
    pub delivery_id: String,
    /// Empty for the delivery's first run; a replay or redrive has its own.
    pub run_id: String,
    pub attempt: u32,
    /// Micro-retries inside one attempt count up from 1; 0 for a record that ended a delivery without a request.
    pub try_no: u32,
    pub subscription_id: String,
    pub started_at_ms: i64,
    pub duration_ms: i64,
    /// The policy language's outcome token: `503`, `timeout`, `connect_error`, ...
    pub outcome: String,
    /// 0 when there was no HTTP response.
    pub http_status: u16,
    pub reason: String,
    /// Request headers as sent, secrets redacted ([`redact_headers`]). Empty when the record carried none.
    pub request_headers: Vec<(String, String)>,
    /// Where the body is: the event's payload (`event:<id>`), since hookline sends the event's data as the body.
    pub body_ref: String,
    pub response_headers: Vec<(String, String)>,
    /// The response body, capped by the policy's response cap.
    pub response_excerpt: String,
    /// `success`, `retry`, `terminal`.
    pub verdict: String,
    pub counts_toward_disable: bool,
    /// When the next attempt is due (ms since epoch); 0 when none is scheduled.
    pub next_due_at_ms: i64,
    /// Set when this try ended the delivery.
    pub final_state: String,
    pub status_word: String,
    /// The policy that decided (a profile name or `inline`).
    pub policy: String,
    pub concludes_attempt: u32,
    pub traceparent: String,
    /// The policy's reasoning: which step decided (`None`: a record without one, or indexed before migration 4).
    pub decided_by: Option<hookline_core::DecidedBy>,
    /// The `classify` rule that matched, 1-based (0: none or unknown), and its `when` matchers.
    pub rule: u32,
    pub rule_when: String,
}

/// A delivery as stored: one event for one subscription, across all its runs.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct DeliveryRow {
    pub delivery_id: String,
    pub subscription_id: String,
    /// The event's tenant, from the delivery's own records (empty: an event of no tenant). With `event_id`, the
    /// event's identity.
    pub tenant: String,
    pub event_id: String,
    pub event_type: String,
    pub state: DeliveryState,
    /// The policy's own word for the state.
    pub status_word: String,
    pub first_at_ms: i64,
    pub last_at_ms: i64,
    /// Highest attempt number seen (counted across runs).
    pub attempts_made: u32,
    /// Status of the latest try (0: no response).
    pub last_http_status: u16,
    pub last_outcome: String,
    /// The run of the latest record.
    pub run_id: String,
    /// Set once the delivery was dead-lettered: the dead letter's reason.
    pub dead_letter_reason: String,
}

/// A delivery with its attempts (oldest first, at most [`MAX_ATTEMPTS_RETURNED`]) and its event, when stored.
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryDetail {
    pub delivery: DeliveryRow,
    pub attempts: Vec<AttemptRow>,
    /// What a resend sends again (same id, type, data).
    pub event: Option<Event>,
}

/// A bound on the attempts one detail query returns (a policy caps attempts far below this).
pub const MAX_ATTEMPTS_RETURNED: usize = 1_000;
/// The largest page.
pub const MAX_PAGE: usize = 1_000;

/// Whose deliveries a list or stats query covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    Subscription(String),
    Tenant(String),
}

/// Newest first, `(first_at_ms, delivery_id)` descending: the position after the last item of a page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub first_at_ms: i64,
    pub delivery_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid cursor: pass the `next` value of the previous page unchanged")]
pub struct InvalidCursor;

impl Cursor {
    /// Opaque to clients: `<ms>.<delivery id>`.
    pub fn encode(&self) -> String {
        format!("{}.{}", self.first_at_ms, self.delivery_id)
    }

    pub fn decode(s: &str) -> Result<Self, InvalidCursor> {
        let (at, id) = s.split_once('.').ok_or(InvalidCursor)?;
        let first_at_ms = at.parse().map_err(|_| InvalidCursor)?;
        if id.is_empty() || id.len() > 256 || !id.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(InvalidCursor);
        }
        Ok(Self { first_at_ms, delivery_id: id.to_owned() })
    }
}

/// A list query. Filters combine with AND; times are the delivery's first attempt, `[since_ms, until_ms)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListQuery {
    pub scope: Scope,
    pub state: Option<DeliveryState>,
    /// The status of the delivery's latest try (0: none).
    pub http_status: Option<u16>,
    pub event_type: Option<String>,
    pub since_ms: Option<i64>,
    pub until_ms: Option<i64>,
    /// 1..=[`MAX_PAGE`]; larger values are clamped.
    pub limit: usize,
    pub after: Option<Cursor>,
}

impl ListQuery {
    pub fn new(scope: Scope) -> Self {
        Self { scope, state: None, http_status: None, event_type: None, since_ms: None, until_ms: None, limit: 50, after: None }
    }

    pub fn page_size(&self) -> usize {
        self.limit.clamp(1, MAX_PAGE)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub items: Vec<DeliveryRow>,
    pub next: Option<Cursor>,
}

/// Deliveries by state, for deliveries first attempted in `[since_ms, until_ms)`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Stats {
    pub since_ms: i64,
    pub until_ms: i64,
    pub total: u64,
    pub by_state: Vec<(DeliveryState, u64)>,
}

/// What the per-minute statistics need of one try: when, how long, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AttemptPoint {
    pub started_at_ms: i64,
    pub duration_ms: i64,
    pub verdict: String,
    pub final_state: String,
}

/// Most tries one statistics query reads (a window with more is counted up to this many, the newest kept).
pub const MAX_ATTEMPT_POINTS: usize = 200_000;

/// One Kafka record's worth of input to [`crate::LogStore::index`].
#[derive(Debug, Clone, Default)]
pub struct Batch {
    pub attempts: Vec<AttemptRecord>,
    pub dead_letters: Vec<DeadLetter>,
    /// Events with the time they were written (the record's timestamp), which places them in time.
    pub events: Vec<(Event, i64)>,
}

impl Batch {
    pub fn len(&self) -> usize {
        self.attempts.len() + self.dead_letters.len() + self.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What one indexed batch changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IndexSummary {
    pub attempts: usize,
    pub deliveries: usize,
    pub events: usize,
    /// Records that carry no delivery (malformed-input dead letters) or are older than the retention.
    pub skipped: usize,
}

/// An event as stored: the protobuf `Event`, encoded, so a resend sends exactly what was accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRow {
    pub event_id: String,
    pub event_type: String,
    pub tenant: String,
    pub at_ms: i64,
    pub payload: Vec<u8>,
}

/// The rows a batch writes, each key once (a backend's multi-row upsert may not touch a row twice).
#[derive(Debug, Default)]
pub struct Folded {
    pub events: Vec<EventRow>,
    pub attempts: Vec<AttemptRow>,
    pub deliveries: Vec<DeliveryRow>,
    pub skipped: usize,
    /// How far behind Kafka this batch was, written with it (the indexer's; none for batches of other origins).
    pub progress: Option<Progress>,
}

/// How far the indexer was behind the topics when it wrote its latest batch, stored with the batch so every API
/// replica reads the same figure (`store_meta`, key `indexer_progress`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Progress {
    /// The newest record's Kafka timestamp in the batch.
    pub newest_record_ms: i64,
    /// When the batch was made (the indexer's clock).
    pub indexed_at_ms: i64,
}

impl Progress {
    /// How far behind the topics the history was at `indexed_at_ms` (never negative).
    pub fn behind_ms(&self) -> i64 {
        self.indexed_at_ms.saturating_sub(self.newest_record_ms).max(0)
    }

    /// The stored form: `<newest record ms> <indexed at ms>`.
    pub fn encode(&self) -> String {
        format!("{} {}", self.newest_record_ms, self.indexed_at_ms)
    }

    pub fn decode(s: &str) -> Option<Self> {
        let (a, b) = s.split_once(' ')?;
        Some(Self { newest_record_ms: a.parse().ok()?, indexed_at_ms: b.parse().ok()? })
    }
}

/// The `store_meta` key of [`Progress`].
pub const PROGRESS_KEY: &str = "indexer_progress";

fn clamp_u16(v: u32) -> u16 {
    u16::try_from(v).unwrap_or(0)
}

/// The stored row of an attempt record, its strings moved out of the record (which is not used again).
pub fn attempt_row(rec: AttemptRecord) -> AttemptRow {
    AttemptRow {
        body_ref: if rec.event_id.is_empty() { String::new() } else { format!("event:{}", rec.event_id) },
        delivery_id: rec.delivery_id,
        run_id: rec.run_id,
        attempt: rec.attempt,
        try_no: rec.r#try,
        subscription_id: rec.subscription_id,
        started_at_ms: rec.started_at_ms,
        duration_ms: rec.duration_ms.max(0),
        outcome: rec.outcome,
        http_status: clamp_u16(rec.http_status),
        reason: rec.reason,
        request_headers: header_pairs(rec.request_headers),
        response_headers: header_pairs(rec.response_headers),
        response_excerpt: rec.response_excerpt,
        verdict: rec.verdict,
        counts_toward_disable: rec.counts_toward_disable,
        next_due_at_ms: rec.next_due_at_ms,
        final_state: rec.final_state,
        status_word: rec.status_word,
        policy: rec.policy,
        concludes_attempt: rec.concludes_attempt,
        traceparent: rec.traceparent,
        decided_by: hookline_core::DecidedBy::from_wire(rec.decided_by),
        rule: rec.rule,
        rule_when: rec.rule_when,
    }
}

/// A record's headers as text pairs (a value that is not UTF-8 is read lossily: the log is for people).
fn header_pairs(headers: Vec<hookline_core::model::Header>) -> Vec<(String, String)> {
    headers.into_iter().map(|h| (h.name, String::from_utf8_lossy(&h.value).into_owned())).collect()
}

/// Merges `new` into `old` the way the backends merge into a stored row (kept in one place: the SQL of both
/// backends says the same).
fn merge(old: &mut DeliveryRow, new: DeliveryRow) {
    let newer = new.last_at_ms >= old.last_at_ms;
    old.first_at_ms = old.first_at_ms.min(new.first_at_ms);
    old.attempts_made = old.attempts_made.max(new.attempts_made);
    for (o, n) in [
        (&mut old.subscription_id, &new.subscription_id),
        (&mut old.tenant, &new.tenant),
        (&mut old.event_id, &new.event_id),
        (&mut old.event_type, &new.event_type),
        (&mut old.dead_letter_reason, &new.dead_letter_reason),
    ] {
        if !n.is_empty() && (o.is_empty() || newer) {
            o.clone_from(n);
        }
    }
    if newer {
        old.last_at_ms = new.last_at_ms;
        old.state = new.state;
        old.status_word = new.status_word;
        old.last_http_status = new.last_http_status;
        old.last_outcome = new.last_outcome;
        old.run_id = new.run_id;
    }
}

/// Folds a batch into rows: events and attempts deduplicated by key (the last copy wins), deliveries merged.
/// Records older than `cutoff_ms` (outside the retention) and dead letters of no delivery are skipped.
pub fn fold(batch: Batch, cutoff_ms: i64) -> Folded {
    let mut out = Folded::default();
    // An event is (tenant, id): two tenants may publish the same id, and each keeps its own row.
    let mut events: HashMap<(String, String, i64), EventRow> = HashMap::new();
    for (ev, at_ms) in batch.events {
        let at_ms = if at_ms > 0 { at_ms } else { ev.accepted_at_ms.max(ev.occurred_at_ms) };
        if ev.id.is_empty() || at_ms < cutoff_ms {
            out.skipped += 1;
            continue;
        }
        events.insert((ev.tenant.clone(), ev.id.clone(), at_ms), event_row(&ev, at_ms));
    }
    let mut attempts: HashMap<(String, String, u32, u32, i64), AttemptRow> = HashMap::new();
    let mut deliveries: HashMap<String, DeliveryRow> = HashMap::new();
    for rec in batch.attempts {
        if rec.delivery_id.is_empty() || rec.started_at_ms < cutoff_ms {
            out.skipped += 1;
            continue;
        }
        let mut rec = rec;
        // The record's own tenant, never one looked up by the event id (another tenant may share it).
        let (tenant, event_id, event_type) = (std::mem::take(&mut rec.tenant), rec.event_id.clone(), std::mem::take(&mut rec.event_type));
        let row = attempt_row(rec);
        let delivery = DeliveryRow {
            delivery_id: row.delivery_id.clone(),
            subscription_id: row.subscription_id.clone(),
            tenant,
            event_id,
            event_type,
            state: DeliveryState::from_final(&row.final_state),
            status_word: row.status_word.clone(),
            first_at_ms: row.started_at_ms,
            last_at_ms: row.started_at_ms,
            attempts_made: row.attempt,
            last_http_status: row.http_status,
            last_outcome: row.outcome.clone(),
            run_id: row.run_id.clone(),
            dead_letter_reason: String::new(),
        };
        upsert(&mut deliveries, delivery);
        let key = (row.delivery_id.clone(), row.run_id.clone(), row.attempt, row.try_no, row.started_at_ms);
        match attempts.get_mut(&key) {
            // The record that concludes an attempt repeats its last try: keep the conclusion.
            Some(old) => {
                let concludes = old.concludes_attempt.max(row.concludes_attempt);
                *old = row;
                old.concludes_attempt = concludes;
            }
            None => {
                attempts.insert(key, row);
            }
        }
    }
    for dl in batch.dead_letters {
        if dl.delivery_id.is_empty() || dl.at_ms < cutoff_ms {
            out.skipped += 1;
            continue;
        }
        let ev = dl.event.as_ref();
        if let Some(ev) = ev.filter(|e| !e.id.is_empty()) {
            events.insert((ev.tenant.clone(), ev.id.clone(), dl.at_ms), event_row(ev, dl.at_ms));
        }
        let first = if dl.first_attempt_at_ms > 0 { dl.first_attempt_at_ms.min(dl.at_ms) } else { dl.at_ms };
        let delivery = DeliveryRow {
            delivery_id: dl.delivery_id.clone(),
            subscription_id: dl.subscription_id.clone(),
            tenant: ev.map(|e| e.tenant.clone()).unwrap_or_default(),
            event_id: ev.map(|e| e.id.clone()).unwrap_or_default(),
            event_type: ev.map(|e| e.r#type.clone()).unwrap_or_default(),
            state: DeliveryState::from_final(&dl.final_state),
            status_word: dl.status_word.clone(),
            first_at_ms: first,
            last_at_ms: dl.at_ms,
            attempts_made: dl.attempts,
            last_http_status: dl.last_outcome.parse::<u16>().unwrap_or(0),
            last_outcome: dl.last_outcome.clone(),
            run_id: String::new(),
            dead_letter_reason: dl.reason.clone(),
        };
        upsert(&mut deliveries, delivery);
    }
    out.events = events.into_values().collect();
    out.attempts = attempts.into_values().collect();
    out.deliveries = deliveries.into_values().collect();
    // A stable order: rows are locked in the same order by concurrent writers (no deadlock between indexers).
    out.events.sort_by(|a, b| (&a.tenant, &a.event_id, a.at_ms).cmp(&(&b.tenant, &b.event_id, b.at_ms)));
    out.attempts.sort_by(|a, b| {
        (&a.delivery_id, &a.run_id, a.attempt, a.try_no, a.started_at_ms).cmp(&(
            &b.delivery_id,
            &b.run_id,
            b.attempt,
            b.try_no,
            b.started_at_ms,
        ))
    });
    out.deliveries.sort_by(|a, b| a.delivery_id.cmp(&b.delivery_id));
    out
}

fn upsert(map: &mut HashMap<String, DeliveryRow>, row: DeliveryRow) {
    match map.get_mut(&row.delivery_id) {
        Some(old) => merge(old, row),
        None => {
            map.insert(row.delivery_id.clone(), row);
        }
    }
}

fn event_row(ev: &Event, at_ms: i64) -> EventRow {
    use prost::Message as _;
    EventRow { event_id: ev.id.clone(), event_type: ev.r#type.clone(), tenant: ev.tenant.clone(), at_ms, payload: ev.encode_to_vec() }
}

/// Headers as the stored JSON text: `[["name","value"],...]` (order and repeats kept).
pub fn headers_to_json(headers: &[(String, String)]) -> String {
    // Redacted as written, borrowing the strings (no copy of the pairs per attempt).
    let pairs: Vec<(&str, &str)> = headers
        .iter()
        .map(|(name, value)| (name.as_str(), if hookline_core::request::is_secret_header(name) { REDACTED } else { value.as_str() }))
        .collect();
    serde_json::to_string(&pairs).unwrap_or_else(|_| "[]".into())
}

pub fn headers_from_json(text: &str) -> Vec<(String, String)> {
    serde_json::from_str(text).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(delivery: &str, attempt: u32, try_no: u32, at: i64, final_state: &str) -> AttemptRecord {
        AttemptRecord {
            delivery_id: delivery.into(),
            subscription_id: "sub".into(),
            event_id: "evt".into(),
            event_type: "order.created".into(),
            tenant: "acme".into(),
            attempt,
            r#try: try_no,
            started_at_ms: at,
            outcome: if final_state == "succeeded" { "200".into() } else { "503".into() },
            http_status: if final_state == "succeeded" { 200 } else { 503 },
            final_state: final_state.into(),
            ..Default::default()
        }
    }

    #[test]
    fn states_parse_strictly() {
        for s in DeliveryState::ALL {
            assert_eq!(s.as_str().parse::<DeliveryState>().unwrap(), s);
        }
        let e = "delivered".parse::<DeliveryState>().unwrap_err();
        assert!(e.to_string().contains("\"delivered\"") && e.to_string().contains("succeeded"), "{e}");
        assert!("FAILED".parse::<DeliveryState>().is_err());
        assert!("".parse::<DeliveryState>().is_err());
    }

    #[test]
    fn secret_headers_are_redacted_and_named() {
        let h = vec![
            ("Content-Type".to_owned(), "application/json".to_owned()),
            ("webhook-signature".to_owned(), "v1,abc".to_owned()),
            ("Authorization".to_owned(), "Bearer x".to_owned()),
            ("X-Custom-Token".to_owned(), "t".to_owned()),
            ("webhook-id".to_owned(), "msg_1".to_owned()),
        ];
        let r = redact_headers(&h);
        assert_eq!(r[0].1, "application/json");
        assert_eq!(r[4].1, "msg_1");
        assert!(r[1..4].iter().all(|(_, v)| v == REDACTED), "{r:?}");
        assert_eq!(headers_from_json(&headers_to_json(&h)), r);
    }

    #[test]
    fn cursors_round_trip_and_garbage_is_refused() {
        let c = Cursor { first_at_ms: 1_700_000_000_000, delivery_id: "dlv_ab.c".into() };
        assert_eq!(Cursor::decode(&c.encode()).unwrap(), c);
        for bad in ["", "x", "12", "12.", "a.b", "1.\u{7f}", "1.has space"] {
            assert_eq!(Cursor::decode(bad), Err(InvalidCursor), "{bad:?}");
        }
    }

    #[test]
    fn a_batch_folds_to_one_row_per_key_with_the_newest_state() {
        let mut concluding = rec("d1", 2, 1, 20, "succeeded");
        concluding.concludes_attempt = 2;
        let batch = Batch {
            attempts: vec![
                rec("d1", 1, 1, 10, ""),
                rec("d1", 2, 1, 20, "succeeded"),
                concluding,
                rec("d1", 1, 1, 10, ""),
                rec("d2", 1, 1, 5, ""),
                rec("old", 1, 1, 1, "failed"),
            ],
            dead_letters: vec![DeadLetter { reason: "invalid_json".into(), ..Default::default() }],
            events: vec![(Event { id: "evt".into(), tenant: "acme".into(), ..Default::default() }, 7)],
        };
        let f = fold(batch, 3);
        assert_eq!(f.skipped, 2, "the record older than the cutoff and the dead letter of no delivery");
        assert_eq!(f.attempts.len(), 3);
        let a = f.attempts.iter().find(|a| a.delivery_id == "d1" && a.attempt == 2).unwrap();
        assert_eq!(a.concludes_attempt, 2);
        assert_eq!(a.body_ref, "event:evt");
        let d1 = f.deliveries.iter().find(|d| d.delivery_id == "d1").unwrap();
        assert_eq!(
            (d1.state, d1.first_at_ms, d1.last_at_ms, d1.attempts_made, d1.last_http_status, d1.tenant.as_str()),
            (DeliveryState::Succeeded, 10, 20, 2, 200, "acme")
        );
        assert_eq!(f.events.len(), 1);
    }

    /// Two tenants publish the same event id: each keeps its own event row, and each delivery keeps the tenant its
    /// own record names, whatever the batch holds of the other's.
    #[test]
    fn the_same_event_id_from_two_tenants_is_two_events() {
        let ev = |tenant: &str, card: &str| Event {
            id: "order-2000".into(),
            tenant: tenant.into(),
            data_json: card.as_bytes().to_vec().into(),
            ..Default::default()
        };
        let mut a = rec("dA", 1, 1, 10, "succeeded");
        a.event_id = "order-2000".into();
        a.tenant = "A".into();
        let mut b = rec("dB", 1, 1, 10, "succeeded");
        b.event_id = "order-2000".into();
        b.tenant = "B".into();
        let f = fold(Batch { attempts: vec![a, b], dead_letters: vec![], events: vec![(ev("A", "1111"), 10), (ev("B", "4242"), 10)] }, 0);
        assert_eq!(f.events.len(), 2, "one row per (tenant, id, time)");
        let tenants: Vec<(&str, &[u8])> = f.events.iter().map(|e| (e.tenant.as_str(), e.payload.as_slice())).collect();
        assert_eq!(tenants.iter().map(|t| t.0).collect::<Vec<_>>(), ["A", "B"]);
        let of = |id: &str| f.deliveries.iter().find(|d| d.delivery_id == id).unwrap().tenant.clone();
        assert_eq!((of("dA"), of("dB")), ("A".to_owned(), "B".to_owned()));
        // A record of no tenant is not given one by an event that shares its id.
        let mut legacy = rec("dL", 1, 1, 10, "");
        legacy.event_id = "order-2000".into();
        legacy.tenant = String::new();
        let f = fold(Batch { attempts: vec![legacy], dead_letters: vec![], events: vec![(ev("B", "4242"), 10)] }, 0);
        assert_eq!(f.deliveries[0].tenant, "");
    }

    #[test]
    fn an_older_record_read_late_does_not_roll_the_state_back() {
        let mut d = DeliveryRow { last_at_ms: 50, state: DeliveryState::Dead, attempts_made: 5, ..Default::default() };
        merge(
            &mut d,
            DeliveryRow { last_at_ms: 10, state: DeliveryState::Pending, attempts_made: 1, first_at_ms: 10, ..Default::default() },
        );
        assert_eq!((d.state, d.attempts_made, d.first_at_ms), (DeliveryState::Dead, 5, 0));
    }
}
