//! hookline's producer: librdkafka's, whose acknowledgements reach either a future the caller awaits or a callback
//! run on the producer's polling thread.
//!
//! A callback is for a record whose acknowledgement is the last thing its work waits for (the dispatcher's record
//! that concludes a delivery, the fan-out's tasks): what follows the acknowledgement (storing the input's offset)
//! runs where the acknowledgement arrives, instead of waking a task on another thread only to do that and end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::channel::oneshot;
use rdkafka::config::{ClientConfig, FromClientConfigAndContext};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{Message, OwnedMessage, ToBytes};
use rdkafka::producer::{BaseRecord, DeliveryResult, FutureRecord, Producer as _, ProducerContext, ThreadedProducer};
use rdkafka::util::Timeout;
use rdkafka::Timestamp;

use crate::client::KafkaContext;

pub use rdkafka::producer::future_producer::{Delivery, OwnedDeliveryResult};

/// What [`Producer::send_then`] calls with a record's acknowledgement or failure.
pub type Then = Box<dyn FnOnce(Result<Delivery, Failed<'_>>) + Send + Sync>;

/// What is done with a record's acknowledgement (or its failure), on the producer's polling thread.
pub enum Ack {
    /// Sent to the future [`Producer::send`] or [`Producer::send_result`] returned.
    Wake(oneshot::Sender<OwnedDeliveryResult>),
    /// Called (see [`Producer::send_then`]); it must be quick, as every acknowledgement waits behind it.
    Then(Then),
}

/// A record librdkafka gave up on (`delivery.timeout.ms`, a fatal error) or could not enqueue (a full queue),
/// with its key and payload so that the caller can write it again.
#[derive(Debug)]
pub struct Failed<'a> {
    pub error: KafkaError,
    pub topic: &'a str,
    pub key: Option<&'a [u8]>,
    pub payload: Option<&'a [u8]>,
}

impl ProducerContext for KafkaContext {
    type DeliveryOpaque = Box<Ack>;

    fn delivery(&self, result: &DeliveryResult<'_>, ack: Box<Ack>) {
        match *ack {
            Ack::Wake(tx) => {
                let owned = match result {
                    Ok(m) => Ok(Delivery { partition: m.partition(), offset: m.offset(), timestamp: m.timestamp() }),
                    Err((e, m)) => Err((e.clone(), m.detach())),
                };
                // The receiver gone means its caller stopped waiting: nothing to tell.
                let _ = tx.send(owned);
            }
            Ack::Then(then) => then(match result {
                Ok(m) => Ok(Delivery { partition: m.partition(), offset: m.offset(), timestamp: m.timestamp() }),
                Err((e, m)) => Err(Failed { error: e.clone(), topic: m.topic(), key: m.key(), payload: m.payload() }),
            }),
        }
    }
}

/// A producer of hookline records (cheap to clone: one librdkafka producer and its polling thread).
#[derive(Clone)]
pub struct Producer {
    inner: Arc<ThreadedProducer<KafkaContext>>,
}

/// How long [`Producer::send`] waits before it tries again to enqueue into a full local queue.
const QUEUE_FULL_BACKOFF: Duration = Duration::from_millis(100);

impl Producer {
    /// A producer from `config` (see `client::producer_config` for hookline's settings).
    pub fn from_config(config: &ClientConfig) -> KafkaResult<Self> {
        Ok(Self { inner: Arc::new(ThreadedProducer::from_config_and_context(config, KafkaContext)?) })
    }

