//! What was accepted and what became of it: accepted events (from the publisher), attempt records and dead
//! letters (read back from their topics), and the receiver's requests. `missing` is kept incrementally (an
//! accepted delivery with no final attempt record yet), so waiting on it costs nothing per record.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hookline_core::model::AttemptRecord;
use hookline_kafka::Topics;
use hookline_service::Config;
use prost::Message;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::endpoints_for;
use super::receiver::{Endpoint, Recorded};

/// (event id, subscription id).
type Pair = (String, String);

#[derive(Default)]
struct State {
    accepted: Vec<(String, u64)>,
    accepted_ids: HashSet<String>,
    /// Accepted deliveries without a final attempt record yet.
    pending: HashSet<Pair>,
    finals: HashMap<Pair, Vec<String>>,
    dead_letters: HashSet<Pair>,
}

pub struct Ledger {
    endpoint_of: HashMap<String, Endpoint>,
    sub_of: HashMap<Endpoint, String>,
    state: Mutex<State>,
    recorded: Arc<Recorded>,
    pub accepted_events: AtomicU64,
    pub attempt_records: AtomicU64,
    changed: Notify,
}

pub struct Tally {
    /// Accepted deliveries: (event, subscription) pairs the accepted events fan out to.
    pub expected: usize,
    pub final_states: usize,
    pub missing: usize,
    /// Deliveries whose final records never name the state their endpoint implies.
    pub unexpected_final: usize,
    /// Receiver requests beyond the first per (event, endpoint, attempt number).
    pub duplicates: u64,
    pub duplicate_finals: usize,
    pub requests: u64,
    pub dead_letters: usize,
    /// `failed` or `dead` deliveries with no dead letter.
    pub missing_dead_letters: usize,
    pub examples_missing: Vec<String>,
    /// The most requests any one (event, endpoint, attempt) received.
    pub max_copies: u32,
    /// Duplicates per "endpoint/attempt": where the redone work was.
    pub duplicates_by_attempt: std::collections::BTreeMap<String, u64>,
}

impl Ledger {
    pub async fn start(
        config: &Config,
        topics: &Topics,
        endpoint_of: HashMap<String, Endpoint>,
        recorded: Arc<Recorded>,
        stop: CancellationToken,
    ) -> anyhow::Result<Arc<Ledger>> {
        let sub_of = endpoint_of.iter().map(|(id, e)| (*e, id.clone())).collect();
        let ledger = Arc::new(Ledger {
            endpoint_of,
            sub_of,
            state: Mutex::default(),
            recorded,
            accepted_events: AtomicU64::new(0),
            attempt_records: AtomicU64::new(0),
            changed: Notify::new(),
        });
        let l = ledger.clone();
        hookline_kafka::table::spawn(
            &config.kafka,
            topics.attempts(),
            "soak-attempts",
            move |_, _, v| {
                let Some(a) = v.and_then(|v| AttemptRecord::decode(v).ok()) else { return };
                l.attempt_records.fetch_add(1, Ordering::Relaxed);
                if !a.final_state.is_empty() {
                    let mut s = l.state.lock().unwrap();
                    let key = (a.event_id, a.subscription_id);
                    s.pending.remove(&key);
                    s.finals.entry(key).or_default().push(a.final_state);
                    drop(s);
                    l.changed.notify_waiters();
                }
            },
            stop.clone(),
        )
        .await?;
        let l = ledger.clone();
        hookline_kafka::table::spawn(
            &config.kafka,
            topics.dlq(),
            "soak-dlq",
            move |_, _, v| {
                let Some(d) = v.and_then(|v| hookline_core::dead_letter::decode(v, None).ok()) else { return };
                let Some(event) = d.event else { return };
                l.state.lock().unwrap().dead_letters.insert((event.id, d.subscription_id));
            },
            stop,
        )
        .await?;
        Ok(ledger)
    }

