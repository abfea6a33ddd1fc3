//! The one HTTP server every hookline listener uses (the ingest API and the health servers): HTTP/1.1 with
//! timeouts, a minimum body rate, a connection cap and a per-client share of it, so slow, idle or greedy clients
//! cannot tie it up.
//!
//! - `header_read_timeout_ms`: a request's headers must be complete within this long of the connection opening, or
//!   of the first byte of a later request on a kept-alive connection; otherwise the connection is closed.
//! - `request_timeout_ms`: a request's body must be complete within this long of its first byte, and
//!   `min_body_bytes_per_s`: after `body_rate_grace_ms`, a body must keep arriving at least this fast. Either
//!   failing cuts the body short: the handler sees a body error (the API answers 408) and the connection closes.
//! - `idle_timeout_ms`: a connection on which no byte moves either way for this long is closed, whatever it is doing:
//!   waiting for its next request (keep-alive), a client that stops reading its response.
//!   It must exceed the slowest handler, and is best longer than clients keep idle connections pooled (90 s for
//!   hyper and Go), so a client does not reuse a connection the server is closing.
//! - `max_connections_per_client`: connections one client address may hold at once; a further one is closed as it
//!   is accepted (0: no limit, for a listener behind a proxy whose address every client shares).
//! - `max_connections`: at the cap, a new connection sheds one that is not handling a request (one that never sent a
//!   complete request first, then the longest idle); when every connection is handling a request, new ones wait in
//!   the kernel's listen backlog until one closes. A flood delays clients but cannot use up the process's file
//!   descriptors, which Kafka needs too.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::http_body_guard::BodyLimits;

/// Limits of one HTTP listener (`[ingest.http]`, `[dispatcher.health_http]`, `[retry_scheduler.health_http]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpServerSettings {
    /// From a connection's opening, or a later request's first byte, to the end of the request's headers.
    pub header_read_timeout_ms: u64,
    /// No byte read or written for this long closes the connection (keep-alive idling included).
    pub idle_timeout_ms: u64,
    /// Connections served at once; at the cap an idle one is shed, or further ones wait in the listen backlog.
    pub max_connections: usize,
    /// Connections one client address may hold at once; 0: no limit (behind a proxy every client shares).
    pub max_connections_per_client: usize,
    /// From a request's first byte to the end of its body.
    pub request_timeout_ms: u64,
    /// After `body_rate_grace_ms` of a body, it must have arrived at this rate on average; 0: no minimum.
    pub min_body_bytes_per_s: u64,
    pub body_rate_grace_ms: u64,
}

impl HttpServerSettings {
    /// Checks the limits; `section` is the key prefix the errors name (`ingest.http`).
    pub fn validate(&self, section: &str) -> Result<(), String> {
        let range = |key: &str, v: u64, min: u64, max: u64| {
            if (min..=max).contains(&v) {
                Ok(())
            } else {
                Err(format!("{section}.{key}: must be from {min} to {max}, got {v}"))
            }
        };
        range("header_read_timeout_ms", self.header_read_timeout_ms, 1, 600_000)?;
        range("idle_timeout_ms", self.idle_timeout_ms, 1, 3_600_000)?;
        range("max_connections", u64::try_from(self.max_connections).unwrap_or(u64::MAX), 1, 100_000)?;
        range("max_connections_per_client", u64::try_from(self.max_connections_per_client).unwrap_or(u64::MAX), 0, 100_000)?;
        range("request_timeout_ms", self.request_timeout_ms, 1, 3_600_000)?;
        range("min_body_bytes_per_s", self.min_body_bytes_per_s, 0, 1 << 30)?;
        range("body_rate_grace_ms", self.body_rate_grace_ms, 0, 600_000)?;
        if self.max_connections_per_client > self.max_connections {
            return Err(format!(
                "{section}.max_connections_per_client: must not exceed max_connections ({}), got {}",
                self.max_connections, self.max_connections_per_client
            ));
        }
        Ok(())
    }
}

impl Default for HttpServerSettings {
    /// The same for every listener. The idle timeout outlasts the slowest handler (a replay may read Kafka for 60 s
    /// before it answers) and the 90 s clients commonly keep an idle connection.
    fn default() -> Self {
        Self {
            header_read_timeout_ms: 10_000,
            idle_timeout_ms: 120_000,
            max_connections: 512,
            max_connections_per_client: 64,
            request_timeout_ms: 60_000,
            min_body_bytes_per_s: 1_024,
            body_rate_grace_ms: 5_000,
        }
    }
}

