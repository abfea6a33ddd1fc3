//! Owner e-mail: reads the `ops` topic (group `<ingest.group_id>-notify`) and e-mails the subscription's
//! `owner_email` when its policy paused or disabled the endpoint. A record's offset is
//! stored only after the relay accepted the mail, or when the record was deliberately skipped (no or unusable
//! owner address, a kind that is not mailed, undecodable). A failed send is retried with backoff; only a message
//! the relay keeps refusing permanently (5xx to RCPT TO or to the message) is given up, loudly, after
//! `MAX_REJECTIONS` tries.

pub mod smtp;

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hookline_core::model::OpsEvent;
use hookline_kafka::rebalance::RebalanceEvent;
use hookline_kafka::worker::{self, Control, Done, Handler, Liveness, Worker};
use hookline_kafka::Topics;
use hookline_service::config::NotifySettings;
use prost::Message as _;
use rdkafka::error::KafkaError;
use rdkafka::message::BorrowedMessage;
use rdkafka::Message;
use tokio_util::sync::CancellationToken;

use lettre::message::header::{ContentType, HeaderName, HeaderValue, MIME_VERSION_1_0};
use lettre::message::Mailbox;
use lettre::{Address, Message as Email};

use crate::smtp::{Credentials, SmtpError, SmtpSettings};

/// Mails waiting for their turn; past this the loop pauses its partitions (polling continues) until a quarter
/// of them is sent.
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
    from_mailbox: Mailbox,
    smtp: SmtpSettings,
}

/// One composed e-mail.
#[derive(Debug, Clone)]
pub struct Mail {
    pub to: String,
    pub subject: String,
    /// The formatted message (headers and body, CRLF line endings), as handed to DATA.
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
    /// The message could not be built from the record (lettre refused a value).
    Unbuildable(String),
}

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Skip::NoOwnerEmail => f.write_str("the subscription has no owner_email"),
            Skip::UnusableOwnerEmail => f.write_str("owner_email is not a usable SMTP address"),
            Skip::NotNotifiable(kind) => write!(f, "kind {kind:?} is not e-mailed"),
            Skip::Undecodable(e) => write!(f, "not an OpsEvent: {e}"),
            Skip::Unbuildable(e) => write!(f, "the e-mail could not be built: {e}"),
        }
    }
}

impl Notifier {
    /// `None` when `smtp_addr` is unset (e-mail off). Reads `tls_ca_file`.
    pub fn new(settings: &NotifySettings) -> Result<Option<Notifier>, NotifyError> {
        let Some((host, port)) = settings.host_port() else { return Ok(None) };
        let credentials = match (&settings.username, &settings.password) {
            (Some(u), Some(p)) => Some(Credentials { username: u.clone(), password: p.clone() }),
            _ => None,
        };
        let ca_pem = match &settings.tls_ca_file {
            None => None,
            Some(path) => {
                Some(std::fs::read(path).map_err(|e| NotifyError::Config(format!("notify.tls_ca_file: reading {}: {e}", path.display())))?)
            }
        };
        let from = settings.from.parse::<Mailbox>().map_err(|e| NotifyError::Config(format!("notify.from: {e}")))?;
        Ok(Some(Notifier {
            from: settings.from.clone(),
            from_mailbox: from,
            smtp: SmtpSettings {
                host,
                port,
                tls: settings.tls_mode(),
                ca_pem,
                credentials,
                timeout: Duration::from_millis(settings.timeout_ms.max(1)),
            },
        }))
    }

    pub fn smtp(&self) -> &SmtpSettings {
        &self.smtp
    }

