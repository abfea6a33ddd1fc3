//! The dispatcher's HTTP/1.1 client: per route (set of egress rules), idle connections kept by scheme and
//! authority, each connection one hyper `client::conn::http1` handshake over the guarded connector.
//!
//! Why not hyper-util's legacy `Client`: with 10,000 deliveries in flight there are 10,000 connections, and each
//! request there costs a boxed response future (~2.6 KB, its pool checkout and connect state inlined) on top of
//! the connection itself. Here a request is the connection's `send_request` future, inlined in the send step,
//! and a connection's task holds the plain TCP stream inline (a TLS stream is boxed: it is much larger).
//!
//! Behaviour kept from the legacy client: origin-form request targets and a `Host` header; a request that a
//! reused connection never sent (the receiver closed it while idle) goes once more on a new connection; no
//! redirects, no proxies; idle connections closed after `IDLE_TIMEOUT`, at most `MAX_IDLE_PER_HOST` per host.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, Uri};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_rustls::{HttpsConnector, MaybeHttpsStream};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tower::Service;

use crate::connector::GuardedConnector;

/// Idle connections kept per scheme and authority (beyond it a finished connection is closed).
pub const MAX_IDLE_PER_HOST: usize = 64;
/// An idle connection older than this is closed rather than reused.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest response head (and body chunk buffered) hyper reads before failing the try as `connect_error`
/// ("message head is too large"): 64 KiB, where hyper's default is ~400 KiB per connection. The attempt record
/// keeps 4 KiB of response headers at most.
pub const MAX_BUF_BYTES: usize = 64 * 1024;

type Body = Full<Bytes>;

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
struct Key {
    scheme: Scheme,
    authority: Authority,
}

struct Idle {
    tx: SendRequest<Body>,
    since: Instant,
}

/// A connection whose response is being read. Give it back with [`Pool::put_back`] once the body was read to
/// its end; dropped, it closes the connection.
pub struct Lease {
    key: Key,
    tx: SendRequest<Body>,
}

/// Why a request got no response.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// Not an absolute `http`/`https` URI (the sender sends only URLs the guard parsed, so this is a bug guard).
    #[error("invalid request: {0}")]
    Uri(&'static str),
    /// The connector failed (refused by the egress guard, DNS, TCP, TLS): the cause is the source.
    #[error("could not connect")]
    Connect(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("request failed")]
    Http(#[source] hyper::Error),
}

pub struct Pool {
    connector: HttpsConnector<GuardedConnector>,
    idle: Arc<Mutex<Idles>>,
}

struct Idles {
    by_key: HashMap<Key, Vec<Idle>>,
    timeout: Duration,
}

impl Idles {
    /// Drops (so closes) every idle connection that is closed or past the idle timeout.
    fn sweep(&mut self, now: Instant) {
        let timeout = self.timeout;
        self.by_key.retain(|_, conns| {
            conns.retain(|c| usable(c, now, timeout));
            !conns.is_empty()
        });
    }
}

/// Closes expired idle connections every idle timeout, also when no request comes (a burst to many hosts then
/// silence must not keep their connections open); ends with its pool.
async fn reap(idle: Weak<Mutex<Idles>>, every: Duration) {
    let mut tick = tokio::time::interval_at(Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(idle) = idle.upgrade() else { return };
        idle.lock().expect("pool lock").sweep(Instant::now());
    }
}

impl Pool {
    pub fn new(connector: HttpsConnector<GuardedConnector>) -> Self {
        Self::with_idle_timeout(connector, IDLE_TIMEOUT)
    }

    pub fn with_idle_timeout(connector: HttpsConnector<GuardedConnector>, timeout: Duration) -> Self {
        let idle = Arc::new(Mutex::new(Idles { by_key: HashMap::new(), timeout }));
        // Routes are made by sends, on the runtime; outside one (a unit test's plain constructor) nothing is idle yet.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(reap(Arc::downgrade(&idle), timeout));
        }
        Self { connector, idle }
    }

    /// Sends `req` (an absolute URI; its target is sent in origin form with a `Host` header) on an idle
    /// connection to its authority, or a new one.
    pub async fn send(&self, mut req: Request<Body>) -> Result<(Response<Incoming>, Lease), SendError> {
        let uri = std::mem::take(req.uri_mut());
        let (key, origin) = split(&uri)?;
        if !req.headers().contains_key(http::header::HOST) {
            let host = http::HeaderValue::from_str(key.authority.as_str()).map_err(|_| SendError::Uri("the authority is not a valid Host header"))?;
            req.headers_mut().insert(http::header::HOST, host);
        }
        *req.uri_mut() = origin;
        // A reused connection may have been closed by the receiver while idle; the request, unsent, goes again on
        // the next one (or a new one). A new connection's failure is the try's.
        loop {
            let (mut tx, reused) = match self.checkout(&key).await {
                Some(tx) => (tx, true),
                // Boxed: the handshake's state is large, and the send step lives as long as the request.
                None => (Box::pin(self.connect(&uri)).await?, false),
            };
            match tx.try_send_request(req).await {
                Ok(resp) => return Ok((resp, Lease { key, tx })),
                Err(mut e) => match e.take_message() {
                    Some(unsent) if reused => req = unsent,
                    _ => return Err(SendError::Http(e.into_error())),
                },
            }
        }
    }

    /// Keeps a connection whose response was read to its end, for the next request to its host.
    pub fn put_back(&self, lease: Lease) {
        if lease.tx.is_closed() {
            return;
        }
        let now = Instant::now();
        let mut idle = self.idle.lock().expect("pool lock");
        let timeout = idle.timeout;
        let conns = idle.by_key.entry(lease.key).or_default();
        conns.retain(|c| usable(c, now, timeout));
        if conns.len() < MAX_IDLE_PER_HOST {
            conns.push(Idle { tx: lease.tx, since: now });
        }
    }

    /// The most recently used idle connection to `key` that is still open, ready for a request.
    async fn checkout(&self, key: &Key) -> Option<SendRequest<Body>> {
        loop {
            let candidate = {
                let mut idle = self.idle.lock().expect("pool lock");
                let now = Instant::now();
                let timeout = idle.timeout;
                let conns = idle.by_key.get_mut(key)?;
                let found = loop {
                    match conns.pop() {
                        Some(c) if usable(&c, now, timeout) => break Some(c.tx),
                        Some(_) => continue,
                        None => break None,
                    }
                };
                if conns.is_empty() {
                    idle.by_key.remove(key);
                }
                found?
            };
            let mut tx = candidate;
            // Put back right after its response ended, a connection may not have taken up its next request yet;
            // it does at once, or turns out closed.
            if tx.is_ready() || tx.ready().await.is_ok() {
                return Some(tx);
            }
        }
    }

    async fn connect(&self, uri: &Uri) -> Result<SendRequest<Body>, SendError> {
        let stream = self.connector.clone().call(uri.clone()).await.map_err(SendError::Connect)?;
        let io = match stream {
            MaybeHttpsStream::Http(tcp) => Stream::Plain(tcp),
            tls => Stream::Tls(Box::new(tls)),
        };
        let (tx, conn) = http1::Builder::new().max_buf_size(MAX_BUF_BYTES).handshake(io).await.map_err(SendError::Http)?;
        // Ends when the connection closes: the receiver closed it, a try timed out during its exchange, or the
        // pool dropped its last handle.
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(tx)
    }
}

