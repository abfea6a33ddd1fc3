//! The guarded connector under real hyper requests, against receivers listening on loopback.
//!
//! Loopback is non-public, so most tests put 127.0.0.1/32 in `allow_ranges` to stand for "a public
//! address" and use other loopback addresses (127.0.0.2, ...) as the private targets an attacker wants.

use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use hookline_core::egress::{EgressGuard, EgressSettings, RefusalKind};
use hookline_core::policy::EgressRules;
use hookline_core::Outcome;
use hookline_dispatcher::connector::{https_connector, precheck, refusal_in, ConnectError, GuardedConnector, PrecheckError, Resolve};
use http_body_util::{BodyExt, Empty};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tower::Service;

const HOSTILE: &str = include_str!("../../core/src/egress/hostile_urls.tsv");

// ---------------------------------------------------------------------------------------------------------
// Test doubles

/// A resolver that answers from a script (the last answer repeats) and logs every question.
struct Scripted {
    answers: Mutex<VecDeque<Vec<IpAddr>>>,
    last: Mutex<Vec<IpAddr>>,
    log: Mutex<Vec<String>>,
}

impl Scripted {
    fn new(answers: &[&[&str]]) -> Arc<Self> {
        let parsed: VecDeque<Vec<IpAddr>> = answers.iter().map(|a| a.iter().map(|s| s.parse().unwrap()).collect()).collect();
        Arc::new(Self { answers: Mutex::new(parsed), last: Mutex::new(Vec::new()), log: Mutex::new(Vec::new()) })
    }

    fn asked(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

impl Resolve for Scripted {
    fn resolve(&self, host: &str, _port: u16) -> BoxFuture<'static, io::Result<Vec<IpAddr>>> {
        self.log.lock().unwrap().push(host.to_owned());
        let mut last = self.last.lock().unwrap();
        if let Some(next) = self.answers.lock().unwrap().pop_front() {
            *last = next;
        }
        let answer = last.clone();
        Box::pin(async move {
            if answer.is_empty() {
                Err(io::Error::new(io::ErrorKind::NotFound, "no such host"))
            } else {
                Ok(answer)
            }
        })
    }
}

/// A receiver that counts connections and answers every request with a fixed response, then closes.
struct Receiver {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    requests: Arc<Mutex<Vec<String>>>,
}

impl Receiver {
    async fn start(bind: SocketAddr, response: &'static str) -> io::Result<Receiver> {
        let listener = TcpListener::bind(bind).await?;
        let addr = listener.local_addr()?;
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (c, r) = (connections.clone(), requests.clone());
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                c.fetch_add(1, Ordering::SeqCst);
                let r = r.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    // The request head is enough: the tests send no bodies.
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    r.lock().unwrap().push(String::from_utf8_lossy(&buf).into_owned());
                    let _ = sock.write_all(response.as_bytes()).await;
                    let _ = sock.shutdown().await;
                });
            }
        });
        Ok(Receiver { addr, connections, requests })
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

const OK: &str = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok";
const REDIRECT_TO_METADATA: &str = "HTTP/1.1 302 Found\r\nlocation: http://169.254.169.254/latest/meta-data/\r\n\
                                    content-length: 0\r\nconnection: close\r\n\r\n";

fn loopback(last: u8) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, last], 0))
}

fn guard(allow: &[&str], allow_http: bool) -> Arc<EgressGuard> {
    let settings = EgressSettings { allow_ranges: allow.iter().map(|s| s.to_string()).collect(), allow_http, ..Default::default() };
    Arc::new(EgressGuard::new(&settings, &EgressRules::default()).unwrap())
}

type TestClient = Client<HttpsConnector<GuardedConnector>, Empty<Bytes>>;

fn client(guard: &Arc<EgressGuard>, resolver: Arc<dyn Resolve>) -> TestClient {
    let connector = GuardedConnector::new(guard.clone(), resolver);
    Client::builder(TokioExecutor::new()).build(https_connector(connector))
}

