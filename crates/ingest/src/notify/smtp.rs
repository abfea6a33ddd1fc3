//! A small SMTP client (RFC 5321) over plain TCP, enough to hand one message to a local relay or sidecar:
//! greeting, EHLO (HELO when EHLO is not understood), AUTH PLAIN when credentials are configured, MAIL FROM,
//! RCPT TO, DATA (dot-stuffed, CRLF line endings), QUIT. Every command waits at most the configured timeout for
//! its reply. There is no STARTTLS: the connection is plain text, so TLS to the outside world is the relay's job.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Longest reply line accepted (RFC 5321 allows 512 octets; servers exceed it in their text).
const MAX_LINE: u64 = 4_096;
/// Most lines in one multi-line reply.
const MAX_LINES: usize = 128;

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
    /// `host:port` of the relay.
    pub addr: String,
    /// AUTH PLAIN is used only when these are set.
    pub credentials: Option<Credentials>,
    /// Per command: connect, each reply, and sending the message with its final reply.
    pub timeout: Duration,
}

/// The step of the conversation an error happened in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Connect,
    Greeting,
    Ehlo,
    Helo,
    Auth,
    MailFrom,
    RcptTo,
    Data,
    /// Sending the message and reading the reply after the final `.`.
    Message,
    Quit,
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stage::Connect => "connect",
            Stage::Greeting => "greeting",
            Stage::Ehlo => "EHLO",
            Stage::Helo => "HELO",
            Stage::Auth => "AUTH PLAIN",
            Stage::MailFrom => "MAIL FROM",
            Stage::RcptTo => "RCPT TO",
            Stage::Data => "DATA",
            Stage::Message => "end of DATA",
            Stage::Quit => "QUIT",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SmtpError {
    #[error("SMTP connect to {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("SMTP {stage}: no answer within {timeout:?}")]
    Timeout { stage: Stage, timeout: Duration },
    #[error("SMTP {stage}: {source}")]
    Io {
        stage: Stage,
        #[source]
        source: std::io::Error,
    },
    /// The server answered with a code the step does not accept.
    #[error("SMTP {stage}: server replied {code} {text}")]
    Reply { stage: Stage, code: u16, text: String },
    #[error("SMTP {stage}: malformed reply: {detail}")]
    Protocol { stage: Stage, detail: String },
    #[error("SMTP AUTH: credentials are configured but the server does not offer AUTH PLAIN")]
    AuthNotOffered,
    #[error("SMTP: {0:?} is not a usable address (ASCII, one @, no spaces, brackets or control characters)")]
    InvalidAddress(String),
}

