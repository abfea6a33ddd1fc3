//! Owner e-mail: reads the `ops` topic (group `<ingest.group_id>-notify`) and e-mails the subscription's
//! `owner_email` when its policy paused or disabled the endpoint. A record's offset is
//! stored only after the relay accepted the mail, or when the record was deliberately skipped (no or unusable
//! owner address, a kind that is not mailed, undecodable). A failed send is retried with backoff; only a message
//! the relay keeps refusing permanently (5xx to RCPT TO or to the message) is given up, loudly, after
//! `MAX_REJECTIONS` tries.

pub mod smtp;

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use hookline_core::model::OpsEvent;
use hookline_kafka::client::group_consumer_config;
use hookline_kafka::rebalance::{RebalanceContext, RebalanceEvent};
use hookline_kafka::watermark::{store, Watermarks};
use hookline_kafka::Topics;
use hookline_service::config::NotifySettings;
use prost::Message as _;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::{Message, TopicPartitionList};
use tokio_util::sync::CancellationToken;

use self::smtp::{Credentials, SmtpError, SmtpSettings};

/// Mails waiting for their turn; past this the partition a new one came from is paused (polling continues).
const MAX_QUEUED: usize = 1_000;
/// Sends of one message the relay refused permanently before it is given up (logged at error, counted failed).
pub const MAX_REJECTIONS: u32 = 5;
/// Backoff between tries: 1 s doubling up to this.
const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// At shutdown, how long a send in progress may take to finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Longest URL quoted in a subject line (the body has all of it).
const SUBJECT_URL_CHARS: usize = 200;

#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("notify: kafka: {0}")]
    Kafka(#[from] KafkaError),
    #[error("notify: {0}")]
    Config(String),
}

/// Composes and sends owner e-mails.
#[derive(Debug, Clone)]
pub struct Notifier {
    from: String,
    smtp: SmtpSettings,
}

/// One composed e-mail.
#[derive(Debug, Clone)]
pub struct Mail {
    pub to: String,
    pub subject: String,
    /// Headers and body, CRLF line endings, ready for DATA (before dot-stuffing).
    pub message: Vec<u8>,
}

/// Why a record gets no e-mail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    NoOwnerEmail,
    /// The owner address cannot be used in SMTP as it is (spaces, brackets, control or non-ASCII characters).
    UnusableOwnerEmail,
    NotNotifiable(String),
    Undecodable(String),
}

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Skip::NoOwnerEmail => f.write_str("the subscription has no owner_email"),
            Skip::UnusableOwnerEmail => f.write_str("owner_email is not a usable SMTP address"),
            Skip::NotNotifiable(kind) => write!(f, "kind {kind:?} is not e-mailed"),
            Skip::Undecodable(e) => write!(f, "not an OpsEvent: {e}"),
        }
    }
}

impl Notifier {
    /// `None` when `smtp_addr` is unset (e-mail off).
    pub fn new(settings: &NotifySettings) -> Option<Notifier> {
        let addr = settings.smtp_addr.clone()?;
        let credentials = match (&settings.username, &settings.password) {
            (Some(u), Some(p)) => Some(Credentials { username: u.clone(), password: p.clone() }),
            _ => None,
        };
        Some(Notifier {
            from: settings.from.clone(),
            smtp: SmtpSettings { addr, credentials, timeout: Duration::from_millis(settings.timeout_ms.max(1)) },
        })
    }

    pub fn smtp(&self) -> &SmtpSettings {
        &self.smtp
    }

    /// The e-mail for an ops record's value, or why there is none.
    pub fn compose_record(&self, value: &[u8]) -> Result<Mail, Skip> {
        let ev = OpsEvent::decode(value).map_err(|e| Skip::Undecodable(e.to_string()))?;
        self.compose(&ev, crate::now_ms())
    }

