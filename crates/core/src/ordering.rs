//! Ordered delivery, opt-in per subscription (`ordering = "key" | "strict"`): the key of an event and the gate that
//! lets one delivery per key out at a time. Pure: the dispatcher holds the gates and writes what they decide.
//!
//! A key's *head* is the one delivery of the key that is out: being sent, or waiting on the retry ladder. Every
//! later delivery of the key waits behind it, in arrival order, until the head concludes (delivered, dead-lettered,
//! cancelled, skipped or held); then the first waiting one becomes the head. The head's own retry, coming back
//! from the ladder, goes out at once.

use std::collections::VecDeque;

use crate::model::{Event, OrderingMode};
use crate::payload_filter::{self, Data, EventFields, Found};

/// Longer key values are replaced by their SHA-256 (hex), so the state per key stays small.
pub const MAX_KEY_BYTES: usize = 128;

/// How a subscription orders its deliveries (none: not ordered, every delivery concurrent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ordering {
    /// One at a time for the whole subscription, first in first out.
    Strict,
    /// One at a time per value of the event field at `path` (a filter path: `entity_id`, `data.customer.id`).
    Key { path: String, segments: Vec<String> },
}

/// A field of the subscription that does not describe an ordering.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct OrderingError {
    pub field: &'static str,
    pub message: String,
}

impl Ordering {
    /// The ordering a subscription's fields ask for; `ordering_key` is required with `key` and refused otherwise.
    pub fn from_fields(mode: i32, ordering_key: &str) -> Result<Option<Ordering>, OrderingError> {
        let err = |field, message: String| OrderingError { field, message };
        match OrderingMode::try_from(mode) {
            Ok(OrderingMode::None) | Ok(OrderingMode::Strict) if !ordering_key.is_empty() => {
                Err(err("ordering_key", "only with \"ordering\": \"key\"".into()))
            }
            Ok(OrderingMode::None) => Ok(None),
            Ok(OrderingMode::Strict) => Ok(Some(Ordering::Strict)),
            Ok(OrderingMode::Key) if ordering_key.is_empty() => Err(err(
                "ordering_key",
                "required with \"ordering\": \"key\": the event field that keys the order, e.g. \"entity_id\"".into(),
            )),
            Ok(OrderingMode::Key) => payload_filter::parse_path(ordering_key)
                .map(|segments| Some(Ordering::Key { path: ordering_key.to_owned(), segments }))
                .map_err(|e| err("ordering_key", e)),
            Err(_) => Err(err("ordering", format!("unknown ordering mode {mode}"))),
        }
    }

    /// The key of an event: the field's value as text (a JSON value other than a string as its JSON text); `""`
    /// for `strict`, and for an event without the field (such events are ordered among themselves).
    pub fn key_of(&self, ev: Option<&Event>) -> String {
        let (Ordering::Key { segments, .. }, Some(ev)) = (self, ev) else { return String::new() };
        let data = if segments.first().is_some_and(|s| s == "data") { Data::parse(&ev.data_json) } else { Data::Absent };
        let key = match payload_filter::resolve(&EventFields::of(ev, &data), segments) {
            None => String::new(),
            Some(Found::Str(s)) => s.to_owned(),
            Some(Found::Json(serde_json::Value::String(s))) => s.clone(),
            Some(Found::Json(v)) => v.to_string(),
        };
        if key.len() > MAX_KEY_BYTES {
            return format!("sha256:{}", crate::model::sha256_hex(key.as_bytes()));
        }
        key
    }

    /// The API's word for it.
    pub fn word(mode: i32) -> &'static str {
        match OrderingMode::try_from(mode) {
            Ok(OrderingMode::Key) => "key",
            Ok(OrderingMode::Strict) => "strict",
            _ => "none",
        }
    }

    /// The mode for the API's word.
    pub fn mode(word: &str) -> Option<OrderingMode> {
        match word {
            "none" => Some(OrderingMode::None),
            "key" => Some(OrderingMode::Key),
            "strict" => Some(OrderingMode::Strict),
            _ => None,
        }
    }
}

