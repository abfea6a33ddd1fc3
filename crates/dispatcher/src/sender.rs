//! One HTTP try: egress check, connect (through the guarded connector), POST, read at most the response cap,
//! all under the policy's single deadline. Never follows redirects, never uses a proxy.

mod h1;
mod plan;
mod pool;
#[cfg(test)]
mod test_server;
#[cfg(test)]
mod wire_tests;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hookline_core::egress::{EgressGuard, EgressSettings};
use hookline_core::model::Header;
use hookline_core::policy::Policy;
use hookline_core::Outcome;
use hookline_kafka::state::SubscriptionEntry;

use crate::connector::{self, GuardedConnector, PrecheckError, Resolve};

pub use plan::SendPlan;

/// What one try produced, for the engine and the attempt log.
#[derive(Debug, Clone)]
pub struct TryResult {
    pub outcome: Outcome,
    /// "HTTP 503", "Timed out after 10 s", "egress refused: 10.0.0.7 is private (RFC 1918)".
    pub reason: String,
    pub response_excerpt: String,
    pub duration: Duration,
    /// The request's headers as the attempt record keeps them (secrets redacted); empty unless the try was sent
    /// with [`Sender::send_recorded`].
    pub request_headers: Vec<Header>,
    /// The response's headers (secrets redacted), at most [`RESPONSE_HEADERS_MAX`] and
    /// [`RESPONSE_HEADER_BYTES_MAX`] bytes of names and values; empty without a response.
    pub response_headers: Vec<Header>,
}

/// Bytes of the response kept for the delivery log.
const EXCERPT_BYTES: usize = 512;
/// Most response headers kept for the delivery log, and the most bytes of names and values (the rest left out).
pub const RESPONSE_HEADERS_MAX: usize = 32;
pub const RESPONSE_HEADER_BYTES_MAX: usize = 4096;

struct Route {
    guard: Arc<EgressGuard>,
    pool: pool::Pool,
}

pub struct Sender {
    settings: EgressSettings,
    resolver: Arc<dyn Resolve>,
    /// One guard and connection pool per distinct set of egress rules. Looked up when a plan is made (and by the
    /// unplanned sends), not per attempt.
    routes: Mutex<HashMap<String, Arc<Route>>>,
    /// The send plan of each subscription sent to (see `sender/plan.rs`).
    plans: plan::Plans,
}

impl Sender {
    /// `resolver` is put behind the DNS cache that `settings` describes (`egress.dns_cache_ttl_s`); the guard
    /// judges its answers on every attempt and every connect all the same.
    pub fn new(settings: EgressSettings, resolver: Arc<dyn Resolve>) -> Self {
        let resolver = crate::connector::dns::cached(resolver, &settings);
        Self { settings, resolver, routes: Mutex::new(HashMap::new()), plans: Default::default() }
    }

    /// The send plan for this version of the subscription (`policy` is its parsed policy): the one kept, or a new
    /// one when the subscription is new to this process or changed since (URL, policy, headers, secrets).
    pub fn plan(&self, entry: &Arc<SubscriptionEntry>, policy: &Policy) -> Arc<SendPlan> {
        self.plans.get_or_build(entry, || SendPlan::build(entry, policy, self.route(&entry.egress_key, policy)))
    }

    /// Keeps the plans of the subscriptions `live` accepts (the others were deleted); returns how many were dropped.
    pub fn retain_plans(&self, live: impl Fn(&str) -> bool) -> usize {
        self.plans.retain(live)
    }

    /// How many plans are kept.
    pub fn plans_kept(&self) -> usize {
        self.plans.len()
    }

    /// Keeps the routes (guard + connection pool) whose egress rules a live subscription still uses; returns how
    /// many were dropped (their idle connections close with them).
    pub fn retain_routes(&self, live: impl Fn(&str) -> bool) -> usize {
        let mut routes = self.routes.lock().expect("routes lock");
        let before = routes.len();
        routes.retain(|key, _| live(key));
        before - routes.len()
    }

    fn route(&self, egress_key: &str, policy: &Policy) -> Result<Arc<Route>, String> {
        let mut routes = self.routes.lock().expect("routes lock");
        if let Some(r) = routes.get(egress_key) {
            return Ok(r.clone());
        }
        let guard = Arc::new(EgressGuard::new(&self.settings, &policy.egress).map_err(|e| e.to_string())?);
        let connector = GuardedConnector::new(guard.clone(), self.resolver.clone());
        let route = Arc::new(Route { guard, pool: pool::Pool::new(connector::https_connector(connector)) });
        routes.insert(egress_key.to_owned(), route.clone());
        Ok(route)
    }

