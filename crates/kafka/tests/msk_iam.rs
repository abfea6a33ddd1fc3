//! Amazon MSK IAM authentication: the token byte for byte against Amazon's Java library (the vectors in
//! `msk_iam_vectors.json`, written by scripts/msk-iam-vectors), and the AWS credential chain against real HTTP
//! servers on 127.0.0.1:0 speaking AWS's documented protocols (the container endpoint, IMDSv2, STS
//! AssumeRoleWithWebIdentity).

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use bytes::Bytes;
use hookline_kafka::aws::credentials::{CredentialCache, CredentialChain, Credentials, CredentialsError, Environment};
use hookline_kafka::aws::sigv4::msk_iam_token;
use hookline_kafka::aws::MskIamClient;
use hookline_kafka::settings::{KafkaSettings, SaslMechanism, Secret, SecurityProtocol};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

#[derive(serde::Deserialize)]
struct Fixture {
    vectors: Vec<Vector>,
}

#[derive(serde::Deserialize)]
struct Vector {
    name: String,
    access_key_id: String,
    secret_access_key: String,
    session_token: Option<String>,
    region: String,
    signing_time: String,
    user_agent: String,
    url: String,
    token: String,
}

fn fixture() -> Fixture {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/msk_iam_vectors.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn rfc3339(s: &str) -> SystemTime {
    // The vectors' times are whole seconds in UTC: `2024-02-29T23:59:59Z`.
    let d = |r: std::ops::Range<usize>| s[r].parse::<i64>().unwrap();
    let (y, m, day) = (d(0..4), d(5..7), d(8..10));
    // Days from the civil date (Howard Hinnant), written again here so the test does not lean on the code it checks.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    let secs = days * 86_400 + d(11..13) * 3600 + d(14..16) * 60 + d(17..19);
    UNIX_EPOCH + Duration::from_secs(secs as u64)
}

/// hookline's token equals, byte for byte, what `software.amazon.msk:aws-msk-iam-auth` made for the same
/// credentials, region, time and User-Agent: with and without a session token, in three regions, with secrets and
/// session tokens holding `/`, `+`, `=`, spaces and symbols.
#[test]
fn tokens_equal_the_aws_java_librarys_byte_for_byte() {
    let f = fixture();
    assert!(f.vectors.len() >= 4, "the fixture lost its vectors");
    assert!(f.vectors.iter().any(|v| v.session_token.is_none()) && f.vectors.iter().any(|v| v.session_token.is_some()));
    for v in &f.vectors {
        let credentials = Credentials {
            access_key_id: v.access_key_id.clone(),
            secret_access_key: Secret::new(v.secret_access_key.clone()),
            session_token: v.session_token.clone().map(Secret::new),
            expires_at: None,
            source: "test",
        };
        let now = rfc3339(&v.signing_time);
        let t = msk_iam_token(&credentials, &v.region, now, &v.user_agent);
        let url = String::from_utf8(base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(t.token.expose()).unwrap()).unwrap();
        assert_eq!(url, v.url, "{}: the URL", v.name);
        assert_eq!(t.token.expose(), v.token, "{}: the token", v.name);
        let signed_at_ms = now.duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
        assert_eq!(t.expires_at_ms, signed_at_ms + 900_000, "{}: X-Amz-Date + X-Amz-Expires", v.name);
    }
}

/// One request as a test server saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    headers: http::HeaderMap,
    body: String,
}

type Handler = Arc<dyn Fn(&Seen) -> (u16, String) + Send + Sync>;

