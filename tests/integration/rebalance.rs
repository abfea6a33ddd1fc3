//! Incremental rebalancing (cooperative-sticky) with two dispatchers through the embedded broker: scaling out and
//! back in moves only the partitions that change owner, the member that keeps its partitions is never made to
//! revoke them, and under a steady stream of events every delivery reaches its endpoint exactly once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hookline_kafka::rebalance::RebalanceEvent;
use hookline_kafka::Topics;
use serde_json::json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::support::{wait_for, Pipeline};

const LIMIT: Duration = Duration::from_secs(60);
pub(crate) const PARTITIONS: i32 = 4;
const SUBSCRIPTIONS: usize = 8;
/// Events published once both rebalances are over.
const EVENTS_AFTER: usize = 20;

/// A dispatcher of the pipeline's group, run by the test, with what its rebalances told it.
struct Member {
    /// The pipeline's `deliveries` topic.
    topic: String,
    stop: CancellationToken,
    run: tokio::task::JoinHandle<()>,
    events: Arc<Mutex<Vec<RebalanceEvent>>>,
    changed: Arc<Notify>,
}

impl Member {
    fn start(p: &Pipeline, name: &str) -> Member {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let events = Arc::new(Mutex::new(Vec::new()));
        let changed = Arc::new(Notify::new());
        let (e, c) = (events.clone(), changed.clone());
        tokio::spawn(async move {
            while let Some(ev) = rx.recv().await {
                e.lock().unwrap().push(ev);
                c.notify_waiters();
            }
        });
        let stop = CancellationToken::new();
        let options = hookline_dispatcher::Options { instance: Some(name.into()), rebalances: Some(tx), ..Default::default() };
        let run = hookline_dispatcher::run(p.config.clone(), stop.clone(), options);
        let topic = Topics::new(p.config.kafka.topic_prefix.clone()).deliveries().to_owned();
        Member { topic, stop, run: tokio::spawn(async move { run.await.expect("dispatcher runs") }), events, changed }
    }

    /// The `deliveries` partitions it owns now, from the deltas it was given.
    fn owned(&self) -> BTreeSet<i32> {
        let topic = &self.topic;
        let mut owned = BTreeSet::new();
        for ev in self.events.lock().unwrap().iter() {
            match ev {
                RebalanceEvent::Assigned(ps) => owned.extend(ps.iter().filter(|(t, _)| t == topic).map(|(_, p)| *p)),
                RebalanceEvent::Revoked(ps) => ps.iter().filter(|(t, _)| t == topic).for_each(|(_, p)| {
                    owned.remove(p);
                }),
            }
        }
        owned
    }

    /// Every partition it was ever made to give up.
    fn revoked(&self) -> BTreeSet<i32> {
        let topic = &self.topic;
        let events = self.events.lock().unwrap();
        events
            .iter()
            .filter_map(|ev| match ev {
                RebalanceEvent::Revoked(ps) => Some(ps.iter().filter(|(t, _)| t == topic).map(|(_, p)| *p)),
                RebalanceEvent::Assigned(_) => None,
            })
            .flatten()
            .collect()
    }

    async fn wait(&self, what: &str, cond: impl Fn(&Member) -> bool) {
        wait_for(&self.changed, LIMIT, what, || cond(self)).await;
    }

    async fn stop(self) {
        self.stop.cancel();
        self.run.await.unwrap();
    }
}

