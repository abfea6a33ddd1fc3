//! A request body with a deadline and a minimum rate: a client that sends `Content-Length: 1000000` and then one
//! byte every few seconds would otherwise hold its connection (and a handler) for as long as the idle timeout keeps
//! being reset. The body fails with [`BodyCutShort`] once it is late; the handler answers (the API: 408) and the
//! connection closes, since its request was not read to the end.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Bytes, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

/// The bounds of one request body (`[ingest.http]` and the other listeners' settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyLimits {
    /// From the request's first byte to the body's last.
    pub request: Duration,
    /// 0: no minimum rate.
    pub min_bytes_per_s: u64,
    /// How long a body may lag behind the minimum rate from the request's start.
    pub grace: Duration,
}

/// Why a body was cut short.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BodyCutShort {
    #[error("the request was not complete within {0:?} of its first byte (request_timeout_ms)")]
    Deadline(Duration),
    #[error("the request body arrived slower than {0} bytes/s (min_body_bytes_per_s)")]
    TooSlow(u64),
}

impl BodyCutShort {
    /// The metric label.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Deadline(_) => "request_timeout",
            Self::TooSlow(_) => "body_too_slow",
        }
    }
}

pub struct Guarded<B> {
    inner: B,
    limits: BodyLimits,
    started: Instant,
    received: u64,
    timer: Pin<Box<Sleep>>,
    ended: bool,
}

impl<B> Guarded<B> {
    pub fn new(inner: B, limits: BodyLimits, started: Instant) -> Self {
        let mut g = Self { inner, limits, started, received: 0, timer: Box::pin(tokio::time::sleep_until(started)), ended: false };
        let at = g.deadline();
        g.timer.as_mut().reset(at);
        g
    }

    /// The later of the rate's allowance for what has arrived and nothing past the request's deadline: with `n`
    /// bytes received the body may last `grace + n / rate`.
    fn deadline(&self) -> Instant {
        let total = self.started + self.limits.request;
        if self.limits.min_bytes_per_s == 0 {
            return total;
        }
        let earned_ms = self.received.saturating_mul(1_000) / self.limits.min_bytes_per_s;
        total.min(self.started + self.limits.grace + Duration::from_millis(earned_ms))
    }

    fn cut(&self) -> BodyCutShort {
        if Instant::now() >= self.started + self.limits.request {
            BodyCutShort::Deadline(self.limits.request)
        } else {
            BodyCutShort::TooSlow(self.limits.min_bytes_per_s)
        }
    }
}

impl<B> Body for Guarded<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.received = self.received.saturating_add(data.len() as u64);
                    let at = self.deadline();
                    self.timer.as_mut().reset(at);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => {
                self.ended = true;
                Poll::Ready(None)
            }
            Poll::Pending => {
                if self.timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                let cut = self.cut();
                self.ended = true;
                metrics::counter!("hookline_http_requests_cut_total", "reason" => cut.reason()).increment(1);
                Poll::Ready(Some(Err(Box::new(cut))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The cut in an error's chain, if it is one (how a handler tells a slow client from a broken body).
pub fn cut_short(e: &(dyn std::error::Error + 'static)) -> Option<BodyCutShort> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(c) = err.downcast_ref::<BodyCutShort>() {
            return Some(*c);
        }
        cur = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    const LIMITS: BodyLimits = BodyLimits { request: Duration::from_secs(60), min_bytes_per_s: 1_000, grace: Duration::from_secs(5) };

    /// A body fed by hand: `(sender, body)`.
    fn channel() -> (tokio::sync::mpsc::Sender<Bytes>, impl Body<Data = Bytes, Error = std::convert::Infallible> + Unpin) {
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
        let stream = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (Ok(Frame::data(b)), rx)) });
        (tx, http_body_util::StreamBody::new(Box::pin(stream)))
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_keeps_the_rate_is_read_whole() {
        let (tx, body) = channel();
        let guarded = Guarded::new(body, LIMITS, Instant::now());
        let feed = tokio::spawn(async move {
            for _ in 0..20 {
                tokio::time::sleep(Duration::from_secs(1)).await;
                tx.send(Bytes::from(vec![b'x'; 1_000])).await.unwrap();
            }
        });
        let got = guarded.collect().await.unwrap().to_bytes();
        feed.await.unwrap();
        assert_eq!(got.len(), 20_000);
    }

    #[tokio::test(start_paused = true)]
    async fn a_dribbling_body_is_cut_after_the_grace() {
        let (tx, body) = channel();
        let t0 = Instant::now();
        let guarded = Guarded::new(body, LIMITS, t0);
        let _feed = tokio::spawn(async move {
            loop {
                if tx.send(Bytes::from_static(b"x")).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        });
        let e = guarded.collect().await.unwrap_err();
        assert_eq!(cut_short(e.as_ref()), Some(BodyCutShort::TooSlow(1_000)));
        // The grace plus what two bytes earned (2 ms): cut at the first check after it.
        let waited = t0.elapsed();
        assert!(waited >= Duration::from_secs(5) && waited < Duration::from_secs(6), "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_fast_but_endless_body_meets_the_request_deadline() {
        let (tx, body) = channel();
        let t0 = Instant::now();
        let limits = BodyLimits { request: Duration::from_secs(10), ..LIMITS };
        let guarded = Guarded::new(body, limits, t0);
        let _feed = tokio::spawn(async move {
            while tx.send(Bytes::from(vec![b'x'; 10_000])).await.is_ok() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        let e = guarded.collect().await.unwrap_err();
        assert_eq!(cut_short(e.as_ref()), Some(BodyCutShort::Deadline(Duration::from_secs(10))));
        assert!(t0.elapsed() >= Duration::from_secs(10) && t0.elapsed() < Duration::from_millis(10_200), "{:?}", t0.elapsed());
    }

    #[tokio::test(start_paused = true)]
    async fn no_minimum_rate_leaves_only_the_deadline() {
        let (tx, body) = channel();
        let limits = BodyLimits { min_bytes_per_s: 0, request: Duration::from_secs(30), grace: Duration::ZERO };
        let guarded = Guarded::new(body, limits, Instant::now());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(20)).await;
            tx.send(Bytes::from_static(b"late")).await.unwrap();
        });
        assert_eq!(guarded.collect().await.unwrap().to_bytes(), Bytes::from_static(b"late"));
    }
}
