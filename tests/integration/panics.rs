//! A partition keeps moving when handling one of its deliveries panics: the delivery is dead-lettered
//! (`internal_error`, redrivable) instead of leaving its offset unfinished, which would hold back the partition's
//! watermark and so every later commit.

use std::io;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use hookline_core::model::Subscription;
use hookline_dispatcher::connector::Resolve;
use hookline_kafka::scan::scan;
use prost::Message as _;
use rdkafka::Message as _;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::support::{wait_for, Pipeline};

const LIMIT: Duration = Duration::from_secs(60);

/// A dispatcher of the pipeline's group, run by the test.
fn dispatcher(p: &Pipeline, name: &str, options: hookline_dispatcher::Options) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let stop = CancellationToken::new();
    let options = hookline_dispatcher::Options { instance: Some(name.into()), ..options };
    let run = hookline_dispatcher::run(p.config.clone(), stop.clone(), options);
    (stop, tokio::spawn(async move { run.await.expect("dispatcher runs") }))
}

/// Resolving `panic_on` panics inside the dispatcher's attempt (its egress check resolves names); other names are
/// 127.0.0.1.
struct PanicOn(&'static str);

impl Resolve for PanicOn {
    fn resolve(&self, host: &str, _port: u16) -> BoxFuture<'static, io::Result<Vec<IpAddr>>> {
        assert_ne!(host, self.0, "injected panic: resolving {host}");
        Box::pin(async { Ok(vec![IpAddr::from([127, 0, 0, 1])]) })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_that_panics_is_dead_lettered_and_its_partition_goes_on() {
    let p = Pipeline::start_without_dispatcher(1, |c| c.dispatcher.per_subscription_concurrency = 1).await;
    let (boom, _) = p.subscribe(json!({"url": p.url("boom"), "event_types": ["*"]})).await;
    let (ok, _) = p.subscribe(json!({"url": p.url("ok"), "event_types": ["*"]})).await;
    // The API resolves a name when it is saved, so the name that makes the dispatcher panic is written to the
    // subscriptions table directly (same record, another host).
    let topics = p.topics();
    let mut record = None;
    scan(&p.config.kafka, topics.subscriptions(), None, LIMIT, |m| {
        if let Some(Ok(sub)) = m.payload().map(Subscription::decode) {
            if sub.id == boom {
                record = Some(sub);
            }
        }
    })
    .await
    .expect("scan subscriptions");
    let mut record = record.expect("the boom subscription's record");
    record.url = record.url.replace("127.0.0.1", "boom.invalid");
    let producer = hookline_kafka::client::producer(&p.config.kafka, "backpressure-test").unwrap();
    hookline_kafka::produce::send(&producer, topics.subscriptions(), &boom, &record.encode_to_vec()).await.unwrap();

    let options = hookline_dispatcher::Options { resolver: Some(Arc::new(PanicOn("boom.invalid"))), ..Default::default() };
    let (stop, first) = dispatcher(&p, "dispatcher-panics", options);
    p.publish("evt_panics", "order.created").await;
    let dlq = p.dlq.clone();
    wait_for(&p.dlq.changed, LIMIT, "the panicked delivery's dead letter", || {
        dlq.items.lock().unwrap().iter().any(|d| d.subscription_id == boom)
    })
    .await;
    let dl = p.dlq.items.lock().unwrap().iter().find(|d| d.subscription_id == boom).cloned().unwrap();
    assert_eq!(dl.reason, "internal_error", "{dl:?}");
    assert!(dl.detail.contains("injected panic"), "the panic's message is kept: {}", dl.detail);
    assert!(!dl.delivery_id.is_empty() && dl.event.as_ref().is_some_and(|e| e.id == "evt_panics"), "redrivable: {dl:?}");
    p.wait_final_of(&ok, 1, LIMIT).await;
    p.publish("evt_after", "order.created").await;
    p.wait_final_of(&ok, 2, LIMIT).await;
    stop.cancel();
    first.await.unwrap();

    // The next owner (resolving the name to the receiver) starts from the committed offset: past the panicked
    // record, so the boom endpoint never gets `evt_panics` — with a frozen watermark it would be redone and sent.
    let options = hookline_dispatcher::Options { resolver: Some(Arc::new(PanicOn("nothing"))), ..Default::default() };
    let (stop, next) = dispatcher(&p, "dispatcher-next", options);
    p.publish("evt_fence", "order.created").await;
    wait_for(&p.seen.changed, LIMIT, "the fence's request to boom", || p.requests_for("boom", "evt_fence") == 1).await;
    assert_eq!(p.requests_for("boom", "evt_panics"), 0, "the panicked delivery was not redone");
    stop.cancel();
    next.await.unwrap();
    p.stop().await;
}