    fn pairs(&self, event_id: &str, index: u64) -> impl Iterator<Item = (Pair, Endpoint)> + '_ {
        let id = event_id.to_owned();
        endpoints_for(index % 50).into_iter().map(move |e| ((id.clone(), self.sub_of[&e].clone()), e))
    }

    /// The API answered 202 to event `index`.
    pub fn accept(&self, event_id: &str, index: u64) {
        let pairs: Vec<Pair> = self.pairs(event_id, index).map(|(p, _)| p).collect();
        let mut s = self.state.lock().unwrap();
        if !s.accepted_ids.insert(event_id.to_owned()) {
            return;
        }
        s.accepted.push((event_id.to_owned(), index));
        for p in pairs {
            if !s.finals.contains_key(&p) {
                s.pending.insert(p);
            }
        }
        drop(s);
        self.accepted_events.fetch_add(1, Ordering::Relaxed);
    }

    /// Accepted deliveries without a final state, per endpoint (for progress lines).
    pub fn pending_by_endpoint(&self) -> String {
        let s = self.state.lock().unwrap();
        let mut by: std::collections::BTreeMap<&str, usize> = Default::default();
        for (_, sub) in &s.pending {
            *by.entry(self.endpoint_of[sub].path()).or_default() += 1;
        }
        by.iter().map(|(k, v)| format!("{k}:{v}")).collect::<Vec<_>>().join(" ")
    }

    pub fn missing(&self) -> usize {
        self.state.lock().unwrap().pending.len()
    }

    /// Until the next final record, or `limit`.
    pub async fn wait_change(&self, limit: Duration) {
        let _ = tokio::time::timeout(limit, self.changed.notified()).await;
    }

    /// The requests the receiver has seen so far.
    pub fn requests(&self) -> u64 {
        self.recorded.requests()
    }

    /// Until the receiver has seen `n` requests, or `limit`.
    pub async fn wait_requests(&self, n: u64, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            let changed = self.recorded.changed.notified();
            tokio::pin!(changed);
            // Registered before the check, so a request between the check and the wait is not missed.
            changed.as_mut().enable();
            if self.recorded.requests() >= n {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, changed).await.is_err() {
                return self.recorded.requests() >= n;
            }
        }
    }

    /// Until the receiver has had no request for `quiet`, or `limit` has passed.
    pub async fn wait_quiet(&self, quiet: Duration, limit: Duration) {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if tokio::time::timeout(quiet, self.recorded.changed.notified()).await.is_err() {
                return;
            }
        }
    }

    /// Every accepted delivery with a final record: (delivery id, the final states its records name).
    pub fn finished_deliveries(&self) -> Vec<(String, Vec<String>)> {
        let s = self.state.lock().unwrap();
        let mut out = Vec::new();
        for (id, index) in &s.accepted {
            for (pair, _) in self.pairs(id, *index) {
                if let Some(finals) = s.finals.get(&pair) {
                    out.push((hookline_core::model::delivery_id(&pair.0, &pair.1), finals.clone()));
                }
            }
        }
        out
    }

    pub fn tally(&self) -> Tally {
        let s = self.state.lock().unwrap();
        let mut t = Tally {
            expected: 0,
            final_states: 0,
            missing: s.pending.len(),
            unexpected_final: 0,
            duplicates: 0,
            duplicate_finals: 0,
            requests: self.recorded.requests(),
            dead_letters: s.dead_letters.len(),
            missing_dead_letters: 0,
            duplicates_by_attempt: Default::default(),
            max_copies: 0,
            examples_missing: s.pending.iter().take(5).map(|(e, sub)| format!("{e} -> {}", self.endpoint_of[sub].path())).collect(),
        };
        for (id, index) in &s.accepted {
            for (pair, endpoint) in self.pairs(id, *index) {
                t.expected += 1;
                let Some(finals) = s.finals.get(&pair) else { continue };
                t.final_states += 1;
                t.duplicate_finals += finals.len() - 1;
                if !finals.iter().any(|f| f == endpoint.expected_final()) {
                    t.unexpected_final += 1;
                }
                if endpoint.expected_final() != "succeeded" && !s.dead_letters.contains(&pair) {
                    t.missing_dead_letters += 1;
                }
            }
        }
        drop(s);
        for ((_, path, attempt), n) in self.recorded.per_attempt.lock().unwrap().iter() {
            t.max_copies = t.max_copies.max(*n);
            if *n > 1 {
                t.duplicates += u64::from(*n) - 1;
                *t.duplicates_by_attempt.entry(format!("{path}/{attempt}")).or_default() += u64::from(*n) - 1;
            }
        }
        t
    }
}
