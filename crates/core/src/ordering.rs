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
            Ok(OrderingMode::Key) if ordering_key.is_empty() => {
                Err(err("ordering_key", "required with \"ordering\": \"key\": the event field that keys the order, e.g. \"entity_id\"".into()))
            }
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

#[derive(Debug)]
struct Head {
    run: RunId,
    /// Out now from this process (not on the ladder).
    sending: bool,
}

/// One key's gate: its head and the deliveries waiting behind it, oldest first. Nothing is let out until
/// [`KeyGate::sync`] gave it the head that the durable state names.
#[derive(Debug)]
pub struct KeyGate<J> {
    synced: bool,
    head: Option<Head>,
    queue: VecDeque<(RunId, J)>,
}

impl<J> Default for KeyGate<J> {
    fn default() -> Self {
        Self { synced: false, head: None, queue: VecDeque::new() }
    }
}

impl<J> KeyGate<J> {
    /// The head the durable state names (or none): from now on the gate decides.
    pub fn sync(&mut self, head: Option<RunId>) -> Option<(RunId, J, Start)> {
        if !self.synced {
            self.synced = true;
            self.head = head.map(|run| Head { run, sending: false });
        }
        self.next()
    }

    pub fn is_synced(&self) -> bool {
        self.synced
    }

    /// A delivery of the key arrived: let out now (the head's retry, or an open key), or queued behind.
    pub fn arrive(&mut self, run: RunId, job: J) -> Option<(RunId, J, Start)> {
        self.queue.push_back((run, job));
        self.next()
    }

    /// The delivery let out last has left the dispatcher; what goes next.
    pub fn left(&mut self, start: Start, exit: Exit) -> Option<(RunId, J, Start)> {
        if head_stays(start, exit) {
            if let Some(h) = &mut self.head {
                h.sending = false;
            }
        } else {
            self.head = None;
        }
        self.next()
    }

    /// What may go out now.
    fn next(&mut self) -> Option<(RunId, J, Start)> {
        if !self.synced {
            return None;
        }
        match &mut self.head {
            Some(h) if h.sending => None,
            // Blocked until the head comes back (a redo of it or its retry); everything else waits.
            Some(h) => {
                let i = self.queue.iter().position(|(r, _)| *r == h.run)?;
                let (run, job) = self.queue.remove(i)?;
                h.sending = true;
                Some((run, job, Start::Resume))
            }
            None => {
                let (run, job) = self.queue.pop_front()?;
                self.head = Some(Head { run: run.clone(), sending: true });
                Some((run, job, Start::Fresh))
            }
        }
    }

    /// Nothing out and nothing waiting: the gate can be dropped.
    pub fn is_idle(&self) -> bool {
        self.synced && self.head.is_none() && self.queue.is_empty()
    }

    /// Deliveries waiting behind the head.
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

    #[test]
    fn nothing_goes_before_the_gate_knows_the_durable_head() {
        let mut g = KeyGate::default();
        assert!(g.arrive(run("a2"), 2).is_none());
        assert!(g.arrive(run("a1"), 1).is_none());
        // An earlier owner left a1 as the head: its redo goes first, a2 waits behind it.
        let (r, j, s) = g.sync(Some(run("a1"))).unwrap();
        assert_eq!((r, j, s), (run("a1"), 1, Start::Resume));
        assert!(g.left(Start::Resume, Exit::Redo).is_none(), "a1's retry is still on the ladder");
        assert_eq!(g.arrive(run("a1"), 10).map(|x| x.1), Some(10), "its retry goes at once");
        assert_eq!(g.left(Start::Resume, Exit::Final).map(|x| (x.1, x.2)), Some((2, Start::Fresh)));
    }

    #[test]
    fn one_out_per_key_in_arrival_order_and_the_heads_retry_passes_the_queue() {
        let mut g = KeyGate::default();
        assert!(g.sync(None).is_none());
        assert_eq!(g.arrive(run("a1"), 1).map(|x| x.2), Some(Start::Fresh));
        for (id, j) in [("a2", 2), ("a3", 3)] {
            assert!(g.arrive(run(id), j).is_none(), "{id} waits behind the head");
        }
        assert!(g.left(Start::Fresh, Exit::Ladder).is_none(), "a retry keeps the key blocked");
        assert_eq!(g.waiting(), 2);
        assert_eq!(g.arrive(run("a1"), 11).map(|x| (x.1, x.2)), Some((11, Start::Resume)));
        // A replay of a1 is a new run: it queues at the back.
        assert!(g.arrive(RunId { delivery_id: "a1".into(), run_id: "replay".into() }, 12).is_none());
        assert_eq!(g.left(Start::Resume, Exit::Final).map(|x| x.1), Some(2));
        assert_eq!(g.left(Start::Fresh, Exit::Held).map(|x| x.1), Some(3), "a held head lets the next go (to held too)");
        assert_eq!(g.left(Start::Fresh, Exit::Final).map(|x| x.1), Some(12));
        assert!(!g.is_idle());
        assert!(g.left(Start::Fresh, Exit::Final).is_none());
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
