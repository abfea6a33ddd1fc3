//! The outgoing request of one attempt: its JSON body and its headers, from the policy's `request` section.
//!
//! Body: `{"id":..,"type":..,"occurred_at":"<RFC 3339 UTC, millis>","tenant":..,"entity_id":..,"data":<data>}`
//! (`occurredAt`/`entityId` with `body_style = camel_case`; `tenant` and `entity_id` left out when empty; `data` is
//! the event's JSON text verbatim, `null` when empty). The common path writes it straight into one pre-sized
//! buffer; only an oversize body is scanned again, and then only to splice the cut string in place, so the
//! producer's key order and formatting survive truncation too.

use std::borrow::Cow;

use bytes::Bytes;

use crate::cloudevents_out;
use crate::model::Event;
use crate::policy::{BodyStyle, OversizeAction, Policy, RequestFormat, SignatureScheme};
use crate::sign::{self, names, HeaderLookup, SignError};

/// `hookline/<version>`.
pub const USER_AGENT: &str = concat!("hookline/", env!("CARGO_PKG_VERSION"));

/// Why no body could be built for an event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// The body is over the policy's limit and the policy says `dead`, or truncation cannot make it fit (the
    /// pointer does not lead to a string inside an object, or the body is too big even with that string empty).
    #[error("the body is {size} bytes, over the limit of {limit} bytes")]
    Oversize { size: u64, limit: u64 },
}

/// The body of `event` for `policy` (its `request.format`). Byte-for-byte the same for every attempt of a delivery.
pub fn body(policy: &Policy, event: &Event) -> Result<Bytes, BodyError> {
    let shape = &policy.request;
    let buf = match shape.format {
        RequestFormat::Envelope => envelope(shape.body_style, event),
        RequestFormat::CloudeventsBinary => cloudevents_out::binary_body(event),
        RequestFormat::CloudeventsStructured => cloudevents_out::structured_body(shape.cloudevents_source.as_deref(), event),
    };
    let limit = shape.body_limit_bytes;
    if buf.len() as u64 <= limit {
        return Ok(Bytes::from(buf));
    }
    let oversize = BodyError::Oversize { size: buf.len() as u64, limit };
    match &shape.oversize {
        OversizeAction::Dead => Err(oversize),
        OversizeAction::Truncate { pointer, fetch_url_template } => {
            let limit = usize::try_from(limit).unwrap_or(usize::MAX);
            let url = fetch_url(fetch_url_template, &event.id);
            truncate(&buf, limit, pointer, &url).map(Bytes::from).ok_or(oversize)
        }
    }
}

fn envelope(style: BodyStyle, event: &Event) -> Vec<u8> {
    let (occurred_key, entity_key): (&[u8], &[u8]) = match style {
        BodyStyle::SnakeCase => (b",\"occurred_at\":\"", b",\"entity_id\":"),
        BodyStyle::CamelCase => (b",\"occurredAt\":\"", b",\"entityId\":"),
    };
    let data = trim_json_ws(&event.data_json);
    // Fixed punctuation and keys are under 100 bytes; strings rarely need escapes.
    let mut out =
        Vec::with_capacity(100 + event.id.len() + event.r#type.len() + event.tenant.len() + event.entity_id.len() + data.len().max(4));
    out.extend_from_slice(b"{\"id\":");
    write_json_str(&mut out, &event.id);
    out.extend_from_slice(b",\"type\":");
    write_json_str(&mut out, &event.r#type);
    out.extend_from_slice(occurred_key);
    // A producer may leave occurred_at out; the moment ingest accepted the event is the best stand-in.
    let occurred = if event.occurred_at_ms != 0 { event.occurred_at_ms } else { event.accepted_at_ms };
    write_rfc3339_millis(&mut out, occurred);
    out.push(b'"');
    if !event.tenant.is_empty() {
        out.extend_from_slice(b",\"tenant\":");
        write_json_str(&mut out, &event.tenant);
    }
    if !event.entity_id.is_empty() {
        out.extend_from_slice(entity_key);
        write_json_str(&mut out, &event.entity_id);
    }
    out.extend_from_slice(b",\"data\":");
    if data.is_empty() {
        out.extend_from_slice(b"null");
    } else {
        out.extend_from_slice(data);
    }
    out.push(b'}');
    out
}

fn is_json_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

pub(crate) fn trim_json_ws(s: &[u8]) -> &[u8] {
    let start = s.iter().position(|b| !is_json_ws(*b)).unwrap_or(s.len());
    let end = s.iter().rposition(|b| !is_json_ws(*b)).map_or(start, |i| i + 1);
    &s[start..end]
}

/// The bytes `c` takes inside a JSON string as `write_json_str` writes it.
fn escaped_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

/// `s` as a quoted JSON string. Only what JSON requires is escaped; other characters stay UTF-8.
pub(crate) fn write_json_str(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut run_start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let esc: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0x00..=0x1f => {
                out.extend_from_slice(&bytes[run_start..i]);
                out.extend_from_slice(&[b'\\', b'u', b'0', b'0', HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]]);
                run_start = i + 1;
                continue;
            }
            _ => continue,
        };
        out.extend_from_slice(&bytes[run_start..i]);
        out.extend_from_slice(esc);
        run_start = i + 1;
    }
    out.extend_from_slice(&bytes[run_start..]);
    out.push(b'"');
}

/// `ms` since the epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ`, clamped to years 0000–9999 so the output is always valid
/// RFC 3339.
pub fn rfc3339_millis(ms: i64) -> String {
    let mut out = Vec::with_capacity(24);
    write_rfc3339_millis(&mut out, ms);
    // Only ASCII digits and punctuation were written.
    String::from_utf8(out).unwrap_or_default()
}

fn write_rfc3339_millis(out: &mut Vec<u8>, ms: i64) {
    const MIN_MS: i64 = -62_167_219_200_000; // 0000-01-01T00:00:00.000Z
    const MAX_MS: i64 = 253_402_300_799_999; // 9999-12-31T23:59:59.999Z
    const DAY_MS: i64 = 86_400_000;
    let ms = ms.clamp(MIN_MS, MAX_MS);
    let (y, m, d) = civil_from_days(ms.div_euclid(DAY_MS));
    let rem = ms.rem_euclid(DAY_MS);
    push_digits(out, y, 4);
    out.push(b'-');
    push_digits(out, m, 2);
    out.push(b'-');
    push_digits(out, d, 2);
    out.push(b'T');
    push_digits(out, rem / 3_600_000, 2);
    out.push(b':');
    push_digits(out, rem / 60_000 % 60, 2);
    out.push(b':');
    push_digits(out, rem / 1000 % 60, 2);
    out.push(b'.');
    push_digits(out, rem % 1000, 3);
    out.push(b'Z');
}

