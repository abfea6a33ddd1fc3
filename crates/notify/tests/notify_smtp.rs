//! Owner e-mail: the SMTP client (lettre) against a test SMTP server on 127.0.0.1:0 started here — plain,
//! STARTTLS and implicit TLS, with certificates made by the `openssl` command — and `notify::run` end to end from
//! the embedded broker's `ops` topic to that server.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hookline_core::model::OpsEvent;
use hookline_kafka::mock::DevBroker;
use hookline_kafka::Topics;
use hookline_notify::smtp::{self, Credentials, SmtpError, SmtpSettings, Stage};
use hookline_notify::{Notifier, Skip};
use hookline_service::config::{NotifySettings, SmtpTls};
use prost::Message as _;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

// ---------------------------------------------------------------------------------------------------------------
// The test SMTP server.

/// One accepted message as the server saw it.
#[derive(Debug, Clone, Default)]
struct Recorded {
    ehlo: String,
    auth: Option<String>,
    /// Whether the session was encrypted when AUTH came (if it came) and when the message came.
    auth_encrypted: bool,
    encrypted: bool,
    from: String,
    to: Vec<String>,
    /// The message after removing the transparency dots, CRLF line endings.
    data: String,
}

impl Recorded {
    /// Header fields, unfolded (RFC 5322 2.2.3: a CRLF followed by white space continues the field).
    fn headers(&self) -> Vec<String> {
        let head = self.data.split("\r\n\r\n").next().unwrap();
        let mut out: Vec<String> = Vec::new();
        for line in head.split("\r\n") {
            match out.last_mut() {
                Some(last) if line.starts_with([' ', '\t']) => last.push_str(line),
                _ => out.push(line.to_owned()),
            }
        }
        out
    }

    fn header(&self, name: &str) -> Option<String> {
        let prefix = format!("{}:", name.to_ascii_lowercase());
        self.headers().iter().find(|h| h.to_ascii_lowercase().starts_with(&prefix)).map(|h| h[prefix.len()..].trim().to_owned())
    }

    fn body(&self) -> &str {
        self.data.split_once("\r\n\r\n").map_or("", |(_, b)| b)
    }
}

#[derive(Default)]
struct Fake {
    mails: Mutex<Vec<Recorded>>,
    commands: Mutex<Vec<String>>,
    changed: Notify,
    /// Raw replies to RCPT TO, used in order; then `250`.
    rcpt_replies: Mutex<VecDeque<&'static str>>,
    /// Accept connections and never say anything.
    silent: bool,
    /// Offer STARTTLS with this certificate.
    starttls: Option<TlsAcceptor>,
    /// TLS from the first byte.
    implicit: Option<TlsAcceptor>,
}

impl Fake {
    fn mails(&self) -> Vec<Recorded> {
        self.mails.lock().unwrap().clone()
    }

    fn commands(&self) -> Vec<String> {
        self.commands.lock().unwrap().clone()
    }
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

async fn fake_smtp(fake: Fake) -> (SocketAddr, Arc<Fake>) {
    let fake = Arc::new(fake);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind fake SMTP server");
    let addr = listener.local_addr().unwrap();
    let f = fake.clone();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let f = f.clone();
            tokio::spawn(async move {
                let result = match &f.implicit {
                    Some(acceptor) => match acceptor.accept(sock).await {
                        Ok(tls) => session(Box::new(tls), &f, true, true).await,
                        Err(e) => Err(e),
                    },
                    None => session(Box::new(sock), &f, false, true).await,
                };
                if let Err(e) = result {
                    eprintln!("fake SMTP session ended: {e}");
                }
            });
        }
    });
    (addr, fake)
}