impl SmtpError {
    /// The server's reply code, when the error is a reply.
    pub fn code(&self) -> Option<u16> {
        match self {
            SmtpError::Reply { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// A permanent (5xx) refusal of this recipient or this message. Anything else (connection, timeout, 4xx, a
    /// refusal of the sender or of the login) is about the relay or its configuration, not the message.
    pub fn rejects_message(&self) -> bool {
        matches!(self, SmtpError::Reply { stage: Stage::RcptTo | Stage::Message, code: 500..=599, .. })
    }
}

/// One (possibly multi-line) reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub code: u16,
    /// The text of each line, without the code and separator.
    pub lines: Vec<String>,
}

impl Reply {
    pub fn text(&self) -> String {
        self.lines.join(" | ")
    }
}

/// Whether `addr` can be put between `<` and `>` in MAIL FROM / RCPT TO and in a header as it is: printable
/// ASCII without spaces or brackets, a non-empty local part and domain around the last `@`, at most 254 octets.
pub fn valid_address(addr: &str) -> bool {
    let Some((local, domain)) = addr.rsplit_once('@') else { return false };
    !local.is_empty()
        && !domain.is_empty()
        && addr.len() <= 254
        && addr.bytes().all(|b| b.is_ascii_graphic() && !matches!(b, b'<' | b'>' | b'(' | b')' | b',' | b';' | b'\\'))
}

/// Sends `message` (headers and body, lines ending in LF or CRLF) from `from` to `to` in one SMTP session.
/// Returns once the server accepted the message (2xx after the final `.`).
pub async fn send(settings: &SmtpSettings, from: &str, to: &[String], message: &[u8]) -> Result<(), SmtpError> {
    for a in std::iter::once(from).chain(to.iter().map(String::as_str)) {
        if !valid_address(a) {
            return Err(SmtpError::InvalidAddress(a.to_owned()));
        }
    }
    let timeout = settings.timeout;
    let stream = tokio::time::timeout(timeout, TcpStream::connect(&settings.addr))
        .await
        .map_err(|_| SmtpError::Timeout { stage: Stage::Connect, timeout })?
        .map_err(|source| SmtpError::Connect { addr: settings.addr.clone(), source })?;
    let local = stream.local_addr().map_err(|source| SmtpError::Io { stage: Stage::Connect, source })?;
    let mut conn = Conn { stream: BufReader::new(stream), timeout };
    let result = conversation(&mut conn, settings, local, from, to, message).await;
    if let Err(SmtpError::Reply { .. }) = &result {
        // The server is listening but said no: end the session politely.
        let _ = conn.expect(Stage::Quit, Some("QUIT"), |c| c == 221).await;
    }
    result
}

async fn conversation(
    conn: &mut Conn,
    settings: &SmtpSettings,
    local: SocketAddr,
    from: &str,
    to: &[String],
    message: &[u8],
) -> Result<(), SmtpError> {
    conn.expect(Stage::Greeting, None, |c| c == 220).await?;
    let me = address_literal(local);
    let extensions = match conn.command(Stage::Ehlo, &format!("EHLO {me}")).await? {
        r if r.code == 250 => r.lines.into_iter().skip(1).map(|l| l.to_ascii_uppercase()).collect::<Vec<_>>(),
        // A server that does not know EHLO: plain HELO, no extensions.
        r if matches!(r.code, 500 | 502) => {
            conn.expect(Stage::Helo, Some(&format!("HELO {me}")), |c| c == 250).await?;
            Vec::new()
        }
        r => return Err(SmtpError::Reply { stage: Stage::Ehlo, code: r.code, text: r.text() }),
    };
    if let Some(cred) = &settings.credentials {
        let plain = extensions.iter().any(|l| {
            let mut words = l.split([' ', '=']);
            words.next() == Some("AUTH") && words.any(|w| w == "PLAIN")
        });
        if !plain {
            return Err(SmtpError::AuthNotOffered);
        }
        let token = base64(format!("\0{}\0{}", cred.username, cred.password).as_bytes());
        let r = conn.command(Stage::Auth, &format!("AUTH PLAIN {token}")).await?;
        let r = if r.code == 334 { conn.command(Stage::Auth, &token).await? } else { r };
        if r.code != 235 {
            return Err(SmtpError::Reply { stage: Stage::Auth, code: r.code, text: r.text() });
        }
    }
    conn.expect(Stage::MailFrom, Some(&format!("MAIL FROM:<{from}>")), |c| c == 250).await?;
    for rcpt in to {
        conn.expect(Stage::RcptTo, Some(&format!("RCPT TO:<{rcpt}>")), |c| c == 250 || c == 251).await?;
    }
    conn.expect(Stage::Data, Some("DATA"), |c| c == 354).await?;
    conn.send_data(&dot_stuff(message)).await?;
    // The message is accepted; a failing QUIT changes nothing.
    let _ = conn.expect(Stage::Quit, Some("QUIT"), |c| c == 221).await;
    Ok(())
}

struct Conn {
    stream: BufReader<TcpStream>,
    timeout: Duration,
}

impl Conn {
    /// Sends `line` (if any), reads the reply and checks its code.
    async fn expect(&mut self, stage: Stage, line: Option<&str>, ok: impl Fn(u16) -> bool) -> Result<Reply, SmtpError> {
        let r = match line {
            Some(line) => self.command(stage, line).await?,
            None => {
                let timeout = self.timeout;
                tokio::time::timeout(timeout, self.read_reply(stage))
                    .await
                    .map_err(|_| SmtpError::Timeout { stage, timeout })??
            }
        };
        if ok(r.code) {
            Ok(r)
        } else {
            Err(SmtpError::Reply { stage, code: r.code, text: r.text() })
        }
    }

    /// Writes `line` + CRLF and reads the reply, within the timeout.
    async fn command(&mut self, stage: Stage, line: &str) -> Result<Reply, SmtpError> {
        self.exchange(stage, format!("{line}\r\n").as_bytes()).await
    }

    /// Writes `bytes` and reads the reply, within the timeout.
    async fn exchange(&mut self, stage: Stage, bytes: &[u8]) -> Result<Reply, SmtpError> {
        let timeout = self.timeout;
        let work = async {
            self.write(stage, bytes).await?;
            self.read_reply(stage).await
        };
        tokio::time::timeout(timeout, work).await.map_err(|_| SmtpError::Timeout { stage, timeout })?
    }

    /// The message, already dot-stuffed and terminated, then the final reply (2xx: accepted).
    async fn send_data(&mut self, data: &[u8]) -> Result<Reply, SmtpError> {
        let r = self.exchange(Stage::Message, data).await?;
        if (200..300).contains(&r.code) {
            Ok(r)
        } else {
            Err(SmtpError::Reply { stage: Stage::Message, code: r.code, text: r.text() })
        }
    }

    async fn write(&mut self, stage: Stage, bytes: &[u8]) -> Result<(), SmtpError> {
        let s = self.stream.get_mut();
        s.write_all(bytes).await.map_err(|source| SmtpError::Io { stage, source })?;
        s.flush().await.map_err(|source| SmtpError::Io { stage, source })
    }

    /// Reads one reply: lines `NNN-text` continue it, the line `NNN text` (or bare `NNN`) ends it.
    async fn read_reply(&mut self, stage: Stage) -> Result<Reply, SmtpError> {
        let protocol = |detail: String| SmtpError::Protocol { stage, detail };
        let mut code = None;
        let mut lines = Vec::new();
        loop {
            let mut buf = Vec::new();
            (&mut self.stream)
                .take(MAX_LINE)
                .read_until(b'\n', &mut buf)
                .await
                .map_err(|source| SmtpError::Io { stage, source })?;
            if buf.is_empty() {
                return Err(SmtpError::Io {
                    stage,
                    source: std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "connection closed by the server"),
                });
            }
            if buf.last() != Some(&b'\n') {
                return Err(protocol(format!("reply line longer than {MAX_LINE} bytes")));
            }
            let line = String::from_utf8_lossy(&buf);
            let line = line.trim_end_matches(['\r', '\n']);
            let (digits, rest) = line.split_at(line.len().min(3));
            let this: u16 = match digits.parse() {
                Ok(c) if digits.len() == 3 && digits.bytes().all(|b| b.is_ascii_digit()) && (200..600).contains(&c) => c,
                _ => return Err(protocol(format!("{line:?} does not start with a reply code"))),
            };
            if *code.get_or_insert(this) != this {
                return Err(protocol(format!("reply code changed from {} to {this} within one reply", code.unwrap_or(0))));
            }
            let (more, text) = match rest.as_bytes().first() {
                None => (false, ""),
                Some(b'-') => (true, &rest[1..]),
                Some(b' ') => (false, &rest[1..]),
                Some(_) => return Err(protocol(format!("{line:?}: expected ' ' or '-' after the code"))),
            };
            lines.push(text.to_owned());
            if !more {
                return Ok(Reply { code: this, lines });
            }
            if lines.len() >= MAX_LINES {
                return Err(protocol(format!("reply longer than {MAX_LINES} lines")));
            }
        }
    }
}

/// The EHLO argument: the client's own address as an address literal (RFC 5321 4.1.3), which is always valid
/// where no host name is configured.
fn address_literal(addr: SocketAddr) -> String {
    match addr {
        SocketAddr::V4(a) => format!("[{}]", a.ip()),
        SocketAddr::V6(a) => match a.ip().to_ipv4_mapped() {
            Some(v4) => format!("[{v4}]"),
            None => format!("[IPv6:{}]", a.ip()),
        },
    }
}

/// The DATA payload: every line (LF or CRLF in `message`) ends in CRLF, a line starting with `.` gets a second
/// `.` (RFC 5321 4.5.2), and the terminating `.` line follows.
pub fn dot_stuff(message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(message.len() + message.len() / 32 + 8);
    let body = message.strip_suffix(b"\n").unwrap_or(message);
    if !message.is_empty() {
        for line in body.split(|&b| b == b'\n') {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.first() == Some(&b'.') {
                out.push(b'.');
            }
            out.extend_from_slice(line);
            out.extend_from_slice(b"\r\n");
        }
    }
    out.extend_from_slice(b".\r\n");
    out
}

/// Standard base64 with padding (RFC 4648), for AUTH PLAIN.
pub fn base64(input: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (i, o) in [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foob", "Zm9vYg=="), ("fooba", "Zm9vYmE="), ("foobar", "Zm9vYmFy")] {
            assert_eq!(base64(i.as_bytes()), o);
        }
        assert_eq!(base64(b"\0alice\0s3cret"), "AGFsaWNlAHMzY3JldA==");
    }

    #[test]
    fn dot_stuffing_and_line_endings() {
        assert_eq!(dot_stuff(b"a\n.b\r\n.\n..c"), b"a\r\n..b\r\n..\r\n...c\r\n.\r\n".to_vec());
        assert_eq!(dot_stuff(b"x\r\n"), b"x\r\n.\r\n".to_vec());
        assert_eq!(dot_stuff(b""), b".\r\n".to_vec());
    }

    #[test]
    fn addresses_that_could_break_a_command_are_refused() {
        assert!(valid_address("owner@example.com"));
        assert!(valid_address("a+tag@sub.example.co"));
        for bad in ["", "no-at", "@example.com", "a@", "a b@example.com", "a@example.com>\r\nRCPT TO:<x@y", "a@ex\nample", "é@example.com", "<a@b>"] {
            assert!(!valid_address(bad), "{bad:?}");
        }
    }

    #[test]
    fn ehlo_argument_is_an_address_literal() {
        assert_eq!(address_literal("127.0.0.1:5".parse().unwrap()), "[127.0.0.1]");
        assert_eq!(address_literal("[::1]:5".parse().unwrap()), "[IPv6:::1]");
    }
}