    /// Enqueues `record` and waits for its acknowledgement. While the local queue is full, tries again until
    /// `queue_timeout`; past that, the error is `QueueFull`. Once enqueued, librdkafka's own timeouts apply
    /// (`delivery.timeout.ms`).
    pub async fn send<K, P>(&self, record: FutureRecord<'_, K, P>, queue_timeout: impl Into<Timeout>) -> OwnedDeliveryResult
    where
        K: ToBytes + ?Sized,
        P: ToBytes + ?Sized,
    {
        let started = Instant::now();
        let queue_timeout = queue_timeout.into();
        let (tx, rx) = oneshot::channel();
        let mut record = base(record, Box::new(Ack::Wake(tx)));
        loop {
            match self.inner.send(record) {
                Ok(()) => {
                    // The polling thread answers every enqueued record (librdkafka purges what it cannot send
                    // when the producer is dropped, and we hold the producer).
                    return match rx.await {
                        Ok(answer) => answer,
                        Err(_) => canceled(),
                    };
                }
                Err((e, back)) if is_queue_full(&e) && within(started, queue_timeout) => {
                    record = back;
                    tokio::time::sleep(QUEUE_FULL_BACKOFF).await;
                }
                Err((e, back)) => return Err((e, owned(&back))),
            }
        }
    }

    /// Enqueues `record` without waiting (keeps its order with other enqueues to the same partition); the future
    /// resolves once it is acknowledged. On failure to enqueue (a full queue), the record comes back.
    #[allow(clippy::result_large_err)]
    pub fn send_result<'a, K, P>(&self, record: FutureRecord<'a, K, P>) -> Result<DeliveryFuture, (KafkaError, FutureRecord<'a, K, P>)>
    where
        K: ToBytes + ?Sized,
        P: ToBytes + ?Sized,
    {
        let (tx, rx) = oneshot::channel();
        match self.inner.send(base(record, Box::new(Ack::Wake(tx)))) {
            Ok(()) => Ok(DeliveryFuture { rx }),
            Err((e, back)) => Err((e, future_record(back))),
        }
    }

    /// Enqueues `record` without waiting. `then` is called exactly once: with its acknowledgement, or with its
    /// failure, on the producer's polling thread; or at once, on this thread, when it cannot be enqueued (a full
    /// local queue, which this does not wait out).
    pub fn send_then<K, P>(&self, record: FutureRecord<'_, K, P>, then: impl FnOnce(Result<Delivery, Failed<'_>>) + Send + Sync + 'static)
    where
        K: ToBytes + ?Sized,
        P: ToBytes + ?Sized,
    {
        if let Err((error, back)) = self.inner.send(base(record, Box::new(Ack::Then(Box::new(then))))) {
            let failed =
                Failed { error, topic: back.topic, key: back.key.map(ToBytes::to_bytes), payload: back.payload.map(ToBytes::to_bytes) };
            if let Ack::Then(then) = *back.delivery_opaque {
                then(Err(failed));
            }
        }
    }

    /// Waits up to `timeout` for every enqueued record to be acknowledged (or to fail).
    pub fn flush(&self, timeout: impl Into<Timeout>) -> KafkaResult<()> {
        self.inner.flush(timeout)
    }

    /// Records enqueued and not yet answered.
    pub fn in_flight_count(&self) -> i32 {
        self.inner.in_flight_count()
    }

    /// A handle that does not keep the producer alive (for what a record's own callback holds).
    pub fn downgrade(&self) -> WeakProducer {
        WeakProducer(Arc::downgrade(&self.inner))
    }

    /// The librdkafka client (metadata, OAUTHBEARER tokens).
    pub fn client(&self) -> &rdkafka::client::Client<KafkaContext> {
        self.inner.client()
    }
}

/// A [`Producer`] that may be gone.
#[derive(Clone)]
pub struct WeakProducer(std::sync::Weak<ThreadedProducer<KafkaContext>>);

impl WeakProducer {
    pub fn upgrade(&self) -> Option<Producer> {
        self.0.upgrade().map(|inner| Producer { inner })
    }
}

/// The acknowledgement of a record enqueued by [`Producer::send_result`].
#[must_use = "a delivery future does nothing unless awaited"]
pub struct DeliveryFuture {
    rx: oneshot::Receiver<OwnedDeliveryResult>,
}

impl std::future::Future for DeliveryFuture {
    type Output = Result<OwnedDeliveryResult, oneshot::Canceled>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.rx).poll(cx)
    }
}

fn is_queue_full(e: &KafkaError) -> bool {
    *e == KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull)
}

fn within(started: Instant, timeout: Timeout) -> bool {
    match timeout {
        Timeout::Never => true,
        Timeout::After(t) => started.elapsed() < t,
    }
}

fn base<'a, K, P>(r: FutureRecord<'a, K, P>, ack: Box<Ack>) -> BaseRecord<'a, K, P, Box<Ack>>
where
    K: ToBytes + ?Sized,
    P: ToBytes + ?Sized,
{
    BaseRecord {
        topic: r.topic,
        partition: r.partition,
        payload: r.payload,
        key: r.key,
        timestamp: r.timestamp,
        headers: r.headers,
        delivery_opaque: ack,
    }
}

fn future_record<'a, K, P>(r: BaseRecord<'a, K, P, Box<Ack>>) -> FutureRecord<'a, K, P>
where
    K: ToBytes + ?Sized,
    P: ToBytes + ?Sized,
{
    FutureRecord { topic: r.topic, partition: r.partition, payload: r.payload, key: r.key, timestamp: r.timestamp, headers: r.headers }
}

/// An owned copy of a record that could not be enqueued, for the caller's error.
fn owned<K, P>(r: &BaseRecord<'_, K, P, Box<Ack>>) -> OwnedMessage
where
    K: ToBytes + ?Sized,
    P: ToBytes + ?Sized,
{
    OwnedMessage::new(
        r.payload.map(|p| p.to_bytes().to_vec()),
        r.key.map(|k| k.to_bytes().to_vec()),
        r.topic.to_owned(),
        r.timestamp.map_or(Timestamp::NotAvailable, Timestamp::CreateTime),
        r.partition.unwrap_or(-1),
        0,
        r.headers.clone(),
    )
}

/// The answer for a record whose acknowledgement can no longer come (rdkafka's own type: its error is large).
#[allow(clippy::result_large_err)]
fn canceled() -> OwnedDeliveryResult {
    Err((KafkaError::Canceled, OwnedMessage::new(None, None, String::new(), Timestamp::NotAvailable, -1, 0, None)))
}