/// Requests per (endpoint, event id).
fn deliveries(p: &Pipeline) -> BTreeMap<(String, String), usize> {
    let mut n = BTreeMap::new();
    for r in p.seen.requests.lock().unwrap().iter() {
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        *n.entry((r.path.clone(), body["id"].as_str().unwrap().to_owned())).or_default() += 1;
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_out_and_in_moves_only_the_partitions_that_change_owner_and_delivers_each_event_once() {
    let p = Pipeline::start_without_dispatcher(PARTITIONS, |c| {
        revoke_drain(c);
        // The mock broker waits the session timeout less 1 s for members to rejoin, in each of a cooperative
        // rebalance's two rounds.
        c.kafka.session_timeout_ms = 3_000;
    })
    .await;
    scaling_out_and_in_moves_only_the_partitions_that_change_owner_and_delivers_each_event_once_on(p).await;
}

/// Deliveries in flight on a partition that moves finish (and their outcomes are written) before the next owner
/// reads what was concluded; the mock broker refuses commits during a rebalance, and the redo check then
/// acknowledges that work without sending it again.
pub(crate) fn revoke_drain(c: &mut hookline_service::Config) {
    c.dispatcher.revoke_drain_ms = 5_000;
}

/// The body of the test above on a pipeline without a dispatcher, with [`PARTITIONS`] partitions (also run on
/// Apache Kafka: `apache_kafka.rs`).
pub(crate) async fn scaling_out_and_in_moves_only_the_partitions_that_change_owner_and_delivers_each_event_once_on(p: Pipeline) {
    for i in 0..SUBSCRIPTIONS {
        p.subscribe(json!({"url": p.url(&format!("s{i}")), "event_types": ["*"]})).await;
    }
    let all: BTreeSet<i32> = (0..PARTITIONS).collect();
    let a = Member::start(&p, "dispatcher-a");
    a.wait("a owns every partition", |m| m.owned() == all).await;

    // Events go on arriving through both rebalances, and a few more after.
    let scaled = CancellationToken::new();
    let published = async {
        let mut n = 0;
        let mut after = 0;
        while after < EVENTS_AFTER {
            p.publish(&format!("evt_{n}"), "order.created").await;
            n += 1;
            if scaled.is_cancelled() {
                after += 1;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        n
    };
    let scale = async {
        let seen = p.seen.clone();
        wait_for(&p.seen.changed, LIMIT, "deliveries under way", || seen.requests.lock().unwrap().len() >= 100).await;

        // Scale out: b joins and takes some partitions; a gives up exactly those and keeps delivering the rest.
        let b = Member::start(&p, "dispatcher-b");
        b.wait("b owns partitions", |m| !m.owned().is_empty()).await;
        a.wait("a and b split the partitions", |a| a.owned().len() + b.owned().len() == all.len()).await;
        let (owned_a, owned_b) = (a.owned(), b.owned());
        assert!(
            owned_a.is_disjoint(&owned_b) && owned_a.union(&owned_b).copied().collect::<BTreeSet<_>>() == all,
            "{owned_a:?} {owned_b:?}"
        );
        assert!(!owned_a.is_empty(), "a kept none: {owned_b:?}");
        assert_eq!(a.revoked(), owned_b, "a gave up only what b took (an eager rebalance revokes all of a's)");

        // Scale in: a leaves; b takes a's partitions without giving up its own.
        let before = seen.requests.lock().unwrap().len();
        wait_for(&p.seen.changed, LIMIT, "more deliveries", || seen.requests.lock().unwrap().len() >= before + 50).await;
        a.stop().await;
        b.wait("b owns every partition", |m| m.owned() == all).await;
        assert!(b.revoked().is_empty(), "b was made to give up {:?}", b.revoked());
        scaled.cancel();
        b
    };
    let (published, b) = tokio::join!(published, scale);

    let expected = SUBSCRIPTIONS * published;
    let seen = p.seen.clone();
    let distinct = || deliveries(&p).len();
    wait_for(&seen.changed, LIMIT, &format!("{expected} distinct deliveries"), || distinct() >= expected).await;
    let counts = deliveries(&p);
    assert_eq!(counts.len(), expected, "nothing lost");
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "{} deliveries sent more than once: {twice:?}", twice.len());
    b.stop().await;
    p.stop().await;
}

/// A dispatcher whose in-flight budget is spent (every delivery it took hangs at its endpoint) takes part in a
/// rebalance at once and stays a member: a joining member gets partitions within a few session timeouts and
/// delivers their backlog, while the saturated one keeps the rest. (On the mock broker this holds even for a member
/// that stops polling, which the mock drops from a join round after the session timeout, so it does not by itself
/// prove the pause-based backpressure; a real broker waits `max.poll.interval.ms` for such a member.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatcher_with_its_budget_spent_still_rebalances_promptly() {
    const BUDGET: usize = 8;
    let p = Pipeline::start_without_dispatcher(PARTITIONS, |c| {
        c.dispatcher.max_in_flight = BUDGET;
        c.dispatcher.revoke_drain_ms = 1_000;
        c.dispatcher.drain_timeout_ms = 1_000;
        c.kafka.session_timeout_ms = 3_000;
    })
    .await;
    // Every request hangs; the attempt timeout outlasts the test, so nothing frees the budget meanwhile.
    let mut policy = hookline_core::policy::builtin("standard").unwrap();
    policy.name = "hang-long".into();
    policy.attempt.timeout_ms = 120_000;
    let policy = toml::to_string(&policy).unwrap();
    for i in 0..SUBSCRIPTIONS {
        p.script(&format!("/h{i}"), vec![None]);
        p.subscribe(json!({"url": p.url(&format!("h{i}")), "event_types": [format!("t{i}")], "policy_toml": policy})).await;
    }
    let all: BTreeSet<i32> = (0..PARTITIONS).collect();
    let a = Member::start(&p, "dispatcher-a");
    a.wait("a owns every partition", |m| m.owned() == all).await;
    // Several events per subscription: a takes BUDGET of them, the rest wait on the broker.
    for n in 0..(SUBSCRIPTIONS * 4) {
        p.publish(&format!("evt_{n}"), &format!("t{}", n % SUBSCRIPTIONS)).await;
    }
    let seen = p.seen.clone();
    wait_for(&seen.changed, LIMIT, "a's budget in flight", || seen.requests.lock().unwrap().len() >= BUDGET).await;
    let sent_by_a = seen.requests.lock().unwrap().len();

    let joined = std::time::Instant::now();
    let b = Member::start(&p, "dispatcher-b");
    b.wait("b owns partitions", |m| !m.owned().is_empty()).await;
    let took = joined.elapsed();
    assert!(took < Duration::from_secs(20), "b waited {took:?} for partitions: a did not take part in the rebalance");
    a.wait("a and b split the partitions", |a| a.owned().len() + b.owned().len() == all.len()).await;
    assert!(!a.owned().is_empty(), "a is still a member and kept partitions");
    // b delivers the backlog of the partitions it took (its requests hang too, beyond a's budget).
    wait_for(&seen.changed, LIMIT, "b sends", || seen.requests.lock().unwrap().len() > sent_by_a).await;
    eprintln!("b was assigned {} partitions {took:?} after joining", b.owned().len());
    a.stop().await;
    b.stop().await;
    p.stop().await;
}