async fn get(client: &TestClient, url: &str) -> Result<(u16, http::HeaderMap, String), hyper_util::client::legacy::Error> {
    let req = http::Request::get(url).body(Empty::new()).unwrap();
    let resp = client.request(req).await?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    Ok((status, headers, String::from_utf8_lossy(&body).into_owned()))
}

/// Gives spawned accept loops a moment, so a connection that was made would be counted.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(100)).await;
}

// ---------------------------------------------------------------------------------------------------------

#[tokio::test]
async fn loopback_is_refused_unless_allow_listed_with_http() {
    let rx = Receiver::start(loopback(1), OK).await.unwrap();
    let url = format!("http://127.0.0.1:{}/hook", rx.addr.port());
    let nobody = Scripted::new(&[]);

    // Default settings: http itself is refused.
    let c = client(&guard(&[], false), nobody.clone());
    let err = get(&c, &url).await.unwrap_err();
    let r = refusal_in(&err).expect("a refusal in the error chain");
    assert_eq!(r.reason, "scheme http is not allowed (allowed: https)");

    // http allowed, loopback not.
    let c = client(&guard(&[], true), nobody.clone());
    let err = get(&c, &url).await.unwrap_err();
    let r = refusal_in(&err).expect("a refusal in the error chain");
    assert_eq!((r.kind, r.reason.as_str()), (RefusalKind::EgressRefused, "127.0.0.1 is loopback"));
    assert_eq!(r.outcome(), Outcome::EgressRefused);
    settle().await;
    assert_eq!(rx.connections(), 0, "a refused destination must not be connected to");

    // Both allowed: the request goes through.
    let c = client(&guard(&["127.0.0.0/8"], true), nobody.clone());
    let (status, _, body) = get(&c, &url).await.unwrap();
    assert_eq!((status, body.as_str()), (200, "ok"));
    assert_eq!(rx.connections(), 1);
    assert!(nobody.asked().is_empty(), "IP literals are not resolved: {:?}", nobody.asked());
}

#[tokio::test]
async fn ip_literals_are_checked_by_the_connector_itself() {
    let rx = Receiver::start(loopback(1), OK).await.unwrap();
    let nobody = Scripted::new(&[]);
    let mut connector = GuardedConnector::new(guard(&[], true), nobody.clone());
    for uri in [
        format!("http://127.0.0.1:{}/", rx.addr.port()),
        format!("http://[::ffff:127.0.0.1]:{}/", rx.addr.port()),
        format!("http://[::ffff:7f00:1]:{}/", rx.addr.port()),
        format!("http://2130706433:{}/", rx.addr.port()),
        format!("http://0x7f.1:{}/", rx.addr.port()),
    ] {
        let uri: http::Uri = uri.parse().unwrap();
        match connector.call(uri.clone()).await {
            Err(ConnectError::Refused(r)) => assert!(r.reason.contains("loopback"), "{uri}: {}", r.reason),
            Err(e) => panic!("{uri}: not a refusal: {e}"),
            Ok(_) => panic!("{uri}: connected"),
        }
    }
    settle().await;
    assert_eq!(rx.connections(), 0);
    assert!(nobody.asked().is_empty());
}

#[tokio::test]
async fn https_to_a_private_address_is_refused_before_any_tls() {
    let c = client(&guard(&[], false), Scripted::new(&[]));
    let err = get(&c, "https://10.0.0.7/hook").await.unwrap_err();
    assert_eq!(refusal_in(&err).unwrap().reason, "10.0.0.7 is private (RFC 1918)");
    let err = get(&c, "https://[fd00:ec2::254]/latest/meta-data/").await.unwrap_err();
    assert_eq!(refusal_in(&err).unwrap().reason, "fd00:ec2::254 is a cloud metadata address");
}

