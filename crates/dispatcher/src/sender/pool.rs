//! The dispatcher's HTTP/1.1 connections: per route (set of egress rules), idle connections kept by scheme and
//! authority, each one opened by the guarded connector and spoken to with the dispatcher's own framing
//! (`sender/h1`). A request's future drives its connection itself: there is no task per connection.
//!
//! Behaviour kept from hyper's clients: origin-form request targets and a `Host` header; a request that a reused
//! connection did not answer (the receiver closed it while idle: the write failed, or the connection ended before
//! any byte of a response) goes once more on a new connection; no redirects, no proxies; idle connections closed
//! after `IDLE_TIMEOUT`, at most `MAX_IDLE_PER_HOST` per host.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use http::uri::{Authority, Scheme};
use http::{HeaderMap, Uri};
use hyper_rustls::HttpsConnector;
use tokio::time::Instant;
use tower::Service;

use super::h1;
use crate::connector::GuardedConnector;

/// Idle connections kept per scheme and authority (beyond it a finished connection is closed).
pub const MAX_IDLE_PER_HOST: usize = 64;
/// An idle connection older than this is closed rather than reused.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
struct Key {
    scheme: Scheme,
    authority: Authority,
}

struct Idle {
    io: h1::Stream,
    since: Instant,
}

/// A response whose head was read; read its body with [`Pool::read_body`].
pub struct Response {
    inner: h1::Response,
    key: Key,
}

impl Response {
    pub fn status(&self) -> http::StatusCode {
        self.inner.status
    }

    pub fn headers(&self) -> &HeaderMap {
        &self.inner.headers
    }
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
    Http(#[source] h1::Error),
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
    /// Drops (so closes) every idle connection that the receiver closed or that is past the idle timeout.
    fn sweep(&mut self, now: Instant) {
        let timeout = self.timeout;
        self.by_key.retain(|_, conns| {
            conns.retain_mut(|c| usable(c, now, timeout));
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

    /// [`Pool::send_method`] with POST.
    #[cfg(test)]
    pub fn send<'a>(
        &'a self,
        uri: &'a Uri,
        headers: HeaderMap,
        body: Bytes,
    ) -> impl std::future::Future<Output = Result<Response, SendError>> + 'a {
        self.send_method(h1::Method::Post, uri, headers, body)
    }

    /// Sends `body` with `headers` to `uri` (absolute; sent in origin form with a `Host` header) on an idle
    /// connection to its authority, or a new one, and reads the response head.
    ///
    /// Not an `async fn`: the head is encoded before the future is made, so the future does not hold the map.
    pub fn send_method<'a>(
        &'a self,
        method: h1::Method,
        uri: &'a Uri,
        headers: HeaderMap,
        body: Bytes,
    ) -> impl std::future::Future<Output = Result<Response, SendError>> + 'a {
        let prepared = key(uri).map(|key| {
            let target = uri.path_and_query().map_or("/", |p| p.as_str());
            let head = h1::encode_method_head(method, target, key.authority.as_str(), &headers, body.len());
            (key, head, h1::asks_close(&headers))
        });
        drop(headers);
        async move {
            let (key, mut head, close) = prepared?;
            let mut body = body;
            let mut reuse = true;
            loop {
                let (mut io, reused) = match reuse.then(|| self.checkout(&key)).flatten() {
                    Some(io) => (io, true),
                    // Boxed: the connector's state is large, and the send step lives as long as the request.
                    None => (Box::pin(self.connect(uri)).await?, false),
                };
                match h1::write_request(&mut io, &head, &body).await {
                    Ok(()) => {}
                    // The receiver closed the kept connection while it was idle: once more, on a new one.
                    Err(e) if reused && e.unanswered() => {
                        reuse = false;
                        continue;
                    }
                    Err(e) => return Err(SendError::Http(e)),
                }
                if !reused {
                    // A new connection's request is never sent again: neither its head nor its body (~1 KiB of a
                    // typical event, one per delivery in flight) is kept while the answer is awaited.
                    head = Vec::new();
                    body = Bytes::new();
                }
                match h1::read_response(io, close).await {
                    Ok(inner) => return Ok(Response { inner, key }),
                    Err(e) if reused && e.unanswered() => reuse = false,
                    Err(e) => return Err(SendError::Http(e)),
                }
            }
        }
    }

    /// Reads the response's body until its end or `cap` bytes, keeping its first `keep` bytes; the connection is
    /// kept for the next request to its host when it can take one. Also how reading the body stopped.
    pub async fn read_body(&self, resp: Response, cap: u64, keep: usize) -> (Vec<u8>, h1::BodyEnd) {
        let read = resp.inner.read_body(cap, keep).await;
        if let Some(io) = read.reusable {
            self.put_back(resp.key, io);
        }
        (read.excerpt, read.end)
    }

