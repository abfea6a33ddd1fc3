//! The egress-guarded connector: every connection hookline opens to a webhook endpoint goes through here.
//!
//! For each new connection it parses the destination with the guard, resolves the name (IP literals are not
//! resolved but still judged), refuses if ANY resolved address is non-public, and connects only to an address
//! it has just checked — there is no second resolution between check and connect, so DNS rebinding cannot
//! slip a private address in. [`precheck`] runs the same judgement before every attempt, because a pooled
//! connection skips the connector.
//!
//! Redirects and proxies: neither the sender's client (`sender/pool.rs` over `sender/h1`) nor hyper-util's
//! legacy client (the tests') follows redirects (a 3xx is just a response) or reads
//! `HTTP_PROXY`/`HTTPS_PROXY`/`NO_PROXY`; this connector opens a direct TCP connection and nothing else. Both are
//! pinned by tests in `tests/egress_connector.rs`.

pub mod dns;

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use hookline_core::egress::{EgressGuard, Refusal, Target, TargetHost};
use http::Uri;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Name resolution, swappable so tests can play DNS tricks.
pub trait Resolve: Send + Sync + 'static {
    /// The addresses `host` resolves to. `port` is passed for resolvers that want it (SRV-less system
    /// resolution ignores it).
    fn resolve(&self, host: &str, port: u16) -> BoxFuture<'static, io::Result<Vec<IpAddr>>>;

    /// [`Resolve::resolve`], with how long the answer may be kept when the resolver knows it (DNS answers carry
    /// a TTL; `getaddrinfo` reports none, hence `None` by default). The cache ([`dns`]) keeps an answer for at
    /// most this long.
    fn resolve_with_ttl(&self, host: &str, port: u16) -> BoxFuture<'static, io::Result<(Vec<IpAddr>, Option<Duration>)>> {
        let answer = self.resolve(host, port);
        Box::pin(async move { answer.await.map(|addrs| (addrs, None)) })
    }
}

/// The operating system's resolver (`getaddrinfo` through tokio), addresses deduplicated in its order.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(&self, host: &str, port: u16) -> BoxFuture<'static, io::Result<Vec<IpAddr>>> {
        let host = host.to_owned();
        Box::pin(async move {
            let mut out: Vec<IpAddr> = Vec::new();
            for sa in tokio::net::lookup_host((host.as_str(), port)).await? {
                if !out.contains(&sa.ip()) {
                    out.push(sa.ip());
                }
            }
            Ok(out)
        })
    }
}

/// Why the connector did not return a connection.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The guard refused the destination; the sender records it as `egress_refused` / `invalid_url`.
    #[error("egress refused: {0}")]
    Refused(Refusal),
    #[error("DNS resolution of {host} failed: {source}")]
    Resolve { host: String, source: io::Error },
    /// Every checked address failed; the error of the last one.
    #[error("connecting to {addr} failed: {source}")]
    Connect { addr: SocketAddr, source: io::Error },
    #[error("connecting to {addr} timed out after {timeout:?}")]
    ConnectTimeout { addr: SocketAddr, timeout: Duration },
}

/// A hyper connector that only connects where the [`EgressGuard`] allows.
#[derive(Clone)]
pub struct GuardedConnector {
    guard: Arc<EgressGuard>,
    resolver: Arc<dyn Resolve>,
    connect_timeout: Option<Duration>,
}

impl GuardedConnector {
    pub fn new(guard: Arc<EgressGuard>, resolver: Arc<dyn Resolve>) -> Self {
        Self { guard, resolver, connect_timeout: None }
    }