/// One run of one delivery (a replay is a new run of the same delivery id, and queues as a new delivery).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunId {
    pub delivery_id: String,
    pub run_id: String,
}

/// How a delivery that the gate let out is to be started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// It becomes the key's head: the head must be written durably before it is sent.
    Fresh,
    /// It is the key's head already (its retry came back, or an earlier owner made it the head).
    Resume,
}

/// How a delivery left the dispatcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Concluded: delivered, dead-lettered, cancelled or skipped.
    Final,
    /// Put on the retry ladder (a retry, a spill, a breaker's wait, an early replay): it comes back.
    Ladder,
    /// Parked on `held` (its subscription is inactive): it comes back as a new arrival, in order with the others.
    Held,
    /// Its attempt's outcome was already written (a redo after a crash or a move): nothing was sent.
    Redo,
}

/// Whether the key stays blocked by the head after it left.
pub fn head_stays(start: Start, exit: Exit) -> bool {
    match exit {
        Exit::Ladder => true,
        Exit::Final | Exit::Held => false,
        // A redo of the head an earlier owner left (its retry is on the ladder); a fresh redo concluded before,
        // or the key would still name it.
        Exit::Redo => start == Start::Resume,
    }
}

/// A key's durable state, as the endpoint state holds it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Durable {
    pub head: Option<RunId>,
    /// Where the key's parked deliveries begin on the subscription's `ordered` partition.
    pub parked_from: Option<i64>,
}

/// What the gate asks its owner to do, in order.
#[derive(Debug, PartialEq, Eq)]
pub enum Step<J> {
    /// Send it as the key's head (a [`Start::Fresh`] head is written to the durable state first).
    Send(RunId, J, Start),
    /// Write it to `ordered`, then report the offset ([`KeyGate::parked_at`]); then it is done.
    Park(J),
    /// Read `ordered` from [`KeyGate::parked_from`] (known once the parks before this step are done) for the key's
    /// first parked delivery and put it back on `deliveries`, marked with its offset; report
    /// [`KeyGate::released_none`] if there is none.
    Release,
    /// A delivery released from `ordered`: it becomes the head; write the head with `parked_from`, then send it.
    Adopt(RunId, J, i64),
    /// A copy of a released delivery that is not the one due (a release repeated after a crash): done, not sent.
    Skip(J),
}

#[derive(Debug)]
struct Head {
    run: RunId,
    /// Out now from this process (not on the ladder).
    sending: bool,
}

/// One key's gate: its head, the deliveries waiting in memory behind a head that is being sent, and whether
/// deliveries are parked on `ordered` (while the head waits on the ladder, and until every one parked is released).
/// Nothing is decided until [`KeyGate::sync`] gave it the durable state.
#[derive(Debug)]
pub struct KeyGate<J> {
    synced: bool,
    head: Option<Head>,
    /// In memory, oldest first; only while nothing of the key is parked (parked ones are older than any of these).
    queue: VecDeque<(RunId, J)>,
    /// Deliveries are parked (or being parked); `parked_from` once the first one's offset is known.
    parked: bool,
    parked_from: Option<i64>,
    /// A release is reading or its delivery is on its way back: no fresh head until it arrives.
    releasing: bool,
    /// Arrivals before the sync, decided by it.
    unsynced: Vec<(RunId, J, Option<i64>)>,
}

impl<J> Default for KeyGate<J> {
    fn default() -> Self {
        Self { synced: false, head: None, queue: VecDeque::new(), parked: false, parked_from: None, releasing: false, unsynced: Vec::new() }
    }
}

