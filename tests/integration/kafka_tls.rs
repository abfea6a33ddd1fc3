//! Kafka over TLS, with real handshakes done by librdkafka's OpenSSL: a rustls terminator listens in front of the
//! embedded (plaintext) mock broker, and the broker advertises the terminator's address, so every connection of
//! every client (producers, group consumers and their coordinator connections, table readers) goes through TLS. Certificates are made at test time
//! with the `openssl` command. The mock broker has no SASL handshake, so SASL is covered by the configuration
//! tests in crates/kafka, not here.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hookline_kafka::mock::DevBroker;
use hookline_kafka::settings::SecurityProtocol;
use hookline_kafka::Topics;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_util::sync::CancellationToken;

const LIMIT: Duration = Duration::from_secs(60);

/// A CA, server certificates signed by it (one for 127.0.0.1, one for another name), a client certificate signed
/// by it, and an unrelated CA.
struct Pki {
    dir: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the openssl command (Debian package openssl) makes the test certificates");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

impl Pki {
    fn generate(name: &str) -> Pki {
        let dir = std::env::temp_dir().join(format!("hookline-tls-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
        for ca in ["ca", "other-ca"] {
            let (key, pem, subj) = (format!("{ca}.key"), format!("{ca}.pem"), format!("/CN=hookline test {ca}"));
            let mut args = vec!["req", "-x509", "-days", "2", "-keyout", &key, "-out", &pem, "-subj", &subj];
            args.extend(ec);
            args.extend(["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"]);
            openssl(&dir, &args);
        }
        for (leaf, san, usage) in [
            ("server", "IP:127.0.0.1,DNS:localhost", "serverAuth"),
            ("wronghost", "DNS:broker.invalid", "serverAuth"),
            ("client", "DNS:hookline-client", "clientAuth"),
        ] {
            let (key, csr, pem, ext) = (format!("{leaf}.key"), format!("{leaf}.csr"), format!("{leaf}.pem"), format!("{leaf}.ext"));
            std::fs::write(
                dir.join(&ext),
                format!("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage={usage}\nsubjectAltName={san}\n"),
            )
            .unwrap();
            let subj = format!("/CN={leaf}");
            let mut args = vec!["req", "-keyout", &key, "-out", &csr, "-subj", &subj];
            args.extend(ec);
            openssl(&dir, &args);
            openssl(
                &dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    "ca.pem",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-days",
                    "2",
                    "-out",
                    &pem,
                    "-extfile",
                    &ext,
                ],
            );
        }
        Pki { dir }
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }
}

/// Terminates TLS for the mock broker: accepts on 127.0.0.1:0, forwards the plaintext to the broker.
struct Terminator {
    port: u16,
    handshakes: Arc<AtomicUsize>,
}

impl Terminator {
    /// `server` names the certificate it presents; with `require_client_cert` it asks for a client certificate
    /// signed by the test CA and refuses connections without one.
    fn start(pki: &Pki, server: &str, require_client_cert: bool, upstream: String) -> Terminator {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_file_iter(pki.path(&format!("{server}.pem"))).unwrap().map(Result::unwrap).collect();
        let key = PrivateKeyDer::from_pem_file(pki.path(&format!("{server}.key"))).unwrap();
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions().unwrap();
        let config = if require_client_cert {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(pki.path("ca.pem")).unwrap() {
                roots.add(c.unwrap()).unwrap();
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider).build().unwrap();
            builder.with_client_cert_verifier(verifier).with_single_cert(chain, key).unwrap()
        } else {
            builder.with_no_client_auth().with_single_cert(chain, key).unwrap()
        };
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let handshakes = Arc::new(AtomicUsize::new(0));
        let done = handshakes.clone();
        // Its own thread and runtime, as a separate proxy process would be: on the test's runtime its tasks starve
        // whenever the clients' synchronous librdkafka calls (a commit in a revoke callback, the final commit, a
        // consumer's close) hold every worker thread, and those calls wait for the proxy: the clients then hang
        // until librdkafka's request timeout.
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                loop {
                    let Ok((tcp, _)) = listener.accept().await else { return };
                    let (acceptor, upstream, done) = (acceptor.clone(), upstream.clone(), done.clone());
                    tokio::spawn(async move {
                        let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                        done.fetch_add(1, Ordering::Relaxed);
                        let Ok(mut broker) = tokio::net::TcpStream::connect(&upstream).await else { return };
                        let _ = tokio::io::copy_bidirectional(&mut tls, &mut broker).await;
                    });
                }
            });
        });
        Terminator { port, handshakes }
    }

    fn handshakes(&self) -> usize {
        self.handshakes.load(Ordering::Relaxed)
    }
}

