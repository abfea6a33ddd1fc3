//! Handing one message to the SMTP server, through lettre's SMTP client (protocol, AUTH, dot-stuffing, TLS with
//! rustls). The steps are driven here one by one, so an error says which step failed: a permanent refusal of the
//! recipient or the message gives the mail up, a refused login or sender is the configuration's problem and is
//! retried. TLS is `STARTTLS` (required: no fallback to plain text), implicit (SMTPS) or none; AUTH is never sent
//! over plain text except to a loopback address.

use std::fmt;
use std::time::Duration;

use hookline_service::config::SmtpTls;
use lettre::transport::smtp::authentication::{Credentials as LettreCredentials, Mechanism};
use lettre::transport::smtp::client::{AsyncSmtpConnection, Certificate, CertificateStore, TlsParameters};
use lettre::transport::smtp::commands::{Data, Mail, Rcpt};
use lettre::transport::smtp::extension::ClientId;
use lettre::Address;

#[derive(Clone)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials").field("username", &self.username).field("password", &"<redacted>").finish()
    }
}

#[derive(Debug, Clone)]
pub struct SmtpSettings {
    pub host: String,
    pub port: u16,
    pub tls: SmtpTls,
    /// PEM CA certificates trusted instead of the public roots.
    pub ca_pem: Option<Vec<u8>>,
    /// AUTH (PLAIN or LOGIN) is used only when these are set.
    pub credentials: Option<Credentials>,
    /// Per step: connect (with greeting and EHLO), STARTTLS, AUTH, each command, the message.
    pub timeout: Duration,
}