    /// The e-mail for `ev`, dated `now_ms`.
    pub fn compose(&self, ev: &OpsEvent, now_ms: i64) -> Result<Mail, Skip> {
        let (word, action) = match ev.kind.as_str() {
            "endpoint_paused" => ("paused", Action::Resume),
            "endpoint_disabled" => ("disabled", Action::Enable),
            // Every success after any failure streak is a recovery: an ops event for automation, not a mail for
            // an owner who was never told the endpoint failed.
            other => return Err(Skip::NotNotifiable(other.to_owned())),
        };
        let to = ev.owner_email.trim();
        if to.is_empty() {
            return Err(Skip::NoOwnerEmail);
        }
        if !smtp::valid_address(to) {
            return Err(Skip::UnusableOwnerEmail);
        }
        let id = one_line(&ev.subscription_id);
        let url = one_line(&ev.url);
        let subject = format!("[hookline] Endpoint {word}: {}", shorten(&url, SUBJECT_URL_CHARS));
        let domain = self.from.rsplit_once('@').map(|(_, d)| d).filter(|d| !d.is_empty()).unwrap_or("localhost");
        let message_id = format!("<hookline.{}.{}.{}@{}>", atom(&ev.kind), atom(&id), ev.at_ms, domain_atoms(domain));

        let at = if ev.at_ms > 0 { rfc5322_date(ev.at_ms) } else { "unknown".to_owned() };
        let mut body = String::new();
        let intro = match action {
            Action::Resume => format!("hookline paused the webhook endpoint of subscription {id}: it kept failing, and its policy switches it off.\n"),
            Action::Enable => format!("hookline disabled the webhook endpoint of subscription {id}: it kept failing, and its policy switches it off.\n"),
        };
        body.push_str(&intro);
        body.push('\n');
        for (k, v) in [
            ("Subscription", id.clone()),
            ("URL", url.clone()),
            ("Event", one_line(&ev.kind)),
            ("Reason", if ev.reason.is_empty() { "-".into() } else { one_line(&ev.reason) }),
            ("Detail", if ev.detail.is_empty() { "-".into() } else { one_line(&ev.detail) }),
            ("At", at),
        ] {
            body.push_str(&format!("{:<14}{v}\n", format!("{k}:")));
        }
        body.push('\n');
        match action {
            Action::Resume => body.push_str(&format!(
                "hookline sends nothing to this endpoint until it is resumed. Depending on the subscription's\n\
                 policy, new deliveries are held and sent after the resume, or cancelled.\n\n\
                 What to do: fix the endpoint so that it answers with a 2xx status, then resume the subscription:\n\n    \
                 POST /v1/subscriptions/{id}/resume\n"
            )),
            Action::Enable => body.push_str(&format!(
                "hookline sends nothing to this endpoint until it is enabled again. Depending on the\n\
                 subscription's policy, new deliveries are held and sent after that, or cancelled.\n\n\
                 What to do: fix the endpoint so that it answers with a 2xx status, then enable the subscription:\n\n    \
                 PATCH /v1/subscriptions/{id}\n    {{\"enabled\": true}}\n"
            )),
        }
        body.push_str("\n-- \nThis message was sent automatically by hookline.\n");

        let (encoding, body) = encode_body(&body);
        let headers = [
            ("From", one_line(&self.from)),
            ("To", to.to_owned()),
            ("Subject", encode_header_text(&one_line(&subject))),
            ("Date", rfc5322_date(now_ms)),
            ("Message-ID", message_id),
            ("MIME-Version", "1.0".into()),
            ("Content-Type", "text/plain; charset=utf-8".into()),
            ("Content-Transfer-Encoding", encoding.into()),
            ("Auto-Submitted", "auto-generated".into()),
            ("X-Hookline-Subscription", encode_header_text(&id)),
            ("X-Hookline-Event", encode_header_text(&one_line(&ev.kind))),
        ];
        let mut message = String::new();
        for (name, value) in headers {
            message.push_str(&format!("{name}: {value}\r\n"));
        }
        message.push_str("\r\n");
        message.push_str(&body);
        Ok(Mail { to: to.to_owned(), subject, message: message.into_bytes() })
    }

    /// One SMTP session for `mail`.
    pub async fn send(&self, mail: &Mail) -> Result<(), SmtpError> {
        smtp::send(&self.smtp, &self.from, std::slice::from_ref(&mail.to), &mail.message).await
    }

