//! The delivery log: every attempt of every delivery, rebuilt from the `attempts` topic at start and followed
//! afterwards (so it survives restarts of the API process), plus the event of every dead-lettered delivery from
//! the `dlq` topic (what a replay sends again). Bounded by a retention time and a maximum number of deliveries;
//! the oldest go first.

use std::collections::{BTreeSet, HashMap};
use std::sync::RwLock;

use hookline_core::model::{AttemptRecord, DeadLetter, Event};

/// Attempts kept per delivery; older ones are summarised by the count.
const MAX_ATTEMPTS_KEPT: usize = 100;

#[derive(Debug, Clone)]
pub struct DeliveryEntry {
    pub delivery_id: String,
    pub subscription_id: String,
    pub event_id: String,
    pub event_type: String,
    /// `pending`, `succeeded`, `failed`, `dead`, `cancelled`, `skipped`.
    pub state: String,
    /// The policy's own word for `state`.
    pub status_word: String,
    pub first_at_ms: i64,
    pub last_at_ms: i64,
    /// Highest attempt number seen: a replay continues counting from here.
    pub attempts_made: u32,
    pub attempts: Vec<AttemptRecord>,
    /// The event, known for dead-lettered deliveries.
    pub event: Option<Event>,
}

#[derive(Default)]
struct Inner {
    deliveries: HashMap<String, DeliveryEntry>,
    /// (first_at, delivery id) per subscription, for listing newest first.
    by_subscription: HashMap<String, BTreeSet<(i64, String)>>,
    /// (first_at, delivery id) of everything, for eviction.
    by_age: BTreeSet<(i64, String)>,
    /// Dead letters read before their delivery's first attempt record: the two topics are read independently.
    early_dead_letters: HashMap<String, DeadLetter>,
}

/// Early dead letters kept at most; beyond it the oldest waiting ones are dropped (their deliveries stay readable,
/// only not replayable one by one; a redrive still finds them).
const MAX_EARLY_DEAD_LETTERS: usize = 10_000;

pub struct DeliveryLog {
    inner: RwLock<Inner>,
    retention_ms: i64,
    max_deliveries: usize,
}

/// A page of a subscription's deliveries.
pub struct Page {
    pub items: Vec<DeliveryEntry>,
    /// Cursor for the next page, when there is one.
    pub next: Option<String>,
}

#[derive(Default)]
pub struct Filter<'a> {
    /// Matches the delivery state (`failed`, `dead`, ...).
    pub state: Option<&'a str>,
    pub since_ms: Option<i64>,
    pub until_ms: Option<i64>,
}

impl DeliveryLog {
    pub fn new(retention_ms: i64, max_deliveries: usize) -> Self {
        Self { inner: RwLock::new(Inner::default()), retention_ms, max_deliveries }
    }

    pub fn apply_attempt(&self, rec: AttemptRecord, now_ms: i64) {
        let mut guard = self.inner.write().expect("delivery log lock");
        let inner = &mut *guard;
        let at = rec.started_at_ms;
        let early = inner.early_dead_letters.remove(&rec.delivery_id);
        let entry = match inner.deliveries.get_mut(&rec.delivery_id) {
            Some(e) => e,
            None => {
                let key = (at, rec.delivery_id.clone());
                inner.by_subscription.entry(rec.subscription_id.clone()).or_default().insert(key.clone());
                inner.by_age.insert(key);
                inner.deliveries.entry(rec.delivery_id.clone()).or_insert_with(|| DeliveryEntry {
                    delivery_id: rec.delivery_id.clone(),
                    subscription_id: rec.subscription_id.clone(),
                    event_id: rec.event_id.clone(),
                    event_type: rec.event_type.clone(),
                    state: "pending".into(),
                    status_word: String::new(),
                    first_at_ms: at,
                    last_at_ms: at,
                    attempts_made: 0,
                    attempts: Vec::new(),
                    event: None,
                })
            }
        };
        if let Some(dl) = early {
            entry.event = dl.event;
            entry.attempts_made = entry.attempts_made.max(dl.attempts);
        }
        entry.last_at_ms = entry.last_at_ms.max(at);
        entry.attempts_made = entry.attempts_made.max(rec.attempt);
        entry.state = if rec.final_state.is_empty() { "pending".into() } else { rec.final_state.clone() };
        entry.status_word = rec.status_word.clone();
        if entry.attempts.len() >= MAX_ATTEMPTS_KEPT {
            entry.attempts.remove(0);
        }
        entry.attempts.push(rec);
        Self::evict(inner, now_ms - self.retention_ms, self.max_deliveries);
    }