impl SmtpSettings {
    pub fn addr(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    fn is_loopback(&self) -> bool {
        self.host.eq_ignore_ascii_case("localhost") || self.host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
    }

    fn tls_parameters(&self) -> Result<TlsParameters, SmtpError> {
        let mut b = TlsParameters::builder(self.host.clone());
        if let Some(pem) = &self.ca_pem {
            b = b
                .certificate_store(CertificateStore::None)
                .add_root_certificate(Certificate::from_pem(pem).map_err(SmtpError::TlsSettings)?);
        }
        b.build().map_err(SmtpError::TlsSettings)
    }
}

/// The step of the conversation an error happened in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Connecting (and the TLS handshake with implicit TLS), the greeting and EHLO.
    Connect,
    StartTls,
    Auth,
    MailFrom,
    RcptTo,
    Data,
    /// Sending the message and reading the reply after it.
    Message,
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stage::Connect => "connect",
            Stage::StartTls => "STARTTLS",
            Stage::Auth => "AUTH",
            Stage::MailFrom => "MAIL FROM",
            Stage::RcptTo => "RCPT TO",
            Stage::Data => "DATA",
            Stage::Message => "end of DATA",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SmtpError {
    #[error("SMTP {stage}: {source}")]
    Smtp {
        stage: Stage,
        #[source]
        source: lettre::transport::smtp::Error,
    },
    #[error("SMTP {stage}: no answer within {timeout:?}")]
    Timeout { stage: Stage, timeout: Duration },
    #[error("SMTP STARTTLS: the server does not offer STARTTLS, and notify.tls = \"starttls\" never falls back to plain text")]
    StartTlsNotOffered,
    #[error("SMTP AUTH: refused to send credentials over a connection that is not encrypted (set notify.tls)")]
    PlaintextAuth,
    #[error("SMTP TLS settings (notify.tls_ca_file): {0}")]
    TlsSettings(#[source] lettre::transport::smtp::Error),
    #[error("SMTP: {0:?} is not a usable address (ASCII local@domain, no spaces, brackets or control characters)")]
    InvalidAddress(String),
}

impl SmtpError {
    /// The server's reply code, when the error is a negative reply.
    pub fn code(&self) -> Option<u16> {
        match self {
            SmtpError::Smtp { source, .. } => source.status().map(u16::from),
            _ => None,
        }
    }

    /// A permanent (5xx) refusal of this recipient or this message. Anything else (connection, timeout, 4xx, a
    /// refusal of the sender or of the login) is about the server or its configuration, not the message.
    pub fn rejects_message(&self) -> bool {
        matches!(self, SmtpError::Smtp { stage: Stage::RcptTo | Stage::Message, source } if source.is_permanent())
    }
}

/// Whether `addr` is a plain ASCII `local@domain` that lettre accepts, so it can go into the envelope and a
/// header as it is (no SMTPUTF8 needed, nothing that could end a command).
pub fn valid_address(addr: &str) -> bool {
    addr.len() <= 254 && addr.bytes().all(|b| b.is_ascii_graphic()) && addr.parse::<Address>().is_ok()
}

fn address(addr: &str) -> Result<Address, SmtpError> {
    if !valid_address(addr) {
        return Err(SmtpError::InvalidAddress(addr.to_owned()));
    }
    addr.parse().map_err(|_| SmtpError::InvalidAddress(addr.to_owned()))
}

/// Runs one step within the timeout.
async fn step<T>(
    stage: Stage,
    timeout: Duration,
    f: impl std::future::Future<Output = Result<T, lettre::transport::smtp::Error>>,
) -> Result<T, SmtpError> {
    tokio::time::timeout(timeout, f)
        .await
        .map_err(|_| SmtpError::Timeout { stage, timeout })?
        .map_err(|source| SmtpError::Smtp { stage, source })
}

/// Sends `message` (a formatted RFC 5322 message) from `from` to `to` in one SMTP session. Returns once the
/// server accepted the message (2xx after the data).
pub async fn send(settings: &SmtpSettings, from: &str, to: &[String], message: &[u8]) -> Result<(), SmtpError> {
    let sender = address(from)?;
    let recipients = to.iter().map(|a| address(a)).collect::<Result<Vec<_>, _>>()?;
    let implicit = match settings.tls {
        SmtpTls::Implicit => Some(settings.tls_parameters()?),
        SmtpTls::Starttls | SmtpTls::None => None,
    };
    let timeout = settings.timeout;
    let hello = ClientId::default();
    let mut conn = step(
        Stage::Connect,
        timeout,
        AsyncSmtpConnection::connect_tokio1((settings.host.as_str(), settings.port), Some(timeout), &hello, implicit, None),
    )
    .await?;
    let result = conversation(&mut conn, settings, &hello, sender, recipients, message).await;
    // The server said yes or no to a command: end the session politely (a failing QUIT changes nothing). After
    // a failed or interrupted STARTTLS, or a timeout, the stream is unusable: it is only dropped.
    let answered = matches!(
        &result,
        Ok(()) | Err(SmtpError::Smtp { stage: Stage::Auth | Stage::MailFrom | Stage::RcptTo | Stage::Data | Stage::Message, .. })
    );
    if answered && !conn.has_broken() {
        let _ = tokio::time::timeout(timeout, conn.quit()).await;
    }
    result
}

async fn conversation(
    conn: &mut AsyncSmtpConnection,
    settings: &SmtpSettings,
    hello: &ClientId,
    sender: Address,
    recipients: Vec<Address>,
    message: &[u8],
) -> Result<(), SmtpError> {
    let timeout = settings.timeout;
    if settings.tls == SmtpTls::Starttls {
        if !conn.can_starttls() {
            return Err(SmtpError::StartTlsNotOffered);
        }
        let params = settings.tls_parameters()?;
        step(Stage::StartTls, timeout, conn.starttls(params, hello)).await?;
    }
    if let Some(c) = &settings.credentials {
        // Config validation refuses this already; checked again where the password would be written.
        if !conn.is_encrypted() && !settings.is_loopback() {
            return Err(SmtpError::PlaintextAuth);
        }
        let creds = LettreCredentials::new(c.username.clone(), c.password.clone());
        step(Stage::Auth, timeout, conn.auth(&[Mechanism::Plain, Mechanism::Login], &creds)).await?;
    }
    step(Stage::MailFrom, timeout, conn.command(Mail::new(Some(sender), Vec::new()))).await?;
    for r in recipients {
        step(Stage::RcptTo, timeout, conn.command(Rcpt::new(r, Vec::new()))).await?;
    }
    step(Stage::Data, timeout, conn.command(Data)).await?;
    // lettre ends the data with CRLF . CRLF itself: a final CRLF of the message would add an empty line.
    let message = message.strip_suffix(b"\r\n").unwrap_or(message);
    step(Stage::Message, timeout, conn.message(message)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_that_could_break_a_command_are_refused() {
        assert!(valid_address("owner@example.com"));
        assert!(valid_address("a+tag@sub.example.co"));
        for bad in [
            "",
            "no-at",
            "@example.com",
            "a@",
            "a b@example.com",
            "a@example.com>\r\nRCPT TO:<x@y",
            "a@ex\nample",
            "\u{e9}@example.com",
            "<a@b>",
        ] {
            assert!(!valid_address(bad), "{bad:?}");
        }
    }
}