    /// Bounds each address's TCP connect, so a black-holed first address leaves time for the next one.
    /// Off by default: the sender's per-attempt deadline bounds the whole exchange anyway.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    pub fn guard(&self) -> &Arc<EgressGuard> {
        &self.guard
    }

    async fn connect(self, dst: Uri) -> Result<TokioIo<TcpStream>, ConnectError> {
        // Judge the URI as the URL parser reads it; the sender built it from a checked URL already, and this
        // catches any request that was not.
        let target = self.guard.check_url(&dst.to_string()).map_err(ConnectError::Refused)?;
        let addrs = resolve_target(self.resolver.as_ref(), &target)
            .await
            .map_err(|source| ConnectError::Resolve { host: target.host.to_string(), source })?;
        self.guard.check_resolved(&target, &addrs).map_err(ConnectError::Refused)?;

        let mut last = None;
        for ip in addrs {
            // An IPv4-mapped address is dialled as the IPv4 address it is (the guard judged it as such).
            let addr = SocketAddr::new(ip.to_canonical(), target.port);
            let attempt = TcpStream::connect(addr);
            let result = match self.connect_timeout {
                None => attempt.await,
                Some(t) => match tokio::time::timeout(t, attempt).await {
                    Ok(r) => r,
                    Err(_) => {
                        last = Some(ConnectError::ConnectTimeout { addr, timeout: t });
                        continue;
                    }
                },
            };
            match result {
                Ok(stream) => {
                    // Webhook requests are small writes followed by a wait for the answer: no Nagle delay.
                    stream.set_nodelay(true).map_err(|source| ConnectError::Connect { addr, source })?;
                    return Ok(TokioIo::new(stream));
                }
                Err(source) => last = Some(ConnectError::Connect { addr, source }),
            }
        }
        // `check_resolved` refuses an empty list, so there was at least one address.
        Err(last.unwrap_or_else(|| {
            ConnectError::Refused(Refusal {
                kind: hookline_core::egress::RefusalKind::EgressRefused,
                reason: format!("{} resolved to no addresses", target.host),
            })
        }))
    }
}

impl tower::Service<Uri> for GuardedConnector {
    type Response = TokioIo<TcpStream>;
    type Error = ConnectError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        Box::pin(self.clone().connect(dst))
    }
}

/// The refusal somewhere in an error's `source()` chain (a hyper client error wrapping the connector's), so
/// the sender can record `egress_refused` / `invalid_url` with its reason rather than `connect_error`.
pub fn refusal_in(err: &(dyn std::error::Error + 'static)) -> Option<Refusal> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(ConnectError::Refused(r)) = e.downcast_ref::<ConnectError>() {
            return Some(r.clone());
        }
        if let Some(r) = e.downcast_ref::<Refusal>() {
            return Some(r.clone());
        }
        // `io::Error::source()` skips the error it wraps; look inside it explicitly.
        if let Some(inner) = e.downcast_ref::<io::Error>().and_then(|io| io.get_ref()) {
            if let Some(r) = refusal_in(inner) {
                return Some(r);
            }
        }
        cur = e.source();
    }
    None
}

/// Why [`precheck`] stopped an attempt: a refusal (`egress_refused` / `invalid_url`), or a DNS failure, which
/// is an ordinary `connect_error` (transient, retried by policy).
#[derive(Debug, thiserror::Error)]
pub enum PrecheckError {
    #[error("egress refused: {0}")]
    Refused(Refusal),
    #[error("DNS resolution failed: {0}")]
    Resolve(io::Error),
}

/// The addresses a target stands for: an IP literal is itself; a name is resolved now.
pub async fn resolve_target(resolver: &dyn Resolve, target: &Target) -> io::Result<Vec<IpAddr>> {
    match &target.host {
        TargetHost::Ip(ip) => Ok(vec![*ip]),
        TargetHost::Name(name) => resolver.resolve(name, target.port).await,
    }
}

/// What the sender runs before EVERY attempt, even when a pooled connection to the host exists: parse and
/// judge the URL, resolve the host, judge every address. The connection itself is checked again by
/// [`GuardedConnector`]. Send the request to `target.url`, the parsed form of `url`.
pub async fn precheck(guard: &EgressGuard, resolver: &dyn Resolve, url: &str) -> Result<(Target, Vec<IpAddr>), PrecheckError> {
    let target = guard.check_url(url).map_err(PrecheckError::Refused)?;
    let addrs = precheck_target(guard, resolver, &target).await?;
    Ok((target, addrs))
}