/// An HTTP server on 127.0.0.1:0 answering with `handler`, remembering every request.
struct Server {
    base: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

async fn server(handler: impl Fn(&Seen) -> (u16, String) + Send + Sync + 'static) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let handler: Handler = Arc::new(handler);
    let s = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let (s, handler) = (s.clone(), handler.clone());
            tokio::spawn(async move {
                let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let (s, handler) = (s.clone(), handler.clone());
                    async move {
                        let (parts, body) = req.into_parts();
                        let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                        let seen = Seen {
                            method: parts.method.to_string(),
                            path: parts.uri.path().to_owned(),
                            headers: parts.headers,
                            body: String::from_utf8_lossy(&body).into_owned(),
                        };
                        let (status, answer) = handler(&seen);
                        s.lock().unwrap().push(seen);
                        Ok::<_, Infallible>(hyper::Response::builder().status(status).body(Full::new(Bytes::from(answer))).unwrap())
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    Server { base, seen }
}

impl Server {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

fn file(contents: &str) -> PathBuf {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("hookline-kafka-msk-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("f");
    std::fs::write(&path, contents).unwrap();
    path
}

const EXPIRATION: &str = "2030-01-01T00:00:00Z";

fn credentials_json(id: &str) -> String {
    format!(r#"{{"AccessKeyId":"{id}","SecretAccessKey":"sk-{id}","Token":"st-{id}","Expiration":"{EXPIRATION}"}}"#)
}

async fn fetch(env: &[(&str, &str)]) -> Result<Credentials, CredentialsError> {
    CredentialChain::new(Environment::from_pairs(env.iter().copied()), "eu-west-1").fetch().await
}

#[tokio::test]
async fn environment_credentials_come_first() {
    let c = fetch(&[
        ("AWS_ACCESS_KEY_ID", "AKIAENV"),
        ("AWS_SECRET_ACCESS_KEY", "env-secret"),
        ("AWS_SESSION_TOKEN", "env-session"),
        // Configured too, but the environment's keys win, as in the AWS SDKs.
        ("AWS_CONTAINER_CREDENTIALS_FULL_URI", "http://127.0.0.1:1/creds"),
    ])
    .await
    .unwrap();
    assert_eq!((c.access_key_id.as_str(), c.secret_access_key.expose(), c.source), ("AKIAENV", "env-secret", "environment"));
    assert_eq!(c.session_token.as_ref().map(Secret::expose), Some("env-session"));
    assert_eq!(c.expires_at, None);
    let e = fetch(&[("AWS_ACCESS_KEY_ID", "AKIAENV")]).await.unwrap_err().to_string();
    assert!(e.contains("AWS_SECRET_ACCESS_KEY is not"), "{e}");
    let dump = format!("{c:?}");
    assert!(!dump.contains("env-secret") && !dump.contains("env-session") && dump.contains("AKIAENV"), "{dump}");
}

/// EKS Pod Identity: a full URI and a token file (read at every fetch, it is rotated), sent as Authorization.
#[tokio::test]
async fn the_container_endpoint_is_asked_with_its_authorization_token() {
    let srv = server(|s| {
        if s.headers.get("authorization").and_then(|v| v.to_str().ok()) == Some("pod-identity-token") {
            (200, credentials_json("ASIACONTAINER"))
        } else {
            (401, "no".into())
        }
    })
    .await;
    let uri = format!("{}/v1/credentials", srv.base);
    let token_file = file("pod-identity-token\n");
    let env =
        [("AWS_CONTAINER_CREDENTIALS_FULL_URI", uri.as_str()), ("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", token_file.to_str().unwrap())];
    let c = fetch(&env).await.unwrap();
    assert_eq!((c.access_key_id.as_str(), c.secret_access_key.expose(), c.source), ("ASIACONTAINER", "sk-ASIACONTAINER", "container"));
    assert_eq!(c.session_token.as_ref().map(Secret::expose), Some("st-ASIACONTAINER"));
    assert_eq!(c.expires_at, Some(rfc3339(EXPIRATION)));
    assert_eq!(srv.seen()[0].path, "/v1/credentials");

    // The ECS form: the token in a variable; a wrong one is refused and the error says where and what.
    let e = fetch(&[("AWS_CONTAINER_CREDENTIALS_FULL_URI", uri.as_str()), ("AWS_CONTAINER_AUTHORIZATION_TOKEN", "stale")])
        .await
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("AWS credentials from container:") && e.contains("answered 401"), "{e}");
    assert!(!e.contains("stale"), "the token is not in the error: {e}");

    // Plain http off the machine would carry the token in clear.
    let e = fetch(&[("AWS_CONTAINER_CREDENTIALS_FULL_URI", "http://203.0.113.9/creds")]).await.unwrap_err().to_string();
    assert!(e.contains("must be https, or http to a loopback address"), "{e}");
}

/// IMDSv2: a session token by PUT, then the role and its credentials with that token; the endpoint is
/// `AWS_EC2_METADATA_SERVICE_ENDPOINT`'s.
#[tokio::test]
async fn instance_metadata_is_asked_with_an_imdsv2_session_token() {
    let srv = server(|s| {
        let token = s.headers.get("x-aws-ec2-metadata-token").and_then(|v| v.to_str().ok());
        match (s.method.as_str(), s.path.as_str(), token) {
            ("PUT", "/latest/api/token", None) if s.headers.contains_key("x-aws-ec2-metadata-token-ttl-seconds") => {
                (200, "imds-session".into())
            }
            ("GET", "/latest/meta-data/iam/security-credentials/", Some("imds-session")) => (200, "hookline-node-role\n".into()),
            ("GET", "/latest/meta-data/iam/security-credentials/hookline-node-role", Some("imds-session")) => (
                200,
                format!(
                    r#"{{"Code":"Success","LastUpdated":"2029-12-31T23:00:00Z","Type":"AWS-HMAC",{}"#,
                    &credentials_json("ASIAIMDS")[1..]
                ),
            ),
            _ => (401, String::new()),
        }
    })
    .await;
    let c = fetch(&[("AWS_EC2_METADATA_SERVICE_ENDPOINT", srv.base.as_str())]).await.unwrap();
    assert_eq!((c.access_key_id.as_str(), c.source), ("ASIAIMDS", "instance metadata"));
    assert_eq!(c.session_token.as_ref().map(Secret::expose), Some("st-ASIAIMDS"));
    let paths: Vec<String> = srv.seen().iter().map(|s| format!("{} {}", s.method, s.path)).collect();
    assert_eq!(
        paths,
        [
            "PUT /latest/api/token",
            "GET /latest/meta-data/iam/security-credentials/",
            "GET /latest/meta-data/iam/security-credentials/hookline-node-role"
        ]
    );

    let e = fetch(&[("AWS_EC2_METADATA_DISABLED", "true")]).await.unwrap_err().to_string();
    assert!(e.starts_with("no AWS credentials:") && e.contains("AWS_EC2_METADATA_DISABLED"), "{e}");
}

/// A metadata endpoint that accepts and never answers fails the fetch at its timeout (paused time: no waiting).
#[tokio::test(start_paused = true)]
async fn a_silent_metadata_service_fails_within_its_timeout() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            open.push(stream);
        }
    });
    let started = tokio::time::Instant::now();
    let e = fetch(&[("AWS_EC2_METADATA_SERVICE_ENDPOINT", base.as_str())]).await.unwrap_err().to_string();
    assert!(e.starts_with("no AWS credentials:") && e.contains("did not answer: no answer within 2s"), "{e}");
    assert_eq!(started.elapsed(), Duration::from_secs(2), "bounded by the IMDS timeout");
    held.abort();
}

/// IRSA: STS AssumeRoleWithWebIdentity with the role and the service account's token, at `AWS_ENDPOINT_URL_STS`.
#[tokio::test]
async fn web_identity_assumes_the_role_through_sts() {
    let srv = server(|s| {
        let form: std::collections::HashMap<String, String> = url::form_urlencoded::parse(s.body.as_bytes()).into_owned().collect();
        if form.get("WebIdentityToken").map(String::as_str) != Some("eyJ.sa-token.sig") {
            return (
                400,
                "<ErrorResponse><Error><Type>Sender</Type><Code>InvalidIdentityToken</Code><Message>bad &amp; old</Message></Error></ErrorResponse>"
                    .into(),
            );
        }
        (
            200,
            format!(
                "<AssumeRoleWithWebIdentityResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\"><AssumeRoleWithWebIdentityResult>\
                 <Credentials><AccessKeyId>ASIASTS</AccessKeyId><SecretAccessKey>sts/secret+key</SecretAccessKey>\
                 <SessionToken>sts-session&amp;token</SessionToken><Expiration>{EXPIRATION}</Expiration></Credentials>\
                 </AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>"
            ),
        )
    })
    .await;
    let jwt = file("eyJ.sa-token.sig\n");
    let env = [
        ("AWS_WEB_IDENTITY_TOKEN_FILE", jwt.to_str().unwrap()),
        ("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/hookline"),
        ("AWS_ROLE_SESSION_NAME", "hookline-test"),
        ("AWS_ENDPOINT_URL_STS", srv.base.as_str()),
    ];
    let c = fetch(&env).await.unwrap();
    assert_eq!((c.access_key_id.as_str(), c.secret_access_key.expose(), c.source), ("ASIASTS", "sts/secret+key", "web identity"));
    assert_eq!(c.session_token.as_ref().map(Secret::expose), Some("sts-session&token"));
    assert_eq!(c.expires_at, Some(rfc3339(EXPIRATION)));
    let req = &srv.seen()[0];
    assert_eq!(req.method, "POST");
    let form: Vec<(String, String)> = url::form_urlencoded::parse(req.body.as_bytes()).into_owned().collect();
    assert_eq!(
        form,
        [
            ("Action".into(), "AssumeRoleWithWebIdentity".into()),
            ("Version".into(), "2011-06-15".into()),
            ("RoleArn".into(), "arn:aws:iam::123456789012:role/hookline".into()),
            ("RoleSessionName".into(), "hookline-test".into()),
            ("WebIdentityToken".into(), "eyJ.sa-token.sig".into()),
        ]
    );

    let other = file("eyJ.other.sig");
    let mut env = env;
    env[0].1 = other.to_str().unwrap();
    let e = fetch(&env).await.unwrap_err().to_string();
    assert!(e.contains("answered 400 Bad Request: InvalidIdentityToken bad & old"), "{e}");
    let e = fetch(&env[..1]).await.unwrap_err().to_string();
    assert!(e.contains("AWS_ROLE_ARN is not"), "{e}");
}

/// Credentials are reused while fresh and fetched again 5 minutes before they expire; a failed refresh keeps the
/// old ones until they actually expire. The clock is passed in: no waiting.
#[tokio::test]
async fn credentials_are_cached_and_refreshed_before_they_expire() {
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let f = fail.clone();
    let srv =
        server(
            move |_| {
                if f.load(std::sync::atomic::Ordering::SeqCst) {
                    (500, "down".into())
                } else {
                    (200, credentials_json("ASIACACHED"))
                }
            },
        )
        .await;
    let uri = format!("{}/creds", srv.base);
    let chain = CredentialChain::new(Environment::from_pairs([("AWS_CONTAINER_CREDENTIALS_FULL_URI", uri.as_str())]), "eu-west-1");
    let cache = CredentialCache::new();
    let expiry = rfc3339(EXPIRATION);
    let at = |before_expiry: u64| expiry - Duration::from_secs(before_expiry);

    cache.get(&chain, at(3600)).await.unwrap();
    cache.get(&chain, at(1800)).await.unwrap();
    cache.get(&chain, at(301)).await.unwrap();
    assert_eq!(srv.seen().len(), 1, "fresh credentials are reused");
    cache.get(&chain, at(299)).await.unwrap();
    assert_eq!(srv.seen().len(), 2, "fetched again within 5 minutes of their expiry");

    fail.store(true, std::sync::atomic::Ordering::SeqCst);
    let kept = cache.get(&chain, at(60)).await.unwrap();
    assert_eq!(kept.access_key_id, "ASIACACHED", "a failed refresh keeps credentials that have not expired");
    assert_eq!(srv.seen().len(), 3);
    let e = cache.get(&chain, expiry + Duration::from_secs(1)).await.unwrap_err().to_string();
    assert!(e.contains("answered 500"), "expired credentials are not used: {e}");
}

/// The token of a client: signed with the chain's credentials for the configured region, its lifetime capped by
/// the credentials' expiry so librdkafka asks again before they lapse.
#[tokio::test]
async fn a_clients_token_is_signed_for_its_region_and_lives_no_longer_than_its_credentials() {
    let srv = server(|_| (200, credentials_json("ASIATOKEN"))).await;
    let uri = format!("{}/creds", srv.base);
    let env = || Environment::from_pairs([("AWS_CONTAINER_CREDENTIALS_FULL_URI", uri.as_str())]);
    let client = MskIamClient { region: "ap-southeast-2".into() };
    let cache = CredentialCache::new();

    let now = rfc3339("2029-12-31T23:00:00Z");
    let t = client.token(env(), &cache, now).await.unwrap();
    let url = String::from_utf8(base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(t.token.expose()).unwrap()).unwrap();
    assert!(
        url.starts_with("https://kafka.ap-southeast-2.amazonaws.com?Action=kafka-cluster%3AConnect&X-Amz-Security-Token=st-ASIATOKEN&"),
        "{url}"
    );
    assert!(url.contains("X-Amz-Credential=ASIATOKEN%2F20291231%2Fap-southeast-2%2Fkafka-cluster%2Faws4_request"), "{url}");
    assert!(url.ends_with(&format!("&User-Agent=hookline%2F{}", env!("CARGO_PKG_VERSION"))), "{url}");
    assert!(!url.contains("sk-ASIATOKEN"), "the secret key signs, it is never sent");
    assert_eq!(t.principal, "ASIATOKEN");
    let ms = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
    assert_eq!(t.expires_at_ms, ms(now) + 900_000, "15 minutes when the credentials outlive them");

    let late = rfc3339(EXPIRATION) - Duration::from_secs(400);
    let t = client.token(env(), &cache, late).await.unwrap();
    assert_eq!(t.expires_at_ms, ms(rfc3339(EXPIRATION)), "no longer than the credentials");
}

fn msk_settings(region: Option<&str>) -> KafkaSettings {
    let mut s =
        KafkaSettings { bootstrap_servers: "127.0.0.1:1".into(), security_protocol: SecurityProtocol::SaslSsl, ..Default::default() };
    s.sasl.mechanism = Some(SaslMechanism::AwsMskIam);
    s.aws.region = region.map(str::to_owned);
    s
}

/// The settings reach librdkafka's refresh hook through `sasl.oauthbearer.config`, and the hook signs a token
/// from there (here with the process's environment: this is the only test in this binary that reads it).
#[test]
fn the_refresh_hook_signs_a_token_from_the_client_config() {
    std::env::set_var("AWS_ACCESS_KEY_ID", "AKIAHOOK");
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "hook-secret");
    let s = msk_settings(Some("eu-central-1"));
    s.validate().unwrap();
    let c = hookline_kafka::client::producer_config(&s, "p").unwrap();
    assert_eq!(c.get("sasl.mechanism"), Some("OAUTHBEARER"));
    assert_eq!(c.get("security.protocol"), Some("sasl_ssl"));
    let config = c.get("sasl.oauthbearer.config").unwrap();
    assert_eq!(config, r#"{"aws_msk_iam":{"region":"eu-central-1"}}"#);
    let before = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
    let t = hookline_kafka::oauth::generate(Some(config)).unwrap();
    let url = String::from_utf8(base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(&t.token).unwrap()).unwrap();
    assert!(url.starts_with("https://kafka.eu-central-1.amazonaws.com?Action=kafka-cluster%3AConnect&X-Amz-Algorithm="), "{url}");
    assert!(url.contains("X-Amz-Credential=AKIAHOOK%2F"), "{url}");
    assert_eq!(t.principal_name, "AKIAHOOK");
    assert!((before - 1000 + 900_000..=before + 901_000).contains(&t.lifetime_ms), "{}", t.lifetime_ms);
}