/// (year, month, day) of a day count since 1970-01-01 in the proleptic Gregorian calendar (Howard Hinnant's
/// civil-from-days: shift to eras of 400 years starting on March 1st, so leap days fall at the end of a year).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // day of era, 0..=146096
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // year of era, 0..=399
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // day of the March-based year, 0..=365
    let mp = (5 * doy + 2) / 153; // March = 0
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// `n` (non-negative) zero-padded to `width` digits.
fn push_digits(out: &mut Vec<u8>, n: i64, width: usize) {
    let mut buf = [b'0'; 20];
    let mut n = n.unsigned_abs();
    let mut i = buf.len();
    while n > 0 {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
    }
    let start = i.min(buf.len() - width.min(buf.len()));
    out.extend_from_slice(&buf[start..]);
}

/// The template with `{event_id}` replaced by the percent-encoded event id.
fn fetch_url(template: &str, event_id: &str) -> String {
    let mut id = String::with_capacity(event_id.len());
    for b in event_id.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            id.push(char::from(b));
        } else {
            id.push_str(&format!("%{b:02X}"));
        }
    }
    template.replace("{event_id}", &id)
}

/// Cuts the string at `pointer` so the body fits in `limit`, and adds `"truncated":true,"fetchUrl":<url>` to the
/// object holding it. `None` when that cannot be done.
fn truncate(buf: &[u8], limit: usize, pointer: &str, url: &str) -> Option<Vec<u8>> {
    let tokens = parse_pointer(pointer)?;
    let target = locate(buf, &tokens)?;
    let text: String = serde_json::from_slice(&buf[target.start..target.end]).ok()?;

    let mut extra = Vec::with_capacity(32 + url.len());
    extra.extend_from_slice(b",\"truncated\":true,\"fetchUrl\":");
    write_json_str(&mut extra, url);

    // Everything but the string's content, plus the two quotes and the added members.
    let fixed = buf.len() - (target.end - target.start) + 2 + extra.len();
    let mut budget = limit.checked_sub(fixed)?;
    let mut cut = 0;
    for (i, c) in text.char_indices() {
        let n = escaped_len(c);
        if n > budget {
            break;
        }
        budget -= n;
        cut = i + c.len_utf8();
    }

    let mut out = Vec::with_capacity(limit.min(buf.len() + extra.len()));
    out.extend_from_slice(&buf[..target.start]);
    write_json_str(&mut out, &text[..cut]);
    out.extend_from_slice(&buf[target.end..target.object_end]);
    out.extend_from_slice(&extra);
    out.extend_from_slice(&buf[target.object_end..]);
    debug_assert!(out.len() <= limit);
    Some(out)
}

/// RFC 6901 tokens of a pointer (`/data/text` → `["data", "text"]`). The empty pointer (the whole document) cannot
/// name a string inside an object.
fn parse_pointer(pointer: &str) -> Option<Vec<String>> {
    let rest = pointer.strip_prefix('/')?;
    Some(rest.split('/').map(|t| t.replace("~1", "/").replace("~0", "~")).collect())
}

/// Byte spans in the body: the target string token (quotes included) and the `}` that closes its object.
struct Target {
    start: usize,
    end: usize,
    object_end: usize,
}

/// Walks `buf` (JSON) along `tokens`. The last token must name a string member of an object that has no
/// `truncated`/`fetchUrl` member already (adding them would duplicate keys). Any unexpected byte gives `None`.
fn locate(buf: &[u8], tokens: &[String]) -> Option<Target> {
    let (last, path) = tokens.split_last()?;
    let mut s = Scanner { b: buf, i: 0 };
    for tok in path {
        s.ws();
        match s.peek()? {
            b'{' => s.enter_member(tok)?,
            b'[' => s.enter_element(tok)?,
            _ => return None,
        }
    }
    s.ws();
    if s.peek()? != b'{' {
        return None;
    }
    s.i += 1;
    let mut target = None;
    loop {
        s.ws();
        if s.peek()? == b'}' {
            break;
        }
        let name = s.key()?;
        if name == "truncated" || name == "fetchUrl" {
            return None;
        }
        if target.is_none() && name == last.as_str() {
            if s.peek()? != b'"' {
                return None;
            }
            let start = s.i;
            s.skip_string()?;
            target = Some((start, s.i));
        } else {
            s.skip_value()?;
        }
        s.ws();
        match s.peek()? {
            b',' => s.i += 1,
            b'}' => break,
            _ => return None,
        }
    }
    let (start, end) = target?;
    Some(Target { start, end, object_end: s.i })
}

/// A forward-only cursor over JSON text that the ingest already validated; it still never panics on bad input.
struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Scanner<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn ws(&mut self) {
        while self.peek().is_some_and(is_json_ws) {
            self.i += 1;
        }
    }

    /// At `"`: moves past the closing quote.
    fn skip_string(&mut self) -> Option<()> {
        if self.peek()? != b'"' {
            return None;
        }
        self.i += 1;
        loop {
            match self.peek()? {
                b'"' => {
                    self.i += 1;
                    return Some(());
                }
                b'\\' => self.i += 2,
                _ => self.i += 1,
            }
        }
    }

    /// Skips one value. Containers are skipped by counting brackets (outside strings) rather than recursing, so
    /// deep nesting cannot exhaust the stack.
    fn skip_value(&mut self) -> Option<()> {
        self.ws();
        match self.peek()? {
            b'"' => self.skip_string(),
            b'{' | b'[' => {
                let mut depth = 0usize;
                loop {
                    match self.peek()? {
                        b'"' => {
                            self.skip_string()?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth = depth.checked_sub(1)?;
                            if depth == 0 {
                                self.i += 1;
                                return Some(());
                            }
                        }
                        _ => {}
                    }
                    self.i += 1;
                }
            }
            _ => {
                let start = self.i;
                while self.peek().is_some_and(|b| !matches!(b, b',' | b'}' | b']') && !is_json_ws(b)) {
                    self.i += 1;
                }
                (self.i > start).then_some(())
            }
        }
    }

    /// At a member's key: returns the decoded key and leaves the cursor at the member's value.
    fn key(&mut self) -> Option<Cow<'a, str>> {
        let b: &'a [u8] = self.b;
        let start = self.i;
        self.skip_string()?;
        let end = self.i;
        self.ws();
        if self.peek()? != b':' {
            return None;
        }
        self.i += 1;
        self.ws();
        let token = &b[start..end];
        let raw = &token[1..token.len() - 1];
        if raw.contains(&b'\\') {
            serde_json::from_slice::<String>(token).ok().map(Cow::Owned)
        } else {
            std::str::from_utf8(raw).ok().map(Cow::Borrowed)
        }
    }

    /// At `{`: moves to the value of member `name`.
    fn enter_member(&mut self, name: &str) -> Option<()> {
        self.i += 1;
        loop {
            self.ws();
            if self.peek()? != b'"' {
                return None;
            }
            if self.key()? == name {
                return Some(());
            }
            self.skip_value()?;
            self.ws();
            if self.peek()? != b',' {
                return None;
            }
            self.i += 1;
        }
    }

    /// At `[`: moves to element `index` (RFC 6901: decimal, no leading zeros).
    fn enter_element(&mut self, index: &str) -> Option<()> {
        if index.is_empty() || (index.len() > 1 && index.starts_with('0')) || !index.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let n: usize = index.parse().ok()?;
        self.i += 1;
        for _ in 0..n {
            self.ws();
            if self.peek()? == b']' {
                return None;
            }
            self.skip_value()?;
            self.ws();
            if self.peek()? != b',' {
                return None;
            }
            self.i += 1;
        }
        self.ws();
        (self.peek()? != b']').then_some(())
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Headers
// ---------------------------------------------------------------------------------------------------------------

/// What the headers of one attempt depend on besides the policy and the body.
#[derive(Debug, Clone, Copy)]
pub struct HeaderContext<'a> {
    pub event_id: &'a str,
    pub event_type: &'a str,
    pub delivery_id: &'a str,
    pub subscription_id: &'a str,
    /// 1 on the first try, counting up across retries and redeliveries (Gauge-Delivery-Attempt).
    pub attempt_number: u32,
    /// The attempt's wall clock: the signature timestamp.
    pub now_ms: i64,
    /// Every signing secret in force, newest first; each adds a signature (rotation overlap).
    pub secrets: &'a [String],
    /// The event carried, for what a CloudEvents format takes from it (`ce-*`, the data's content type); `None`
    /// for a request that carries no event (the verification challenge).
    pub event: Option<&'a Event>,
}

