//! The one HTTP server every hookline listener uses (the ingest API and the health servers): HTTP/1.1 with a
//! header-read timeout, an idle timeout and a connection cap, so slow or idle clients cannot tie it up.
//!
//! - `header_read_timeout_ms`: a connection must deliver a request's complete headers within this long of opening,
//!   or of its previous response; otherwise it is closed. This also ends a keep-alive connection that sits idle
//!   between requests (hyper's header timer runs while it waits for the next request).
//! - `idle_timeout_ms`: a connection on which no byte moves either way for this long is closed, whatever it is doing
//!   (a stalled request body, a client that stops reading its response). It must exceed the slowest handler.
//! - `max_connections`: past the cap the server stops accepting; new connections wait in the kernel's listen
//!   backlog until one closes (each is bounded by the two timeouts), so a flood delays clients but cannot use up the
//!   process's file descriptors, which Kafka needs too.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Limits of one HTTP listener (`[ingest.http]`, `[dispatcher.health_http]`, `[retry_scheduler.health_http]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpServerSettings {
    /// From a connection's opening (or its previous response) to the end of the request's headers.
    pub header_read_timeout_ms: u64,
    /// No byte read or written for this long closes the connection.
    pub idle_timeout_ms: u64,
    /// Connections served at once; further ones wait in the listen backlog.
    pub max_connections: usize,
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
        Ok(())
    }
}

impl Default for HttpServerSettings {
    /// The same for every listener. The idle timeout outlasts the slowest handler: a replay may read Kafka for
    /// 60 s before it answers.
    fn default() -> Self {
        Self { header_read_timeout_ms: 10_000, idle_timeout_ms: 90_000, max_connections: 512 }
    }
}

/// Serves `app` on `listener` until `shutdown`, then lets the open connections finish their requests (idle ones
/// close at once) and returns when all are closed.
pub async fn serve(listener: TcpListener, app: Router, settings: HttpServerSettings, shutdown: CancellationToken) {
    let max = settings.max_connections.clamp(1, Semaphore::MAX_PERMITS);
    let permits = Arc::new(Semaphore::new(max));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(settings.header_read_timeout_ms.max(1)))
        .keep_alive(true);
    let builder = Arc::new(builder);
    let idle = Duration::from_millis(settings.idle_timeout_ms.max(1));
    loop {
        // A permit before accepting: past the cap, connections wait in the backlog rather than take descriptors.
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = shutdown.cancelled() => break,
        };
        let (stream, _peer) = tokio::select! {
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
        let _ = stream.set_nodelay(true);
        let (builder, app, shutdown) = (builder.clone(), app.clone(), shutdown.clone());
        tokio::spawn(async move {
            serve_connection(&builder, stream, app, idle, shutdown).await;
            drop(permit);
        });
    }
    drop(listener);
    // Every connection holds a permit until it is closed: all of them back means all are closed.
    let _ = permits.acquire_many(u32::try_from(max).unwrap_or(u32::MAX)).await;
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

async fn serve_connection(
    builder: &hyper::server::conn::http1::Builder,
    stream: TcpStream,
    app: Router,
    idle: Duration,
    shutdown: CancellationToken,
) {
    let origin = Instant::now();
    let last = Arc::new(AtomicU64::new(0));
    let io = Watched { io: stream, origin, last: last.clone() };
    let conn = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(app));
    tokio::pin!(conn);
    let mut draining = false;
    loop {
        let quiet_since = origin + Duration::from_millis(last.load(Ordering::Relaxed));
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "HTTP connection ended with an error");
                }
                return;
            }
            _ = shutdown.cancelled(), if !draining => {
                conn.as_mut().graceful_shutdown();
                draining = true;
            }
            _ = tokio::time::sleep_until(quiet_since + idle) => {
                // Bytes may have moved since `quiet_since` was read; only a full quiet period closes.
                if Instant::now().saturating_duration_since(origin + Duration::from_millis(last.load(Ordering::Relaxed))) >= idle {
                    tracing::debug!("closing an HTTP connection idle for {idle:?}");
                    return;
                }
            }
        }
    }
}

/// A stream that notes when a byte last moved (milliseconds after `origin`).
struct Watched {
    io: TcpStream,
    origin: Instant,
    last: Arc<AtomicU64>,
}

impl Watched {
    fn touch(&self) {
        let ms = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(ms, Ordering::Relaxed);
    }
}

impl AsyncRead for Watched {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.touch();
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

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
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