/// Points `config` at the terminator over TLS, trusting `ca`.
fn use_tls(config: &mut hookline_service::Config, t: &Terminator, pki: &Pki, ca: &str) {
    config.kafka.bootstrap_servers = format!("127.0.0.1:{}", t.port);
    config.kafka.security_protocol = SecurityProtocol::Ssl;
    config.kafka.tls.ca_file = Some(pki.path(ca));
}

/// A broker behind a terminator, and a config that reaches it over TLS; `edit` adjusts the TLS settings.
fn tls_broker(
    pki: &Pki,
    server: &str,
    mtls: bool,
    edit: impl FnOnce(&mut hookline_service::Config),
) -> (DevBroker, Terminator, hookline_service::Config) {
    let topics = Topics::new("hookline.");
    let broker = DevBroker::start(&topics, 1, 1).unwrap();
    let t = Terminator::start(pki, server, mtls, broker.bootstrap_servers());
    broker.advertise("127.0.0.1", t.port).unwrap();
    let mut config = hookline_service::Config::dev(&broker.bootstrap_servers(), 1, crate::support::TOKEN);
    config.telemetry.log_level = "warn".into();
    use_tls(&mut config, &t, pki, "ca.pem");
    edit(&mut config);
    config.validate().expect("the TLS settings are valid");
    (broker, t, config)
}