    fn put_back(&self, key: Key, io: h1::Stream) {
        let now = Instant::now();
        let mut idle = self.idle.lock().expect("pool lock");
        let timeout = idle.timeout;
        let conns = idle.by_key.entry(key).or_default();
        conns.retain_mut(|c| usable(c, now, timeout));
        if conns.len() < MAX_IDLE_PER_HOST {
            conns.push(Idle { io, since: now });
        }
    }

    /// The most recently used idle connection to `key` that is still open.
    fn checkout(&self, key: &Key) -> Option<h1::Stream> {
        let mut idle = self.idle.lock().expect("pool lock");
        let now = Instant::now();
        let timeout = idle.timeout;
        let conns = idle.by_key.get_mut(key)?;
        let found = loop {
            let Some(mut c) = conns.pop() else { break None };
            if usable(&mut c, now, timeout) {
                break Some(c.io);
            }
        };
        if conns.is_empty() {
            idle.by_key.remove(key);
        }
        found
    }

    async fn connect(&self, uri: &Uri) -> Result<h1::Stream, SendError> {
        let stream = self.connector.clone().call(uri.clone()).await.map_err(SendError::Connect)?;
        Ok(h1::Stream::from_connector(stream))
    }
}

fn usable(c: &mut Idle, now: Instant, timeout: Duration) -> bool {
    now.duration_since(c.since) < timeout && !c.io.closed_while_idle()
}

