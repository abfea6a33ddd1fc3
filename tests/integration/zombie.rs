//! The zombie fence: a dispatcher whose consume loop stops polling is dropped from its group by librdkafka after
//! `kafka.max_poll_interval_ms`, and its partitions go to another member, while its deliveries already taken
//! could go on being sent. The fence stops them before the group moves the partitions: the stalled member sends
//! nothing once it is out, the other member delivers everything, and when the stalled loop comes back its
//! leftover deliveries are dropped (lost partitions), not sent.
//!
//! Each dispatcher resolves the receiver's host name to its own loopback address (127.0.0.1 or 127.0.0.2, the
//! same port), so the test knows who sent each request.

use std::collections::BTreeSet;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use bytes::Bytes;
use futures::future::BoxFuture;
use hookline_core::model::Subscription;
use hookline_dispatcher::connector::Resolve;
use hookline_kafka::rebalance::RebalanceEvent;
use hookline_kafka::scan::scan;
use hookline_kafka::Topics;
use prost::Message as _;
use rdkafka::Message as _;
use serde_json::json;
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

use crate::support::{wait_for, Pipeline};

const LIMIT: Duration = Duration::from_secs(90);
pub(crate) const PARTITIONS: i32 = 4;
/// Enough that each member owns some with near certainty (ids are random; a member with none fails loudly).
const SUBSCRIPTIONS: usize = 12;
const EVENTS: usize = 30;
/// The stalled member's receiver answers this slowly, so its lanes (one request at a time) hold deliveries that
/// would still be sent long after the member is dropped.
const SLOW: Duration = Duration::from_millis(600);
const HOST: &str = "zombie-receiver.test";
const MAX_POLL_MS: u64 = 6_000;

/// Requests one receiver saw: (path, event id, when).
#[derive(Default)]
struct Seen {
    requests: Mutex<Vec<(String, String, Instant)>>,
    changed: Notify,
    delay: Mutex<Duration>,
}

async fn receive(State(s): State<Arc<Seen>>, Path(path): Path<String>, body: Bytes) -> StatusCode {
    let id = serde_json::from_slice::<serde_json::Value>(&body).ok().and_then(|v| v["id"].as_str().map(str::to_owned)).unwrap_or_default();
    s.requests.lock().unwrap().push((path, id, Instant::now()));
    s.changed.notify_waiters();
    let delay = *s.delay.lock().unwrap();
    tokio::time::sleep(delay).await;
    StatusCode::NO_CONTENT
}

async fn serve(listener: tokio::net::TcpListener, delay: Duration) -> Arc<Seen> {
    let seen = Arc::new(Seen { delay: Mutex::new(delay), ..Default::default() });
    let app = axum::Router::new().route("/{path}", axum::routing::post(receive)).with_state(seen.clone());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    seen
}

/// Two listeners on one port, at 127.0.0.1 and 127.0.0.2.
async fn two_listeners() -> (tokio::net::TcpListener, tokio::net::TcpListener) {
    for _ in 0..20 {
        let a = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1");
        let port = a.local_addr().unwrap().port();
        if let Ok(b) = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 2], port))).await {
            return (a, b);
        }
    }
    panic!("no port free on both 127.0.0.1 and 127.0.0.2");
}

/// Resolves every name to one address.
struct To(IpAddr);

impl Resolve for To {
    fn resolve(&self, _host: &str, _port: u16) -> BoxFuture<'static, io::Result<Vec<IpAddr>>> {
        let ip = self.0;
        Box::pin(async move { Ok(vec![ip]) })
    }
}

/// A dispatcher of the pipeline's group with what its rebalances told it, and when.
struct Member {
    /// The pipeline's `deliveries` topic.
    topic: String,
    stop: CancellationToken,
    run: tokio::task::JoinHandle<()>,
    events: Arc<Mutex<Vec<(Instant, RebalanceEvent)>>>,
    changed: Arc<Notify>,
}