/// The headers of one attempt, in sending order. Names keep each scheme's documented capitalisation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AttemptHeaders(pub Vec<(Cow<'static, str>, String)>);

impl AttemptHeaders {
    /// The first value of `name`, compared case-insensitively.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(n, v)| (n.as_ref(), v.as_str()))
    }

    pub fn into_vec(self) -> Vec<(Cow<'static, str>, String)> {
        self.0
    }

    /// W3C trace context of the attempt (tracing on): `traceparent`, and `tracestate` when there is one. The values
    /// are formatted by hookline from a parsed context, never copied from input.
    pub fn push_trace_context(&mut self, traceparent: String, tracestate: String) {
        self.0.push((Cow::Borrowed("traceparent"), traceparent));
        if !tracestate.is_empty() {
            self.0.push((Cow::Borrowed("tracestate"), tracestate));
        }
    }
}

impl HeaderLookup for AttemptHeaders {
    fn header(&self, name: &str) -> Option<String> {
        self.get(name).map(str::to_owned)
    }
}

/// The headers of one attempt carrying `body`: content type, user agent, the scheme's signature headers (one
/// signature per secret in force) and the policy's optional id/type/attempt/idempotency headers. Every secret given
/// is in force. A sender that signs many attempts for one subscription builds a [`HeaderPlan`] once instead.
pub fn headers(policy: &Policy, ctx: &HeaderContext<'_>, body: &[u8]) -> Result<AttemptHeaders, SignError> {
    let secrets = ctx.secrets.iter().map(|s| (s.as_str(), None));
    HeaderPlan::build(policy, ctx.subscription_id, secrets).headers(&AttemptIds::from(ctx), body)
}

/// What an attempt's headers depend on that is not the subscription's: the ids, the attempt number, the clock.
#[derive(Debug, Clone, Copy)]
pub struct AttemptIds<'a> {
    pub event_id: &'a str,
    pub event_type: &'a str,
    pub delivery_id: &'a str,
    /// 1 on the first try, counting up across retries and redeliveries (Gauge-Delivery-Attempt).
    pub attempt_number: u32,
    /// The attempt's wall clock: the signature timestamp, and which secrets are still in force.
    pub now_ms: i64,
    /// The event carried (see [`HeaderContext::event`]).
    pub event: Option<&'a Event>,
}

impl<'a> From<&HeaderContext<'a>> for AttemptIds<'a> {
    fn from(c: &HeaderContext<'a>) -> Self {
        Self {
            event_id: c.event_id,
            event_type: c.event_type,
            delivery_id: c.delivery_id,
            attempt_number: c.attempt_number,
            now_ms: c.now_ms,
            event: c.event,
        }
    }
}

/// Where the value of one header of a [`HeaderPlan`] comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderSource {
    /// The same for every attempt of the subscription: content type, user agent, the subscription's id.
    Fixed(Cow<'static, str>),
    /// A CloudEvents format's `Content-Type`: the data's (binary mode) or the event format's (structured).
    ContentType,
    EventId,
    EventType,
    DeliveryId,
    AttemptNumber,
    /// `webhook-timestamp`: Unix seconds.
    UnixSeconds,
    /// `x-pulse-timestamp`: epoch milliseconds.
    UnixMillis,
    /// `webhook-signature`: one `v1,<base64>` per secret in force.
    StandardSignature,
    /// `Gauge-Signature`: `t=<ms>`, then one `,v1=<hex>` per secret in force.
    GaugeSignature,
    /// `x-pulse-signature`: the newest secret's hex alone.
    GaugeLegacySignature,
}

/// One subscription's headers worked out once (when it loads or changes, not per attempt): the names in sending
/// order with where each value comes from, and each secret keyed once. [`HeaderPlan::values`] then only computes
/// what differs per attempt; the output is byte for byte what [`headers`] gives.
#[derive(Debug)]
pub struct HeaderPlan {
    entries: Box<[(Cow<'static, str>, HeaderSource)]>,
    scheme: SignatureScheme,
    format: RequestFormat,
    /// `request.cloudevents_source`, for the `ce-source` of events that have none.
    cloudevents_source: Option<Box<str>>,
    /// Newest first. Unsigned schemes keep none.
    secrets: Box<[PlannedSecret]>,
}

#[derive(Debug)]
struct PlannedSecret {
    /// `None`: in force whatever the clock (the newest, or one that never expires).
    until_ms: Option<i64>,
    /// A secret that cannot be used fails the attempts it is in force for, with its position among those in force.
    key: Result<sign::SigningKey, sign::SecretProblem>,
}

impl HeaderPlan {
    /// The plan for a subscription's stored secrets (newest first): the newest always signs, an older one until
    /// its `expires_at_ms` (0: never expires); one that is not open (empty value) never signs.
    pub fn new(policy: &Policy, subscription_id: &str, secrets: &[crate::model::Secret]) -> Self {
        Self::with_secrets(policy, subscription_id, secrets.iter().map(|s| (s.value.as_str(), s.expires_at_ms)))
    }

    /// [`HeaderPlan::new`] over the secrets as (value, `expires_at_ms`) pairs, newest first, however they are held.
    pub fn with_secrets<'s>(policy: &Policy, subscription_id: &str, secrets: impl Iterator<Item = (&'s str, i64)>) -> Self {
        let in_force = secrets.enumerate().filter(|(_, (value, _))| !value.is_empty()).map(|(i, (value, expires_at_ms))| {
            let until = (i != 0 && expires_at_ms != 0).then_some(expires_at_ms);
            (value, until)
        });
        Self::build(policy, subscription_id, in_force)
    }