    /// Sends until the relay accepts, retrying with backoff; gives up only after `MAX_REJECTIONS` permanent
    /// refusals of this message. Cancelled by dropping the future.
    async fn send_until_done(&self, item: Item) {
        let mut tries = 0u32;
        let mut rejections = 0u32;
        loop {
            tries += 1;
            match self.send(&item.mail).await {
                Ok(()) => {
                    metrics::counter!("hookline_notifications_total", "result" => "sent").increment(1);
                    tracing::info!(subscription = %item.subscription_id, kind = %item.kind, tries, "owner e-mail sent");
                    return;
                }
                Err(e) => {
                    metrics::counter!("hookline_notifications_total", "result" => "failed").increment(1);
                    if e.rejects_message() {
                        rejections += 1;
                        if rejections >= MAX_REJECTIONS {
                            tracing::error!(
                                subscription = %item.subscription_id, kind = %item.kind, partition = item.partition,
                                offset = item.offset, tries, error = %e,
                                "owner e-mail given up: the SMTP server refuses it permanently"
                            );
                            return;
                        }
                    }
                    let wait = backoff(tries);
                    tracing::warn!(
                        subscription = %item.subscription_id, kind = %item.kind, tries, error = %e,
                        retry_in_ms = wait.as_millis() as u64, "owner e-mail failed; retrying"
                    );
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }
}

#[derive(Clone, Copy)]
enum Action {
    Resume,
    Enable,
}

fn backoff(tries: u32) -> Duration {
    Duration::from_secs(1u64 << tries.saturating_sub(1).min(16)).min(MAX_BACKOFF)
}

/// A mail waiting to be sent, with the record it came from.
struct Item {
    partition: i32,
    offset: i64,
    subscription_id: String,
    kind: String,
    mail: Mail,
}

type Job<'a> = (i32, i64, Pin<Box<dyn Future<Output = ()> + Send + 'a>>);

/// Consumes `ops` until `shutdown` and e-mails owners. Returns at once when `notify.smtp_addr` is unset.
pub async fn run(config: &hookline_service::Config, shutdown: CancellationToken) -> Result<(), NotifyError> {
    let Some(notifier) = Notifier::new(&config.notify) else { return Ok(()) };
    config.notify.validate().map_err(|e| NotifyError::Config(e.to_string()))?;
    if notifier.smtp.credentials.is_some() && !is_loopback(&notifier.smtp.addr) {
        tracing::warn!(addr = %notifier.smtp.addr, "notify: AUTH PLAIN over plain TCP to a non-loopback relay sends the password unencrypted");
    }
    let topics = Topics::new(config.kafka.topic_prefix.clone());
    let topic = topics.ops();
    let group = format!("{}-notify", config.ingest.group_id);
    let (context, mut rebalances) = RebalanceContext::new("ingest-notify");
    let consumer: StreamConsumer<RebalanceContext> =
        group_consumer_config(&config.kafka, &group, "hookline-ingest-notify")?.create_with_context(context)?;
    consumer.subscribe(&[topic])?;
    tracing::info!(%topic, %group, relay = %notifier.smtp.addr, "owner e-mail notifications on");

    let mut marks = Watermarks::new();
    let mut queue: VecDeque<Item> = VecDeque::new();
    let mut job: Option<Job<'_>> = None;
    let mut paused: HashSet<i32> = HashSet::new();
    let pause = |p: i32, on: bool| {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(topic, p);
        let r = if on { consumer.pause(&tpl) } else { consumer.resume(&tpl) };
        if let Err(e) = r {
            tracing::debug!(partition = p, error = %e, "notify: pause/resume failed (partition revoked?)");
        }
    };
    loop {
        if job.is_none() {
            if let Some(item) = queue.pop_front() {
                let (p, o) = (item.partition, item.offset);
                job = Some((p, o, Box::pin(notifier.send_until_done(item))));
            }
        }
        if queue.len() < MAX_QUEUED / 2 {
            for p in paused.drain() {
                pause(p, false);
            }
        }
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            Some(ev) = rebalances.recv() => {
                if let RebalanceEvent::Revoked(parts) = ev {
                    for (t, p) in parts {
                        // The next owner reads these again from the last commit.
                        marks.forget(&t, p);
                        queue.retain(|i| i.partition != p);
                        paused.remove(&p);
                        if job.as_ref().is_some_and(|j| j.0 == p) {
                            job = None;
                        }
                    }
                }
            }
            () = async { job.as_mut().expect("guarded by the branch condition").2.as_mut().await }, if job.is_some() => {
                let (p, o, _) = job.take().expect("a job just finished");
                if let Some(w) = marks.complete(topic, p, o) {
                    store(&consumer, topic, p, w);
                }
            }
            received = consumer.recv() => {
                let m = match received {
                    Ok(m) => m,
                    Err(e) => { tracing::warn!(error = %e, "ops consumer error"); continue; }
                };
                let (p, o) = (m.partition(), m.offset());
                marks.start(topic, p, o);
                let composed = OpsEvent::decode(m.payload().unwrap_or_default())
                    .map_err(|e| Skip::Undecodable(e.to_string()))
                    .and_then(|ev| notifier.compose(&ev, crate::now_ms()).map(|mail| (ev, mail)));
                match composed {
                    Ok((ev, mail)) => {
                        queue.push_back(Item { partition: p, offset: o, subscription_id: ev.subscription_id, kind: ev.kind, mail });
                        if queue.len() >= MAX_QUEUED && paused.insert(p) {
                            pause(p, true);
                        }
                    }
                    Err(skip) => {
                        metrics::counter!("hookline_notifications_total", "result" => "skipped").increment(1);
                        let key = m.key().map(String::from_utf8_lossy).unwrap_or_default();
                        match skip {
                            Skip::NotNotifiable(_) => tracing::debug!(subscription = %key, partition = p, offset = o, %skip, "ops record: no e-mail"),
                            Skip::NoOwnerEmail => tracing::info!(subscription = %key, partition = p, offset = o, %skip, "ops record: no e-mail"),
                            _ => tracing::warn!(subscription = %key, partition = p, offset = o, %skip, "ops record: no e-mail"),
                        }
                        if let Some(w) = marks.complete(topic, p, o) {
                            store(&consumer, topic, p, w);
                        }
                    }
                }
            }
        }
    }
    // A mail being sent may finish (it may have been accepted already, with QUIT pending); one still failing is
    // left, like the queue, uncommitted: the next start sends them.
    if let Some((p, o, fut)) = job.take() {
        if tokio::time::timeout(SHUTDOWN_GRACE.min(notifier.smtp.timeout), fut).await.is_ok() {
            if let Some(w) = marks.complete(topic, p, o) {
                store(&consumer, topic, p, w);
            }
        }
    }
    if let Err(e) = consumer.commit_consumer_state(CommitMode::Sync) {
        tracing::debug!(error = %e, "notify: final commit (nothing stored?)");
    }
    hookline_kafka::client::close_consumer(consumer, hookline_kafka::client::LEAVE_GROUP_WITHIN, "notify").await;
    tracing::info!("owner e-mail notifications stopped");
    Ok(())
}

fn is_loopback(addr: &str) -> bool {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h).trim_start_matches('[').trim_end_matches(']');
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// A value for one line: every control character (CR and LF included) becomes a space, so a value from a user
/// cannot start a new header or line.
pub fn one_line(s: &str) -> String {
    s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect::<String>().trim().to_owned()
}

/// Letters, digits, `-` and `_` only, everything else `-` (a Message-ID part).
fn atom(s: &str) -> String {
    let a: String = s.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_') { c } else { '-' }).collect();
    if a.is_empty() { "x".into() } else { a }
}

/// A domain for the Message-ID: dot-separated atoms.
fn domain_atoms(s: &str) -> String {
    let d: Vec<String> = s.split('.').filter(|p| !p.is_empty()).map(atom).collect();
    if d.is_empty() { "localhost".into() } else { d.join(".") }
}

fn shorten(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        format!("{}...", s.chars().take(max).collect::<String>())
    }
}