/// hookline's producer writes a record over TLS and hookline's table reader reads it back over TLS.
async fn round_trip(config: &hookline_service::Config) {
    let topic = Topics::new("hookline.").subscriptions().to_owned();
    let producer = hookline_kafka::client::producer(&config.kafka, "tls-producer").unwrap();
    let acked = tokio::time::timeout(LIMIT, hookline_kafka::produce::send(&producer, &topic, "sub_tls", b"over tls")).await;
    acked.expect("acknowledged in time").expect("the record is acknowledged");
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = seen.clone();
    let cancel = CancellationToken::new();
    let reader = hookline_kafka::table::spawn(
        &config.kafka,
        &topic,
        "tls-reader",
        move |_, k, v| s.lock().unwrap().push((k.to_vec(), v.map(<[u8]>::to_vec))),
        cancel.clone(),
    )
    .await
    .expect("the reader connects over TLS");
    tokio::time::timeout(LIMIT, reader.wait_caught_up()).await.expect("caught up in time");
    assert_eq!(*seen.lock().unwrap(), vec![(b"sub_tls".to_vec(), Some(b"over tls".to_vec()))]);
    cancel.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_go_through_tls_both_ways() {
    let pki = Pki::generate("ok");
    let (broker, t, config) = tls_broker(&pki, "server", false, |_| {});
    round_trip(&config).await;
    assert!(t.handshakes() >= 2, "only {} TLS handshakes", t.handshakes());
    std::mem::forget(broker);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_works_with_a_client_certificate() {
    let pki = Pki::generate("mtls");
    let (broker, t, config) = tls_broker(&pki, "server", true, |c| {
        c.kafka.tls.cert_file = Some(pki.path("client.pem"));
        c.kafka.tls.key_file = Some(pki.path("client.key"));
    });
    round_trip(&config).await;
    assert!(t.handshakes() >= 2, "only {} TLS handshakes", t.handshakes());
    std::mem::forget(broker);
}

/// Starts ingest alone against a terminator and returns its start error and how long it took to fail.
async fn ingest_start_error(
    pki: &Pki,
    server: &str,
    mtls: bool,
    edit: impl FnOnce(&mut hookline_service::Config),
) -> (String, Duration, usize) {
    let topics = Topics::new("hookline.");
    let broker = DevBroker::start(&topics, 1, 1).unwrap();
    let t = Terminator::start(pki, server, mtls, broker.bootstrap_servers());
    broker.advertise("127.0.0.1", t.port).unwrap();
    let mut config = hookline_service::Config::dev(&broker.bootstrap_servers(), 1, crate::support::TOKEN);
    config.telemetry.log_level = "warn".into();
    use_tls(&mut config, &t, pki, "ca.pem");
    edit(&mut config);
    config.validate().unwrap();
    let started = Instant::now();
    let shutdown = CancellationToken::new();
    let result = tokio::time::timeout(LIMIT, hookline_ingest::run(config, shutdown.clone(), Default::default())).await;
    shutdown.cancel();
    let elapsed = started.elapsed();
    // Clients may still be closing against it.
    std::mem::forget(broker);
    match result {
        Ok(Err(e)) => (e.to_string(), elapsed, t.handshakes()),
        Ok(Ok(())) => panic!("ingest started without a working TLS connection"),
        Err(_) => panic!("ingest neither started nor failed within {LIMIT:?}"),
    }
}

/// "Fails fast": well before the 10 s a metadata request would wait for a broker that never answers.
const FAST: Duration = Duration::from_secs(8);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_fails_fast_and_says_so() {
    let pki = Pki::generate("wrongca");
    let (e, took, handshakes) = ingest_start_error(&pki, "server", false, |c| c.kafka.tls.ca_file = Some(pki.path("other-ca.pem"))).await;
    assert!(took < FAST, "took {took:?}: {e}");
    assert_eq!(handshakes, 0);
    assert!(e.contains("the TLS handshake with the broker failed (check kafka.tls.ca_file"), "{e}");
    assert!(e.contains("certificate verify failed"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostname_mismatch_fails_unless_the_check_is_off() {
    let pki = Pki::generate("host");
    let (e, took, handshakes) = ingest_start_error(&pki, "wronghost", false, |_| {}).await;
    assert!(took < FAST, "took {took:?}: {e}");
    assert_eq!(handshakes, 0);
    assert!(e.contains("the TLS handshake with the broker failed") && e.contains("certificate verify failed"), "{e}");

    // The same certificate is accepted once kafka.tls.check_hostname is off: the name was the only problem.
    let (broker, t, config) = tls_broker(&pki, "wronghost", false, |c| c.kafka.tls.check_hostname = false);
    round_trip(&config).await;
    assert!(t.handshakes() >= 2);
    std::mem::forget(broker);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_without_a_client_certificate_fails_and_says_so() {
    let pki = Pki::generate("nocert");
    let (e, took, _) = ingest_start_error(&pki, "server", true, |_| {}).await;
    assert!(took < FAST, "took {took:?}: {e}");
    assert!(e.contains("the TLS handshake with the broker failed"), "{e}");
    assert!(e.contains("kafka.tls.cert_file/key_file if the broker requires a client certificate"), "{e}");
}

/// The whole pipeline over TLS: ingest (API, fan-out group), dispatcher and retry-scheduler (their groups, table
/// readers, producers) and the test's collectors reach the broker only through the terminator. An event that fails
/// once goes through the retry-scheduler and arrives at the receiver; the services then stop cleanly (drain, commit,
/// leave their groups) over TLS.
async fn pipeline_over_tls(name: &str, mtls: bool) {
    let pki = Pki::generate(name);
    let broker = DevBroker::start(&Topics::new("hookline."), 2, 2).unwrap();
    let t = Terminator::start(&pki, "server", mtls, broker.bootstrap_servers());
    broker.advertise("127.0.0.1", t.port).unwrap();
    let bootstrap = broker.bootstrap_servers();
    let p = crate::support::Pipeline::start_at(
        Some(broker),
        &bootstrap,
        2,
        |c| {
            use_tls(c, &t, &pki, "ca.pem");
            if mtls {
                c.kafka.tls.cert_file = Some(pki.path("client.pem"));
                c.kafka.tls.key_file = Some(pki.path("client.key"));
            }
        },
        true,
    )
    .await;
    let toml = crate::pipeline::quick_policy(&[1.0], |_| {});
    p.script("tls", vec![Some((503, None)), Some((200, None))]);
    let (id, _) = p.subscribe(serde_json::json!({"url": p.url("tls"), "event_types": ["*"], "policy_toml": toml})).await;
    p.publish("evt_tls1", "order.created").await;
    let attempts = p.wait_final_of(&id, 1, LIMIT).await;
    assert_eq!(p.requests_to("tls").len(), 2, "a failure, then the retry's success");
    let last = attempts.last().unwrap();
    assert_eq!((last.attempt, last.final_state.as_str()), (2, "succeeded"), "{attempts:?}");
    // Three group members, their table readers, producers and the collectors: every one connected through TLS.
    assert!(t.handshakes() >= 10, "only {} TLS handshakes", t.handshakes());
    tokio::time::timeout(LIMIT, p.stop()).await.expect("the services stop over TLS in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_published_over_tls_arrive_through_the_whole_pipeline() {
    pipeline_over_tls("pipeline", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_pipeline_works_over_mutual_tls() {
    pipeline_over_tls("pipeline-mtls", true).await;
}