impl Member {
    fn start(p: &Pipeline, name: &str, ip: IpAddr, stall: Option<watch::Receiver<bool>>) -> Member {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let events = Arc::new(Mutex::new(Vec::new()));
        let changed = Arc::new(Notify::new());
        let (e, c) = (events.clone(), changed.clone());
        tokio::spawn(async move {
            while let Some(ev) = rx.recv().await {
                e.lock().unwrap().push((Instant::now(), ev));
                c.notify_waiters();
            }
        });
        let stop = CancellationToken::new();
        let options = hookline_dispatcher::Options {
            instance: Some(name.into()),
            rebalances: Some(tx),
            resolver: Some(Arc::new(To(ip))),
            stall_polling: stall,
            ..Default::default()
        };
        let run = hookline_dispatcher::run(p.config.clone(), stop.clone(), options);
        let topic = Topics::new(p.config.kafka.topic_prefix.clone()).deliveries().to_owned();
        Member { topic, stop, run: tokio::spawn(async move { run.await.expect("dispatcher runs") }), events, changed }
    }

    /// The `deliveries` partitions it owns, from the deltas it was given, and when it last gained one.
    fn owned(&self) -> (BTreeSet<i32>, Option<Instant>) {
        let topic = &self.topic;
        let mut owned = BTreeSet::new();
        let mut gained = None;
        for (at, ev) in self.events.lock().unwrap().iter() {
            match ev {
                RebalanceEvent::Assigned(ps) => {
                    owned.extend(ps.iter().filter(|(t, _)| t == topic).map(|(_, p)| *p));
                    gained = Some(*at);
                }
                RebalanceEvent::Revoked(ps) => ps.iter().filter(|(t, _)| t == topic).for_each(|(_, p)| {
                    owned.remove(p);
                }),
            }
        }
        (owned, gained)
    }