/// Serves `app` on `listener` until `shutdown`, then lets the open connections finish their requests (idle ones
/// close at once) and returns when all are closed.
pub async fn serve(listener: TcpListener, app: Router, settings: HttpServerSettings, shutdown: CancellationToken) {
    let max = settings.max_connections.clamp(1, Semaphore::MAX_PERMITS);
    let permits = Arc::new(Semaphore::new(max));
    let open = Arc::new(Open::default());
    let mut builder = hyper::server::conn::http1::Builder::new();
    let limits = Limits::of(&settings);
    // hyper's header timer runs from the end of one response to the next request's headers, idle time included, so
    // it gets the idle timeout; the header timeout proper (from a request's first byte) is `serve_connection`'s.
    builder.timer(TokioTimer::new()).header_read_timeout(limits.idle.max(limits.header)).keep_alive(true);
    let builder = Arc::new(builder);
    let mut next_id = 0u64;
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    // Out of descriptors, or a connection reset before it was accepted: wait a little, go on.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(50)) => continue,
                        _ = shutdown.cancelled() => break,
                    }
                }
            },
            _ = shutdown.cancelled() => break,
        };
        let Some(client) = open.admit(peer.ip(), settings.max_connections_per_client) else {
            metrics::counter!("hookline_http_connections_refused_total", "reason" => "per_client_limit").increment(1);
            tracing::debug!(client = %peer.ip(), "closing a connection past the client's share (max_connections_per_client)");
            continue;
        };
        // At the cap, an idle connection makes room (its permit comes back as it closes); with none idle, this one
        // waits for a slot, and the next ones wait in the listen backlog rather than take descriptors.
        let permit = match permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                open.shed_one();
                tokio::select! {
                    p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
                    _ = shutdown.cancelled() => break,
                }
            }
        };
        let _ = stream.set_nodelay(true);
        next_id = next_id.wrapping_add(1);
        let conn = open.register(next_id, client);
        let (builder, app, shutdown) = (builder.clone(), app.clone(), shutdown.clone());
        tokio::spawn(async move {
            serve_connection(&builder, stream, app, limits, &conn, shutdown).await;
            drop(conn);
            drop(permit);
        });
    }
    drop(listener);
    // Every connection holds a permit until it is closed: all of them back means all are closed.
    let _ = permits.acquire_many(u32::try_from(max).unwrap_or(u32::MAX)).await;
}

/// The connections a listener has open, by client address and by id (for shedding).
#[derive(Default)]
struct Open {
    per_client: Mutex<HashMap<IpAddr, usize>>,
    conns: Mutex<HashMap<u64, Arc<Clocks>>>,
}

/// One connection's place in [`Open`]: leaves it when dropped.
struct Registered {
    open: Arc<Open>,
    id: u64,
    client: IpAddr,
    clocks: Arc<Clocks>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.open.conns.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.id);
        let mut per = self.open.per_client.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = per.get_mut(&self.client) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                per.remove(&self.client);
            }
        }
    }
}

impl Open {
    /// Counts a connection of `client`, or `None` when it holds its share already (`limit` 0: no share).
    fn admit(&self, client: IpAddr, limit: usize) -> Option<IpAddr> {
        let mut per = self.per_client.lock().unwrap_or_else(|e| e.into_inner());
        let n = per.entry(client).or_insert(0);
        if limit > 0 && *n >= limit {
            return None;
        }
        *n += 1;
        Some(client)
    }

    fn register(self: &Arc<Self>, id: u64, client: IpAddr) -> Registered {
        let clocks = Arc::new(Clocks::new());
        self.conns.lock().unwrap_or_else(|e| e.into_inner()).insert(id, clocks.clone());
        Registered { open: self.clone(), id, client, clocks }
    }

    /// Closes one connection that is not handling a request: one that never completed a request first, then the
    /// one idle longest. False when every connection is handling a request.
    fn shed_one(&self) -> bool {
        let conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        let victim = conns
            .values()
            .filter(|c| !c.in_request.load(Ordering::Relaxed) && !c.shed.is_cancelled())
            .min_by_key(|c| (c.served.load(Ordering::Relaxed) > 0, c.origin + Duration::from_millis(c.last_io.load(Ordering::Relaxed))));
        match victim {
            Some(c) => {
                c.shed.cancel();
                metrics::counter!("hookline_http_connections_shed_total").increment(1);
                true
            }
            None => false,
        }
    }
}

/// Binds `addr` and serves `app` there in a task until `shutdown`. Returns the bound address (port 0 picks one)
/// and the task, which ends once every connection is closed.
pub async fn spawn(
    addr: SocketAddr,
    app: Router,
    settings: HttpServerSettings,
    shutdown: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    Ok((local, tokio::spawn(serve(listener, app, settings, shutdown))))
}

#[derive(Clone, Copy)]
struct Limits {
    idle: Duration,
    header: Duration,
    body: BodyLimits,
}

impl Limits {
    fn of(s: &HttpServerSettings) -> Self {
        Self {
            idle: Duration::from_millis(s.idle_timeout_ms.max(1)),
            header: Duration::from_millis(s.header_read_timeout_ms.max(1)),
            body: BodyLimits {
                request: Duration::from_millis(s.request_timeout_ms.max(1)),
                min_bytes_per_s: s.min_body_bytes_per_s,
                grace: Duration::from_millis(s.body_rate_grace_ms),
            },
        }
    }
}