#[tokio::test]
async fn a_name_resolving_to_public_and_private_is_refused() {
    let rx = Receiver::start(loopback(1), OK).await.unwrap();
    let g = guard(&["127.0.0.1/32"], true);
    let url = format!("http://mixed.test:{}/", rx.addr.port());
    for answer in [["127.0.0.1", "10.0.0.7"], ["10.0.0.7", "127.0.0.1"]] {
        let dns = Scripted::new(&[&answer]);
        match precheck(&g, dns.as_ref(), &url).await {
            Err(PrecheckError::Refused(r)) => {
                assert_eq!(r.reason, "mixed.test resolves to a refused address: 10.0.0.7 is private (RFC 1918)")
            }
            other => panic!("{other:?}"),
        }
        let err = get(&client(&g, dns.clone()), &url).await.unwrap_err();
        assert!(refusal_in(&err).unwrap().reason.ends_with("10.0.0.7 is private (RFC 1918)"));
    }
    settle().await;
    assert_eq!(rx.connections(), 0, "not even the allowed address is connected to when another is refused");
}

#[tokio::test]
async fn dns_failure_is_not_a_refusal() {
    let g = guard(&[], false);
    let dns = Scripted::new(&[&[]]);
    match precheck(&g, dns.as_ref(), "https://nowhere.test/").await {
        Err(PrecheckError::Resolve(e)) => assert_eq!(e.kind(), io::ErrorKind::NotFound),
        other => panic!("{other:?}"),
    }
    let err = get(&client(&g, dns), "https://nowhere.test/").await.unwrap_err();
    assert_eq!(refusal_in(&err), None, "a DNS failure is a connect_error, not egress_refused");
}

/// DNS rebinding: the name is public (allow-listed 127.0.0.1) when checked, private (127.0.0.2) when the
/// attacker hopes it will be connected to. The connector connects only to addresses it checked itself.
#[tokio::test]
async fn dns_rebinding_cannot_reach_a_private_address() {
    // The same port on both addresses, so only the resolved address decides where a connection lands.
    let (public, private) = loop {
        let public = Receiver::start(loopback(1), OK).await.unwrap();
        if let Ok(private) = Receiver::start(SocketAddr::from(([127, 0, 0, 2], public.addr.port())), OK).await {
            break (public, private);
        }
    };
    let g = guard(&["127.0.0.1/32"], true);
    let url = format!("http://rebind.test:{}/hook", public.addr.port());

    // First lookup (the precheck) public, every later one private.
    let dns = Scripted::new(&[&["127.0.0.1"], &["127.0.0.2"]]);
    let (target, addrs) = precheck(&g, dns.as_ref(), &url).await.unwrap();
    assert_eq!(addrs, vec!["127.0.0.1".parse::<IpAddr>().unwrap()]);
    let c = client(&g, dns.clone());
    let err = get(&c, target.url.as_str()).await.unwrap_err();
    assert_eq!(refusal_in(&err).unwrap().reason, "rebind.test resolves to a refused address: 127.0.0.2 is loopback");
    match precheck(&g, dns.as_ref(), &url).await {
        Err(PrecheckError::Refused(_)) => {}
        other => panic!("the next attempt must be refused too: {other:?}"),
    }

    // A resolver flipping between the two in an irregular pattern (P P X P X ...), over many attempts: the
    // connector sees the private answer after a public precheck several times, and never connects to it.
    let pattern: Vec<&[&str]> = (0..60).map(|i| if matches!(i % 5, 0 | 1 | 3) { &["127.0.0.1"][..] } else { &["127.0.0.2"][..] }).collect();
    let dns = Scripted::new(&pattern);
    let c = client(&g, dns.clone());
    let (mut delivered, mut refused_at_connect) = (0, 0);
    for _ in 0..12 {
        if precheck(&g, dns.as_ref(), &url).await.is_err() {
            continue;
        }
        match get(&c, &url).await {
            Ok((200, _, _)) => delivered += 1,
            Err(e) if refusal_in(&e).is_some() => refused_at_connect += 1,
            other => panic!("{other:?}"),
        }
    }
    assert!(delivered > 0 && refused_at_connect > 0, "delivered {delivered}, refused at connect {refused_at_connect}");
    settle().await;
    assert_eq!(private.connections(), 0, "the private address was connected to");
    assert!(private.requests.lock().unwrap().is_empty());
    assert_eq!(public.connections(), delivered);
    assert!(dns.asked().len() >= 10, "every attempt resolves: {:?}", dns.asked());
}