    fn build<'s>(policy: &Policy, subscription_id: &str, secrets: impl Iterator<Item = (&'s str, Option<i64>)>) -> Self {
        let shape = &policy.request;
        let mut entries: Vec<(Cow<'static, str>, HeaderSource)> = Vec::with_capacity(12);
        let content_type = match shape.format {
            RequestFormat::Envelope => HeaderSource::Fixed(Cow::Borrowed("application/json")),
            RequestFormat::CloudeventsBinary | RequestFormat::CloudeventsStructured => HeaderSource::ContentType,
        };
        entries.push((Cow::Borrowed("content-type"), content_type));
        entries.push((Cow::Borrowed("user-agent"), HeaderSource::Fixed(Cow::Borrowed(USER_AGENT))));
        match shape.signature {
            SignatureScheme::None => {}
            SignatureScheme::StandardWebhooks => {
                entries.push((Cow::Borrowed(names::WEBHOOK_ID), HeaderSource::EventId));
                entries.push((Cow::Borrowed(names::WEBHOOK_TIMESTAMP), HeaderSource::UnixSeconds));
                entries.push((Cow::Borrowed(names::WEBHOOK_SIGNATURE), HeaderSource::StandardSignature));
            }
            SignatureScheme::Gauge => {
                entries.push((Cow::Borrowed(names::GAUGE_SIGNATURE), HeaderSource::GaugeSignature));
                // Legacy receivers compare one hex string, so the legacy header carries the newest secret's only.
                entries.push((Cow::Borrowed(names::PULSE_SIGNATURE), HeaderSource::GaugeLegacySignature));
                entries.push((Cow::Borrowed(names::PULSE_TIMESTAMP), HeaderSource::UnixMillis));
                entries.push((Cow::Borrowed(names::PULSE_EVENT), HeaderSource::EventType));
            }
        }
        let optional = [
            (&shape.idempotency_key_header, HeaderSource::DeliveryId),
            (&shape.event_id_header, HeaderSource::EventId),
            (&shape.event_type_header, HeaderSource::EventType),
            (&shape.webhook_id_header, HeaderSource::Fixed(Cow::Owned(subscription_id.to_owned()))),
            (&shape.attempt_header, HeaderSource::AttemptNumber),
        ];
        for (name, source) in optional {
            if let Some(name) = name {
                entries.push((Cow::Owned(name.clone()), source));
            }
        }
        // The web hooks spec: once a validation handshake granted an origin, every delivery names it.
        if let Some(origin) = policy.verification.as_ref().and_then(|v| v.cloudevents_origin()) {
            entries.push((Cow::Borrowed("origin"), HeaderSource::Fixed(Cow::Owned(origin.to_owned()))));
        }
        let secrets = match shape.signature {
            SignatureScheme::None => Vec::new(),
            scheme => secrets.map(|(value, until_ms)| PlannedSecret { until_ms, key: sign::SigningKey::new(scheme, value) }).collect(),
        };
        Self {
            entries: entries.into_boxed_slice(),
            scheme: shape.signature,
            format: shape.format,
            cloudevents_source: shape.cloudevents_source.as_deref().map(Box::from),
            secrets: secrets.into_boxed_slice(),
        }
    }

    /// The headers in sending order: each name, and where its value comes from.
    pub fn entries(&self) -> &[(Cow<'static, str>, HeaderSource)] {
        &self.entries
    }

    /// The values of the entries that are not [`HeaderSource::Fixed`], in order: one per such entry.
    pub fn values(&self, ids: &AttemptIds<'_>, body: &[u8]) -> Result<Vec<String>, SignError> {
        let signed = self.sign(ids, body)?;
        let mut out = Vec::with_capacity(self.entries.len());
        let (mut standard, mut gauge, mut legacy) = (signed.standard, signed.gauge, signed.legacy);
        for (_, source) in self.entries.iter() {
            out.push(match source {
                HeaderSource::Fixed(_) => continue,
                HeaderSource::ContentType => cloudevents_out::content_type(self.format, ids.event).to_owned(),
                HeaderSource::EventId => ids.event_id.to_owned(),
                HeaderSource::EventType => ids.event_type.to_owned(),
                HeaderSource::DeliveryId => ids.delivery_id.to_owned(),
                HeaderSource::AttemptNumber => ids.attempt_number.to_string(),
                HeaderSource::UnixSeconds => signed.seconds.clone(),
                HeaderSource::UnixMillis => signed.millis.clone(),
                // Each appears once in a plan; `take` hands over the string instead of copying it.
                HeaderSource::StandardSignature => std::mem::take(&mut standard),
                HeaderSource::GaugeSignature => std::mem::take(&mut gauge),
                HeaderSource::GaugeLegacySignature => std::mem::take(&mut legacy),
            });
        }
        Ok(out)
    }

    /// The headers that depend on the event beyond its id and type, after the entries: a binary-mode CloudEvent's
    /// `ce-*` attributes (their number varies with its extensions). Empty for other formats and without an event.
    pub fn event_headers(&self, ids: &AttemptIds<'_>) -> Vec<(Cow<'static, str>, String)> {
        match (self.format, ids.event) {
            (RequestFormat::CloudeventsBinary, Some(event)) => cloudevents_out::binary_headers(self.cloudevents_source.as_deref(), event),
            _ => Vec::new(),
        }
    }

    /// The whole headers of one attempt, as [`headers`] returns them: the entries, then [`HeaderPlan::event_headers`].
    pub fn headers(&self, ids: &AttemptIds<'_>, body: &[u8]) -> Result<AttemptHeaders, SignError> {
        let mut values = self.values(ids, body)?.into_iter();
        let mut h: Vec<(Cow<'static, str>, String)> = self
            .entries
            .iter()
            .map(|(name, source)| {
                let value = match source {
                    HeaderSource::Fixed(v) => v.clone().into_owned(),
                    _ => values.next().unwrap_or_default(),
                };
                (name.clone(), value)
            })
            .collect();
        h.extend(self.event_headers(ids));
        Ok(AttemptHeaders(h))
    }

    /// The signatures of one attempt under the secrets in force at `ids.now_ms`.
    fn sign(&self, ids: &AttemptIds<'_>, body: &[u8]) -> Result<Signed, SignError> {
        let mut signed = Signed::default();
        match self.scheme {
            SignatureScheme::None => return Ok(signed),
            SignatureScheme::StandardWebhooks => signed.seconds = ids.now_ms.div_euclid(1000).to_string(),
            SignatureScheme::Gauge => signed.millis = ids.now_ms.to_string(),
        }
        let mut keys = Vec::with_capacity(self.secrets.len());
        for s in self.secrets.iter().filter(|s| s.until_ms.is_none_or(|until| until > ids.now_ms)) {
            let position = keys.len() + 1;
            keys.push(s.key.as_ref().map_err(|problem| SignError::BadSecret { position, problem: problem.clone() })?);
        }
        if keys.is_empty() {
            return Err(SignError::NoSecret);
        }
        if self.scheme == SignatureScheme::StandardWebhooks {
            let mut sig = String::with_capacity(48 * keys.len());
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    sig.push(' ');
                }
                key.push_standard(&mut sig, ids.event_id, &signed.seconds, body);
            }
            signed.standard = sig;
        } else {
            let hexes: Vec<String> = keys.iter().map(|k| k.gauge_hex(&signed.millis, body)).collect();
            let mut value = String::with_capacity(signed.millis.len() + 2 + 68 * hexes.len());
            value.push_str("t=");
            value.push_str(&signed.millis);
            for hx in &hexes {
                value.push_str(",v1=");
                value.push_str(hx);
            }
            signed.gauge = value;
            signed.legacy = hexes.into_iter().next().unwrap_or_default();
        }
        Ok(signed)
    }
}