/// The pool key of an absolute URI.
fn key(uri: &Uri) -> Result<Key, SendError> {
    let scheme = uri.scheme().cloned().ok_or(SendError::Uri("no scheme"))?;
    if scheme != Scheme::HTTP && scheme != Scheme::HTTPS {
        return Err(SendError::Uri("not http or https"));
    }
    let authority = uri.authority().cloned().ok_or(SendError::Uri("no host"))?;
    Ok(Key { scheme, authority })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_keyed_by_scheme_and_authority() {
        let key = key(&"https://hooks.example.com:8443/a/b?x=1".parse().unwrap()).unwrap();
        assert_eq!((key.scheme.as_str(), key.authority.as_str()), ("https", "hooks.example.com:8443"));
        assert!(matches!(super::key(&"/relative".parse().unwrap()), Err(SendError::Uri(_))));
        assert!(matches!(super::key(&"ftp://example.com/".parse().unwrap()), Err(SendError::Uri(_))));
    }

    /// Every waiting delivery holds its stream: a plain connection's should be the socket, not room for TLS.
    #[test]
    fn a_plain_stream_is_small() {
        use hyper_rustls::MaybeHttpsStream;
        use hyper_util::rt::TokioIo;
        let (plain, maybe_tls) =
            (std::mem::size_of::<h1::Stream>(), std::mem::size_of::<MaybeHttpsStream<TokioIo<tokio::net::TcpStream>>>());
        assert!(plain <= 40 && maybe_tls > 256, "plain {plain} bytes, with room for TLS {maybe_tls}");
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
        let settings =
            hookline_core::egress::EgressSettings { allow_ranges: vec!["127.0.0.1/32".into()], allow_http: true, ..Default::default() };
        let guard = Arc::new(hookline_core::egress::EgressGuard::new(&settings, &Default::default()).unwrap());
        let connector = GuardedConnector::new(guard, Arc::new(crate::connector::SystemResolver));
        let pool = Pool::with_idle_timeout(crate::connector::https_connector(connector), Duration::from_millis(200));
        let uri: Uri = format!("http://{addr}/").parse().unwrap();
        let resp = pool.send(&uri, HeaderMap::new(), Bytes::new()).await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(pool.read_body(resp, 1024, 512).await, (Vec::new(), h1::BodyEnd::Complete));
        assert_eq!(pool.idle.lock().unwrap().by_key.values().map(Vec::len).sum::<usize>(), 1, "kept");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while closed.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(closed.load(Ordering::SeqCst), 1, "the receiver saw the idle connection closed");
        assert!(pool.idle.lock().unwrap().by_key.is_empty());
    }

    /// With 10,000 deliveries waiting for their answers, a body kept per request is ~10 MB: on a new connection
    /// (never sent again) it is freed once written.
    #[tokio::test]
    async fn a_new_connections_request_body_is_freed_before_the_answer_comes() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        struct Watched(Vec<u8>, Arc<AtomicBool>);
        impl AsRef<[u8]> for Watched {
            fn as_ref(&self) -> &[u8] {
                &self.0
            }
        }
        impl Drop for Watched {
            fn drop(&mut self) {
                self.1.store(true, Ordering::SeqCst);
            }
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (read_tx, read_rx) = tokio::sync::oneshot::channel::<()>();
        let (answer_tx, answer_rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            // The head and the 5-byte body.
            while buf.windows(4).position(|w| w == b"\r\n\r\n").is_none_or(|i| buf.len() < i + 4 + 5) {
                let n = sock.read(&mut chunk).await.unwrap();
                assert!(n > 0, "the request was cut short");
                buf.extend_from_slice(&chunk[..n]);
            }
            let _ = read_tx.send(());
            let _ = answer_rx.await;
            let _ = sock.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await;
            let _ = sock.read(&mut chunk).await;
        });
        let settings =
            hookline_core::egress::EgressSettings { allow_ranges: vec!["127.0.0.1/32".into()], allow_http: true, ..Default::default() };
        let guard = Arc::new(hookline_core::egress::EgressGuard::new(&settings, &Default::default()).unwrap());
        let pool = Pool::new(crate::connector::https_connector(GuardedConnector::new(guard, Arc::new(crate::connector::SystemResolver))));
        let uri: Uri = format!("http://{addr}/").parse().unwrap();
        let freed = Arc::new(AtomicBool::new(false));
        let send = pool.send(&uri, HeaderMap::new(), Bytes::from_owner(Watched(b"hello".to_vec(), freed.clone())));
        tokio::pin!(send);
        tokio::select! {
            r = &mut send => panic!("answered before the server let it: {:?}", r.map(|r| r.status())),
            r = read_rx => r.expect("the server read the request"),
        }
        assert!(freed.load(Ordering::SeqCst), "the body is still held while the answer is awaited");
        answer_tx.send(()).unwrap();
        assert_eq!(send.await.unwrap().status(), 200);
    }

    /// A CA and a leaf for 127.0.0.1, made with the `openssl` command: (CA PEM, leaf PEM, leaf key PEM).
    fn test_pki() -> (Vec<u8>, Vec<u8>, Vec<u8>) {
        let dir = std::env::temp_dir().join(format!("hookline-pool-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let run = |args: &[&str]| {
            let out = std::process::Command::new("openssl").args(args).current_dir(&dir).output().expect("the openssl command");
            assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
        let mut ca = vec!["req", "-x509", "-days", "2", "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=hookline pool test ca"];
        ca.extend(ec);
        ca.extend(["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"]);
        run(&ca);
        std::fs::write(
            dir.join("leaf.ext"),
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1\n",
        )
        .unwrap();
        let mut leaf = vec!["req", "-keyout", "leaf.key", "-out", "leaf.csr", "-subj", "/CN=leaf"];
        leaf.extend(ec);
        run(&leaf);
        run(&[
            "x509",
            "-req",
            "-in",
            "leaf.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            "leaf.pem",
            "-extfile",
            "leaf.ext",
        ]);
        let read = |f: &str| std::fs::read(dir.join(f)).unwrap();
        let pki = (read("ca.pem"), read("leaf.pem"), read("leaf.key"));
        let _ = std::fs::remove_dir_all(&dir);
        pki
    }

    /// Over TLS (the connector's rustls stream, unwrapped from hyper's adapters): requests and responses go
    /// through, and a kept-alive connection takes the next request without a new handshake.
    #[tokio::test]
    async fn tls_connections_are_spoken_to_and_reused() {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (ca, leaf, key) = test_pki();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&leaf).map(Result::unwrap).collect();
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, PrivateKeyDer::from_pem_slice(&key).unwrap())
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let handshakes = Arc::new(AtomicUsize::new(0));
        let h = handshakes.clone();
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let Ok(mut tls) = acceptor.accept(sock).await else { continue };
                h.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        // Each request is a head and a 5-byte body.
                        while buf.windows(4).position(|w| w == b"\r\n\r\n").is_none_or(|i| buf.len() < i + 4 + 5) {
                            match tls.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        }
                        let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4 + 5;
                        let body = buf[end - 5..end].to_vec();
                        buf.drain(..end);
                        let reply = [&b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\n"[..], &body, b"\r\n0\r\n\r\n"].concat();
                        if tls.write_all(&reply).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(&ca) {
            roots.add(c.unwrap()).unwrap();
        }
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let settings = hookline_core::egress::EgressSettings { allow_ranges: vec!["127.0.0.1/32".into()], ..Default::default() };
        let guard = Arc::new(hookline_core::egress::EgressGuard::new(&settings, &Default::default()).unwrap());
        let connector = GuardedConnector::new(guard, Arc::new(crate::connector::SystemResolver));
        let https =
            hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(client).https_only().enable_http1().wrap_connector(connector);
        let pool = Pool::new(https);
        let uri: Uri = format!("https://{addr}/hook").parse().unwrap();
        for body in ["hello", "again"] {
            let resp = pool.send(&uri, HeaderMap::new(), Bytes::from_static(body.as_bytes())).await.unwrap();
            assert_eq!(resp.status(), 200);
            assert_eq!(pool.read_body(resp, 1024, 512).await, (body.as_bytes().to_vec(), h1::BodyEnd::Complete));
        }
        assert_eq!(handshakes.load(Ordering::SeqCst), 1, "the second request went on the kept TLS connection");
    }
}