    /// Remembers the event of a dead-lettered delivery, so it can be replayed.
    pub fn apply_dead_letter(&self, dl: DeadLetter) {
        if dl.delivery_id.is_empty() {
            return; // malformed input: no delivery
        }
        let mut inner = self.inner.write().expect("delivery log lock");
        match inner.deliveries.get_mut(&dl.delivery_id) {
            Some(e) => {
                e.event = dl.event;
                e.attempts_made = e.attempts_made.max(dl.attempts);
            }
            None => {
                if inner.early_dead_letters.len() >= MAX_EARLY_DEAD_LETTERS {
                    let oldest = inner.early_dead_letters.iter().min_by_key(|(_, d)| d.at_ms).map(|(k, _)| k.clone());
                    if let Some(k) = oldest {
                        inner.early_dead_letters.remove(&k);
                    }
                }
                inner.early_dead_letters.insert(dl.delivery_id.clone(), dl);
            }
        }
    }

    fn evict(inner: &mut Inner, older_than_ms: i64, max: usize) {
        while let Some((at, id)) = inner.by_age.first().cloned() {
            if at >= older_than_ms && inner.by_age.len() <= max {
                break;
            }
            inner.by_age.pop_first();
            if let Some(e) = inner.deliveries.remove(&id) {
                if let Some(set) = inner.by_subscription.get_mut(&e.subscription_id) {
                    set.remove(&(at, id));
                    if set.is_empty() {
                        inner.by_subscription.remove(&e.subscription_id);
                    }
                }
            }
        }
    }

    pub fn get(&self, delivery_id: &str) -> Option<DeliveryEntry> {
        self.inner.read().expect("delivery log lock").deliveries.get(delivery_id).cloned()
    }

    /// Newest first. `after` is the cursor from the previous page.
    pub fn list(&self, subscription_id: &str, filter: &Filter<'_>, limit: usize, after: Option<&str>) -> Page {
        let inner = self.inner.read().expect("delivery log lock");
        let Some(set) = inner.by_subscription.get(subscription_id) else {
            return Page { items: Vec::new(), next: None };
        };
        let cursor = after.and_then(parse_cursor);
        let mut items = Vec::new();
        let mut next = None;
        for (at, id) in set.iter().rev() {
            if let Some((c_at, c_id)) = &cursor {
                if (*at, id.as_str()) >= (*c_at, c_id.as_str()) {
                    continue;
                }
            }
            if filter.since_ms.is_some_and(|s| *at < s) {
                break; // newest first: everything after is older
            }
            if filter.until_ms.is_some_and(|u| *at > u) {
                continue;
            }
            let Some(e) = inner.deliveries.get(id) else { continue };
            if let Some(st) = filter.state {
                if e.state != st {
                    continue;
                }
            }
            if items.len() == limit {
                next = items.last().map(|l: &DeliveryEntry| format!("{}:{}", l.first_at_ms, l.delivery_id));
                break;
            }
            items.push(e.clone());
        }
        Page { items, next }
    }
}

impl DeliveryLog {
    /// Read-only: visits every kept attempt of a subscription's deliveries that started in `[since_ms, until_ms)`
    /// (for the per-minute statistics). A delivery starts before its attempts, so deliveries first seen at or after
    /// `until_ms` are skipped; older ones are visited because their retries may fall in the range.
    pub fn for_each_attempt(&self, subscription_id: &str, since_ms: i64, until_ms: i64, mut visit: impl FnMut(&AttemptRecord)) {
        let inner = self.inner.read().expect("delivery log lock");
        let Some(set) = inner.by_subscription.get(subscription_id) else { return };
        for (first_at, id) in set.iter() {
            if *first_at >= until_ms {
                break;
            }
            let Some(e) = inner.deliveries.get(id) else { continue };
            if e.last_at_ms < since_ms {
                continue;
            }
            for a in e.attempts.iter().filter(|a| a.started_at_ms >= since_ms && a.started_at_ms < until_ms) {
                visit(a);
            }
        }
    }
}