    /// Sends one POST. `headers` and `body` were built by `hookline_core::request`.
    pub async fn send(
        &self,
        egress_key: &str,
        policy: &Policy,
        url: &str,
        headers: &hookline_core::request::AttemptHeaders,
        body: Bytes,
    ) -> TryResult {
        let map = header_map(headers.iter().map(|(k, v)| (k, http::HeaderValue::from_str(v))), 0);
        self.send_with(egress_key, policy, url, map, Vec::new(), body).await
    }

    /// [`Sender::send`], taking the headers: their values become the request's without being copied, and nothing
    /// of them stays behind while the request is out. `custom` (the subscription's own headers, prepared when it
    /// was loaded) follow the platform's; their names never collide with those (checked on save and on load).
    pub async fn send_owned(
        &self,
        egress_key: &str,
        policy: &Policy,
        url: &str,
        headers: hookline_core::request::AttemptHeaders,
        custom: &[(http::HeaderName, http::HeaderValue)],
        body: Bytes,
    ) -> TryResult {
        let map =
            header_map(headers.into_vec().into_iter().map(|(k, v)| (k, http::HeaderValue::try_from(v))), custom.len()).map(|mut m| {
                for (name, value) in custom {
                    // Cheap clones: both share the bytes prepared on load.
                    m.append(name.clone(), value.clone());
                }
                m
            });
        self.send_with(egress_key, policy, url, map, Vec::new(), body).await
    }

    /// [`Sender::send_owned`], also keeping the headers for the attempt record: each value's buffer is shared
    /// between the request and the record (no copy), a secret's value is never kept, and `logged_custom` (the
    /// custom headers as records keep them, made when the subscription was loaded) is appended as is.
    #[allow(clippy::too_many_arguments)]
    pub async fn send_recorded(
        &self,
        egress_key: &str,
        policy: &Policy,
        url: &str,
        headers: hookline_core::request::AttemptHeaders,
        custom: &[(http::HeaderName, http::HeaderValue)],
        logged_custom: &[Header],
        body: Bytes,
    ) -> TryResult {
        self.recorded(h1::Method::Post, egress_key, policy, url, headers, custom, logged_custom, body).await
    }

    /// The CloudEvents validation handshake: an `OPTIONS` to `url` with `headers` then `custom`, without a body,
    /// through the same egress guard, connector and deadline as a delivery. The result keeps the response's
    /// `WebHook-*` headers (the grant), whatever else the receiver sent.
    pub async fn send_options(
        &self,
        egress_key: &str,
        policy: &Policy,
        url: &str,
        headers: hookline_core::request::AttemptHeaders,
        custom: &[(http::HeaderName, http::HeaderValue)],
    ) -> TryResult {
        self.recorded(h1::Method::Options, egress_key, policy, url, headers, custom, &[], Bytes::new()).await
    }