/// A header value: as it is when it is printable ASCII, otherwise RFC 2047 `=?UTF-8?Q?...?=` words, folded.
pub fn encode_header_text(s: &str) -> String {
    if s.bytes().all(|b| (0x20..0x7f).contains(&b)) && !s.contains("=?") {
        return s.to_owned();
    }
    const MAX_PAYLOAD: usize = 75 - "=?UTF-8?Q??=".len();
    let mut words = Vec::new();
    let mut word = String::new();
    for c in s.chars() {
        let mut enc = String::new();
        let mut buf = [0u8; 4];
        for &b in c.encode_utf8(&mut buf).as_bytes() {
            match b {
                b' ' => enc.push('_'),
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'!' | b'*' | b'+' | b'-' | b'/' => enc.push(b as char),
                _ => enc.push_str(&format!("={b:02X}")),
            }
        }
        if word.len() + enc.len() > MAX_PAYLOAD {
            words.push(std::mem::take(&mut word));
        }
        word.push_str(&enc);
    }
    if !word.is_empty() {
        words.push(word);
    }
    words.iter().map(|w| format!("=?UTF-8?Q?{w}?=")).collect::<Vec<_>>().join("\r\n ")
}

/// The body with CRLF line endings, and its transfer encoding: `7bit` when it is ASCII with lines of at most
/// 998 octets, else quoted-printable (RFC 2045 6.7).
fn encode_body(body: &str) -> (&'static str, String) {
    let lines: Vec<&str> = body.strip_suffix('\n').unwrap_or(body).split('\n').collect();
    if body.is_ascii() && lines.iter().all(|l| l.len() <= 998) {
        return ("7bit", lines.iter().map(|l| format!("{l}\r\n")).collect());
    }
    let mut out = String::new();
    for line in lines {
        let mut col = 0;
        let bytes = line.as_bytes();
        for (i, &b) in bytes.iter().enumerate() {
            let last = i + 1 == bytes.len();
            let enc = match b {
                b'=' => format!("={b:02X}"),
                b' ' | b'\t' if last => format!("={b:02X}"),
                0x21..=0x7e | b' ' | b'\t' => (b as char).to_string(),
                _ => format!("={b:02X}"),
            };
            if col + enc.len() > 75 {
                out.push_str("=\r\n");
                col = 0;
            }
            col += enc.len();
            out.push_str(&enc);
        }
        out.push_str("\r\n");
    }
    ("quoted-printable", out)
}