/// One session; after STARTTLS it goes on in a new call on the encrypted stream (without a greeting).
async fn session(sock: Box<dyn Io>, fake: &Fake, encrypted: bool, greet: bool) -> std::io::Result<()> {
    let mut r = BufReader::new(sock);
    if fake.silent {
        let mut sink = Vec::new();
        let _ = r.read_until(b'\n', &mut sink).await;
        std::future::pending::<()>().await;
    }
    if greet {
        r.get_mut().write_all(b"220 fake.test ESMTP ready\r\n").await?;
    }
    let mut cur = Recorded { encrypted, ..Default::default() };
    loop {
        let mut raw = Vec::new();
        if r.read_until(b'\n', &mut raw).await? == 0 {
            return Ok(());
        }
        let line = String::from_utf8(raw).expect("commands are UTF-8");
        assert!(line.ends_with("\r\n"), "a command must end in CRLF: {line:?}");
        let line = line.trim_end_matches("\r\n").to_owned();
        fake.commands.lock().unwrap().push(line.clone());
        let upper = line.to_ascii_uppercase();
        let arg = |prefix: &str| line[prefix.len()..].trim().trim_start_matches('<').trim_end_matches('>').to_owned();
        let reply: String = if upper.starts_with("EHLO ") {
            cur.ehlo = line[5..].to_owned();
            let starttls = if fake.starttls.is_some() && !encrypted { "250-STARTTLS\r\n" } else { "" };
            format!("250-fake.test greets you\r\n250-PIPELINING\r\n{starttls}250-AUTH LOGIN PLAIN\r\n250 8BITMIME\r\n")
        } else if upper == "STARTTLS" && !encrypted && fake.starttls.is_some() {
            r.get_mut().write_all(b"220 2.0.0 Ready to start TLS\r\n").await?;
            let tls = fake.starttls.as_ref().unwrap().accept(r.into_inner()).await?;
            return Box::pin(session(Box::new(tls), fake, true, false)).await;
        } else if upper.starts_with("AUTH PLAIN ") {
            cur.auth = Some(line[11..].to_owned());
            cur.auth_encrypted = encrypted;
            "235 2.7.0 Authentication successful\r\n".into()
        } else if upper.starts_with("MAIL FROM:") {
            cur.from = arg("MAIL FROM:");
            "250 2.1.0 Ok\r\n".into()
        } else if upper.starts_with("RCPT TO:") {
            let scripted = fake.rcpt_replies.lock().unwrap().pop_front();
            match scripted {
                Some(r) => format!("{r}\r\n"),
                None => {
                    cur.to.push(arg("RCPT TO:"));
                    "250 2.1.5 Ok\r\n".into()
                }
            }
        } else if upper == "DATA" {
            r.get_mut().write_all(b"354 End data with <CR><LF>.<CR><LF>\r\n").await?;
            let mut data = String::new();
            loop {
                let mut raw = Vec::new();
                if r.read_until(b'\n', &mut raw).await? == 0 {
                    return Ok(());
                }
                let l = String::from_utf8(raw).expect("the message is UTF-8");
                assert!(l.ends_with("\r\n"), "a message line must end in CRLF: {l:?}");
                assert!(!l[..l.len() - 2].contains(['\r', '\n']), "bare CR or LF in a line: {l:?}");
                if l == ".\r\n" {
                    break;
                }
                data.push_str(l.strip_prefix('.').unwrap_or(&l));
            }
            cur.data = data;
            cur.encrypted = encrypted;
            fake.mails.lock().unwrap().push(std::mem::replace(&mut cur, Recorded { encrypted, ..Default::default() }));
            fake.changed.notify_waiters();
            "250 2.0.0 Ok: queued as 1\r\n".into()
        } else if upper == "QUIT" {
            r.get_mut().write_all(b"221 2.0.0 Bye\r\n").await?;
            return Ok(());
        } else if upper == "RSET" {
            cur = Recorded { encrypted, ..Default::default() };
            "250 2.0.0 Ok\r\n".into()
        } else {
            "502 5.5.2 Error: command not recognized\r\n".into()
        };
        r.get_mut().write_all(reply.as_bytes()).await?;
        r.get_mut().flush().await?;
    }
}