    async fn wait(&self, what: &str, cond: impl Fn(&Member) -> bool) {
        wait_for(&self.changed, LIMIT, what, || cond(self)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_stops_polling_sends_nothing_once_dropped_and_the_other_delivers_everything() {
    let p = Pipeline::start_without_dispatcher(PARTITIONS, |c| {
        zombie_config(c);
        c.kafka.session_timeout_ms = 3_000;
    })
    .await;
    a_member_that_stops_polling_sends_nothing_once_dropped_and_the_other_delivers_everything_on(p).await;
}

/// The members' settings: a short poll interval, no revoke drain, one request at a time per endpoint. (The
/// session timeout is the caller's: Apache Kafka refuses one under `group.min.session.timeout.ms`, 6 s.)
pub(crate) fn zombie_config(c: &mut hookline_service::Config) {
    c.kafka.max_poll_interval_ms = MAX_POLL_MS;
    c.dispatcher.revoke_drain_ms = 0;
    c.dispatcher.drain_timeout_ms = 2_000;
    c.dispatcher.per_subscription_concurrency = 1;
}

/// The body of the test above, on a pipeline of [`PARTITIONS`] partitions without a dispatcher (also run on Apache
/// Kafka: `apache_kafka.rs`).
pub(crate) async fn a_member_that_stops_polling_sends_nothing_once_dropped_and_the_other_delivers_everything_on(p: Pipeline) {
    let (l1, l2) = two_listeners().await;
    let port = l1.local_addr().unwrap().port();
    let first_seen = serve(l1, SLOW).await;
    let second_seen = serve(l2, Duration::ZERO).await;

    // The API resolves a URL's host when it is saved: the subscriptions are made with the loopback address and
    // their records then rewritten to the host name that each dispatcher resolves to its own receiver.
    let mut ids = Vec::new();
    for i in 0..SUBSCRIPTIONS {
        ids.push(p.subscribe(json!({"url": p.url(&format!("s{i}")), "event_types": ["*"]})).await.0);
    }
    let topics = Topics::new(p.config.kafka.topic_prefix.clone());
    let mut records = Vec::new();
    scan(&p.config.kafka, topics.subscriptions(), None, LIMIT, |m| {
        if let Some(Ok(sub)) = m.payload().map(Subscription::decode) {
            records.push(sub);
        }
    })
    .await
    .expect("scan subscriptions");
    let producer = hookline_kafka::client::producer(&p.config.kafka, "zombie-test").unwrap();
    for mut sub in records.into_iter().filter(|s| ids.contains(&s.id)) {
        let path = sub.url.rsplit('/').next().unwrap().to_owned();
        sub.url = format!("http://{HOST}:{port}/{path}");
        hookline_kafka::produce::send(&producer, topics.subscriptions(), &sub.id, &sub.encode_to_vec()).await.unwrap();
    }

    let all: BTreeSet<i32> = (0..PARTITIONS).collect();
    let (stall, stalled) = watch::channel(false);
    let first = Member::start(&p, "dispatcher-stalls", IpAddr::from([127, 0, 0, 1]), Some(stalled));
    first.wait("the first member owns every partition", |m| m.owned().0 == all).await;
    let second = Member::start(&p, "dispatcher-takes-over", IpAddr::from([127, 0, 0, 2]), None);
    second.wait("the second member owns partitions", |m| !m.owned().0.is_empty()).await;
    first.wait("the members split the partitions", |m| m.owned().0.len() + second.owned().0.len() == all.len()).await;
    let first_owned = first.owned().0;
    assert!(!first_owned.is_empty());

    for n in 0..EVENTS {
        p.publish(&format!("evt_{n}"), "order.created").await;
    }
    // The first member has taken its deliveries (one at a time per endpoint, each answered slowly: an endpoint's
    // second request comes once every event was fanned out and taken) when its loop stops polling.
    wait_for(&first_seen.changed, LIMIT, "the first member's second round of requests", || {
        let requests = first_seen.requests.lock().unwrap();
        requests.iter().any(|(path, ..)| requests.iter().filter(|(p, ..)| p == path).count() >= 2)
    })
    .await;
    stall.send(true).unwrap();
    let stalled_at = Instant::now();

    // Past max.poll.interval.ms librdkafka drops it; the second member is given its partitions.
    second.wait("the second member owns every partition", |m| m.owned().0 == all).await;
    let taken_at = second.owned().1.expect("assigned");
    let took = taken_at.duration_since(stalled_at);
    assert!(
        took >= Duration::from_millis(MAX_POLL_MS) - Duration::from_secs(1),
        "the partitions moved after {took:?}: before max.poll.interval.ms"
    );

    // Every event reaches its endpoint at least once.
    let expected: BTreeSet<(String, String)> =
        (0..SUBSCRIPTIONS).flat_map(|i| (0..EVENTS).map(move |n| (format!("s{i}"), format!("evt_{n}")))).collect();
    let delivered = || {
        let mut d: BTreeSet<(String, String)> = BTreeSet::new();
        for seen in [&first_seen, &second_seen] {
            d.extend(seen.requests.lock().unwrap().iter().map(|(path, id, _)| (path.clone(), id.clone())));
        }
        d
    };
    wait_for(&second_seen.changed, LIMIT, "every event delivered", || delivered().is_superset(&expected)).await;
    // And concluded (its outcome written, its offset stored): nothing is left for a next owner to redo.
    p.wait_finals(expected.len(), LIMIT).await;

    // The stalled loop comes back: its leftover deliveries belong to lost partitions and are dropped. Once it has
    // stopped, everything it would ever send has been sent.
    stall.send(false).unwrap();
    first.wait("the first member learns it lost its partitions", |m| m.owned().0.is_empty() || m.owned().1 > Some(taken_at)).await;
    first.stop.cancel();
    first.run.await.unwrap();
    let first_requests = first_seen.requests.lock().unwrap().clone();
    let late: Vec<_> = first_requests.iter().filter(|(_, _, at)| *at >= taken_at).collect();
    let before = first_requests.iter().filter(|(_, _, at)| *at < stalled_at).count();
    eprintln!(
        "first member: {} requests ({before} before its stall); partitions moved {took:?} after the stall; second member: {} requests",
        first_requests.len(),
        second_seen.requests.lock().unwrap().len()
    );
    assert!(late.is_empty(), "the dropped member sent {} requests after its partitions moved: {late:?}", late.len());
    second.stop.cancel();
    second.run.await.unwrap();
    p.stop().await;
}
