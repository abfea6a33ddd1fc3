//! `hookline verify`: checks a captured webhook request's signature and says exactly why it fails.
//!
//! Exit status: 0 when a signature matches, 1 when verification fails (the reason and hints are printed),
//! 2 for bad arguments (clap's own errors exit 2 as well).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use hookline_core::policy::SignatureScheme;
use hookline_core::sign::{self, human_duration_ms, Verified, VerifyError, SECRET_PREFIX};

// In `after_long_help` rather than `long_about`: the subcommand's doc comment in main.rs sets the about text.
const DETAILS: &str = "\
Checks a captured webhook request's signature, the way a receiver must: over the exact body bytes, with the
signing secret(s), within a timestamp tolerance. Prints `OK: ...` and exits 0 when a signature matches; otherwise
names exactly why it fails (a missing or malformed header, a timestamp outside the tolerance, no matching
signature) with hints, and exits 1. Bad arguments exit 2.

Schemes: Standard Webhooks v1 (webhook-id, webhook-timestamp, webhook-signature) and Gauge (Gauge-Signature, or the
legacy x-pulse-signature + x-pulse-timestamp). `--scheme auto` picks the one whose headers are present.

Examples:
  hookline verify --secret whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw \\
      -H 'webhook-id: msg_p5jXN8AQM9LWM0D4loKWxJek' -H 'webhook-timestamp: 1614265330' \\
      -H 'webhook-signature: v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=' \\
      --body-file body.json --now 1614265342
  pbpaste | hookline verify --secret \"$SECRET\" --headers-file request-headers.txt --body-file -";

#[derive(clap::Args)]
#[command(after_long_help = DETAILS)]
pub struct VerifyArgs {
    /// The signing secret (`whsec_...`). Repeat it to try several (secret rotation); also read from
    /// HOOKLINE_VERIFY_SECRET, which keeps it out of your shell history.
    #[arg(long = "secret", value_name = "SECRET", required = true, env = "HOOKLINE_VERIFY_SECRET", hide_env_values = true)]
    secrets: Vec<String>,

    /// Which signature scheme to check.
    #[arg(long, value_enum, default_value_t = SchemeArg::Auto)]
    scheme: SchemeArg,

    /// A request header as `Name: value`. Repeat for each header.
    #[arg(long = "header", short = 'H', value_name = "NAME: VALUE")]
    headers: Vec<String>,

    /// A file of raw `Name: value` lines, as copied from a request dump (a request line, `> ` prefixes from
    /// `curl -v`, and HTTP/2 pseudo-headers are skipped; reading stops at the first blank line after the headers).
    #[arg(long, value_name = "FILE")]
    headers_file: Option<PathBuf>,

    /// The request body, byte for byte as received; `-` reads standard input.
    #[arg(long, value_name = "FILE|-")]
    body_file: PathBuf,

    /// Accept timestamps this many seconds away from now, in either direction.
    #[arg(long, value_name = "SECONDS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(0..=31_536_000))]
    tolerance_s: u64,