/// [`precheck`] for a target whose URL the guard already judged (a send plan's): resolve the host and judge
/// every address, as before every attempt.
pub async fn precheck_target(guard: &EgressGuard, resolver: &dyn Resolve, target: &Target) -> Result<Vec<IpAddr>, PrecheckError> {
    let addrs = resolve_target(resolver, target).await.map_err(PrecheckError::Resolve)?;
    guard.check_resolved(target, &addrs).map_err(PrecheckError::Refused)?;
    Ok(addrs)
}

/// Wraps the guarded connector in TLS: rustls with the `ring` provider passed explicitly (no reliance on a
/// process-wide default provider), Mozilla's roots from `webpki-roots`, HTTP/1.1. Plain `http` URLs pass
/// through untouched; whether they are allowed is the guard's decision.
pub fn https_connector(connector: GuardedConnector) -> HttpsConnector<GuardedConnector> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    HttpsConnectorBuilder::new()
        .with_provider_and_webpki_roots(provider)
        // Fails only if the provider supports none of rustls' default protocol versions; ring supports both.
        .expect("the ring provider supports TLS 1.2 and 1.3")
        .https_or_http()
        .enable_http1()
        .wrap_connector(connector)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hookline_core::egress::{EgressSettings, RefusalKind};
    use hookline_core::policy::EgressRules;

    struct Fixed(Vec<IpAddr>);

    impl Resolve for Fixed {
        fn resolve(&self, _host: &str, _port: u16) -> BoxFuture<'static, io::Result<Vec<IpAddr>>> {
            let v = self.0.clone();
            Box::pin(async move { Ok(v) })
        }
    }

    struct Failing;

    impl Resolve for Failing {
        fn resolve(&self, host: &str, _port: u16) -> BoxFuture<'static, io::Result<Vec<IpAddr>>> {
            let msg = format!("no such host {host}");
            Box::pin(async move { Err(io::Error::new(io::ErrorKind::NotFound, msg)) })
        }
    }

    fn guard() -> EgressGuard {
        EgressGuard::new(&EgressSettings::default(), &EgressRules::default()).unwrap()
    }

    #[tokio::test]
    async fn precheck_tells_refusal_from_dns_failure() {
        let g = guard();
        let ok = precheck(&g, &Fixed(vec!["93.184.216.34".parse().unwrap()]), "https://hooks.example.com/x").await.unwrap();
        assert_eq!(ok.1, vec!["93.184.216.34".parse::<IpAddr>().unwrap()]);
        assert_eq!(ok.0.url.as_str(), "https://hooks.example.com/x");

        match precheck(&g, &Failing, "https://hooks.example.com/").await {
            Err(PrecheckError::Resolve(e)) => assert_eq!(e.kind(), io::ErrorKind::NotFound),
            other => panic!("{other:?}"),
        }
        let both = Fixed(vec!["93.184.216.34".parse().unwrap(), "10.0.0.7".parse().unwrap()]);
        match precheck(&g, &both, "https://hooks.example.com/").await {
            Err(PrecheckError::Refused(r)) => {
                assert_eq!(r.kind, RefusalKind::EgressRefused);
                assert!(r.reason.ends_with("10.0.0.7 is private (RFC 1918)"), "{}", r.reason);
            }
            other => panic!("{other:?}"),
        }
        // IP literals are never handed to the resolver.
        precheck(&g, &Failing, "https://93.184.216.34/").await.unwrap();
        match precheck(&g, &Failing, "https://0x7f.1/").await {
            Err(PrecheckError::Refused(r)) => assert_eq!(r.reason, "127.0.0.1 is loopback"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn refusal_found_through_wrappers() {
        let r = Refusal { kind: RefusalKind::EgressRefused, reason: "10.0.0.7 is private (RFC 1918)".into() };
        let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(ConnectError::Refused(r.clone()));
        assert_eq!(refusal_in(boxed.as_ref()), Some(r.clone()));
        let io = io::Error::other(ConnectError::Refused(r.clone()));
        assert_eq!(refusal_in(&io), Some(r));
        let plain = io::Error::other("connection refused");
        assert_eq!(refusal_in(&plain), None);
    }

    #[test]
    fn https_connector_builds_without_a_process_default_provider() {
        let c = GuardedConnector::new(Arc::new(guard()), Arc::new(SystemResolver));
        let _ = https_connector(c);
    }
}
