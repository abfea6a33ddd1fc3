//! Ordered delivery (`ordering = "key" | "strict"`) through the real pipeline: a failing head holds only the later
//! deliveries of its key, through its retries, until it is delivered or dead-lettered; other keys keep going; a
//! new dispatcher knows the head from the endpoint state and keeps the order.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use bytes::Bytes;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::{json, Value};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::pipeline::quick_policy;
use crate::support::{wait_for, Pipeline};

const LIMIT: Duration = Duration::from_secs(60);

/// A receiver that answers 500 to the events in `failing` and 204 to the rest, and keeps what it was sent in order.
#[derive(Default)]
struct Receiver {
    /// (event id, status answered), in arrival order.
    got: Mutex<Vec<(String, u16)>>,
    failing: Mutex<HashSet<String>>,
    changed: Notify,
}

impl Receiver {
    async fn start() -> (Arc<Self>, String) {
        let me = Arc::new(Self::default());
        let app = axum::Router::new().route("/ordered", axum::routing::post(answer)).with_state(me.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/ordered", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (me, url)
    }

    fn fail(&self, id: &str, on: bool) {
        let mut f = self.failing.lock().unwrap();
        if on {
            f.insert(id.to_owned());
        } else {
            f.remove(id);
        }
    }

    fn got(&self) -> Vec<(String, u16)> {
        self.got.lock().unwrap().clone()
    }

    /// Event ids answered 2xx, in order.
    fn delivered(&self) -> Vec<String> {
        self.got().into_iter().filter(|(_, s)| *s < 300).map(|(id, _)| id).collect()
    }

    fn tries_of(&self, id: &str) -> usize {
        self.got().iter().filter(|(e, _)| e == id).count()
    }

    /// Where in the arrival order `id` was first sent.
    fn first_sent(&self, id: &str) -> Option<usize> {
        self.got().iter().position(|(e, _)| e == id)
    }

    async fn wait(&self, what: &str, cond: impl FnMut() -> bool) {
        wait_for(&self.changed, LIMIT, what, cond).await;
    }
}

async fn answer(State(r): State<Arc<Receiver>>, body: Bytes) -> StatusCode {
    let id = serde_json::from_slice::<Value>(&body).ok().and_then(|b| b["id"].as_str().map(str::to_owned)).unwrap_or_default();
    let status = if r.failing.lock().unwrap().contains(&id) { StatusCode::INTERNAL_SERVER_ERROR } else { StatusCode::NO_CONTENT };
    r.got.lock().unwrap().push((id, status.as_u16()));
    r.changed.notify_waiters();
    status
}

/// An event of entity `entity` (the events topic is keyed by it, so one entity's events stay in publish order).
async fn publish(p: &Pipeline, id: &str, entity: &str) {
    let (status, v) =
        p.call("POST", "/v1/events", Some(json!({"id": id, "type": "order.updated", "entity_id": entity, "data": {"k": entity}}))).await;
    assert_eq!(status, 202, "publish: {v}");
}

/// `later` were all sent (first) only after `head`'s successful try, and were delivered in the order given.
fn assert_after_in_order(r: &Receiver, head: &str, later: &[&str]) {
    let got = r.got();
    let head_done = got.iter().position(|(e, s)| e == head && *s < 300).unwrap_or_else(|| panic!("{head} delivered: {got:?}"));
    for id in later {
        let first = r.first_sent(id).unwrap_or_else(|| panic!("{id} sent: {got:?}"));
        assert!(first > head_done, "{id} was sent before {head} concluded: {got:?}");
        assert_eq!(r.tries_of(id), 1, "{id} once: {got:?}");
    }
    let order: Vec<String> = r.delivered().into_iter().filter(|e| later.contains(&e.as_str())).collect();
    assert_eq!(order, later, "in order: {got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_key_holds_only_its_own_later_events_while_other_keys_flow() {
    a_failing_key_holds_only_its_own_later_events_while_other_keys_flow_on(Pipeline::start(2).await).await;
}

/// The body of the test above, on any broker's pipeline (also run on Apache Kafka: `apache_kafka.rs`).
pub(crate) async fn a_failing_key_holds_only_its_own_later_events_while_other_keys_flow_on(p: Pipeline) {
    let (r, url) = Receiver::start().await;
    // The fields are checked, each refusal naming its field.
    for (body, field) in [
        (json!({"ordering": "key"}), "ordering_key"),
        (json!({"ordering": "strict", "ordering_key": "entity_id"}), "ordering_key"),
        (json!({"ordering_key": "entity_id"}), "ordering_key"),
        (json!({"ordering": "key", "ordering_key": "amount"}), "ordering_key"),
        (json!({"ordering": "sideways"}), "ordering"),
    ] {
        let mut req = json!({"url": url, "event_types": ["*"]});
        req.as_object_mut().unwrap().extend(body.as_object().unwrap().clone());
        let (status, v) = p.call("POST", "/v1/subscriptions", Some(req)).await;
        assert_eq!(status, 422, "{body}: {v}");
        assert_eq!(v["error"]["field"], field, "{body}: {v}");
    }
    let toml = quick_policy(&[0.2; 30], |_| {});
    let (id, _) =
        p.subscribe(json!({"url": url, "event_types": ["*"], "policy_toml": toml, "ordering": "key", "ordering_key": "entity_id"})).await;
    let (_, view) = p.call("GET", &format!("/v1/subscriptions/{id}"), None).await;
    assert_eq!((view["ordering"].as_str(), view["ordering_key"].as_str()), (Some("key"), Some("entity_id")), "{view}");

    r.fail("a1", true);
    for i in 1..=5 {
        publish(&p, &format!("a{i}"), "A").await;
        publish(&p, &format!("b{i}"), "B").await;
    }
    // B goes through, in order, while A's head keeps failing (were B held behind A, this would time out).
    r.wait("all of B while a1 fails", || r.delivered().iter().filter(|e| e.starts_with('b')).count() == 5).await;
    assert!(r.tries_of("a1") >= 1 && !r.delivered().contains(&"a1".to_owned()));
    let bs: Vec<String> = r.delivered().into_iter().filter(|e| e.starts_with('b')).collect();
    assert_eq!(bs, ["b1", "b2", "b3", "b4", "b5"], "{:?}", r.got());
    // a1 is retried (not just tried once) and nothing else of A went meanwhile.
    r.wait("a1's retries", || r.tries_of("a1") >= 3).await;
    assert!(r.got().iter().all(|(e, _)| !matches!(e.as_str(), "a2" | "a3" | "a4" | "a5")), "A waits behind a1: {:?}", r.got());
    let (_, view) = p.call("GET", &format!("/v1/subscriptions/{id}"), None).await;
    assert_eq!(view["ordering_keys_out"], 1, "A's head is out: {view}");
    // The keying may not change under a key that holds deliveries.
    let (status, v) = p.call("PATCH", &format!("/v1/subscriptions/{id}"), Some(json!({"ordering": "strict"}))).await;
    assert_eq!((status, v["error"]["field"].as_str()), (422, Some("ordering")), "{v}");

    r.fail("a1", false);
    r.wait("A delivered", || r.delivered().iter().filter(|e| e.starts_with('a')).count() == 5).await;
    assert_after_in_order(&r, "a1", &["a2", "a3", "a4", "a5"]);
    p.subscription_when(&id, |v| v["ordering_keys_out"] == 0).await;
    // Once nothing is held, it may (`ordering_key` goes with "key").
    let (status, v) = p.call("PATCH", &format!("/v1/subscriptions/{id}"), Some(json!({"ordering": "strict"}))).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!((v["ordering"].as_str(), &v["ordering_key"]), (Some("strict"), &Value::Null), "{v}");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_ordering_sends_one_at_a_time_first_in_first_out() {
    // One events partition: events of different entities are fanned out in the order they were published.
    let p = Pipeline::start(1).await;
    let (r, url) = Receiver::start().await;
    let toml = quick_policy(&[0.2; 30], |_| {});
    p.subscribe(json!({"url": url, "event_types": ["*"], "policy_toml": toml, "ordering": "strict"})).await;
    r.fail("e1", true);
    // Different entities, one order: strict is one key for the whole subscription.
    for (i, k) in ["x", "y", "z", "x", "w"].iter().enumerate() {
        publish(&p, &format!("e{}", i + 1), k).await;
    }
    r.wait("e1's retries", || r.tries_of("e1") >= 3).await;
    assert!(r.got().iter().all(|(e, _)| e == "e1"), "only the head is sent: {:?}", r.got());
    r.fail("e1", false);
    r.wait("all delivered", || r.delivered().len() == 5).await;
    assert_after_in_order(&r, "e1", &["e2", "e3", "e4", "e5"]);
    assert_eq!(r.delivered(), ["e1", "e2", "e3", "e4", "e5"]);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_lettered_head_releases_the_next_event_of_its_key() {
    let p = Pipeline::start(2).await;
    let (r, url) = Receiver::start().await;
    let toml = quick_policy(&[0.2, 0.2], |_| {});
    p.subscribe(json!({"url": url, "event_types": ["*"], "policy_toml": toml, "ordering": "key", "ordering_key": "data.k"})).await;
    r.fail("a1", true);
    for i in 1..=3 {
        publish(&p, &format!("a{i}"), "A").await;
    }
    r.wait("a2 and a3", || r.delivered() == ["a2", "a3"]).await;
    let got = r.got();
    assert_eq!(&got[..3], [("a1".to_owned(), 500), ("a1".to_owned(), 500), ("a1".to_owned(), 500)], "a1's three attempts first: {got:?}");
    wait_for(&p.dlq.changed, LIMIT, "a1's dead letter", || {
        p.dlq.items.lock().unwrap().iter().any(|d| d.event.as_ref().is_some_and(|e| e.id == "a1"))
    })
    .await;
    p.stop().await;
}

fn dispatcher(p: &Pipeline) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let stop = CancellationToken::new();
    let run = hookline_dispatcher::run(p.config.clone(), stop.clone(), Default::default());
    (stop, tokio::spawn(async move { run.await.expect("dispatcher runs") }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_dispatcher_keeps_the_order_behind_a_head_on_the_retry_ladder() {
    let p = Pipeline::start_without_dispatcher(1, |_| {}).await;
    let (r, url) = Receiver::start().await;
    let toml = quick_policy(&[0.5; 30], |_| {});
    p.subscribe(json!({"url": url, "event_types": ["*"], "policy_toml": toml, "ordering": "key", "ordering_key": "data.k"})).await;
    r.fail("a1", true);
    let (stop, first) = dispatcher(&p);
    for i in 1..=3 {
        publish(&p, &format!("a{i}"), "A").await;
    }
    publish(&p, "b1", "B").await;
    r.wait("a1 tried twice and b1", || r.tries_of("a1") >= 2 && r.delivered() == ["b1"]).await;
    // Gone with a2 and a3 waiting uncommitted, and a1 on the ladder.
    stop.cancel();
    first.await.unwrap();
    let tried = r.tries_of("a1");

    let (stop, next) = dispatcher(&p);
    // The new owner knows a1 is the head: it sends a1's retries, and nothing else of A.
    r.wait("a1 retried by the new owner", || r.tries_of("a1") >= tried + 2).await;
    assert!(r.first_sent("a2").is_none() && r.first_sent("a3").is_none(), "A waits behind a1: {:?}", r.got());
    r.fail("a1", false);
    r.wait("A delivered", || r.delivered().iter().filter(|e| e.starts_with('a')).count() == 3).await;
    assert_after_in_order(&r, "a1", &["a2", "a3"]);
    stop.cancel();
    next.await.unwrap();
    p.stop().await;
}

/// The dispatcher group's committed offset of `deliveries` partition 0.
fn deliveries_committed(p: &Pipeline) -> i64 {
    let consumer: BaseConsumer = hookline_kafka::client::table_consumer_config(&p.config.kafka, "ordering-test-offsets")
        .unwrap()
        .set("group.id", &p.config.dispatcher.group_id)
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(p.topics().deliveries(), 0);
    let committed = consumer.committed_offsets(tpl, Duration::from_secs(10)).unwrap();
    match committed.find_partition(p.topics().deliveries(), 0).map(|e| e.offset()) {
        Some(Offset::Offset(o)) => o,
        _ => 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_parked_behind_a_retrying_head_free_the_budget_and_the_partitions_commits() {
    // A budget far below what waits behind A's head: waiting in memory would pause the partition, B included.
    let p = Pipeline::start_with(1, |c| c.dispatcher.max_in_flight = 4).await;
    let (r, url) = Receiver::start().await;
    let toml = quick_policy(&[0.3; 60], |_| {});
    p.subscribe(json!({"url": url, "event_types": ["*"], "policy_toml": toml, "ordering": "key", "ordering_key": "entity_id"})).await;
    r.fail("a1", true);
    let a: Vec<String> = (1..=12).map(|i| format!("a{i}")).collect();
    for id in &a {
        publish(&p, id, "A").await;
    }
    r.wait("a1 retried", || r.tries_of("a1") >= 2).await;
    for i in 1..=3 {
        publish(&p, &format!("b{i}"), "B").await;
    }
    r.wait("B delivered", || r.delivered().iter().filter(|e| e.starts_with('b')).count() == 3).await;
    // The 15 fanned-out records are committed although 11 of them wait behind a1.
    let deadline = std::time::Instant::now() + LIMIT;
    loop {
        let committed = tokio::task::block_in_place(|| deliveries_committed(&p));
        if committed >= 15 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the committed offset of deliveries/0 stayed at {committed}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!r.delivered().contains(&"a1".to_owned()));
    assert!(r.got().iter().all(|(e, _)| !e.starts_with('a') || e == "a1"), "A waits behind a1: {:?}", r.got());

    r.fail("a1", false);
    r.wait("A delivered", || r.delivered().iter().filter(|e| e.starts_with('a')).count() == 12).await;
    let later: Vec<&str> = a[1..].iter().map(String::as_str).collect();
    assert_after_in_order(&r, "a1", &later);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_of_an_ordered_delivery_queues_at_the_back_of_its_key() {
    let p = Pipeline::start(2).await;
    let (r, url) = Receiver::start().await;
    let toml = quick_policy(&[0.2; 60], |_| {});
    let (sub, _) =
        p.subscribe(json!({"url": url, "event_types": ["*"], "policy_toml": toml, "ordering": "key", "ordering_key": "entity_id"})).await;
    publish(&p, "a1", "A").await;
    r.wait("a1", || r.delivered() == ["a1"]).await;
    let (_, found) = p.get_when_ok("/v1/deliveries?event_id=a1", |v| v["items"][0]["state"] == "succeeded").await;
    let delivery = found["items"][0]["delivery_id"].as_str().unwrap().to_owned();
    p.get_when(&format!("/v1/deliveries/{delivery}"), |d| d["replayable"] == true).await;

    r.fail("a2", true);
    publish(&p, "a2", "A").await;
    publish(&p, "a3", "A").await;
    r.wait("a2 retried", || r.tries_of("a2") >= 2).await;
    let (status, v) = p.call("POST", &format!("/v1/deliveries/{delivery}/replay"), None).await;
    assert_eq!(status, 202, "{v}");
    // Behind a2 (failing) and a3: nothing of A but a2 goes meanwhile.
    r.wait("a2 retried after the replay", || r.tries_of("a2") >= 4).await;
    assert_eq!(r.tries_of("a1"), 1, "the replay waits: {:?}", r.got());
    r.fail("a2", false);
    r.wait("a3 and the replay", || r.tries_of("a1") == 2 && r.delivered().contains(&"a3".to_owned())).await;
    assert_eq!(r.delivered(), ["a1", "a2", "a3", "a1"], "the replay went last: {:?}", r.got());
    p.subscription_when(&sub, |v| v["ordering_keys_out"] == 0).await;
    p.stop().await;
}