    /// The e-mail for an ops record's value, or why there is none.
    pub fn compose_record(&self, value: &[u8]) -> Result<Mail, Skip> {
        let ev = OpsEvent::decode(value).map_err(|e| Skip::Undecodable(e.to_string()))?;
        self.compose(&ev, hookline_service::now_ms())
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

        let at = (ev.at_ms > 0).then(|| hookline_core::time::rfc3339_ms(ev.at_ms)).flatten().unwrap_or_else(|| "unknown".to_owned());
        let mut body = String::new();
        let intro = match action {
            Action::Resume => {
                format!("hookline paused the webhook endpoint of subscription {id}: it kept failing, and its policy switches it off.\n")
            }
            Action::Enable => {
                format!("hookline disabled the webhook endpoint of subscription {id}: it kept failing, and its policy switches it off.\n")
            }
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

        let recipient: Address = to.parse().map_err(|_| Skip::UnusableOwnerEmail)?;
        let date = std::time::UNIX_EPOCH + Duration::from_millis(u64::try_from(now_ms).unwrap_or(0));
        let raw = |name: &'static str, value: String| HeaderValue::new(HeaderName::new_from_ascii_str(name), value);
        // lettre encodes non-ASCII header text (RFC 2047) and picks the body's transfer encoding.
        let message = Email::builder()
            .from(self.from_mailbox.clone())
            .to(Mailbox::new(None, recipient))
            .subject(one_line(&subject))
            .date(date)
            .message_id(Some(message_id))
            .header(MIME_VERSION_1_0)
            .header(ContentType::TEXT_PLAIN)
            .raw_header(raw("Auto-Submitted", "auto-generated".into()))
            .raw_header(raw("X-Hookline-Subscription", id.clone()))
            .raw_header(raw("X-Hookline-Event", one_line(&ev.kind)))
            .body(body)
            .map_err(|e| Skip::Unbuildable(e.to_string()))?;
        Ok(Mail { to: to.to_owned(), subject, message: message.formatted() })
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

/// The mail being sent and its record.
struct Job {
    done: Done,
    send: Pin<Box<dyn Future<Output = ()> + Send>>,
}

/// Consumes `ops` until `shutdown` and e-mails owners. Returns at once when `notify.smtp_addr` is unset.
pub async fn run(config: &hookline_service::Config, shutdown: CancellationToken) -> Result<(), NotifyError> {
    config.notify.validate().map_err(|e| NotifyError::Config(e.to_string()))?;
    let Some(notifier) = Notifier::new(&config.notify)? else { return Ok(()) };
    let topics = Topics::new(config.kafka.topic_prefix.clone());
    let topic = topics.ops();
    let group = format!("{}-notify", config.ingest.group_id);
    let grace = SHUTDOWN_GRACE.min(notifier.smtp.timeout);
    let settings = worker::Settings {
        name: "ingest-notify",
        group_id: group.clone(),
        client_id: "hookline-ingest-notify".into(),
        topics: vec![topic.to_owned()],
        // Past this many mails waiting, the partitions pause (polling goes on).
        max_in_flight: Some(MAX_QUEUED),
        paused_gauge: None,
        // The mail being sent gets `grace` (see `stopping`); this only bounds the wait for it.
        drain: grace + Duration::from_secs(1),
        stall: None,
        prefetch_kbytes: None,
    };
    let liveness = Liveness::new(Duration::from_millis(config.kafka.max_poll_interval_ms));
    let worker = Worker::subscribe(&config.kafka, settings, liveness, None)?;
    tracing::info!(%topic, %group, relay = %notifier.smtp.addr(), tls = ?notifier.smtp.tls, "owner e-mail notifications on");
    let mut handler = Mails { notifier: Arc::new(notifier), queue: VecDeque::new(), job: None, grace };
    worker.run(&mut handler, &shutdown).await;
    tracing::info!("owner e-mail notifications stopped");
    Ok(())
}

/// The notifier's handling of `ops` records: one mail at a time, in order.
struct Mails {
    notifier: Arc<Notifier>,
    queue: VecDeque<(Item, Done)>,
    job: Option<Job>,
    grace: Duration,
}

impl Handler for Mails {
    type Wake = ();

    fn rebalance(&mut self, ev: RebalanceEvent, _: &Control<'_>) {
        if let RebalanceEvent::Revoked(parts) = ev {
            for (_, p) in parts {
                // The next owner reads these again from the last commit.
                self.queue.retain(|(i, _)| i.partition != p);
                if self.job.as_ref().is_some_and(|j| j.done.partition() == p) {
                    self.job = None;
                }
            }
        }
    }

    fn record(&mut self, m: &BorrowedMessage<'_>, done: Done, _: &Control<'_>) {
        let (p, o) = (done.partition(), done.offset());
        let composed = OpsEvent::decode(m.payload().unwrap_or_default())
            .map_err(|e| Skip::Undecodable(e.to_string()))
            .and_then(|ev| self.notifier.compose(&ev, hookline_service::now_ms()).map(|mail| (ev, mail)));
        match composed {
            Ok((ev, mail)) => {
                self.queue.push_back((Item { partition: p, offset: o, subscription_id: ev.subscription_id, kind: ev.kind, mail }, done));
            }
            Err(skip) => {
                metrics::counter!("hookline_notifications_total", "result" => "skipped").increment(1);
                let key = m.key().map(String::from_utf8_lossy).unwrap_or_default();
                match skip {
                    Skip::NotNotifiable(_) => {
                        tracing::debug!(subscription = %key, partition = p, offset = o, %skip, "ops record: no e-mail")
                    }
                    Skip::NoOwnerEmail => tracing::info!(subscription = %key, partition = p, offset = o, %skip, "ops record: no e-mail"),
                    _ => tracing::warn!(subscription = %key, partition = p, offset = o, %skip, "ops record: no e-mail"),
                }
                done.complete();
            }
        }
    }

    /// The mail being sent, the next one taken from the queue when none is.
    async fn wake(&mut self) {
        if self.job.is_none() {
            let Some((item, done)) = self.queue.pop_front() else { return std::future::pending().await };
            let notifier = self.notifier.clone();
            self.job = Some(Job { done, send: Box::pin(async move { notifier.send_until_done(item).await }) });
        }
        if let Some(job) = &mut self.job {
            job.send.as_mut().await;
        }
    }

    fn woken(&mut self, _: (), _: &Control<'_>) {
        if let Some(job) = self.job.take() {
            job.done.complete();
        }
    }

    /// A mail being sent may finish (it may have been accepted already, with QUIT pending); one still failing is
    /// left, like the queue, uncommitted: the next start sends them.
    fn stopping(&mut self) {
        self.queue.clear();
        if let Some(Job { done, send }) = self.job.take() {
            let grace = self.grace;
            tokio::spawn(async move {
                if tokio::time::timeout(grace, send).await.is_ok() {
                    done.complete();
                }
            });
        }
    }
}

/// A value for one line: every control character (CR and LF included) becomes a space, so a value from a user
/// cannot start a new header or line.
pub fn one_line(s: &str) -> String {
    s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect::<String>().trim().to_owned()
}

/// Letters, digits, `-` and `_` only, everything else `-` (a Message-ID part).
fn atom(s: &str) -> String {
    let a: String = s.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_') { c } else { '-' }).collect();
    if a.is_empty() {
        "x".into()
    } else {
        a
    }
}

/// A domain for the Message-ID: dot-separated atoms.
fn domain_atoms(s: &str) -> String {
    let d: Vec<String> = s.split('.').filter(|p| !p.is_empty()).map(atom).collect();
    if d.is_empty() {
        "localhost".into()
    } else {
        d.join(".")
    }
}

fn shorten(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        format!("{}...", s.chars().take(max).collect::<String>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_a_cap() {
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(3), Duration::from_secs(4));
        assert_eq!(backoff(40), MAX_BACKOFF);
    }
}