#[tokio::test]
async fn a_redirect_to_the_metadata_address_is_not_followed() {
    let rx = Receiver::start(loopback(1), REDIRECT_TO_METADATA).await.unwrap();
    let dns = Scripted::new(&[&["127.0.0.1"]]);
    let c = client(&guard(&["127.0.0.1/32"], true), dns.clone());
    let (status, headers, _) = get(&c, &format!("http://receiver.test:{}/hook", rx.addr.port())).await.unwrap();
    assert_eq!(status, 302);
    assert_eq!(headers["location"], "http://169.254.169.254/latest/meta-data/");
    settle().await;
    assert_eq!(rx.connections(), 1);
    assert_eq!(dns.asked(), ["receiver.test"], "nothing else was looked up");
}

#[tokio::test]
async fn a_redirect_to_an_allowed_host_is_not_followed_either() {
    let second = Receiver::start(loopback(1), OK).await.unwrap();
    let location: &'static str = Box::leak(
        format!(
            "HTTP/1.1 307 Temporary Redirect\r\nlocation: http://second.test:{}/\r\ncontent-length: 0\r\n\
             connection: close\r\n\r\n",
            second.addr.port()
        )
        .into_boxed_str(),
    );
    let first = Receiver::start(loopback(1), location).await.unwrap();
    let dns = Scripted::new(&[&["127.0.0.1"]]);
    let c = client(&guard(&["127.0.0.1/32"], true), dns.clone());
    let (status, _, _) = get(&c, &format!("http://first.test:{}/", first.addr.port())).await.unwrap();
    assert_eq!(status, 307);
    settle().await;
    assert_eq!((first.connections(), second.connections()), (1, 0));
    assert_eq!(dns.asked(), ["first.test"]);
}

#[tokio::test]
async fn proxy_environment_variables_are_ignored() {
    let proxy = Receiver::start(loopback(1), OK).await.unwrap();
    let rx = Receiver::start(loopback(1), OK).await.unwrap();
    let proxy_url = format!("http://127.0.0.1:{}", proxy.addr.port());
    for var in ["HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"] {
        std::env::set_var(var, &proxy_url);
    }
    let c = client(&guard(&["127.0.0.1/32"], true), Scripted::new(&[]));
    let (status, _, _) = get(&c, &format!("http://127.0.0.1:{}/direct", rx.addr.port())).await.unwrap();
    assert_eq!(status, 200);
    settle().await;
    assert_eq!((rx.connections(), proxy.connections()), (1, 0));
    assert!(rx.requests.lock().unwrap()[0].starts_with("GET /direct HTTP/1.1\r\n"), "origin-form, not proxy form");
}

fn hostile_rows() -> Vec<(&'static str, &'static str, &'static str)> {
    HOSTILE
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let c: Vec<&str> = l.split('\t').collect();
            (c[0], c[1], c[2])
        })
        .collect()
}