/// A test CA and a certificate for 127.0.0.1 / localhost signed by it, made with the `openssl` command.
struct Pki {
    dir: PathBuf,
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
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
        let dir = std::env::temp_dir().join(format!("hookline-smtp-tls-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
        let mut args = vec!["req", "-x509", "-days", "2", "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=hookline smtp test ca"];
        args.extend(ec);
        args.extend(["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"]);
        openssl(&dir, &args);
        std::fs::write(
            dir.join("server.ext"),
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .unwrap();
        let mut args = vec!["req", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=server"];
        args.extend(ec);
        openssl(&dir, &args);
        openssl(
            &dir,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-out",
                "server.pem",
                "-extfile",
                "server.ext",
            ],
        );
        Pki { dir }
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    fn acceptor(&self) -> TlsAcceptor {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_file_iter(self.path("server.pem")).unwrap().map(Result::unwrap).collect();
        let key = PrivateKeyDer::from_pem_file(self.path("server.key")).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        TlsAcceptor::from(Arc::new(config))
    }
}

async fn wait_for(notify: &Notify, limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    loop {
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if cond() {
            return;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || tokio::time::timeout(left, notified).await.is_err() && !cond() {
            panic!("timed out after {limit:?} waiting for {what}");
        }
    }
}

fn settings(addr: SocketAddr) -> NotifySettings {
    NotifySettings { smtp_addr: Some(addr.to_string()), from: "hookline@hooks.example.com".into(), timeout_ms: 5_000, ..Default::default() }
}

fn event(kind: &str, id: &str, owner: &str) -> OpsEvent {
    OpsEvent {
        kind: kind.into(),
        subscription_id: id.into(),
        reason: "consecutive_failures".into(),
        detail: "policy lucibook; 50 consecutive counted failures; condition Paused".into(),
        at_ms: 1_741_082_405_123,
        owner_email: owner.into(),
        url: "https://hooks.customer.example/lucibook".into(),
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The client.

fn plain(addr: SocketAddr) -> SmtpSettings {
    SmtpSettings {
        host: addr.ip().to_string(),
        port: addr.port(),
        tls: SmtpTls::None,
        ca_pem: None,
        credentials: None,
        timeout: Duration::from_secs(5),
    }
}

fn alice() -> Option<Credentials> {
    Some(Credentials { username: "alice".into(), password: "s3cret".into() })
}

#[tokio::test]
async fn the_server_records_the_envelope_and_the_unstuffed_message() {
    let (addr, fake) = fake_smtp(Fake::default()).await;
    let settings = SmtpSettings { credentials: alice(), ..plain(addr) };
    // Lines that start with a dot and a lone dot (which would end DATA early).
    let message = "Subject: dots\r\n\r\n.hidden\r\n.\r\n..two\r\nlast line\r\n";
    smtp::send(&settings, "hookline@hooks.example.com", &["owner@customer.example".into()], message.as_bytes())
        .await
        .expect("the server accepts the message");

    let mails = fake.mails();
    assert_eq!(mails.len(), 1);
    let m = &mails[0];
    assert!(!m.ehlo.is_empty(), "EHLO names the client");
    assert_eq!(m.auth.as_deref(), Some("AGFsaWNlAHMzY3JldA=="), "AUTH PLAIN is base64(\\0alice\\0s3cret)");
    assert_eq!(m.from, "hookline@hooks.example.com");
    assert_eq!(m.to, vec!["owner@customer.example".to_owned()]);
    assert_eq!(m.data, message);
    let commands = fake.commands();
    assert_eq!(commands.last().map(String::as_str), Some("QUIT"));
    assert_eq!(commands.iter().filter(|c| c.starts_with("EHLO")).count(), 1);
}

#[tokio::test]
async fn no_auth_without_credentials() {
    let (addr, fake) = fake_smtp(Fake::default()).await;
    smtp::send(&plain(addr), "a@b.example", &["c@d.example".into()], b"Subject: x\r\n\r\nhi\r\n").await.unwrap();
    assert!(fake.commands().iter().all(|c| !c.starts_with("AUTH")), "{:?}", fake.commands());
    assert_eq!(fake.mails().len(), 1);
}

#[tokio::test]
async fn starttls_encrypts_before_auth_and_the_message() {
    let pki = Pki::generate("starttls");
    let (addr, fake) = fake_smtp(Fake { starttls: Some(pki.acceptor()), ..Default::default() }).await;
    let ca = std::fs::read(pki.path("ca.pem")).unwrap();
    let settings = SmtpSettings { tls: SmtpTls::Starttls, ca_pem: Some(ca), credentials: alice(), ..plain(addr) };
    smtp::send(&settings, "a@b.example", &["c@d.example".into()], b"Subject: x\r\n\r\nhi\r\n").await.expect("sent over STARTTLS");
    let m = &fake.mails()[0];
    assert!(m.encrypted && m.auth_encrypted, "AUTH and the message went over TLS: {m:?}");
    assert_eq!(m.auth.as_deref(), Some("AGFsaWNlAHMzY3JldA=="));
    let commands = fake.commands();
    let starttls = commands.iter().position(|c| c == "STARTTLS").expect("STARTTLS sent");
    assert!(commands[..starttls].iter().all(|c| !c.starts_with("AUTH") && !c.starts_with("MAIL")), "{commands:?}");
    assert_eq!(commands.iter().filter(|c| c.starts_with("EHLO")).count(), 2, "EHLO again after STARTTLS: {commands:?}");

    // The server's certificate must be trusted: with the public roots only, the handshake fails and nothing
    // (above all no password) is sent.
    let (addr, fake) = fake_smtp(Fake { starttls: Some(pki.acceptor()), ..Default::default() }).await;
    let err = smtp::send(
        &SmtpSettings { tls: SmtpTls::Starttls, credentials: alice(), ..plain(addr) },
        "a@b.example",
        &["c@d.example".into()],
        b"x\r\n",
    )
    .await
    .unwrap_err();
    assert!(matches!(err, SmtpError::Smtp { stage: Stage::StartTls, .. }), "{err:?}");
    assert!(fake.commands().iter().all(|c| !c.starts_with("AUTH")), "{:?}", fake.commands());
}

#[tokio::test]
async fn starttls_is_required_when_configured_never_skipped() {
    let (addr, fake) = fake_smtp(Fake::default()).await;
    let settings = SmtpSettings { tls: SmtpTls::Starttls, credentials: alice(), ..plain(addr) };
    let err = smtp::send(&settings, "a@b.example", &["c@d.example".into()], b"x\r\n").await.unwrap_err();
    assert!(matches!(err, SmtpError::StartTlsNotOffered), "{err:?}");
    assert!(err.to_string().contains("notify.tls"), "{err}");
    assert!(fake.commands().iter().all(|c| !c.starts_with("AUTH") && !c.starts_with("MAIL")), "{:?}", fake.commands());
}

#[tokio::test]
async fn implicit_tls_from_the_first_byte() {
    let pki = Pki::generate("implicit");
    let (addr, fake) = fake_smtp(Fake { implicit: Some(pki.acceptor()), ..Default::default() }).await;
    let ca = std::fs::read(pki.path("ca.pem")).unwrap();
    let settings = SmtpSettings { tls: SmtpTls::Implicit, ca_pem: Some(ca), credentials: alice(), ..plain(addr) };
    smtp::send(&settings, "a@b.example", &["c@d.example".into()], b"Subject: x\r\n\r\nhi\r\n").await.expect("sent over SMTPS");
    let m = &fake.mails()[0];
    assert!(m.encrypted && m.auth_encrypted, "{m:?}");
    assert!(fake.commands().iter().all(|c| c != "STARTTLS"));
}

#[tokio::test]
async fn a_composed_mail_has_its_headers_and_user_text_cannot_add_one() {
    let (addr, fake) = fake_smtp(Fake::default()).await;
    let notifier = Notifier::new(&settings(addr)).expect("valid settings").expect("smtp_addr is set");
    let mut ev = event("endpoint_paused", "sub-1", "owner@customer.example");
    ev.url = "https://hooks.customer.example/x\r\nBcc: victim@evil.example\r\n\r\nforged body".into();
    ev.detail = "line one\r\n.\r\nline two".into();
    let mail = notifier.compose(&ev, 1_741_082_405_000).expect("a paused endpoint with an owner is mailed");
    notifier.send(&mail).await.expect("sent");

    let m = &fake.mails()[0];
    assert_eq!(m.to, vec!["owner@customer.example".to_owned()]);
    assert_eq!(m.from, "hookline@hooks.example.com");
    assert_eq!(m.header("From").as_deref(), Some("hookline@hooks.example.com"));
    assert_eq!(m.header("To").as_deref(), Some("owner@customer.example"));
    let subject = m.header("Subject").unwrap();
    assert_eq!(
        subject.split_whitespace().collect::<Vec<_>>().join(" "),
        "[hookline] Endpoint paused: https://hooks.customer.example/x Bcc: victim@evil.example forged body"
    );
    assert_eq!(m.header("Date").as_deref(), Some("Tue, 04 Mar 2025 10:00:05 +0000"));
    assert_eq!(m.header("Message-ID").as_deref(), Some("<hookline.endpoint_paused.sub-1.1741082405123@hooks.example.com>"));
    assert_eq!(m.header("Content-Type").as_deref(), Some("text/plain; charset=utf-8"));
    assert_eq!(m.header("Auto-Submitted").as_deref(), Some("auto-generated"));
    assert_eq!(m.header("X-Hookline-Subscription").as_deref(), Some("sub-1"));
    assert_eq!(m.header("X-Hookline-Event").as_deref(), Some("endpoint_paused"));
    assert!(m.header("Bcc").is_none(), "a CR/LF in the URL must not start a header: {:?}", m.headers());
    let mut names: Vec<String> = m.headers().iter().map(|h| h.split(':').next().unwrap().to_ascii_lowercase()).collect();
    names.sort();
    let mut want: Vec<String> = [
        "from",
        "to",
        "subject",
        "date",
        "message-id",
        "mime-version",
        "content-type",
        "content-transfer-encoding",
        "auto-submitted",
        "x-hookline-subscription",
        "x-hookline-event",
    ]
    .map(String::from)
    .to_vec();
    want.sort();
    assert_eq!(names, want);
    let body = m.body();
    assert!(body.contains("Subscription: sub-1\r\n"), "{body}");
    assert!(body.contains("Reason:       consecutive_failures\r\n"), "{body}");
    assert!(body.contains("Detail:       line one  .  line two\r\n"), "{body}");
    assert!(body.contains("POST /v1/subscriptions/sub-1/resume"), "{body}");
}

#[tokio::test]
async fn non_ascii_text_is_encoded_and_arrives_intact() {
    let (addr, fake) = fake_smtp(Fake::default()).await;
    let notifier = Notifier::new(&settings(addr)).unwrap().unwrap();
    let mut ev = event("endpoint_paused", "sub-\u{e9}", "owner@customer.example");
    ev.url = "https://b\u{fc}cher.example/hook".into();
    let mail = notifier.compose(&ev, 0).unwrap();
    assert!(mail.message.is_ascii(), "7-bit on the wire: headers RFC 2047, body quoted-printable or base64");
    notifier.send(&mail).await.unwrap();
    let m = &fake.mails()[0];
    let subject = m.header("Subject").unwrap();
    assert!(subject.contains("=?utf-8?") || subject.contains("=?UTF-8?"), "{subject}");
    assert!(m.header("Content-Transfer-Encoding").is_some_and(|e| e == "quoted-printable" || e == "base64"), "{:?}", m.headers());
}

#[test]
fn each_kind_says_what_to_do_and_others_are_skipped() {
    let n = Notifier::new(&settings("127.0.0.1:25".parse().unwrap())).unwrap().unwrap();
    let text = |kind: &str| {
        let m = n.compose(&event(kind, "sub-9", "o@x.example"), 0).unwrap();
        (m.subject, String::from_utf8(m.message).unwrap())
    };
    let (subject, msg) = text("endpoint_disabled");
    assert_eq!(subject, "[hookline] Endpoint disabled: https://hooks.customer.example/lucibook");
    assert!(msg.contains("PATCH /v1/subscriptions/sub-9\r\n    {\"enabled\": true}"), "{msg}");
    // A recovery is an ops event for automation, not a mail.
    assert_eq!(
        n.compose(&event("endpoint_recovered", "s", "o@x.example"), 0).unwrap_err(),
        Skip::NotNotifiable("endpoint_recovered".into())
    );
    assert_eq!(text("endpoint_paused").0, "[hookline] Endpoint paused: https://hooks.customer.example/lucibook");

    assert_eq!(n.compose(&event("delivery_dead", "s", "o@x.example"), 0).unwrap_err(), Skip::NotNotifiable("delivery_dead".into()));
    assert_eq!(n.compose(&event("endpoint_paused", "s", ""), 0).unwrap_err(), Skip::NoOwnerEmail);
    // An owner address that would smuggle a second recipient into the SMTP conversation.
    let evil = event("endpoint_paused", "s", "o@x.example>\r\nRCPT TO:<victim@evil.example");
    assert_eq!(n.compose(&evil, 0).unwrap_err(), Skip::UnusableOwnerEmail);
    assert!(matches!(n.compose_record(b"\xff\xff\xff").unwrap_err(), Skip::Undecodable(_)));
}

#[test]
fn notify_settings_are_validated() {
    let load = |toml: &str| hookline_service::Config::from_toml_with_env(toml, "t", Vec::<(String, String)>::new());
    let c = load("").unwrap();
    assert!(c.notify.smtp_addr.is_none());
    assert_eq!((c.notify.from.as_str(), c.notify.timeout_ms), ("hookline@localhost", 10_000));
    let c = load("[notify]\nsmtp_addr = \"127.0.0.1:1025\"\nfrom = \"hooks@example.com\"\n").unwrap();
    assert_eq!(c.notify.smtp_addr.as_deref(), Some("127.0.0.1:1025"));
    assert_eq!(c.notify.tls_mode(), SmtpTls::None, "a loopback relay: plain by default");
    let e = load("[notify]\nsmtp_addr = \"127.0.0.1:1025\"\nfrom = \"hookline\"\n").unwrap_err();
    assert!(e.to_string().contains("notify.from"), "{e}");
    let e = load("[notify]\nsmtp_addr = \"relay\"\n").unwrap_err();
    assert!(e.to_string().contains("notify.smtp_addr"), "{e}");
    let e = load("[notify]\nsmtp_addr = \"relay:25\"\nusername = \"u\"\n").unwrap_err();
    assert!(e.to_string().contains("notify.password"), "{e}");
    let e = load("[notify]\nsmtp_host = \"relay:25\"\n").unwrap_err();
    assert!(e.to_string().contains("smtp_host"), "{e}");
    let e = load("[notify]\nsmtp_addr = \"relay:25\"\ntls = \"ssl\"\n").unwrap_err();
    assert!(e.to_string().contains("tls") && e.to_string().contains("starttls"), "{e}");
    // Any other relay: STARTTLS by default, and never a password in plain text.
    let c = load("[notify]\nsmtp_addr = \"mail.example.com:587\"\nusername = \"u\"\npassword = \"p\"\n").unwrap();
    assert_eq!(c.notify.tls_mode(), SmtpTls::Starttls);
    let e = load("[notify]\nsmtp_addr = \"mail.example.com:25\"\ntls = \"none\"\nusername = \"u\"\npassword = \"p\"\n").unwrap_err();
    assert!(e.to_string().contains("notify.tls") && e.to_string().contains("plain text"), "{e}");
    assert!(load("[notify]\nsmtp_addr = \"mail.example.com:25\"\ntls = \"none\"\n").is_ok(), "no credentials: plain is allowed");
    assert!(load("[notify]\nsmtp_addr = \"localhost:25\"\ntls = \"none\"\nusername = \"u\"\npassword = \"p\"\n").is_ok(), "loopback dev");
    assert!(load("[notify]\nsmtp_addr = \"[::1]:25\"\nusername = \"u\"\npassword = \"p\"\n").is_ok(), "loopback dev");
    let e = load("[notify]\nsmtp_addr = \"127.0.0.1:25\"\ntls_ca_file = \"/ca.pem\"\n").unwrap_err();
    assert!(e.to_string().contains("notify.tls_ca_file"), "{e}");
    let c = load("[notify]\nsmtp_addr = \"127.0.0.1:465\"\ntls = \"implicit\"\ntls_ca_file = \"/nonexistent/ca.pem\"\n").unwrap();
    let e = Notifier::new(&c.notify).unwrap_err();
    assert!(e.to_string().contains("notify.tls_ca_file"), "{e}");
    // Without a relay nothing is checked (e-mail is off).
    assert!(load("[notify]\nfrom = \"nope\"\n").is_ok());
    assert!(!format!("{:?}", load("[notify]\npassword = \"hunter2\"\nusername = \"u\"\n").unwrap().notify).contains("hunter2"));
}

#[tokio::test]
async fn an_error_reply_is_typed_and_names_its_code() {
    let fake =
        Fake { rcpt_replies: Mutex::new(["550 5.1.1 <nobody@customer.example>: Recipient address rejected"].into()), ..Default::default() };
    let (addr, fake) = fake_smtp(fake).await;
    let err = smtp::send(&plain(addr), "a@b.example", &["nobody@customer.example".into()], b"Subject: x\r\n\r\nhi\r\n").await.unwrap_err();
    match &err {
        SmtpError::Smtp { stage: Stage::RcptTo, .. } => assert!(err.to_string().contains("Recipient address rejected"), "{err}"),
        other => panic!("expected a refusal of RCPT TO, got {other:?}"),
    }
    assert_eq!(err.code(), Some(550));
    assert!(err.rejects_message());
    assert!(err.to_string().contains("RCPT TO") && err.to_string().contains("550"), "{err}");
    assert!(fake.mails().is_empty());

    // A multi-line error reply keeps its text; a 4xx is not a permanent refusal.
    let fake = Fake { rcpt_replies: Mutex::new(["451-4.3.0 first line\r\n451 4.3.0 second line"].into()), ..Default::default() };
    let (addr, _fake) = fake_smtp(fake).await;
    let err = smtp::send(&plain(addr), "a@b.example", &["c@d.example".into()], b"x\r\n").await.unwrap_err();
    assert_eq!(err.code(), Some(451));
    assert!(!err.rejects_message());
    assert!(err.to_string().contains("first line") && err.to_string().contains("second line"), "{err}");
}

#[tokio::test]
async fn a_silent_server_times_out_and_bad_addresses_are_refused() {
    let (addr, _fake) = fake_smtp(Fake { silent: true, ..Default::default() }).await;
    let settings = SmtpSettings { timeout: Duration::from_millis(300), ..plain(addr) };
    let started = Instant::now();
    let err = smtp::send(&settings, "a@b.example", &["c@d.example".into()], b"x\r\n").await.unwrap_err();
    assert!(matches!(err, SmtpError::Timeout { stage: Stage::Connect, .. } | SmtpError::Smtp { stage: Stage::Connect, .. }), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(5), "bounded by the timeout: {:?}", started.elapsed());

    let err = smtp::send(&settings, "a@b.example", &["c@d.example>\r\nDATA".into()], b"x\r\n").await.unwrap_err();
    assert!(matches!(err, SmtpError::InvalidAddress(_)), "{err:?}");
}

// ---------------------------------------------------------------------------------------------------------------
// End to end: ops topic → notify::run → SMTP.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_events_become_owner_emails() {
    // The first RCPT TO is refused for now (451): the mail must be retried, not dropped.
    let fake = Fake { rcpt_replies: Mutex::new(["451 4.7.1 try again later"].into()), ..Default::default() };
    let (smtp_addr, fake) = fake_smtp(fake).await;
    let topics = Topics::new("hookline.");
    let broker = DevBroker::start(&topics, 2, 2).expect("mock broker");
    let mut config = hookline_service::Config::dev(&broker.bootstrap_servers(), 2, "notify-test-token-0123456789");
    config.notify = settings(smtp_addr);
    config.validate().expect("valid config");

    let producer = hookline_kafka::client::producer(&config.kafka, "notify-test").expect("producer");
    let records = [
        event("endpoint_paused", "sub-a", ""),                         // no owner: skipped
        event("delivery_dead", "sub-a", "owner-a@customer.example"),   // not mailed: skipped
        event("endpoint_paused", "sub-a", "owner-a@customer.example"), // mailed after one 451
        event("endpoint_disabled", "sub-b", "owner-b@customer.example"),
    ];
    for ev in &records {
        hookline_kafka::produce::send(&producer, topics.ops(), &ev.subscription_id, &ev.encode_to_vec()).await.expect("produced");
    }

    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let (config, shutdown) = (config.clone(), shutdown.clone());
        async move { hookline_notify::run(&config, shutdown).await }
    });
    wait_for(&fake.changed, Duration::from_secs(60), "two owner e-mails", || fake.mails().len() >= 2).await;

    let mut mails = fake.mails();
    mails.sort_by(|a, b| a.to.cmp(&b.to));
    assert_eq!(mails.len(), 2, "{mails:#?}");
    let (a, b) = (&mails[0], &mails[1]);
    assert_eq!(a.to, vec!["owner-a@customer.example".to_owned()]);
    assert_eq!(a.header("To").as_deref(), Some("owner-a@customer.example"));
    assert_eq!(a.header("Subject").as_deref(), Some("[hookline] Endpoint paused: https://hooks.customer.example/lucibook"));
    assert!(a.body().contains("Subscription: sub-a\r\n") && a.body().contains("POST /v1/subscriptions/sub-a/resume"), "{}", a.body());
    assert!(a.body().contains("Reason:       consecutive_failures"), "{}", a.body());
    assert_eq!(b.to, vec!["owner-b@customer.example".to_owned()]);
    assert_eq!(b.header("Subject").as_deref(), Some("[hookline] Endpoint disabled: https://hooks.customer.example/lucibook"));
    assert!(b.body().contains("PATCH /v1/subscriptions/sub-b"), "{}", b.body());
    let rcpts = fake.commands().iter().filter(|c| c.starts_with("RCPT TO:")).count();
    assert_eq!(rcpts, 3, "one refused (451) and retried, one more: {:?}", fake.commands());

    shutdown.cancel();
    task.await.expect("notify task").expect("notify::run ends cleanly");

    // Every record, skipped or mailed, is committed: a restart sends nothing again.
    let group = format!("{}-notify", config.ingest.group_id);
    let check: BaseConsumer =
        hookline_kafka::client::group_consumer_config(&config.kafka, &group, "notify-test-check").unwrap().create().unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..2 {
        tpl.add_partition(topics.ops(), p);
    }
    let committed = tokio::task::spawn_blocking(move || check.committed_offsets(tpl, Duration::from_secs(10)).expect("committed offsets"))
        .await
        .unwrap();
    let total: i64 = committed
        .elements()
        .iter()
        .map(|e| match e.offset() {
            Offset::Offset(o) => o,
            _ => 0,
        })
        .sum();
    assert_eq!(total, records.len() as i64, "{committed:?}");
    drop(producer);
    // Leaked on purpose: clients still owned by the test's runtime must be able to close against it.
    std::mem::forget(broker);
}