    #[allow(clippy::too_many_arguments)]
    async fn recorded(
        &self,
        method: h1::Method,
        egress_key: &str,
        policy: &Policy,
        url: &str,
        headers: hookline_core::request::AttemptHeaders,
        custom: &[(http::HeaderName, http::HeaderValue)],
        logged_custom: &[Header],
        body: Bytes,
    ) -> TryResult {
        let headers = headers.into_vec();
        let mut logged = Vec::with_capacity(headers.len() + logged_custom.len());
        let mut map = http::HeaderMap::with_capacity(headers.len() + custom.len() + 2);
        let mut bad = None;
        for (name, value) in headers {
            let value = Bytes::from(value);
            let parsed = http::HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| http::Error::from(e).to_string())
                .and_then(|n| Ok((n, http::HeaderValue::from_maybe_shared(value.clone()).map_err(|e| http::Error::from(e).to_string())?)));
            match parsed {
                Ok((n, v)) => {
                    map.append(n, v);
                }
                Err(e) => {
                    bad.get_or_insert(e);
                }
            }
            let kept = if hookline_core::request::is_secret_header(&name) {
                Bytes::from_static(hookline_core::request::REDACTED.as_bytes())
            } else {
                value
            };
            logged.push(Header { name: name.into_owned(), value: kept });
        }
        for (name, value) in custom {
            map.append(name.clone(), value.clone());
        }
        logged.extend(logged_custom.iter().cloned());
        let map = match bad {
            Some(e) => Err(e),
            None => Ok(map),
        };
        let destination = self.route(egress_key, policy).map(|route| (route, Destination::Url(url)));
        self.exchange(method, destination, policy, map, logged, body).await
    }

    /// One attempt by its subscription's plan: the headers of `ids` (signed with the secrets in force at
    /// `ids.now_ms`), then `trace` (the W3C context, tracing on), then the custom headers; kept for the attempt
    /// record as [`Sender::send_recorded`] keeps them.
    ///
    /// Not an `async fn`: the headers are made before the exchange starts, and the exchange is the only future
    /// (a delivery waiting on its endpoint holds it, so it stays small).
    pub fn send_planned<'a>(
        &'a self,
        plan: &'a SendPlan,
        policy: &'a Policy,
        ids: &hookline_core::request::AttemptIds<'_>,
        trace: Option<(String, String)>,
        body: Bytes,
    ) -> impl std::future::Future<Output = TryResult> + 'a {
        let (headers, logged) = match plan.request_headers(ids, &body, trace) {
            Ok(h) => h,
            Err(e) => {
                return futures::future::Either::Left(std::future::ready(TryResult {
                    outcome: Outcome::InvalidUrl,
                    reason: format!("cannot sign the request: {e}"),
                    response_excerpt: String::new(),
                    duration: Duration::ZERO,
                    request_headers: Vec::new(),
                    response_headers: Vec::new(),
                }))
            }
        };
        let destination = match &plan.destination {
            Ok(d) => Ok((d.route.clone(), Destination::Planned(&d.target))),
            Err(e) => Err(e.clone()),
        };
        futures::future::Either::Right(self.exchange(h1::Method::Post, destination, policy, headers, logged, body))
    }

    fn send_with<'a>(
        &'a self,
        egress_key: &str,
        policy: &'a Policy,
        url: &'a str,
        headers: Result<http::HeaderMap, String>,
        request_headers: Vec<Header>,
        body: Bytes,
    ) -> impl std::future::Future<Output = TryResult> + 'a {
        let destination = self.route(egress_key, policy).map(|route| (route, Destination::Url(url)));
        self.exchange(h1::Method::Post, destination, policy, headers, request_headers, body)
    }

    async fn exchange(
        &self,
        method: h1::Method,
        destination: Result<(Arc<Route>, Destination<'_>), String>,
        policy: &Policy,
        headers: Result<http::HeaderMap, String>,
        request_headers: Vec<Header>,
        body: Bytes,
    ) -> TryResult {
        let started = Instant::now();
        let timeout = Duration::from_millis(policy.attempt.timeout_ms);
        // Only a recorded try keeps the response's headers (the records are what the log shows).
        let record = !request_headers.is_empty();
        let finish = |outcome: Outcome, reason: String, excerpt: String, response_headers: Vec<Header>| TryResult {
            outcome,
            reason,
            response_excerpt: excerpt,
            duration: started.elapsed(),
            request_headers,
            response_headers,
        };
        let (route, destination) = match destination {
            Ok(r) => r,
            Err(e) => return finish(Outcome::EgressRefused, format!("egress refused: {e}"), String::new(), Vec::new()),
        };
        let exchange = async {
            // A plan's URL was parsed and judged when the plan was made (its `Uri` too); a raw one is now. In a block:
            // the judged URL is not kept while the request is out.
            let uri = {
                let fresh;
                let (target, planned_uri) = match destination {
                    Destination::Url(url) => match route.guard.check_url(url) {
                        Ok(t) => {
                            fresh = t;
                            (&fresh, None)
                        }
                        Err(r) => return refused(&r),
                    },
                    Destination::Planned(Ok(planned)) => (&planned.target, Some(&planned.uri)),
                    Destination::Planned(Err(r)) => return refused(r),
                };
                // Resolve and judge the destination on every attempt, even when a pooled connection exists.
                match connector::precheck_target(&route.guard, self.resolver.as_ref(), target).await {
                    Ok(_) => {}
                    Err(PrecheckError::Refused(r)) => return refused(&r),
                    Err(PrecheckError::Resolve(e)) => {
                        return (Outcome::ConnectError, format!("DNS resolution failed: {e}"), String::new(), Vec::new())
                    }
                }
                match planned_uri {
                    Some(uri) => uri.clone(),
                    // The parsed, normalised URL that was judged, never the raw string.
                    None => http::Uri::try_from(target.url.as_str()).map_err(|e| http::Error::from(e).to_string()),
                }
            };
            let uri = match uri {
                Ok(uri) => uri,
                Err(e) => return (Outcome::InvalidUrl, format!("invalid request: {e}"), String::new(), Vec::new()),
            };
            let headers = match headers {
                Ok(h) => h,
                Err(e) => return (Outcome::InvalidUrl, format!("invalid request: {e}"), String::new(), Vec::new()),
            };
            let resp = match route.pool.send_method(method, &uri, headers, body).await {
                Ok(r) => r,
                Err(e) => {
                    let (o, r, x) = classify_error(&e);
                    return (o, r, x, Vec::new());
                }
            };
            let status = resp.status().as_u16();
            let retry_after = resp.headers().get(http::header::RETRY_AFTER).and_then(|v| v.to_str().ok()).map(str::to_owned);
            let response_headers = match method {
                // The handshake's grant, wherever it is among the receiver's headers (the record's caps could cut it).
                h1::Method::Options => grant_headers(resp.headers()),
                h1::Method::Post if record => kept_response_headers(resp.headers()),
                h1::Method::Post => Vec::new(),
            };
            // The connection goes back to the pool when the body was read to its end and may be reused. Boxed:
            // reading the body comes after the wait for the answer, whose state (held by every waiting delivery)
            // need not have room for it.
            let (excerpt, end) = Box::pin(route.pool.read_body(resp, policy.attempt.response_cap_bytes, EXCERPT_BYTES)).await;
            let excerpt = String::from_utf8_lossy(&excerpt).into_owned();
            // The status decides the verdict either way; a body that broke off is said in the attempt's reason.
            let reason = match end {
                h1::BodyEnd::CutShort => format!("HTTP {status}; the response body was cut short (the connection ended before its end)"),
                h1::BodyEnd::Complete | h1::BodyEnd::Capped => format!("HTTP {status}"),
            };
            (Outcome::Http { status, retry_after }, reason, excerpt, response_headers)
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok((outcome, reason, excerpt, response_headers)) => {
                if matches!(outcome, Outcome::EgressRefused | Outcome::InvalidUrl) {
                    metrics::counter!("hookline_egress_refusals_total", "outcome" => if outcome == Outcome::EgressRefused { "egress_refused" } else { "invalid_url" }).increment(1);
                }
                finish(outcome, reason, excerpt, response_headers)
            }
            Err(_) => finish(
                Outcome::Timeout,
                format!("Timed out after {}", hookline_core::sign::human_duration_ms(timeout.as_millis() as u64)),
                String::new(),
                Vec::new(),
            ),
        }
    }
}