impl<J> KeyGate<J> {
    /// The durable state (as a partition's owner synced it): from now on the gate decides, starting with what
    /// arrived before, in arrival order.
    pub fn sync(&mut self, durable: Durable) -> Vec<Step<J>> {
        if self.synced {
            return Vec::new();
        }
        self.synced = true;
        self.head = durable.head.map(|run| Head { run, sending: false });
        self.parked = durable.parked_from.is_some();
        self.parked_from = durable.parked_from;
        let mut steps = Vec::new();
        for (run, job, released_from) in std::mem::take(&mut self.unsynced) {
            steps.extend(self.decide(run, job, released_from));
        }
        steps.extend(self.next());
        steps
    }

    pub fn is_synced(&self) -> bool {
        self.synced
    }

    /// A delivery of the key arrived (`released_from`: it was put back from `ordered`, parked at that offset).
    pub fn arrive(&mut self, run: RunId, job: J, released_from: Option<i64>) -> Vec<Step<J>> {
        if !self.synced {
            self.unsynced.push((run, job, released_from));
            return Vec::new();
        }
        let mut steps = self.decide(run, job, released_from);
        steps.extend(self.next());
        steps
    }

    fn decide(&mut self, run: RunId, job: J, released_from: Option<i64>) -> Vec<Step<J>> {
        if let Some(at) = released_from {
            let due = self.head.is_none() && self.parked_from.is_some_and(|from| from <= at);
            if !due {
                return vec![Step::Skip(job)];
            }
            let from = at.saturating_add(1);
            self.parked_from = Some(from);
            self.releasing = false;
            self.head = Some(Head { run: run.clone(), sending: true });
            return vec![Step::Adopt(run, job, from)];
        }
        match &mut self.head {
            // The head's retry (or a redo of it) goes out at once.
            Some(h) if !h.sending && h.run == run => {
                h.sending = true;
                return vec![Step::Send(run, job, Start::Resume)];
            }
            _ => {}
        }
        if self.parked {
            return vec![Step::Park(job)];
        }
        match &self.head {
            Some(h) if h.sending => {
                self.queue.push_back((run, job));
                Vec::new()
            }
            // The head waits on the ladder: park behind it rather than hold the record (and the partition's commit).
            Some(_) => {
                self.parked = true;
                vec![Step::Park(job)]
            }
            None => {
                self.queue.push_back((run, job));
                Vec::new()
            }
        }
    }

    /// The first parked delivery's offset was acknowledged: `true` if it starts the parked range (write it).
    pub fn parked_at(&mut self, offset: i64) -> bool {
        if self.parked_from.is_none() {
            self.parked_from = Some(offset);
            return true;
        }
        false
    }

    /// Where the key's parked deliveries begin, once known.
    pub fn parked_from(&self) -> Option<i64> {
        self.parked_from
    }

    /// The delivery let out last has left the dispatcher; what follows.
    pub fn left(&mut self, start: Start, exit: Exit) -> Vec<Step<J>> {
        let mut steps = Vec::new();
        if head_stays(start, exit) {
            if let Some(h) = &mut self.head {
                h.sending = false;
            }
            // Off to the ladder: what waits in memory is parked, in order.
            if !self.queue.is_empty() {
                self.parked = true;
                steps.extend(std::mem::take(&mut self.queue).into_iter().map(|(_, j)| Step::Park(j)));
            }
        } else {
            self.head = None;
        }
        steps.extend(self.next());
        steps
    }

    /// A release found nothing of the key parked from `parked_from` on: the key is open again.
    pub fn released_none(&mut self) -> Vec<Step<J>> {
        self.parked = false;
        self.parked_from = None;
        self.releasing = false;
        self.next().into_iter().collect()
    }

    /// What may go out now.
    fn next(&mut self) -> Option<Step<J>> {
        if !self.synced || self.head.is_some() || self.releasing {
            return None;
        }
        if self.parked {
            self.releasing = true;
            return Some(Step::Release);
        }
        let (run, job) = self.queue.pop_front()?;
        self.head = Some(Head { run: run.clone(), sending: true });
        Some(Step::Send(run, job, Start::Fresh))
    }