/// `Tue, 04 Mar 2025 10:00:00 +0000` (RFC 5322 3.3), in UTC.
pub fn rfc5322_date(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days since 1970-01-01 to a civil date (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    const WEEKDAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    format!(
        "{}, {day:02} {} {year:04} {:02}:{:02}:{:02} +0000",
        WEEKDAYS[days.rem_euclid(7) as usize],
        MONTHS[(month - 1) as usize],
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_follow_rfc5322() {
        assert_eq!(rfc5322_date(0), "Thu, 01 Jan 1970 00:00:00 +0000");
        assert_eq!(rfc5322_date(951_782_400_000), "Tue, 29 Feb 2000 00:00:00 +0000");
        assert_eq!(rfc5322_date(1_741_082_405_123), "Tue, 04 Mar 2025 10:00:05 +0000");
        assert_eq!(rfc5322_date(-1_000), "Wed, 31 Dec 1969 23:59:59 +0000");
    }

    #[test]
    fn header_text_is_encoded_only_when_needed() {
        assert_eq!(encode_header_text("[hookline] Endpoint paused: https://a.example/x"), "[hookline] Endpoint paused: https://a.example/x");
        let e = encode_header_text("caf\u{e9} ok");
        assert_eq!(e, "=?UTF-8?Q?caf=C3=A9_ok?=");
        let long = encode_header_text(&"\u{e9}".repeat(60));
        assert!(long.split("\r\n ").all(|w| w.len() <= 75 && w.starts_with("=?UTF-8?Q?")), "{long}");
    }

    #[test]
    fn non_ascii_bodies_are_quoted_printable() {
        assert_eq!(encode_body("a = b\nc\n"), ("7bit", "a = b\r\nc\r\n".into()));
        let (enc, body) = encode_body("URL: https://b\u{fc}cher.example/?a=1 \n");
        assert_eq!(enc, "quoted-printable");
        assert_eq!(body, "URL: https://b=C3=BCcher.example/?a=3D1=20\r\n");
        let (_, body) = encode_body(&format!("{}\u{e9}\n", "x".repeat(200)));
        assert!(body.lines().all(|l| l.len() <= 76), "{body}");
    }

    #[test]
    fn backoff_doubles_to_a_cap() {
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(3), Duration::from_secs(4));
        assert_eq!(backoff(40), MAX_BACKOFF);
    }
}