fn refused(r: &hookline_core::egress::Refusal) -> (Outcome, String, String, Vec<Header>) {
    (r.outcome(), format!("egress refused: {}", r.reason), String::new(), Vec::new())
}

/// Where a try goes: a URL judged now, or a plan's URL judged when the plan was made (its addresses are judged
/// now all the same).
enum Destination<'a> {
    Url(&'a str),
    Planned(&'a Result<plan::PlannedTarget, hookline_core::egress::Refusal>),
}

/// The request's header map, sized for the headers, `extra` more and the two the client adds (`host`, `content-length`)
/// so that it is allocated once. An invalid name or value is reported as the request builder would.
fn header_map<K: AsRef<str>>(
    headers: impl Iterator<Item = (K, Result<http::HeaderValue, http::header::InvalidHeaderValue>)>,
    extra: usize,
) -> Result<http::HeaderMap, String> {
    let mut map = http::HeaderMap::with_capacity(headers.size_hint().0 + extra + 2);
    for (k, v) in headers {
        let name = http::HeaderName::from_bytes(k.as_ref().as_bytes()).map_err(|e| http::Error::from(e).to_string())?;
        let value = v.map_err(|e| http::Error::from(e).to_string())?;
        map.append(name, value);
    }
    Ok(map)
}

/// The response's headers as the attempt record keeps them: in order, secrets redacted, at most
/// [`RESPONSE_HEADERS_MAX`] of them and [`RESPONSE_HEADER_BYTES_MAX`] bytes of names and values (a receiver's
/// headers are not ours to store without bound).
fn kept_response_headers(headers: &http::HeaderMap) -> Vec<Header> {
    let mut out = Vec::with_capacity(headers.len().min(RESPONSE_HEADERS_MAX));
    let mut bytes = 0usize;
    for (name, value) in headers {
        let size = name.as_str().len().saturating_add(value.len());
        if out.len() >= RESPONSE_HEADERS_MAX {
            break;
        }
        if bytes.saturating_add(size) > RESPONSE_HEADER_BYTES_MAX {
            continue;
        }
        bytes = bytes.saturating_add(size);
        out.push(hookline_kafka::state::logged_header(name.as_str(), value.as_bytes()));
    }
    out
}

/// A validation handshake's answer as [`Sender::send_options`] returns it: the `WebHook-*` headers only, at most 8.
fn grant_headers(headers: &http::HeaderMap) -> Vec<Header> {
    headers
        .iter()
        .filter(|(name, _)| name.as_str().starts_with("webhook-"))
        .take(8)
        .map(|(name, value)| hookline_kafka::state::logged_header(name.as_str(), value.as_bytes()))
        .collect()
}

/// The rustls error inside `e`, looking through `io::Error` wrappers (hyper-rustls nests them, and
/// `io::Error::source` skips the wrapped error).
fn find_rustls<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut cur = e;
    loop {
        if let Some(tls) = cur.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        cur = cur.downcast_ref::<std::io::Error>()?.get_ref()?;
    }
}