    /// Nothing out, parked or waiting: the gate can be dropped.
    pub fn is_idle(&self) -> bool {
        self.synced && self.head.is_none() && self.queue.is_empty() && !self.parked && !self.releasing && self.unsynced.is_empty()
    }

    /// Deliveries waiting in memory behind the head.
    pub fn waiting(&self) -> usize {
        self.queue.len()
    }

    /// The head, if one is out.
    pub fn head(&self) -> Option<&RunId> {
        self.head.as_ref().map(|h| &h.run)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(id: &str) -> RunId {
        RunId { delivery_id: id.into(), run_id: "r".into() }
    }

    fn ev(entity: &str, data: &str) -> Event {
        Event { id: "e".into(), entity_id: entity.into(), data_json: data.as_bytes().to_vec().into(), ..Default::default() }
    }

    #[test]
    fn fields_are_checked_and_name_the_field_at_fault() {
        assert_eq!(Ordering::from_fields(0, ""), Ok(None));
        assert_eq!(Ordering::from_fields(2, ""), Ok(Some(Ordering::Strict)));
        assert_eq!(Ordering::from_fields(1, "").unwrap_err().field, "ordering_key");
        assert_eq!(Ordering::from_fields(0, "entity_id").unwrap_err().field, "ordering_key");
        assert_eq!(Ordering::from_fields(2, "entity_id").unwrap_err().field, "ordering_key");
        assert_eq!(Ordering::from_fields(1, "amount").unwrap_err().field, "ordering_key", "not a filter path");
        assert_eq!(Ordering::from_fields(9, "").unwrap_err().field, "ordering");
        assert!(matches!(Ordering::from_fields(1, "data.customer.id"), Ok(Some(Ordering::Key { .. }))));
    }

    #[test]
    fn the_key_is_the_fields_value_and_empty_without_it() {
        let by_entity = Ordering::from_fields(1, "entity_id").unwrap().unwrap();
        assert_eq!(by_entity.key_of(Some(&ev("ord_1", ""))), "ord_1");
        assert_eq!(by_entity.key_of(Some(&ev("", ""))), "");
        let by_data = Ordering::from_fields(1, "data.customer.id").unwrap().unwrap();
        assert_eq!(by_data.key_of(Some(&ev("", r#"{"customer":{"id":"c-7"}}"#))), "c-7");
        assert_eq!(by_data.key_of(Some(&ev("", r#"{"customer":{"id":42}}"#))), "42");
        assert_eq!(by_data.key_of(Some(&ev("", "not json"))), "");
        assert_eq!(by_data.key_of(None), "");
        let long = "x".repeat(500);
        let k = by_data.key_of(Some(&ev("", &format!(r#"{{"customer":{{"id":"{long}"}}}}"#))));
        assert!(k.starts_with("sha256:") && k.len() <= MAX_KEY_BYTES, "{k}");
        assert_eq!(Ordering::Strict.key_of(Some(&ev("ord_1", ""))), "");
    }

    fn sends(steps: Vec<Step<i32>>) -> Vec<(i32, Start)> {
        steps
            .into_iter()
            .map(|s| match s {
                Step::Send(_, j, st) => (j, st),
                other => panic!("not a send: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn nothing_goes_before_the_gate_knows_the_durable_head() {
        let mut g = KeyGate::default();
        assert!(g.arrive(run("a2"), 2, None).is_empty());
        assert!(g.arrive(run("a1"), 1, None).is_empty());
        // An earlier owner left a1 as the head, on the ladder: its redo goes at once; a2 parks behind it.
        let steps = g.sync(Durable { head: Some(run("a1")), parked_from: None });
        assert_eq!(steps, vec![Step::Park(2), Step::Send(run("a1"), 1, Start::Resume)]);
        assert!(g.parked_at(40));
        assert!(g.left(Start::Resume, Exit::Redo).is_empty(), "a1's retry is still on the ladder");
        assert_eq!(sends(g.arrive(run("a1"), 10, None)), [(10, Start::Resume)], "its retry goes at once");
        assert_eq!(g.arrive(run("a3"), 3, None), vec![Step::Park(3)], "parked behind a2");
        assert!(!g.parked_at(41), "the range began at a2");
        assert_eq!(g.left(Start::Resume, Exit::Final), vec![Step::Release]);
        assert_eq!(g.parked_from(), Some(40));
        // a2 comes back from `ordered` (offset 40) and becomes the head; a copy of it from a repeated release is not.
        assert_eq!(g.arrive(run("a2"), 20, Some(40)), vec![Step::Adopt(run("a2"), 20, 41)]);
        assert_eq!(g.arrive(run("a2"), 21, Some(40)), vec![Step::Skip(21)]);
        assert_eq!(g.left(Start::Resume, Exit::Final), vec![Step::Release]);
        assert_eq!(g.arrive(run("a3"), 30, Some(41)), vec![Step::Adopt(run("a3"), 30, 42)]);
        assert_eq!(g.left(Start::Resume, Exit::Final), vec![Step::Release]);
        assert!(!g.is_idle());
        assert!(g.released_none().is_empty());
        assert!(g.is_idle());
    }

    #[test]
    fn one_out_per_key_in_arrival_order_and_the_heads_retry_passes_the_queue() {
        let mut g = KeyGate::default();
        assert!(g.sync(Durable::default()).is_empty());
        assert_eq!(sends(g.arrive(run("a1"), 1, None)), [(1, Start::Fresh)]);
        for (id, j) in [("a2", 2), ("a3", 3)] {
            assert!(g.arrive(run(id), j, None).is_empty(), "{id} waits in memory behind the head being sent");
        }
        assert_eq!(g.waiting(), 2);
        // A retry keeps the key blocked, and what waited is parked.
        assert_eq!(g.left(Start::Fresh, Exit::Ladder), vec![Step::Park(2), Step::Park(3)]);
        assert_eq!(g.waiting(), 0);
        assert!(g.parked_at(7));
        assert_eq!(sends(g.arrive(run("a1"), 11, None)), [(11, Start::Resume)]);
        // A replay of a1 is a new run: it queues at the back.
        let replay = RunId { delivery_id: "a1".into(), run_id: "replay".into() };
        assert_eq!(g.arrive(replay.clone(), 12, None), vec![Step::Park(12)]);
        assert_eq!(g.left(Start::Resume, Exit::Final), vec![Step::Release]);
        assert!(g.arrive(run("a4"), 4, None) == vec![Step::Park(4)], "no fresh head while a release is on its way");
        assert_eq!(g.arrive(run("a2"), 2, Some(7)), vec![Step::Adopt(run("a2"), 2, 8)]);
    }

    #[test]
    fn in_memory_waits_go_in_order_while_the_head_concludes_at_once() {
        let mut g = KeyGate::default();
        g.sync(Durable::default());
        assert_eq!(sends(g.arrive(run("a1"), 1, None)), [(1, Start::Fresh)]);
        assert!(g.arrive(run("a2"), 2, None).is_empty());
        assert!(g.arrive(run("a3"), 3, None).is_empty());
        assert_eq!(sends(g.left(Start::Fresh, Exit::Final)), [(2, Start::Fresh)]);
        assert_eq!(sends(g.left(Start::Fresh, Exit::Held)), [(3, Start::Fresh)], "a held head lets the next go (to held too)");
        assert!(g.left(Start::Fresh, Exit::Final).is_empty());
        assert!(g.is_idle());
    }

    #[test]
    fn a_fresh_redo_concludes_a_resumed_one_does_not() {
        assert!(!head_stays(Start::Fresh, Exit::Redo));
        assert!(head_stays(Start::Resume, Exit::Redo));
        assert!(head_stays(Start::Fresh, Exit::Ladder));
        assert!(!head_stays(Start::Resume, Exit::Final));
    }
}