fn usable(c: &Idle, now: Instant, timeout: Duration) -> bool {
    !c.tx.is_closed() && now.duration_since(c.since) < timeout
}

/// The pool key and the origin-form target (`/path?query`) of an absolute URI.
fn split(uri: &Uri) -> Result<(Key, Uri), SendError> {
    let scheme = uri.scheme().cloned().ok_or(SendError::Uri("no scheme"))?;
    if scheme != Scheme::HTTP && scheme != Scheme::HTTPS {
        return Err(SendError::Uri("not http or https"));
    }
    let authority = uri.authority().cloned().ok_or(SendError::Uri("no host"))?;
    let path = uri.path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/"));
    let origin = Uri::from(path);
    Ok((Key { scheme, authority }, origin))
}

type TlsStream = MaybeHttpsStream<TokioIo<TcpStream>>;

/// A connection's transport: plain TCP inline, TLS boxed (rustls' connection state is much larger than a socket,
/// and every connection's task holds its stream).
enum Stream {
    Plain(TokioIo<TcpStream>),
    Tls(Box<TlsStream>),
}

impl hyper::rt::Read for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: hyper::rt::ReadBufCursor<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl hyper::rt::Write for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_go_in_origin_form_keyed_by_scheme_and_authority() {
        let (key, origin) = split(&"https://hooks.example.com:8443/a/b?x=1".parse().unwrap()).unwrap();
        assert_eq!((key.scheme.as_str(), key.authority.as_str(), origin.to_string().as_str()), ("https", "hooks.example.com:8443", "/a/b?x=1"));
        let (_, origin) = split(&"http://[::1]:8080".parse().unwrap()).unwrap();
        assert_eq!(origin.to_string(), "/");
        assert!(matches!(split(&"/relative".parse().unwrap()), Err(SendError::Uri(_))));
        assert!(matches!(split(&"ftp://example.com/".parse().unwrap()), Err(SendError::Uri(_))));
    }

    /// Every connection's task holds its stream: a plain connection's should be the socket, not room for TLS.
    #[test]
    fn a_plain_stream_is_small() {
        let (plain, maybe_tls) = (std::mem::size_of::<Stream>(), std::mem::size_of::<MaybeHttpsStream<TokioIo<TcpStream>>>());
        assert!(plain <= 48 && maybe_tls > 256, "plain {plain} bytes, with room for TLS {maybe_tls}");
    }

    /// An idle connection is closed once it is past the idle timeout, even if no request comes to sweep it.
    #[tokio::test]
    async fn idle_connections_are_closed_after_the_timeout_without_traffic() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let closed = Arc::new(AtomicUsize::new(0));
        let c = closed.clone();
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let c = c.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    // The test sends one bodiless request: answer it, then wait for the client to close.
                    let _ = sock.read(&mut buf).await;
                    let _ = sock.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await;
                    while let Ok(n) = sock.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                    }
                    c.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        let settings = hookline_core::egress::EgressSettings { allow_ranges: vec!["127.0.0.1/32".into()], allow_http: true, ..Default::default() };
        let guard = Arc::new(hookline_core::egress::EgressGuard::new(&settings, &Default::default()).unwrap());
        let connector = GuardedConnector::new(guard, Arc::new(crate::connector::SystemResolver));
        let pool = Pool::with_idle_timeout(crate::connector::https_connector(connector), Duration::from_millis(200));
        let mut req = Request::new(Full::new(Bytes::new()));
        *req.uri_mut() = format!("http://{addr}/").parse().unwrap();
        let (resp, lease) = pool.send(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        pool.put_back(lease);
        assert_eq!(pool.idle.lock().unwrap().by_key.values().map(Vec::len).sum::<usize>(), 1, "kept");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while closed.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(closed.load(Ordering::SeqCst), 1, "the receiver saw the idle connection closed");
        assert!(pool.idle.lock().unwrap().by_key.is_empty());
    }
}