    /// Check as if it were this moment (Unix seconds) instead of now: for requests captured earlier.
    #[arg(long, value_name = "UNIX_SECONDS")]
    now: Option<i64>,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum SchemeArg {
    /// Standard Webhooks v1.
    #[value(alias = "standard-webhooks", alias = "standard_webhooks")]
    Standard,
    /// Gauge.
    Gauge,
    /// Whichever scheme's headers the request carries.
    Auto,
}

pub fn run(args: VerifyArgs) -> anyhow::Result<ExitCode> {
    let mut headers: Vec<(String, String)> = Vec::new();
    if let Some(path) = &args.headers_file {
        headers.extend(read_headers_file(path)?);
    }
    for raw in &args.headers {
        let h = parse_header_line(raw).with_context(|| format!("--header {raw:?}: expected `Name: value`"))?;
        headers.push(h);
    }
    if headers.is_empty() {
        bail!("no headers given: pass the request's headers with --header 'Name: value' or --headers-file FILE");
    }
    let body = read_body(&args.body_file)?;
    let now_ms = match args.now {
        Some(s) => s.checked_mul(1000).context("--now is out of range")?,
        None => {
            let since = SystemTime::now().duration_since(UNIX_EPOCH).context("the system clock is before 1970")?;
            i64::try_from(since.as_millis()).context("the system clock is out of range")?
        }
    };

    let detected = sign::detect_scheme(headers.as_slice());
    let scheme = match args.scheme {
        SchemeArg::Standard => SignatureScheme::StandardWebhooks,
        SchemeArg::Gauge => SignatureScheme::Gauge,
        SchemeArg::Auto => match detected {
            Some(s) => s,
            None => {
                println!(
                    "FAIL: no signature header: expected `webhook-signature` (Standard Webhooks) or \
                     `Gauge-Signature` / `x-pulse-signature` (Gauge)"
                );
                return Ok(ExitCode::from(1));
            }
        },
    };

    let check = Check { scheme, secrets: &args.secrets, headers: &headers, tolerance_s: args.tolerance_s };
    match check.run(&body, now_ms) {
        Ok(v) => {
            println!("{}", ok_line(&v, args.secrets.len()));
            Ok(ExitCode::SUCCESS)
        }
        Err(VerifyError::BadSecret { position, problem }) => {
            bail!("--secret #{position}: {problem}")
        }
        Err(err) => {
            println!("FAIL: {err}");
            for hint in check.hints(&err, &body, now_ms, detected) {
                println!("hint: {hint}");
            }
            Ok(ExitCode::from(1))
        }
    }
}

/// One verification setup, re-run with variations to find hints.
struct Check<'a> {
    scheme: SignatureScheme,
    secrets: &'a [String],
    headers: &'a [(String, String)],
    tolerance_s: u64,
}

impl Check<'_> {
    fn run(&self, body: &[u8], now_ms: i64) -> Result<Verified, VerifyError> {
        match self.scheme {
            SignatureScheme::Gauge => sign::verify_gauge(self.secrets, self.headers, body, now_ms, self.tolerance_s),
            _ => sign::verify_standard(self.secrets, self.headers, body, now_ms, self.tolerance_s),
        }
    }

    fn hints(&self, err: &VerifyError, body: &[u8], now_ms: i64, detected: Option<SignatureScheme>) -> Vec<String> {
        let mut hints = Vec::new();
        match err {
            VerifyError::MissingHeader { .. } => {
                if let Some(other) = detected.filter(|d| *d != self.scheme) {
                    hints.push(format!("the headers look like {}: try --scheme auto", scheme_name(other)));
                }
            }
            VerifyError::TooOld { timestamp_ms, .. } | VerifyError::TooNew { timestamp_ms, .. } => {
                if self.scheme == SignatureScheme::Gauge && *timestamp_ms < 100_000_000_000 {
                    hints.push(format!("t={timestamp_ms} looks like Unix seconds; Gauge's t is in milliseconds"));
                }
                // Is the signature itself right? Check at the moment the request claims.
                match self.run(body, *timestamp_ms) {
                    Ok(_) => hints.push(format!(
                        "the signature itself matches; the request is only outside the tolerance now. To check a \
                         request captured earlier, pass --now {}",
                        timestamp_ms.div_euclid(1000)
                    )),
                    Err(again) => {
                        hints.push(format!("checked at the request's own timestamp, it still fails: {again}"));
                        if matches!(again, VerifyError::NoMatch { .. }) {
                            hints.extend(self.no_match_hints(body, *timestamp_ms));
                        }
                    }
                }
            }
            VerifyError::NoMatch { .. } => hints.extend(self.no_match_hints(body, now_ms)),
            _ => {}
        }
        hints
    }

    fn no_match_hints(&self, body: &[u8], now_ms: i64) -> Vec<String> {
        let mut hints = Vec::new();
        let stripped = body.strip_suffix(b"\r\n").or_else(|| body.strip_suffix(b"\n"));
        if let Some(stripped) = stripped {
            if self.run(stripped, now_ms).is_ok() {
                hints.push(
                    "the body has a trailing newline that was probably added by your editor: it matches without \
                     it. Save the body without a final newline (or capture it with `curl -o`/`printf '%s'`)"
                        .to_owned(),
                );
                return hints;
            }
        }
        for (i, secret) in self.secrets.iter().enumerate() {
            let n = i + 1;
            if secret.trim() != secret {
                hints.push(format!("secret #{n} has leading or trailing whitespace: was it copied with it?"));
            }
            if !secret.starts_with(SECRET_PREFIX) {
                hints.push(match self.scheme {
                    SignatureScheme::Gauge => format!(
                        "secret #{n} does not start with whsec_, so its characters are the key as given; if the \
                         subscription shows a whsec_ secret, pass all of it"
                    ),
                    _ => format!(
                        "secret #{n} does not start with whsec_, so it was read as bare base64 (as the Standard \
                         Webhooks libraries do); pass the whole whsec_... value the subscription shows"
                    ),
                });
            }
        }
        if hints.is_empty() {
            hints.push(
                "check the secret belongs to this endpoint, and that the body is the exact bytes received: a body \
                 parsed and re-serialised (even re-indented) no longer matches"
                    .to_owned(),
            );
        }
        hints
    }
}