/// What [`HeaderPlan::sign`] computed for one attempt.
#[derive(Default)]
struct Signed {
    seconds: String,
    millis: String,
    standard: String,
    gauge: String,
    legacy: String,
}

/// What a secret header's value is replaced with wherever hookline keeps headers (the attempt record, the log).
pub const REDACTED: &str = "<redacted>";

/// Header names whose values are never kept: credentials and signatures (a signature lets anyone who reads the log
/// replay the request within its tolerance window).
const SECRET_HEADERS: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "x-api-key",
    "api-key",
    sign::names::WEBHOOK_SIGNATURE,
    sign::names::GAUGE_SIGNATURE,
    sign::names::PULSE_SIGNATURE,
    "x-hub-signature",
    "x-hub-signature-256",
    "stripe-signature",
    "svix-signature",
];

/// Whether a header's value is a secret: one of [`SECRET_HEADERS`], or any name containing `signature`, `token`,
/// `secret`, `password`, `auth`, `credential`, `api-key` or `apikey` (compared case-insensitively, without allocating: this runs per header
/// of every attempt).
pub fn is_secret_header(name: &str) -> bool {
    fn contains_ci(hay: &str, needle: &str) -> bool {
        hay.as_bytes().windows(needle.len()).any(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
    }
    SECRET_HEADERS.iter().any(|s| s.eq_ignore_ascii_case(name))
        || ["signature", "token", "secret", "password", "auth", "credential", "api-key", "apikey"].iter().any(|w| contains_ci(name, w))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sign::{verify_gauge, verify_standard, VerifyError};
    use proptest::prelude::*;

    fn policy(request: &str) -> Policy {
        let doc = format!(
            r#"
name = "test"
exhausted = "failed"
inactive = "hold"
[schedule]
waits_s = [1]
[attempt]
timeout_ms = 1000
response_cap_bytes = 1024
[[classify]]
when = ["2xx"]
verdict = "success"
[request]
{request}
"#
        );
        match toml::from_str(&doc) {
            Ok(p) => p,
            Err(e) => panic!("test policy does not parse: {e}"),
        }
    }

    const STANDARD: &str = r#"
signature = "standard_webhooks"
body_limit_bytes = 1048576
oversize = { action = "dead" }
"#;

    fn gauge_policy(limit: u64) -> Policy {
        policy(&format!(
            r#"
signature = "gauge"
body_style = "camel_case"
event_id_header = "Gauge-Event-Id"
event_type_header = "Gauge-Event-Type"
attempt_header = "Gauge-Delivery-Attempt"
webhook_id_header = "Gauge-Webhook-Id"
idempotency_key_header = "Idempotency-Key"
body_limit_bytes = {limit}
oversize = {{ action = "truncate", pointer = "/data/message/text", fetch_url_template = "https://api.gauge.example/v2/events/{{event_id}}" }}
"#
        ))
    }

    fn event(data: &str) -> Event {
        Event {
            id: "evt_1".into(),
            r#type: "message.received".into(),
            occurred_at_ms: 1_614_265_330_123,
            tenant: "acme".into(),
            entity_id: "chat_9".into(),
            data_json: Bytes::from(data.to_owned()),
            accepted_at_ms: 1_614_265_331_000,
            traceparent: String::new(),
            tracestate: String::new(),
            only_subscription_id: String::new(),
            ..Default::default()
        }
    }

    #[test]
    fn body_snake_and_camel() {
        let e = event(r#"{"b": 2, "a": [1, "x"]}"#);
        let snake = body(&policy(STANDARD), &e).unwrap();
        assert_eq!(
            std::str::from_utf8(&snake).unwrap(),
            r#"{"id":"evt_1","type":"message.received","occurred_at":"2021-02-25T15:02:10.123Z","tenant":"acme","entity_id":"chat_9","data":{"b": 2, "a": [1, "x"]}}"#
        );
        let camel = body(&gauge_policy(65_536), &e).unwrap();
        assert_eq!(
            std::str::from_utf8(&camel).unwrap(),
            r#"{"id":"evt_1","type":"message.received","occurredAt":"2021-02-25T15:02:10.123Z","tenant":"acme","entityId":"chat_9","data":{"b": 2, "a": [1, "x"]}}"#
        );
    }

    #[test]
    fn body_empty_fields_and_escapes() {
        let mut e = event("  \n");
        e.tenant.clear();
        e.entity_id.clear();
        e.occurred_at_ms = 0; // falls back to when ingest accepted it
        e.r#type = "a\"b\\c\n\u{1}é".into();
        let b = body(&policy(STANDARD), &e).unwrap();
        assert_eq!(
            std::str::from_utf8(&b).unwrap(),
            r#"{"id":"evt_1","type":"a\"b\\c\n\u0001é","occurred_at":"2021-02-25T15:02:11.000Z","data":null}"#
        );
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["type"], "a\"b\\c\n\u{1}é");
    }

    #[test]
    fn rfc3339_formatting() {
        let table = [
            (0, "1970-01-01T00:00:00.000Z"),
            (-1, "1969-12-31T23:59:59.999Z"),
            (951_782_400_000, "2000-02-29T00:00:00.000Z"),
            (1_709_210_096_789, "2024-02-29T12:34:56.789Z"),
            (1_767_225_599_999, "2025-12-31T23:59:59.999Z"),
            (i64::MIN, "0000-01-01T00:00:00.000Z"),
            (i64::MAX, "9999-12-31T23:59:59.999Z"),
        ];
        for (ms, want) in table {
            assert_eq!(rfc3339_millis(ms), want, "{ms}");
        }
    }

    #[test]
    fn oversize_dead() {
        let p = policy(
            r#"
signature = "none"
body_limit_bytes = 100
oversize = { action = "dead" }
"#,
        );
        let e = event(&format!(r#"{{"text":"{}"}}"#, "x".repeat(100)));
        let err = body(&p, &e).unwrap_err();
        assert!(matches!(err, BodyError::Oversize { limit: 100, size } if size > 100), "{err:?}");
    }

    fn long_message(text: &str) -> Event {
        let mut data = Vec::new();
        data.extend_from_slice(br#"{"message": {"text": "#);
        write_json_str(&mut data, text);
        data.extend_from_slice(br#", "from": "ana"}, "chat": "c1"}"#);
        Event { data_json: Bytes::from(data), ..event("") }
    }

    #[test]
    fn gauge_truncation_fits_64k_on_a_char_boundary() {
        // Multi-byte text (2-, 3- and 4-byte characters) plus characters that need escaping, well over 64 KiB.
        let text = "héllo 世界 🎉 \"q\"\n".repeat(6000);
        let e = long_message(&text);
        let b = body(&gauge_policy(65_536), &e).unwrap();
        assert!(b.len() <= 65_536, "{}", b.len());
        assert!(b.len() > 65_536 - 16, "cut more than needed: {}", b.len());
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        let msg = &v["data"]["message"];
        assert_eq!(msg["truncated"], true);
        assert_eq!(msg["fetchUrl"], "https://api.gauge.example/v2/events/evt_1");
        assert_eq!(msg["from"], "ana");
        assert_eq!(v["data"]["chat"], "c1");
        let cut = msg["text"].as_str().unwrap();
        assert!(text.starts_with(cut) && cut.len() < text.len());
        // The producer's formatting elsewhere is untouched.
        assert!(std::str::from_utf8(&b).unwrap().contains(r#", "from": "ana","truncated":true,"fetchUrl":"#));
    }

    #[test]
    fn builtin_gauge_profile_cuts_a_long_message_text() {
        let Some(p) = crate::policy::builtin("gauge") else { panic!("the gauge profile is built in") };
        let mut data = br#"{"text": "#.to_vec();
        write_json_str(&mut data, &"ü".repeat(40_000));
        data.extend_from_slice(br#", "chatId": "c1"}"#);
        let e = Event { data_json: Bytes::from(data), ..event("") };
        let b = body(&p, &e).unwrap();
        assert!(b.len() <= 65_536);
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["data"]["truncated"], true);
        assert!(v["data"]["fetchUrl"].as_str().unwrap().ends_with("/evt_1"));
        assert!(v["occurredAt"].is_string() && v["entityId"] == "chat_9");
        let secrets = vec!["whsec_aGVsbG8gd29ybGQ=".to_owned()];
        let h = headers(&p, &ctx(&secrets), &b).unwrap();
        verify_gauge(&secrets, &h, &b, ctx(&secrets).now_ms, p.request.signature_tolerance_s).unwrap();
        assert_eq!(h.get("Gauge-Delivery-Attempt"), Some("3"));
    }

    #[test]
    fn no_truncation_markers_when_the_body_fits() {
        let e = long_message("short");
        let b = body(&gauge_policy(65_536), &e).unwrap();
        assert!(!std::str::from_utf8(&b).unwrap().contains("truncated"));
    }

    #[test]
    fn truncation_impossible_is_oversize() {
        let big = "x".repeat(70_000);
        let cases = [
            // The pointer leads to a number, to nothing, into an array, or the rest of the body alone is too big.
            (format!(r#"{{"message": {{"text": 5, "pad": "{big}"}}}}"#), "/data/message/text"),
            (format!(r#"{{"message": {{"body": "{big}"}}}}"#), "/data/message/text"),
            (format!(r#"{{"message": ["{big}"]}}"#), "/data/message/0"),
            (format!(r#"{{"message": {{"text": "{big}", "pad": "{big}"}}}}"#), "/data/message/text"),
            (format!(r#"{{"message": {{"text": "{big}", "truncated": false}}}}"#), "/data/message/text"),
        ];
        for (data, pointer) in cases {
            let mut p = gauge_policy(65_536);
            p.request.oversize = OversizeAction::Truncate { pointer: pointer.into(), fetch_url_template: "https://x/{event_id}".into() };
            let err = body(&p, &event(&data)).unwrap_err();
            assert!(matches!(err, BodyError::Oversize { limit: 65_536, .. }), "{pointer}: {err:?}");
        }
    }

    #[test]
    fn pointer_escapes_arrays_and_url_encoding() {
        let data = format!(r#"{{"a/b": [0, {{"t~x": "{}"}}]}}"#, "y".repeat(500));
        let mut p = gauge_policy(300);
        p.request.oversize =
            OversizeAction::Truncate { pointer: "/data/a~1b/1/t~0x".into(), fetch_url_template: "https://x/e/{event_id}?full=1".into() };
        let mut e = event(&data);
        e.id = "evt 1/ä".into();
        let b = body(&p, &e).unwrap();
        assert!(b.len() <= 300);
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        let obj = &v["data"]["a/b"][1];
        assert_eq!(obj["truncated"], true);
        assert_eq!(obj["fetchUrl"], "https://x/e/evt%201%2F%C3%A4?full=1");
    }

    proptest! {
        #[test]
        fn truncated_bodies_always_fit_and_parse(text in "\\PC{0,400}", limit in 200u64..900) {
            let e = long_message(&text);
            let mut p = gauge_policy(limit);
            p.request.oversize = OversizeAction::Truncate {
                pointer: "/data/message/text".into(),
                fetch_url_template: "https://x/{event_id}".into(),
            };
            match body(&p, &e) {
                Ok(b) => {
                    prop_assert!(b.len() as u64 <= limit);
                    let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
                    let cut = v["data"]["message"]["text"].as_str().unwrap();
                    prop_assert!(text.starts_with(cut));
                }
                Err(BodyError::Oversize { size, .. }) => prop_assert!(size > limit),
            }
        }

        #[test]
        fn truncation_never_panics_on_any_data(data in "\\PC{0,200}", pointer in "(/[a-z0-9~]{0,3}){0,4}") {
            let mut p = gauge_policy(50);
            p.request.oversize = OversizeAction::Truncate { pointer, fetch_url_template: "u".into() };
            let _ = body(&p, &event(&data));
        }
    }

    fn ctx<'a>(secrets: &'a [String]) -> HeaderContext<'a> {
        HeaderContext {
            event_id: "evt_1",
            event_type: "message.received",
            delivery_id: "dlv_0123",
            subscription_id: "sub_9",
            attempt_number: 3,
            now_ms: 1_767_225_600_123,
            secrets,
            event: None,
        }
    }

    #[test]
    fn standard_headers_verify() {
        let secrets = vec!["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_owned(), "whsec_aGVsbG8gd29ybGQ=".to_owned()];
        let c = ctx(&secrets);
        let body = b"{\"id\":\"evt_1\"}";
        let h = headers(&policy(STANDARD), &c, body).unwrap();
        assert_eq!(h.get("content-type"), Some("application/json"));
        assert_eq!(h.get("user-agent"), Some(USER_AGENT));
        assert_eq!(h.get("webhook-id"), Some("evt_1"));
        assert_eq!(h.get("webhook-timestamp"), Some("1767225600"));
        let sigs: Vec<&str> = h.get("webhook-signature").unwrap().split(' ').collect();
        assert_eq!(sigs.len(), 2);
        assert!(sigs.iter().all(|s| s.starts_with("v1,")));
        for (i, s) in secrets.iter().enumerate() {
            let r = verify_standard(&[s], &h, body, c.now_ms, 300).unwrap();
            assert_eq!(r.signature_position, i + 1);
        }
        assert!(h.get("Idempotency-Key").is_none());
        assert!(h.get("Gauge-Signature").is_none());
    }

    #[test]
    fn gauge_headers_verify_and_carry_ids() {
        let secrets = vec!["whsec_aGVsbG8gd29ybGQ=".to_owned(), "old plain secret".to_owned()];
        let c = ctx(&secrets);
        let body = b"{}";
        let h = headers(&gauge_policy(65_536), &c, body).unwrap();
        let sig = h.get("Gauge-Signature").unwrap();
        assert!(sig.starts_with("t=1767225600123,v1="), "{sig}");
        assert_eq!(sig.matches(",v1=").count(), 2);
        assert!(h.iter().any(|(n, _)| n == "Gauge-Signature"), "documented capitalisation is kept");
        for s in &secrets {
            verify_gauge(&[s], &h, body, c.now_ms + 10, 300).unwrap();
        }
        assert_eq!(h.get("Gauge-Delivery-Attempt"), Some("3"));
        assert_eq!(h.get("Idempotency-Key"), Some("dlv_0123"));
        assert_eq!(h.get("Gauge-Event-Id"), Some("evt_1"));
        assert_eq!(h.get("Gauge-Event-Type"), Some("message.received"));
        assert_eq!(h.get("Gauge-Webhook-Id"), Some("sub_9"));
        assert_eq!(h.get("x-pulse-timestamp"), Some("1767225600123"));
        assert_eq!(h.get("x-pulse-event"), Some("message.received"));
        // The legacy header carries the newest secret's signature, alone.
        let legacy: Vec<(&str, &str)> =
            vec![("x-pulse-signature", h.get("x-pulse-signature").unwrap()), ("x-pulse-timestamp", "1767225600123")];
        verify_gauge(&[&secrets[0]], legacy.as_slice(), body, c.now_ms, 300).unwrap();
        assert!(matches!(verify_gauge(&[&secrets[1]], legacy.as_slice(), body, c.now_ms, 300), Err(VerifyError::NoMatch { .. })));
    }

    #[test]
    fn unsigned_and_secretless() {
        let p = policy(
            r#"
signature = "none"
idempotency_key_header = "Idempotency-Key"
body_limit_bytes = 1000
oversize = { action = "dead" }
"#,
        );
        let h = headers(&p, &ctx(&[]), b"{}").unwrap();
        let names: Vec<&str> = h.iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["content-type", "user-agent", "Idempotency-Key"]);
        assert_eq!(headers(&policy(STANDARD), &ctx(&[]), b"{}").unwrap_err(), SignError::NoSecret);
        let bad = vec!["whsec_ok+/".to_owned(), "whsec_%%".to_owned()];
        assert!(matches!(headers(&policy(STANDARD), &ctx(&bad), b"{}").unwrap_err(), SignError::BadSecret { position: 2, .. }));
    }

    fn secret(value: &str, expires_at_ms: i64) -> crate::model::Secret {
        crate::model::Secret { value: value.into(), expires_at_ms, ..Default::default() }
    }

    /// A plan built once gives, attempt after attempt, exactly the headers built from scratch (every scheme, every
    /// optional header), with values only for the headers that are not fixed.
    #[test]
    fn a_plan_gives_the_same_headers_as_building_them_each_time() {
        let secrets = vec!["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_owned(), "whsec_aGVsbG8gd29ybGQ=".to_owned()];
        let stored = [secret(&secrets[0], 0), secret(&secrets[1], 0)];
        let unsigned =
            policy("signature = \"none\"\nwebhook_id_header = \"X-Sub\"\nbody_limit_bytes = 10\noversize = { action = \"dead\" }");
        let standard = policy(STANDARD);
        let gauge = gauge_policy(65_536);
        let profiles: Vec<Policy> = crate::policy::BUILTIN_NAMES.iter().filter_map(|n| crate::policy::builtin(n)).collect();
        assert_eq!(profiles.len(), crate::policy::BUILTIN_NAMES.len());
        let all: Vec<&Policy> = [&unsigned, &standard, &gauge].into_iter().chain(profiles.iter()).collect();
        for p in all {
            let plan = HeaderPlan::new(p, "sub_9", &stored);
            for (attempt, now) in [(1, 1_767_225_600_123), (2, 1_767_225_660_999), (7, 0)] {
                let mut c = ctx(&secrets);
                c.attempt_number = attempt;
                c.now_ms = now;
                let body = format!("{{\"n\":{attempt}}}");
                let want = headers(p, &c, body.as_bytes()).unwrap();
                assert_eq!(plan.headers(&AttemptIds::from(&c), body.as_bytes()).unwrap(), want, "policy {}", p.name);
                let values = plan.values(&AttemptIds::from(&c), body.as_bytes()).unwrap();
                let computed: Vec<&str> = want
                    .iter()
                    .zip(plan.entries())
                    .filter(|(_, (_, s))| !matches!(s, HeaderSource::Fixed(_)))
                    .map(|((_, v), _)| v)
                    .collect();
                assert_eq!(values, computed);
            }
        }
    }

    /// The stored secrets' rotation overlap is read at each attempt's clock: an older secret signs until it
    /// expires, then only the newest does, without building the plan again. An unusable secret fails only the
    /// attempts it is in force for, and one that is not open never signs.
    #[test]
    fn a_plan_signs_with_the_secrets_in_force_at_each_attempt() {
        let p = policy(STANDARD);
        let (new, old) = ("whsec_aGVsbG8gd29ybGQ=", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
        let plan = HeaderPlan::new(&p, "sub_9", &[secret(new, 0), secret(old, 2_000_000), secret("", 0)]);
        let at = |now_ms: i64| AttemptIds { event_id: "evt_1", event_type: "t", delivery_id: "d", attempt_number: 1, now_ms, event: None };
        let during = plan.headers(&at(1_999_999), b"{}").unwrap();
        assert_eq!(during.get("webhook-signature").unwrap().split(' ').count(), 2);
        verify_standard(&[old], &during, b"{}", 1_999_999, 300).unwrap();
        let after = plan.headers(&at(2_000_000), b"{}").unwrap();
        assert_eq!(after.get("webhook-signature").unwrap().split(' ').count(), 1);
        verify_standard(&[new], &after, b"{}", 2_000_000, 300).unwrap();
        assert!(matches!(verify_standard(&[old], &after, b"{}", 2_000_000, 300), Err(VerifyError::NoMatch { .. })));

        let bad_old = HeaderPlan::new(&p, "sub_9", &[secret(new, 0), secret("whsec_%%", 2_000_000)]);
        assert!(matches!(bad_old.values(&at(1_000), b"{}"), Err(SignError::BadSecret { position: 2, .. })));
        assert!(bad_old.values(&at(2_000_000), b"{}").is_ok(), "an expired secret is not even read");
        assert_eq!(HeaderPlan::new(&p, "sub_9", &[secret("", 0)]).values(&at(0), b"{}").unwrap_err(), SignError::NoSecret);
    }

    fn cloudevent() -> Event {
        let mut e = event(r#"{"amount": 12}"#);
        e.source = "https://shop.example/orders".into();
        e.subject = "order 42".into();
        e.extensions = [("traceid".to_owned(), "t 1".to_owned())].into_iter().collect();
        e
    }

    /// Binary mode: the body is the data alone, the attributes are headers, and the Standard Webhooks signature
    /// covers the bytes sent; a plan built once gives the same headers as building them.
    #[test]
    fn a_binary_cloudevent_carries_its_attributes_as_headers_and_is_signed_as_sent() {
        let p = policy(&format!("format = \"cloudevents_binary\"\n{STANDARD}"));
        let e = cloudevent();
        let b = body(&p, &e).unwrap();
        assert_eq!(&b[..], br#"{"amount": 12}"#);
        let secrets = vec!["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_owned()];
        let mut c = ctx(&secrets);
        c.event = Some(&e);
        let h = headers(&p, &c, &b).unwrap();
        assert_eq!(h.get("content-type"), Some("application/json"));
        assert_eq!(h.get("ce-specversion"), Some("1.0"));
        assert_eq!(h.get("ce-id"), Some("evt_1"));
        assert_eq!(h.get("ce-type"), Some("message.received"));
        assert_eq!(h.get("ce-source"), Some("https://shop.example/orders"));
        assert_eq!(h.get("ce-time"), Some("2021-02-25T15:02:10.123Z"));
        assert_eq!(h.get("ce-subject"), Some("order%2042"));
        assert_eq!(h.get("ce-traceid"), Some("t%201"));
        assert_eq!(h.get("webhook-id"), Some("evt_1"));
        verify_standard(&[&secrets[0]], &h, &b, c.now_ms, 300).unwrap();
        let stored = [secret(&secrets[0], 0)];
        let plan = HeaderPlan::new(&p, "sub_9", &stored);
        assert_eq!(plan.headers(&AttemptIds::from(&c), &b).unwrap(), h);
        // A request without an event (the verification challenge) is plain JSON, without attributes.
        c.event = None;
        let challenge = headers(&p, &c, b"{}").unwrap();
        assert_eq!(challenge.get("content-type"), Some("application/json"));
        assert!(challenge.iter().all(|(n, _)| !n.starts_with("ce-")));
    }

    #[test]
    fn a_structured_cloudevent_is_one_json_document_without_attribute_headers() {
        let p = policy(&format!("format = \"cloudevents_structured\"\ncloudevents_source = \"/shop/{{tenant}}\"\n{STANDARD}"));
        let mut e = cloudevent();
        e.source.clear();
        let b = body(&p, &e).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(
            (v["specversion"].as_str(), v["source"].as_str(), v["traceid"].as_str()),
            (Some("1.0"), Some("/shop/acme"), Some("t 1"))
        );
        assert_eq!(v["data"], serde_json::json!({"amount": 12}));
        let secrets = vec!["whsec_aGVsbG8gd29ybGQ=".to_owned()];
        let mut c = ctx(&secrets);
        c.event = Some(&e);
        let h = headers(&p, &c, &b).unwrap();
        assert_eq!(h.get("content-type"), Some(cloudevents_out::STRUCTURED_CONTENT_TYPE));
        assert!(h.iter().all(|(n, _)| !n.starts_with("ce-")));
        verify_standard(&[&secrets[0]], &h, &b, c.now_ms, 300).unwrap();
    }

    /// After a CloudEvents handshake every delivery names the origin it was granted for.
    #[test]
    fn a_cloudevents_handshake_policy_sends_its_origin_on_every_request() {
        let mut p = policy(STANDARD);
        p.verification = Some(crate::policy::Verification {
            method: crate::policy::VerificationMethod::Cloudevents,
            timeout_ms: 1000,
            origin: Some("hooks.example.com".into()),
        });
        let secrets = vec!["whsec_aGVsbG8gd29ybGQ=".to_owned()];
        assert_eq!(headers(&p, &ctx(&secrets), b"{}").unwrap().get("origin"), Some("hooks.example.com"));
        p.verification.as_mut().unwrap().method = crate::policy::VerificationMethod::Challenge;
        assert_eq!(headers(&p, &ctx(&secrets), b"{}").unwrap().get("origin"), None);
    }

    #[test]
    fn signatures_and_credentials_are_secret_and_the_identifying_headers_are_not() {
        for secret in [
            "webhook-signature",
            "Gauge-Signature",
            "X-Pulse-Signature",
            "Authorization",
            "Cookie",
            "Set-Cookie",
            "X-Api-Key",
            "x-my-token",
            "X-Auth-User",
            "Client-Secret",
            "X-Credential",
        ] {
            assert!(is_secret_header(secret), "{secret}");
        }
        for plain in [
            "content-type",
            "user-agent",
            "webhook-id",
            "webhook-timestamp",
            "Gauge-Event-Id",
            "Idempotency-Key",
            "x-pulse-timestamp",
            "traceparent",
            "retry-after",
            "",
        ] {
            assert!(!is_secret_header(plain), "{plain}");
        }
    }
}