/// Not a time: the header clock is not running.
const NOT_RUNNING: u64 = u64::MAX;

/// What the watchdog of one connection needs, in milliseconds after `origin`.
struct Clocks {
    origin: Instant,
    /// When a byte last moved either way.
    last_io: AtomicU64,
    /// When the request being read started (its first byte, or the connection's opening); `NOT_RUNNING` while a
    /// request is being handled or the connection waits, idle, for the next one.
    head_started: AtomicU64,
    /// Whether the connection is between requests: the next byte read starts a request's headers.
    between: std::sync::atomic::AtomicBool,
    /// Told when the header clock starts, so the watchdog looks at its deadline.
    started: tokio::sync::Notify,
    /// Whether a request is being handled (its response not produced yet): such a connection is never shed.
    in_request: AtomicBool,
    /// Requests answered on this connection.
    served: AtomicU64,
    /// Cancelled to close the connection (shed at the cap).
    shed: CancellationToken,
}

impl Clocks {
    /// A new connection is reading its first request's headers from the start: one that sends nothing is closed
    /// after the header timeout, not the (longer) idle timeout.
    fn new() -> Self {
        Self {
            origin: Instant::now(),
            last_io: AtomicU64::new(0),
            head_started: AtomicU64::new(0),
            between: AtomicBool::new(false),
            started: tokio::sync::Notify::new(),
            in_request: AtomicBool::new(false),
            served: AtomicU64::new(0),
            shed: CancellationToken::new(),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(NOT_RUNNING - 1)
    }
    fn at(&self, ms: u64) -> Instant {
        self.origin + Duration::from_millis(ms)
    }
}

async fn serve_connection(
    builder: &hyper::server::conn::http1::Builder,
    stream: TcpStream,
    app: Router,
    limits: Limits,
    conn: &Registered,
    shutdown: CancellationToken,
) {
    let clocks = conn.clocks.clone();
    let io = Watched { io: stream, clocks: clocks.clone() };
    let c = clocks.clone();
    // hyper calls the service once a request's headers are complete; when it answers, the connection is between
    // requests again.
    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        // The request's clock started with its first byte (the connection's opening for the first request).
        let head = c.head_started.swap(NOT_RUNNING, Ordering::Relaxed);
        let started = if head == NOT_RUNNING { Instant::now() } else { c.at(head) };
        c.between.store(false, Ordering::Relaxed);
        c.in_request.store(true, Ordering::Relaxed);
        let req = req.map(|body| crate::http_body_guard::Guarded::new(body, limits.body, started));
        let (app, c) = (app.clone(), c.clone());
        async move {
            let resp = tower::ServiceExt::oneshot(app, req).await;
            c.in_request.store(false, Ordering::Relaxed);
            c.served.fetch_add(1, Ordering::Relaxed);
            c.between.store(true, Ordering::Relaxed);
            resp
        }
    });
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let mut draining = false;
    loop {
        let idle_at = clocks.at(clocks.last_io.load(Ordering::Relaxed)) + limits.idle;
        let head = clocks.head_started.load(Ordering::Relaxed);
        let header_at = (head != NOT_RUNNING).then(|| clocks.at(head) + limits.header);
        let deadline = header_at.map_or(idle_at, |h| h.min(idle_at));
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "HTTP connection ended with an error");
                }
                return;
            }
            _ = clocks.started.notified() => {}
            _ = clocks.shed.cancelled() => {
                tracing::debug!("closing an HTTP connection that made no request, to admit a new one (max_connections)");
                return;
            }
            _ = shutdown.cancelled(), if !draining => {
                conn.as_mut().graceful_shutdown();
                draining = true;
            }
            _ = tokio::time::sleep_until(deadline) => {
                // The clocks may have moved since they were read: only an expired one closes.
                let now = clocks.now();
                let head = clocks.head_started.load(Ordering::Relaxed);
                if head != NOT_RUNNING && now.saturating_sub(head) >= limits.header.as_millis() as u64 {
                    tracing::debug!("closing an HTTP connection whose request headers took over {:?}", limits.header);
                    return;
                }
                if now.saturating_sub(clocks.last_io.load(Ordering::Relaxed)) >= limits.idle.as_millis() as u64 {
                    tracing::debug!("closing an HTTP connection idle for {:?}", limits.idle);
                    return;
                }
            }
        }
    }
}

/// A stream that keeps the connection's clocks.
struct Watched {
    io: TcpStream,
    clocks: Arc<Clocks>,
}

impl Watched {
    fn touch(&self) {
        self.clocks.last_io.store(self.clocks.now(), Ordering::Relaxed);
    }
}

impl AsyncRead for Watched {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.touch();
            // The first byte after a response starts the next request's header clock.
            if self.clocks.between.swap(false, Ordering::Relaxed) {
                self.clocks.head_started.store(self.clocks.now(), Ordering::Relaxed);
                self.clocks.started.notify_one();
            }
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        r
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[std::io::IoSlice<'_>]) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