fn scheme_name(s: SignatureScheme) -> &'static str {
    match s {
        SignatureScheme::StandardWebhooks => "standard-webhooks",
        SignatureScheme::Gauge => "gauge",
        SignatureScheme::None => "none",
    }
}

fn ok_line(v: &Verified, secrets: usize) -> String {
    let mut line = format!("OK: signature v1 #{} matches", v.signature_position);
    if secrets > 1 {
        line.push_str(&format!(" secret #{}", v.secret_position));
    }
    line.push_str(&format!(" (scheme {}", scheme_name(v.scheme)));
    if v.header == sign::names::PULSE_SIGNATURE {
        line.push_str(", legacy x-pulse-signature");
    }
    let age = human_duration_ms(v.age_ms.unsigned_abs());
    if v.age_ms >= 0 {
        line.push_str(&format!(", timestamp {age} old)"));
    } else {
        line.push_str(&format!(", timestamp {age} in the future)"));
    }
    line
}

/// `Name: value` with a valid header name (RFC 9110 token).
fn parse_header_line(line: &str) -> Option<(String, String)> {
    let (name, value) = line.split_once(':')?;
    let name = name.trim();
    let is_tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || !name.bytes().all(is_tchar) {
        return None;
    }
    Some((name.to_owned(), value.trim().to_owned()))
}

fn read_headers_file(path: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let raw = std::fs::read(path).with_context(|| format!("--headers-file {}: cannot read it", path.display()))?;
    let text = String::from_utf8_lossy(&raw);
    let mut headers = Vec::new();
    let mut seen_content = false;
    for (i, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        // `curl -v` prefixes request lines with "> " (and ends them with a bare ">").
        let line = line.strip_prefix('>').map_or(line, |l| l.strip_prefix(' ').unwrap_or(l));
        if line.trim().is_empty() {
            if headers.is_empty() {
                continue;
            }
            break; // the blank line after the headers: a body may follow
        }
        let first = !seen_content;
        seen_content = true;
        if line.starts_with('#') || line.starts_with(':') {
            continue; // a comment, or an HTTP/2 pseudo-header (":method: POST")
        }
        if first && line.contains(" HTTP/") {
            continue; // the request line
        }
        match parse_header_line(line) {
            Some(h) => headers.push(h),
            None => bail!("--headers-file {}: line {}: expected `Name: value`, got {:?}", path.display(), i + 1, line),
        }
    }
    if headers.is_empty() {
        bail!("--headers-file {}: no `Name: value` lines in it", path.display());
    }
    Ok(headers)
}

fn read_body(path: &Path) -> anyhow::Result<Vec<u8>> {
    if path.as_os_str() == "-" {
        let mut body = Vec::new();
        std::io::stdin().read_to_end(&mut body).context("--body-file -: cannot read standard input")?;
        Ok(body)
    } else {
        std::fs::read(path).with_context(|| format!("--body-file {}: cannot read it", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_lines() {
        assert_eq!(parse_header_line("webhook-id: msg_1"), Some(("webhook-id".into(), "msg_1".into())));
        assert_eq!(parse_header_line("X-A:b:c "), Some(("X-A".into(), "b:c".into())));
        assert_eq!(parse_header_line("no colon"), None);
        assert_eq!(parse_header_line("bad name: x"), None);
        assert_eq!(parse_header_line(": x"), None);
    }
}
