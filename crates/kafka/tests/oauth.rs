//! OAUTHBEARER tokens: the client-credentials request against a real HTTP token endpoint on 127.0.0.1:0, and
//! every kind of hookline Kafka client asking for a token through rdkafka's refresh hook.

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use hookline_kafka::oauth::{OAuthClient, TokenError};
use hookline_kafka::settings::{KafkaSettings, OAuthSettings, SaslMechanism, SecurityProtocol};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::sync::Notify;

/// A token endpoint answering every POST with `status` and `body`, remembering the form bodies it got.
struct Endpoint {
    url: String,
    requests: Arc<Mutex<Vec<String>>>,
    got: Arc<Notify>,
}

async fn endpoint(status: u16, body: &'static str) -> Endpoint {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/oauth2/token", listener.local_addr().unwrap());
    let requests = Arc::new(Mutex::new(Vec::new()));
    let got = Arc::new(Notify::new());
    let (r, g) = (requests.clone(), got.clone());
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let (r, g) = (r.clone(), g.clone());
            tokio::spawn(async move {
                let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let (r, g) = (r.clone(), g.clone());
                    async move {
                        let form = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                        r.lock().unwrap().push(String::from_utf8_lossy(&form).into_owned());
                        g.notify_waiters();
                        let resp = hyper::Response::builder()
                            .status(status)
                            .header("content-type", "application/json")
                            .body(Full::new(Bytes::from_static(body.as_bytes())))
                            .unwrap();
                        Ok::<_, Infallible>(resp)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    Endpoint { url, requests, got }
}

impl Endpoint {
    fn count(&self) -> usize {
        self.requests.lock().unwrap().len()
    }

    /// Waits (bounded) until the endpoint got more than `n` requests.
    async fn wait_more_than(&self, n: usize, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let notified = self.got.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.count() > n {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "{what}: the token endpoint got no request");
            let _ = tokio::time::timeout(left, notified).await;
        }
    }
}

fn secret_file(contents: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hookline-kafka-oauth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A file per call: tests run in parallel, and rewriting a shared one let another test read it empty.
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(format!("secret-{n}"));
    std::fs::write(&path, contents).unwrap();
    path
}

fn settings(token_endpoint: &str) -> KafkaSettings {
    let mut s = KafkaSettings {
        // Nothing listens there: the clients ask for a token before they connect anywhere.
        bootstrap_servers: "127.0.0.1:1".into(),
        security_protocol: SecurityProtocol::SaslPlaintext,
        ..Default::default()
    };
    s.sasl.mechanism = Some(SaslMechanism::OAuthBearer);
    s.oauth = OAuthSettings {
        token_endpoint: Some(token_endpoint.into()),
        client_id: Some("hookline-svc".into()),
        client_secret_file: Some(secret_file("the-client-secret\n")),
        scope: Some("kafka produce".into()),
    };
    s.validate().unwrap();
    s
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

#[tokio::test]
async fn a_client_credentials_grant_returns_the_token_and_its_expiry() {
    let ep = endpoint(200, r#"{"access_token":"tok-123","token_type":"Bearer","expires_in":300}"#).await;
    let client = OAuthClient::from_settings(&settings(&ep.url)).unwrap();
    let before = now_ms();
    let token = client.fetch().await.unwrap();
    assert_eq!(token.access_token.expose(), "tok-123");
    assert_eq!(token.principal, "hookline-svc", "an opaque token's principal is the client id");
    assert!((before + 299_000..=now_ms() + 300_000).contains(&token.expires_at_ms), "{}", token.expires_at_ms);
    let form = ep.requests.lock().unwrap()[0].clone();
    let pairs: Vec<(String, String)> = url::form_urlencoded::parse(form.as_bytes()).into_owned().collect();
    assert_eq!(
        pairs,
        [
            ("grant_type".into(), "client_credentials".into()),
            ("client_id".into(), "hookline-svc".into()),
            ("client_secret".into(), "the-client-secret".into()),
            ("scope".into(), "kafka produce".into()),
        ]
    );
}

#[tokio::test]
async fn refused_credentials_are_a_clear_error() {
    let ep = endpoint(401, r#"{"error":"invalid_client","error_description":"bad secret"}"#).await;
    let e = OAuthClient::from_settings(&settings(&ep.url)).unwrap().fetch().await.unwrap_err();
    assert!(matches!(e, TokenError::Refused { status: 401, .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("refused the client credentials (401)") && msg.contains("invalid_client"), "{msg}");
    assert!(msg.contains("kafka.oauth.client_id and kafka.oauth.client_secret_file"), "names the keys: {msg}");
    assert!(!msg.contains("the-client-secret"), "never shows the secret: {msg}");
}

#[tokio::test]
async fn a_response_that_is_not_a_token_is_a_clear_error() {
    for (body, reason) in [
        ("<html>sign in</html>", "not JSON"),
        (r#"{"token_type":"Bearer","expires_in":60}"#, "no access_token"),
        (r#"{"access_token":"t","token_type":"Bearer"}"#, "no positive expires_in"),
    ] {
        let ep = endpoint(200, body).await;
        let e = OAuthClient::from_settings(&settings(&ep.url)).unwrap().fetch().await.unwrap_err();
        assert!(matches!(e, TokenError::BadResponse { .. }), "{body}: {e:?}");
        assert!(e.to_string().contains(&format!("the response is not a token: {reason}")), "{e}");
    }
}

#[tokio::test]
async fn an_unreachable_endpoint_is_a_clear_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/token", listener.local_addr().unwrap());
    drop(listener);
    let e = OAuthClient::from_settings(&settings(&url)).unwrap().fetch().await.unwrap_err();
    assert!(matches!(e, TokenError::Request { .. }), "{e:?}");
    assert!(e.to_string().starts_with(&format!("OAuth token endpoint {url}:")), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hook_fetches_from_a_runtime_worker_and_from_a_plain_thread() {
    let ep = endpoint(200, r#"{"access_token":"tok-h","expires_in":"120"}"#).await;
    let client = OAuthClient::from_settings(&settings(&ep.url)).unwrap();
    // On a worker, as when librdkafka's refresh event is served inside a consumer's poll.
    let on_worker = client.fetch_blocking().unwrap();
    assert_eq!(on_worker.access_token.expose(), "tok-h");
    let c = client.clone();
    let on_thread = std::thread::spawn(move || c.fetch_blocking().map(|t| t.expires_at_ms)).join().unwrap().unwrap();
    assert!(on_thread > now_ms() + 100_000);
}

/// Every client hookline creates asks the token endpoint through its context's refresh hook: producers,
/// group consumers (RebalanceContext), table readers and scans (QuietEof), and the admin client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hookline_client_fetches_its_token_through_the_hook() {
    use rdkafka::consumer::{Consumer, StreamConsumer};
    let ep = endpoint(200, r#"{"access_token":"tok-all","expires_in":3600}"#).await;
    let s = settings(&ep.url);

    let n = ep.count();
    let producer = hookline_kafka::client::producer(&s, "oauth-producer").unwrap();
    ep.wait_more_than(n, "producer").await;

    let n = ep.count();
    let (ctx, _events) = hookline_kafka::rebalance::RebalanceContext::new("oauth-test");
    let consumer: StreamConsumer<_> =
        hookline_kafka::client::group_consumer_config(&s, "g", "oauth-group").unwrap().create_with_context(ctx).unwrap();
    consumer.subscribe(&["t"]).unwrap();
    let _ = tokio::time::timeout(Duration::from_millis(300), consumer.recv()).await;
    ep.wait_more_than(n, "group consumer").await;

    // No broker answers: the reader fails, but only after it asked for a token.
    let n = ep.count();
    let cancel = tokio_util::sync::CancellationToken::new();
    let r = hookline_kafka::table::spawn(&s, "t", "oauth-table", |_, _, _| {}, cancel.clone()).await;
    assert!(r.is_err());
    assert!(ep.count() > n, "table reader");

    let n = ep.count();
    let _admin = tokio::task::spawn_blocking(move || hookline_kafka::client::admin(&s, "oauth-admin")).await.unwrap().unwrap();
    assert!(ep.count() > n, "admin client: its first token is set at creation");
    let _ = producer.flush(Duration::ZERO);
}

/// A table reader whose token is refused stops at once with the endpoint's answer, not after a timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_token_fails_a_table_reader_fast_and_says_why() {
    let ep = endpoint(401, r#"{"error":"invalid_client"}"#).await;
    let s = settings(&ep.url);
    let started = Instant::now();
    let cancel = tokio_util::sync::CancellationToken::new();
    let e = match hookline_kafka::table::spawn(&s, "hookline.subscriptions", "oauth-refused", |_, _, _| {}, cancel).await {
        Ok(_) => panic!("a reader without a token must not start"),
        Err(e) => e.to_string(),
    };
    assert!(started.elapsed() < Duration::from_secs(8), "took {:?}", started.elapsed());
    assert!(e.contains("SASL authentication with the broker failed (check kafka.sasl.*, kafka.oauth.* or kafka.aws.*)"), "{e}");
    assert!(e.contains("invalid_client"), "{e}");
}