fn parse_cursor(c: &str) -> Option<(i64, String)> {
    let (at, id) = c.split_once(':')?;
    Some((at.parse().ok()?, id.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(delivery: &str, sub: &str, attempt: u32, at: i64, final_state: &str) -> AttemptRecord {
        AttemptRecord {
            delivery_id: delivery.into(),
            subscription_id: sub.into(),
            attempt,
            started_at_ms: at,
            final_state: final_state.into(),
            status_word: if final_state.is_empty() { "pending".into() } else { final_state.to_uppercase() },
            ..Default::default()
        }
    }

    #[test]
    fn attempts_accumulate_and_the_last_one_sets_the_state() {
        let log = DeliveryLog::new(1_000_000, 100);
        log.apply_attempt(rec("d1", "s", 1, 10, ""), 10);
        log.apply_attempt(rec("d1", "s", 2, 20, "dead"), 20);
        let e = log.get("d1").unwrap();
        assert_eq!((e.state.as_str(), e.attempts.len(), e.attempts_made, e.first_at_ms, e.last_at_ms), ("dead", 2, 2, 10, 20));
        log.apply_dead_letter(DeadLetter { delivery_id: "d1".into(), event: Some(Event { id: "evt".into(), ..Default::default() }), ..Default::default() });
        assert_eq!(log.get("d1").unwrap().event.unwrap().id, "evt");
    }

    #[test]
    fn a_dead_letter_read_before_its_attempts_is_kept_for_them() {
        let log = DeliveryLog::new(1_000_000, 100);
        log.apply_dead_letter(DeadLetter { delivery_id: "d9".into(), attempts: 4, event: Some(Event { id: "e9".into(), ..Default::default() }), ..Default::default() });
        log.apply_attempt(rec("d9", "s", 4, 10, "dead"), 10);
        let e = log.get("d9").unwrap();
        assert_eq!((e.event.unwrap().id.as_str(), e.attempts_made), ("e9", 4));
    }

    #[test]
    fn lists_newest_first_with_filters_and_cursor() {
        let log = DeliveryLog::new(1_000_000, 100);
        for i in 0..5 {
            log.apply_attempt(rec(&format!("d{i}"), "s", 1, i * 10, if i % 2 == 0 { "succeeded" } else { "failed" }), 100);
        }
        log.apply_attempt(rec("other", "t", 1, 5, "succeeded"), 100);
        let p = log.list("s", &Filter::default(), 2, None);
        assert_eq!(p.items.iter().map(|e| e.delivery_id.as_str()).collect::<Vec<_>>(), ["d4", "d3"]);
        let p2 = log.list("s", &Filter::default(), 2, p.next.as_deref());
        assert_eq!(p2.items.iter().map(|e| e.delivery_id.as_str()).collect::<Vec<_>>(), ["d2", "d1"]);
        let failed = log.list("s", &Filter { state: Some("failed"), ..Default::default() }, 10, None);
        assert_eq!(failed.items.len(), 2);
        let recent = log.list("s", &Filter { since_ms: Some(25), ..Default::default() }, 10, None);
        assert_eq!(recent.items.iter().map(|e| e.delivery_id.as_str()).collect::<Vec<_>>(), ["d4", "d3"]);
    }

    #[test]
    fn visits_the_attempts_of_one_subscription_in_a_time_range() {
        let log = DeliveryLog::new(1_000_000, 100);
        log.apply_attempt(rec("d1", "s", 1, 10, ""), 100);
        log.apply_attempt(rec("d1", "s", 2, 50, "succeeded"), 100);
        log.apply_attempt(rec("d2", "s", 1, 60, "failed"), 100);
        log.apply_attempt(rec("d3", "t", 1, 40, "failed"), 100);
        let mut seen = Vec::new();
        log.for_each_attempt("s", 40, 60, |a| seen.push((a.delivery_id.clone(), a.attempt)));
        assert_eq!(seen, [("d1".to_owned(), 2)], "d1's retry is in range, its first try and d2 are not");
        let mut all = 0;
        log.for_each_attempt("s", 0, 1_000, |_| all += 1);
        assert_eq!(all, 3);
    }

    #[test]
    fn retention_and_size_bound_evict_the_oldest() {
        let log = DeliveryLog::new(100, 3);
        for i in 0..5 {
            log.apply_attempt(rec(&format!("d{i}"), "s", 1, 1_000 + i, ""), 1_000 + i);
        }
        assert!(log.get("d0").is_none() && log.get("d1").is_none());
        assert!(log.get("d4").is_some());
        log.apply_attempt(rec("late", "s", 1, 2_000, ""), 2_000);
        assert!(log.get("d4").is_none(), "older than the retention");
        assert_eq!(log.list("s", &Filter::default(), 10, None).items.len(), 1);
    }
}