fn classify_error(err: &pool::SendError) -> (Outcome, String, String) {
    if let Some(r) = connector::refusal_in(err) {
        return (r.outcome(), format!("egress refused: {}", r.reason), String::new());
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    let mut chain = Vec::new();
    while let Some(e) = source {
        if let Some(tls) = find_rustls(e) {
            return (Outcome::TlsError, format!("TLS error: {tls}"), String::new());
        }
        chain.push(e.to_string());
        source = e.source();
    }
    chain.dedup();
    (Outcome::ConnectError, format!("connection failed: {}", chain.join(": ")), String::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A receiver's headers are kept in order, bounded in count and bytes, credentials redacted.
    #[test]
    fn response_headers_are_capped_and_credentials_redacted() {
        let mut m = http::HeaderMap::new();
        m.append("set-cookie", http::HeaderValue::from_static("session=abc"));
        m.append("x-big", http::HeaderValue::from_str(&"b".repeat(5_000)).unwrap());
        for i in 0..40 {
            m.append(http::HeaderName::from_bytes(format!("x-h{i}").as_bytes()).unwrap(), http::HeaderValue::from_static("v"));
        }
        let kept = kept_response_headers(&m);
        assert_eq!(kept.len(), RESPONSE_HEADERS_MAX);
        assert_eq!((kept[0].name.as_str(), &kept[0].value[..]), ("set-cookie", hookline_core::request::REDACTED.as_bytes()));
        assert!(kept.iter().all(|h| h.name != "x-big"), "a header over the byte budget is left out, the rest kept");
        assert_eq!(kept[1].name, "x-h0");
        let bytes: usize = kept.iter().map(|h| h.name.len() + h.value.len()).sum();
        assert!(bytes <= RESPONSE_HEADER_BYTES_MAX);
    }

    /// A handshake's grant is found behind any number of other headers (the attempt record's caps would drop it).
    #[test]
    fn a_grant_is_kept_behind_many_other_headers() {
        let mut m = http::HeaderMap::new();
        for i in 0..40 {
            m.append(http::HeaderName::from_bytes(format!("x-h{i}").as_bytes()).unwrap(), http::HeaderValue::from_static("v"));
        }
        m.append("webhook-allowed-origin", http::HeaderValue::from_static("hooks.example.com"));
        m.append("webhook-allowed-rate", http::HeaderValue::from_static("*"));
        let kept = grant_headers(&m);
        let got: Vec<(&str, &[u8])> = kept.iter().map(|h| (h.name.as_str(), &h.value[..])).collect();
        assert_eq!(got, [("webhook-allowed-origin", &b"hooks.example.com"[..]), ("webhook-allowed-rate", b"*")]);
        assert!(kept_response_headers(&m).iter().all(|h| !h.name.starts_with("webhook-")), "the record's caps would have cut it");
    }

    /// The handshake goes through the egress guard like a delivery: an internal address is refused, not asked.
    #[tokio::test]
    async fn a_handshake_to_an_internal_address_is_refused_by_the_guard() {
        let sender = Sender::new(Default::default(), Arc::new(crate::connector::SystemResolver));
        let policy = hookline_core::policy::builtin("standard").unwrap();
        for url in ["https://127.0.0.1:1/hook", "https://169.254.169.254/latest", "https://10.0.0.7/"] {
            let headers = hookline_core::verification::handshake_headers("hooks.example.com", None);
            let r = sender.send_options("k", &policy, url, headers, &[]).await;
            assert_eq!(r.outcome, Outcome::EgressRefused, "{url}: {}", r.reason);
            assert!(r.reason.starts_with("egress refused"), "{}", r.reason);
        }
    }

    /// The record's copy of a value shares the request's buffer; a secret's value is never kept.
    #[tokio::test]
    async fn recorded_request_headers_are_redacted_in_sending_order() {
        let sender = Sender::new(Default::default(), Arc::new(crate::connector::SystemResolver));
        let policy = hookline_core::policy::builtin("standard").unwrap();
        let headers = hookline_core::request::AttemptHeaders(vec![
            ("content-type".into(), "application/json".into()),
            ("webhook-id".into(), "evt_1".into()),
            ("webhook-signature".into(), "v1,secret".into()),
        ]);
        let logged = [hookline_kafka::state::logged_header("x-partner", b"acme")];
        let custom = [(http::HeaderName::from_static("x-partner"), http::HeaderValue::from_static("acme"))];
        // Port 1 on loopback: refused by the default egress rules, after the headers were prepared.
        let r = sender.send_recorded("k", &policy, "https://127.0.0.1:1/", headers, &custom, &logged, Bytes::new()).await;
        assert_eq!(r.outcome, Outcome::EgressRefused, "{}", r.reason);
        let got: Vec<(&str, &[u8])> = r.request_headers.iter().map(|h| (h.name.as_str(), &h.value[..])).collect();
        assert_eq!(
            got,
            [
                ("content-type", &b"application/json"[..]),
                ("webhook-id", b"evt_1"),
                ("webhook-signature", b"<redacted>"),
                ("x-partner", b"acme")
            ]
        );
        assert!(r.response_headers.is_empty());
    }

    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::AsyncWriteExt;

    use super::test_server::{loopback_sender, read_request};

    /// A loopback receiver answering `200 ok` to every request; with `close_each`, it closes the connection after
    /// each answer without saying so (as a receiver's idle timeout does), else it keeps connections alive.
    async fn receiver(close_each: bool) -> (std::net::SocketAddr, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let (addr, conns, requests, _) = receiver_with_heads(close_each).await;
        (addr, conns, requests)
    }

    /// [`receiver`], also keeping each request's head (request line and headers) as received.
    async fn receiver_with_heads(close_each: bool) -> (std::net::SocketAddr, Arc<AtomicUsize>, Arc<AtomicUsize>, Arc<Mutex<Vec<String>>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (conns, requests) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let heads = Arc::new(Mutex::new(Vec::new()));
        let (c, r, hs) = (conns.clone(), requests.clone(), heads.clone());
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                c.fetch_add(1, Ordering::SeqCst);
                let r = r.clone();
                let hs = hs.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    while let Some(head) = read_request(&mut sock, &mut buf).await {
                        hs.lock().unwrap().push(head);
                        r.fetch_add(1, Ordering::SeqCst);
                        if sock.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await.is_err() {
                            return;
                        }
                        if close_each {
                            let _ = sock.shutdown().await;
                            return;
                        }
                    }
                });
            }
        });
        (addr, conns, requests, heads)
    }

    async fn post(sender: &Sender, url: &str) -> TryResult {
        let policy = hookline_core::policy::builtin("standard").unwrap();
        sender.send("k", &policy, url, &Default::default(), Bytes::from_static(b"{\"a\":1}")).await
    }

    /// Sequential tries reuse one kept-alive connection; concurrent ones open their own, and those are kept too.
    #[tokio::test]
    async fn connections_are_kept_alive_and_reused() {
        let (addr, conns, requests) = receiver(false).await;
        let sender = loopback_sender();
        let url = format!("http://{addr}/hook");
        for _ in 0..5 {
            let r = post(&sender, &url).await;
            assert_eq!(r.outcome, Outcome::Http { status: 200, retry_after: None }, "{}", r.reason);
            assert_eq!(r.response_excerpt, "ok");
        }
        assert_eq!(conns.load(Ordering::SeqCst), 1, "one connection for five sequential tries");
        let tries = futures::future::join_all((0..3).map(|_| post(&sender, &url))).await;
        assert!(tries.iter().all(|r| r.outcome == Outcome::Http { status: 200, retry_after: None }));
        assert_eq!(conns.load(Ordering::SeqCst), 3, "three at once: the idle one and two new ones");
        for _ in 0..3 {
            post(&sender, &url).await;
        }
        assert_eq!(conns.load(Ordering::SeqCst), 3, "the three are kept");
        assert_eq!(requests.load(Ordering::SeqCst), 11);
    }

    /// A receiver that closes each connection after answering: the next try finds the kept connection closed and
    /// opens a new one, and no try fails for it.
    #[tokio::test]
    async fn a_connection_closed_by_the_receiver_while_idle_is_not_a_failure() {
        let (addr, conns, requests) = receiver(true).await;
        let sender = loopback_sender();
        let url = format!("http://{addr}/hook");
        for i in 0..5 {
            let r = post(&sender, &url).await;
            assert_eq!(r.outcome, Outcome::Http { status: 200, retry_after: None }, "try {i}: {}", r.reason);
        }
        assert_eq!(requests.load(Ordering::SeqCst), 5, "each request sent once");
        assert_eq!(conns.load(Ordering::SeqCst), 5);
    }

    fn entry(url: &str, policy: &str, secrets: &[(&str, i64)], headers: &[(&str, &str)]) -> Arc<SubscriptionEntry> {
        Arc::new(SubscriptionEntry::new(hookline_core::model::Subscription {
            id: "sub_1".into(),
            url: url.into(),
            policy: policy.into(),
            secrets: secrets
                .iter()
                .map(|(v, e)| hookline_core::model::Secret { value: (*v).into(), expires_at_ms: *e, ..Default::default() })
                .collect(),
            headers: headers.iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())).collect(),
            enabled: true,
            ..Default::default()
        }))
    }

    fn ids(now_ms: i64) -> hookline_core::request::AttemptIds<'static> {
        hookline_core::request::AttemptIds {
            event_id: "evt_1",
            event_type: "order.paid",
            delivery_id: "dlv_1",
            attempt_number: 2,
            now_ms,
            event: None,
        }
    }

    /// The request line's path and the headers of a received head.
    fn parse_head(head: &str) -> (String, Vec<(String, String)>) {
        let mut lines = head.split("\r\n");
        let path = lines.next().unwrap_or("").split(' ').nth(1).unwrap_or("").to_owned();
        let headers = lines.filter_map(|l| l.split_once(':')).map(|(n, v)| (n.to_owned(), v.trim().to_owned())).collect();
        (path, headers)
    }

    const SECRET_A: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const SECRET_B: &str = "whsec_aGVsbG8gd29ybGQ=";

    /// One plan per version of a subscription: attempts reuse it; a changed URL or a rotated secret (a new version)
    /// gets a new one, whose requests go to the new URL signed with the secrets now in force; a deleted
    /// subscription's plan is forgotten.
    #[tokio::test]
    async fn a_changed_subscription_gets_a_new_plan_and_a_deleted_ones_plan_is_forgotten() {
        let (addr, _, _, heads) = receiver_with_heads(false).await;
        let sender = loopback_sender();
        let policy = hookline_core::policy::builtin("standard").unwrap();
        let now = crate::now_ms();
        let body = Bytes::from_static(b"{\"a\":1}");

        let v1 = entry(&format!("http://{addr}/one"), "standard", &[(SECRET_A, 0)], &[]);
        let p1 = sender.plan(&v1, &policy);
        assert!(Arc::ptr_eq(&p1, &sender.plan(&v1, &policy)), "the same version: the same plan");
        let r = sender.send_planned(&p1, &policy, &ids(now), None, body.clone()).await;
        assert_eq!(r.outcome, Outcome::http(200), "{}", r.reason);

        // Rotation: B is the newest; A still signs for an hour. The URL changed too.
        let v2 = entry(&format!("http://{addr}/two"), "standard", &[(SECRET_B, 0), (SECRET_A, now + 3_600_000)], &[]);
        let p2 = sender.plan(&v2, &policy);
        assert!(!Arc::ptr_eq(&p1, &p2), "a new version: a new plan");
        assert!(p2.is_for(&v2) && !p2.is_for(&v1));
        let r = sender.send_planned(&p2, &policy, &ids(now), None, body.clone()).await;
        assert_eq!(r.outcome, Outcome::http(200), "{}", r.reason);
        assert_eq!(sender.plans_kept(), 1, "one plan per subscription");

        let heads = heads.lock().unwrap().clone();
        assert_eq!(heads.len(), 2);
        let (path, h1) = parse_head(&heads[0]);
        assert_eq!(path, "/one");
        hookline_core::sign::verify_standard(&[SECRET_A], h1.as_slice(), &body, now, 300).unwrap();
        let (path, h2) = parse_head(&heads[1]);
        assert_eq!(path, "/two");
        let sig = h2.iter().find(|(n, _)| n == "webhook-signature").map(|(_, v)| v.clone()).unwrap();
        assert_eq!(sig.split(' ').count(), 2, "both secrets sign during the overlap: {sig}");
        hookline_core::sign::verify_standard(&[SECRET_B], h2.as_slice(), &body, now, 300).unwrap();
        hookline_core::sign::verify_standard(&[SECRET_A], h2.as_slice(), &body, now, 300).unwrap();

        // After the overlap the same plan signs with B alone: expiry is read per attempt, no new plan needed.
        let later = sender.send_planned(&p2, &policy, &ids(now + 3_600_000), None, body.clone()).await;
        let sig = later.request_headers.iter().find(|h| h.name == "webhook-signature").map(|h| h.value.clone());
        assert_eq!(sig.as_deref(), Some(&b"<redacted>"[..]), "the record never keeps a signature");
        assert!(Arc::ptr_eq(&p2, &sender.plan(&v2, &policy)));

        assert_eq!(sender.retain_plans(|id| id != "sub_1"), 1, "the deleted subscription's plan goes");
        assert_eq!(sender.plans_kept(), 0);
        assert!(!Arc::ptr_eq(&p2, &sender.plan(&v2, &policy)), "were it sent to again, it would get a new one");
    }

    /// A plan's try is the unplanned try, header for header (the record's copy included), for a profile with
    /// custom headers and trace context; and a refused URL is refused with the same outcome and reason.
    #[tokio::test]
    async fn a_planned_try_sends_and_records_what_an_unplanned_one_does() {
        let sender = Sender::new(Default::default(), Arc::new(crate::connector::SystemResolver));
        for profile in hookline_core::policy::BUILTIN_NAMES {
            let policy = hookline_core::policy::builtin(profile).unwrap();
            // Port 1 on loopback: refused by the default egress rules, after the headers were prepared.
            let e = entry("https://127.0.0.1:1/hook", profile, &[(SECRET_A, 0), (SECRET_B, 0)], &[("X-Partner", "acme")]);
            let plan = sender.plan(&e, &policy);
            let (tp, ts) = ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_owned(), "k=v".to_owned());
            let trace = Some((tp.clone(), ts.clone()));
            let planned = sender.send_planned(&plan, &policy, &ids(1_767_225_600_123), trace, Bytes::from_static(b"{}")).await;

            let secrets = e.signing_secrets(1_767_225_600_123);
            let hctx = hookline_core::request::HeaderContext {
                event_id: "evt_1",
                event_type: "order.paid",
                delivery_id: "dlv_1",
                subscription_id: "sub_1",
                attempt_number: 2,
                now_ms: 1_767_225_600_123,
                secrets: &secrets,
                event: None,
            };
            let mut headers = hookline_core::request::headers(&policy, &hctx, b"{}").unwrap();
            headers.push_trace_context(tp, ts);
            let unplanned = sender
                .send_recorded(&e.egress_key, &policy, &e.sub.url, headers, &e.headers, &e.logged_headers, Bytes::from_static(b"{}"))
                .await;

            assert_eq!(planned.outcome, Outcome::EgressRefused, "{profile}");
            assert_eq!((&planned.outcome, &planned.reason), (&unplanned.outcome, &unplanned.reason), "{profile}");
            assert_eq!(planned.request_headers, unplanned.request_headers, "{profile}");
            assert!(planned.request_headers.iter().any(|h| h.name == "X-Partner" || h.name == "x-partner"), "{profile}");
        }
    }
}