/// The shared table of hostile URLs, through a real dispatch attempt (the dispatcher's `Sender`, with the
/// standard policy), and through the connector alone (no precheck) wherever hyper can even express the URL.
#[tokio::test]
async fn hostile_table_is_refused_by_a_dispatch_attempt() {
    let rows = hostile_rows();
    assert!(rows.len() >= 60);
    let dns = Scripted::new(&[]);
    let policy = hookline_core::policy::builtin("standard").expect("the standard profile");
    let sender = hookline_dispatcher::sender::Sender::new(EgressSettings::default(), dns.clone());
    let g = Arc::new(EgressGuard::new(&EgressSettings::default(), &policy.egress).unwrap());
    let mut connector = GuardedConnector::new(g, dns.clone());
    let headers = hookline_core::request::AttemptHeaders::default();
    let mut failures = Vec::new();
    let mut through_connector = 0;
    for (url, outcome, fragment) in &rows {
        let result = sender.send("standard", &policy, url, &headers, Bytes::from_static(b"{}")).await;
        if result.outcome.token() != *outcome || !result.reason.contains(fragment) {
            failures.push(format!("sender {url:?}: {} {:?}, want {outcome} containing {fragment:?}", result.outcome, result.reason));
        }
        let Ok(uri) = url.parse::<http::Uri>() else { continue };
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
            continue;
        }
        through_connector += 1;
        match tokio::time::timeout(Duration::from_secs(5), connector.call(uri)).await {
            Ok(Err(ConnectError::Refused(r))) if r.outcome().token() == *outcome && r.reason.contains(fragment) => {}
            Ok(Err(e)) => failures.push(format!("connector {url:?}: {e}, want {outcome} containing {fragment:?}")),
            Ok(Ok(_)) => failures.push(format!("connector {url:?}: connected")),
            Err(_) => failures.push(format!("connector {url:?}: still connecting after 5 s")),
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    assert!(through_connector >= 50, "only {through_connector} rows reached the connector");
    assert!(dns.asked().is_empty(), "hostile rows are refused before any DNS lookup: {:?}", dns.asked());
}

/// The dispatcher's `Sender` keeps a name's addresses (`egress.dns_cache_ttl_s`), and the guard judges the kept
/// addresses on every attempt exactly as fresh ones: one route's rules allowing an address say nothing for another
/// route's, and a name cached as private stays refused without asking DNS again.
#[tokio::test]
async fn cached_addresses_are_judged_on_every_attempt() {
    let rx = Receiver::start(loopback(1), OK).await.unwrap();
    let settings = EgressSettings { allow_ranges: vec!["127.0.0.1/32".into()], allow_http: true, ..Default::default() };
    assert!(settings.dns_cache_ttl_s > 0, "the cache is on by default");
    let dns = Scripted::new(&[&["127.0.0.1"], &["127.0.0.2"]]);
    let sender = hookline_dispatcher::sender::Sender::new(settings, dns.clone());
    let open = hookline_core::policy::builtin("standard").expect("the standard profile");
    let mut closed = open.clone();
    closed.egress.deny_ranges = vec!["127.0.0.1/32".into()];
    let headers = hookline_core::request::AttemptHeaders::default();
    let url = format!("http://cached.test:{}/hook", rx.addr.port());

    let first = sender.send("open", &open, &url, &headers, Bytes::from_static(b"{}")).await;
    assert_eq!(first.outcome, Outcome::Http { status: 200, retry_after: None }, "{}", first.reason);
    // The route that denies the address gets the cached answer, and refuses it.
    for _ in 0..3 {
        let r = sender.send("closed", &closed, &url, &headers, Bytes::from_static(b"{}")).await;
        assert_eq!(r.outcome, Outcome::EgressRefused, "{}", r.reason);
        assert!(r.reason.contains("127.0.0.1"), "{}", r.reason);
    }
    // The name would now resolve elsewhere (127.0.0.2, private), but the kept answer is still the public one.
    let again = sender.send("open", &open, &url, &headers, Bytes::from_static(b"{}")).await;
    assert_eq!(again.outcome, Outcome::Http { status: 200, retry_after: None }, "{}", again.reason);
    assert_eq!(dns.asked(), ["cached.test"], "one lookup served the precheck and connect of every attempt");

    // A name whose kept answer is private is refused on every attempt, never connected to.
    let dns = Scripted::new(&[&["127.0.0.2"], &["127.0.0.1"]]);
    let settings = EgressSettings { allow_ranges: vec!["127.0.0.1/32".into()], allow_http: true, ..Default::default() };
    let sender = hookline_dispatcher::sender::Sender::new(settings, dns.clone());
    let url = format!("http://private.test:{}/hook", rx.addr.port());
    for _ in 0..3 {
        let r = sender.send("open", &open, &url, &headers, Bytes::from_static(b"{}")).await;
        assert_eq!(r.outcome, Outcome::EgressRefused, "{}", r.reason);
        assert!(r.reason.contains("127.0.0.2 is loopback"), "{}", r.reason);
    }
    assert_eq!(dns.asked(), ["private.test"]);
    settle().await;
    assert_eq!(rx.connections(), 2, "only the two allowed attempts connected");
}
