//! Validation: everything a policy must satisfy before the engine may use it. Every issue names its key path.

use std::net::IpAddr;

use super::matcher::{Matcher, OutcomeKey};
use super::{
    Issue, JitterMode, OversizeAction, Policy, PolicyError, RetryAfterUse, Rule, VerdictKind, MAX_ATTEMPTS_LIMIT, MAX_TIMEOUT_MS,
    MAX_WAIT_S, MAX_WINDOW_S,
};

/// Micro-retries happen inside one execution; anything longer belongs on the schedule.
const MICRO_DELAY_LIMIT_MS: u64 = 60_000;
const MICRO_TRIES_LIMIT: u32 = 10;
/// The shortest wait a schedule may state: waits are whole milliseconds.
const MIN_WAIT_S: f64 = 0.001;

#[derive(Default)]
struct Issues(Vec<Issue>);

impl Issues {
    fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(Issue { path: path.into(), message: message.into() });
    }

    /// A positive number of seconds, at most `max` (so due times stay far from the arithmetic's limits).
    fn seconds_at_most(&mut self, path: &str, v: f64, max: f64, what: &str) {
        if !(v.is_finite() && v > 0.0) {
            self.push(path, format!("must be a positive number of seconds, got {v}"));
        } else if v > max {
            self.push(path, format!("must be at most {max} seconds ({what}), got {v}"));
        }
    }

    /// A wait of seconds: at least `MIN_WAIT_S`, at most `MAX_WAIT_S`.
    fn wait(&mut self, path: &str, w: f64) {
        if !(w.is_finite() && w >= MIN_WAIT_S) {
            self.push(path, format!("must be a number of seconds, at least {MIN_WAIT_S}; got {w}"));
        } else if w > MAX_WAIT_S {
            self.push(path, format!("must be at most {MAX_WAIT_S} seconds (30 days); got {w}"));
        }
    }
}

/// Checks a parsed policy. Returns every problem found, not just the first.
pub fn validate(p: &Policy) -> Result<(), PolicyError> {
    let mut v = Issues::default();
    if p.name.trim().is_empty() {
        v.push("name", "must not be empty");
    }
    schedule(p, &mut v);
    if let Some(r) = &p.rate_limit {
        if !(1..=crate::rate_limit::MAX_PER_S).contains(&r.per_s) {
            v.push("rate_limit.per_s", format!("must be from 1 to {}, got {}", crate::rate_limit::MAX_PER_S, r.per_s));
        }
        if let Some(b) = r.burst.filter(|b| !(1..=crate::rate_limit::MAX_BURST).contains(b)) {
            v.push("rate_limit.burst", format!("must be from 1 to {}, got {b}", crate::rate_limit::MAX_BURST));
        }
    }
    if let Some(b) = &p.breaker {
        if !(1..=1_000).contains(&b.consecutive_errors) {
            v.push("breaker.consecutive_errors", format!("must be from 1 to 1000, got {}", b.consecutive_errors));
        }
        let max = super::document::MAX_BREAKER_COOL_OFF_MS;
        if !(100..=max).contains(&b.cool_off_ms) {
            v.push("breaker.cool_off_ms", format!("must be from 100 to {max}, got {}", b.cool_off_ms));
        }
        if b.max_cool_off_ms < b.cool_off_ms || b.max_cool_off_ms > max {
            v.push("breaker.max_cool_off_ms", format!("must be from cool_off_ms ({}) to {max}, got {}", b.cool_off_ms, b.max_cool_off_ms));
        }
    }
    if let Some(c) = &p.concurrency {
        let max = super::document::MAX_CONCURRENCY;
        if !(1..=max).contains(&c.max) {
            v.push("concurrency.max", format!("must be from 1 to {max}, got {}", c.max));
        }
        if c.min < 1 || c.min > c.max {
            v.push("concurrency.min", format!("must be from 1 to concurrency.max ({}), got {}", c.max, c.min));
        }
        if let Some(slow) = c.slow_ms.filter(|s| !(1..=super::MAX_TIMEOUT_MS).contains(s)) {
            v.push("concurrency.slow_ms", format!("must be from 1 to {}, got {slow}", super::MAX_TIMEOUT_MS));
        }
    }
    if let Some(ver) = &p.verification {
        match (ver.method, ver.origin.as_deref()) {
            (super::VerificationMethod::Cloudevents, None) => v.push(
                "verification.origin",
                "is required with method = \"cloudevents\": the name of the sending system, e.g. \"hooks.example.com\"",
            ),
            (super::VerificationMethod::Cloudevents, Some(o)) if !is_origin(o) => v.push(
                "verification.origin",
                format!("{o:?} is not a DNS name (letters, digits, '-' and '.', at most 253 characters), e.g. \"hooks.example.com\""),
            ),
            (super::VerificationMethod::Challenge, Some(_)) => {
                v.push("verification.origin", "is only used with method = \"cloudevents\" (the echo challenge sends no origin)")
            }
            _ => {}
        }
        if !(1..=super::document::MAX_VERIFICATION_TIMEOUT_MS).contains(&ver.timeout_ms) {
            v.push(
                "verification.timeout_ms",
                format!(
                    "must be from 1 to {} (the API waits for the challenge), got {}",
                    super::document::MAX_VERIFICATION_TIMEOUT_MS,
                    ver.timeout_ms
                ),
            );
        }
    }
    if p.attempt.timeout_ms == 0 {
        v.push("attempt.timeout_ms", "must be greater than 0");
    } else if p.attempt.timeout_ms > MAX_TIMEOUT_MS {
        v.push("attempt.timeout_ms", format!("must be at most {MAX_TIMEOUT_MS} (10 minutes), got {}", p.attempt.timeout_ms));
    }
    if p.attempt.response_cap_bytes == 0 {
        v.push("attempt.response_cap_bytes", "must be greater than 0");
    }
    if let Some(m) = &p.micro_retries {
        if !(1..=MICRO_TRIES_LIMIT).contains(&m.max_tries) {
            v.push(
                "micro_retries.max_tries",
                format!("must be from 1 to {MICRO_TRIES_LIMIT} (tries in one attempt, the first included), got {}", m.max_tries),
            );
        }
        if m.delay_min_ms > m.delay_max_ms {
            v.push("micro_retries.delay_min_ms", format!("must not exceed delay_max_ms ({} > {})", m.delay_min_ms, m.delay_max_ms));
        }
        if m.delay_max_ms > MICRO_DELAY_LIMIT_MS {
            v.push("micro_retries.delay_max_ms", format!("must be at most {MICRO_DELAY_LIMIT_MS} ms; longer waits belong on the schedule"));
        }
    }
    classify(p, &mut v);
    disable(p, &mut v);
    for (i, f) in p.follow_ups.iter().enumerate() {
        if f.on_event_type.trim().is_empty() {
            v.push(format!("follow_ups[{i}].on_event_type"), "must not be empty");
        }
        if f.emit_event_type.trim().is_empty() {
            v.push(format!("follow_ups[{i}].emit_event_type"), "must not be empty");
        }
    }
    request(p, &mut v);
    egress(p, &mut v);
    let w = &p.status_words;
    for (key, word) in [
        ("pending", &w.pending),
        ("succeeded", &w.succeeded),
        ("failed", &w.failed),
        ("dead", &w.dead),
        ("cancelled", &w.cancelled),
        ("skipped", &w.skipped),
    ] {
        if word.trim().is_empty() {
            v.push(format!("status_words.{key}"), "must not be empty");
        }
    }
    if v.0.is_empty() {
        Ok(())
    } else {
        Err(PolicyError::Invalid(v.0))
    }
}

fn schedule(p: &Policy, v: &mut Issues) {
    let s = &p.schedule;
    match (&s.waits_s, &s.exponential) {
        (Some(_), Some(_)) => v.push("schedule", "give either waits_s or exponential, not both"),
        (None, None) => v.push("schedule", "give the waits: either waits_s (a list of seconds) or exponential"),
        _ => {}
    }
    let limit = MAX_ATTEMPTS_LIMIT as usize;
    if let Some(waits) = &s.waits_s {
        if waits.is_empty() {
            v.push("schedule.waits_s", "must list at least one wait (for no retries, set max_attempts = 1)");
        }
        if waits.len() >= limit {
            v.push("schedule.waits_s", format!("lists {} waits; at most {} are allowed", waits.len(), limit - 1));
        }
        for (i, w) in waits.iter().enumerate() {
            v.wait(&format!("schedule.waits_s[{i}]"), *w);
        }
    }
    if let Some(e) = &s.exponential {
        v.wait("schedule.exponential.initial_s", e.initial_s);
        if !(e.multiplier.is_finite() && e.multiplier >= 1.0) {
            v.push(
                "schedule.exponential.multiplier",
                format!("must be a finite number, at least 1 (waits never shrink); got {}", e.multiplier),
            );
        }
        v.seconds_at_most("schedule.exponential.max_s", e.max_s, MAX_WAIT_S, "30 days, the longest wait");
        if e.max_s.is_finite() && e.initial_s.is_finite() && e.max_s < e.initial_s {
            v.push("schedule.exponential.max_s", format!("must be at least initial_s ({} < {})", e.max_s, e.initial_s));
        }
    }
    if let Some(max) = s.max_attempts {
        if max == 0 {
            v.push("schedule.max_attempts", "must be at least 1 (the first attempt counts)");
        } else if max > MAX_ATTEMPTS_LIMIT {
            v.push("schedule.max_attempts", format!("must be at most {MAX_ATTEMPTS_LIMIT}, got {max}"));
        }
        if let Some(waits) = &s.waits_s {
            if max as usize > waits.len() + 1 {
                v.push(
                    "schedule.max_attempts",
                    format!(
                        "{max} attempts need {} waits but waits_s lists {}; at most {} attempts",
                        max - 1,
                        waits.len(),
                        waits.len() + 1
                    ),
                );
            }
        }
    }
    if let Some(w) = s.max_window_s {
        v.seconds_at_most("schedule.max_window_s", w, MAX_WINDOW_S, "400 days, the longest window");
    }
    let jitter_down = match &s.jitter {
        Some(j) => {
            if !(j.ratio.is_finite() && (0.0..1.0).contains(&j.ratio)) {
                v.push("schedule.jitter.ratio", format!("must be at least 0 and below 1 (0.2 = 20%), got {}", j.ratio));
            }
            if j.mode == JitterMode::PlusMinus {
                j.ratio
            } else {
                0.0
            }
        }
        None => 0.0,
    };
    // Something must end the retries. An explicit list ends by itself; exponential needs a count or a window.
    if s.waits_s.is_none() && s.max_attempts.is_none() {
        match (s.max_window_s, &s.exponential) {
            (None, _) => v.push("schedule", "set max_attempts or max_window_s, or a failing delivery would be retried forever"),
            // Window only: the shortest possible waits must still fill the window within the attempt limit.
            (Some(window), Some(e))
                if window.is_finite()
                    && e.initial_s >= MIN_WAIT_S
                    && e.multiplier >= 1.0
                    && attempts_fitting(window, e.initial_s, e.multiplier, e.max_s, jitter_down.clamp(0.0, 0.999)) > MAX_ATTEMPTS_LIMIT =>
            {
                v.push(
                    "schedule.max_window_s",
                    format!("with waits this short the window allows more than {MAX_ATTEMPTS_LIMIT} attempts; set max_attempts"),
                );
            }
            _ => {}
        }
    }
}

/// How many attempts the shortest jittered waits fit into a window (stopping once past the limit).
fn attempts_fitting(window_s: f64, initial: f64, mult: f64, max: f64, down: f64) -> u32 {
    let mut elapsed = 0.0;
    let mut attempts = 1;
    let mut wait = initial;
    while attempts <= MAX_ATTEMPTS_LIMIT {
        elapsed += wait.min(max) * (1.0 - down);
        if elapsed > window_s {
            break;
        }
        attempts += 1;
        wait *= mult;
    }
    attempts
}

fn classify(p: &Policy, v: &mut Issues) {
    if p.classify.is_empty() {
        v.push("classify", "must have at least one rule; the last should match \"any\"");
        return;
    }
    // Parsed matchers per rule; a rule with a bad matcher is reported and left out of the coverage check.
    let mut parsed: Vec<Option<Vec<Matcher>>> = Vec::with_capacity(p.classify.len());
    for (i, rule) in p.classify.iter().enumerate() {
        let at = format!("classify[{i}]");
        if rule.when.is_empty() {
            v.push(format!("{at}.when"), "must list at least one matcher");
        }
        let mut ok = true;
        let mut matchers = Vec::new();
        for (j, w) in rule.when.iter().enumerate() {
            match Matcher::parse(w) {
                Ok(m) => matchers.push(m),
                Err(e) => {
                    ok = false;
                    v.push(format!("{at}.when[{j}]"), e);
                }
            }
        }
        parsed.push(ok.then_some(matchers));
        rule_fields(p, rule, &at, v);
    }
    if parsed.iter().any(Option::is_none) {
        return;
    }
    let rules: Vec<Vec<Matcher>> = parsed.into_iter().flatten().collect();
    // Decide every outcome key, noting which rule decides it.
    let mut decides = vec![false; rules.len()];
    let mut unmatched = Vec::new();
    for key in OutcomeKey::all() {
        match rules.iter().position(|ms| ms.iter().any(|m| m.matches(key))) {
            Some(i) => decides[i] = true,
            None => unmatched.push(key),
        }
    }
    if !unmatched.is_empty() {
        v.push(
            "classify",
            format!(
                "no rule matches {}; every status 100-599 and timeout, connect_error, tls_error, egress_refused and \
                 invalid_url must be classified (end the list with a rule for \"any\")",
                describe_keys(&unmatched)
            ),
        );
    }
    for (i, d) in decides.iter().enumerate() {
        if !d {
            v.push(format!("classify[{i}]"), "never applies: everything it matches is decided by an earlier rule");
        }
    }
}

fn rule_fields(p: &Policy, rule: &Rule, at: &str, v: &mut Issues) {
    let ra = !matches!(rule.retry_after, RetryAfterUse::Ignore);
    match rule.verdict {
        VerdictKind::Success => {
            if rule.counts_toward_disable {
                v.push(format!("{at}.counts_toward_disable"), "a success cannot count toward disablement");
            }
        }
        VerdictKind::Retry | VerdictKind::Terminal => {}
    }
    if rule.verdict != VerdictKind::Retry {
        if ra {
            v.push(format!("{at}.retry_after"), "only a retry rule can use Retry-After");
        }
        if rule.micro_retry {
            v.push(format!("{at}.micro_retry"), "only a retry rule can micro-retry");
        }
    }
    if rule.verdict != VerdictKind::Terminal && rule.terminal_state.is_some() {
        v.push(format!("{at}.terminal_state"), "only a terminal rule has a final state (retries end as `exhausted` says)");
    }
    if rule.micro_retry && p.micro_retries.is_none() {
        v.push(format!("{at}.micro_retry"), "needs a [micro_retries] table (max_tries, delay_min_ms, delay_max_ms)");
    }
    match &rule.retry_after {
        RetryAfterUse::Ignore => {}
        RetryAfterUse::Clamp { max_s } => {
            v.seconds_at_most(&format!("{at}.retry_after.max_s"), *max_s, MAX_WAIT_S, "30 days, the longest wait")
        }
        RetryAfterUse::BasePlusJitter { jitter_ratio, max_s } => {
            v.seconds_at_most(&format!("{at}.retry_after.max_s"), *max_s, MAX_WAIT_S, "30 days, the longest wait");
            if !(jitter_ratio.is_finite() && (0.0..=1.0).contains(jitter_ratio)) {
                v.push(format!("{at}.retry_after.jitter_ratio"), format!("must be from 0 to 1 (0.1 = +10%), got {jitter_ratio}"));
            }
            // The receiver picks these waits (Retry-After: 0 included), so only a count can end the retries.
            if p.max_attempts().is_none() {
                v.push(
                    format!("{at}.retry_after"),
                    "base_plus_jitter lets the receiver choose every wait, so the schedule needs max_attempts",
                );
            }
        }
    }
}

/// "status 100-199, 300, timeout": runs of statuses collapsed into ranges.
fn describe_keys(keys: &[OutcomeKey]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut run: Option<(u16, u16)> = None;
    let flush = |run: &mut Option<(u16, u16)>, parts: &mut Vec<String>| {
        if let Some((a, b)) = run.take() {
            parts.push(if a == b { format!("status {a}") } else { format!("statuses {a}-{b}") });
        }
    };
    for k in keys {
        match (*k, run) {
            (OutcomeKey::Status(s), Some((a, b))) if s == b + 1 => run = Some((a, s)),
            (OutcomeKey::Status(s), _) => {
                flush(&mut run, &mut parts);
                run = Some((s, s));
            }
            (other, _) => {
                flush(&mut run, &mut parts);
                parts.push(other.describe());
            }
        }
    }
    flush(&mut run, &mut parts);
    parts.join(", ")
}

fn disable(p: &Policy, v: &mut Issues) {
    let Some(d) = &p.disable else { return };
    if d.after_consecutive_failures.is_none() && d.after_failing_for_s.is_none() {
        v.push("disable", "give after_consecutive_failures, after_failing_for_s, or both");
    }
    if d.after_consecutive_failures == Some(0) {
        v.push("disable.after_consecutive_failures", "must be at least 1");
    }
    if let Some(s) = d.after_failing_for_s {
        v.seconds_at_most("disable.after_failing_for_s", s, MAX_WINDOW_S, "400 days, the longest window");
    }
    if d.reason.trim().is_empty() {
        v.push("disable.reason", "must not be empty (it is shown to the endpoint's owner)");
    }
    if !p.classify.iter().any(|r| r.counts_toward_disable) {
        v.push("disable", "no classify rule has counts_toward_disable = true, so this rule could never trip");
    }
}

fn request(p: &Policy, v: &mut Issues) {
    let r = &p.request;
    if r.signature_tolerance_s == 0 {
        v.push("request.signature_tolerance_s", "must be greater than 0");
    } else if r.signature_tolerance_s as f64 > MAX_WAIT_S {
        v.push("request.signature_tolerance_s", format!("must be at most {MAX_WAIT_S} (30 days), got {}", r.signature_tolerance_s));
    }
    for (key, value) in [
        ("idempotency_key_header", &r.idempotency_key_header),
        ("event_id_header", &r.event_id_header),
        ("event_type_header", &r.event_type_header),
        ("attempt_header", &r.attempt_header),
        ("webhook_id_header", &r.webhook_id_header),
    ] {
        if let Some(name) = value {
            if !is_header_name(name) {
                v.push(format!("request.{key}"), format!("{name:?} is not a valid HTTP header name"));
            }
        }
    }
    if r.body_limit_bytes == 0 {
        v.push("request.body_limit_bytes", "must be greater than 0");
    }
    match (&r.cloudevents_source, r.format.is_cloudevents()) {
        (Some(_), false) => v.push("request.cloudevents_source", "is only used with a CloudEvents format (request.format = \"cloudevents_binary\" or \"cloudevents_structured\")"),
        (Some(src), true) if src.trim().is_empty() || src.chars().any(|c| c.is_whitespace() || c.is_control()) => v.push(
            "request.cloudevents_source",
            format!("{src:?} is not a URI-reference (no spaces or control characters), e.g. \"/billing/{{tenant}}\" or \"https://hooks.example.com\""),
        ),
        _ => {}
    }
    if r.format.is_cloudevents() && r.body_style != super::BodyStyle::SnakeCase {
        v.push("request.body_style", "names the fields of hookline's envelope; a CloudEvents format has its own (leave body_style out)");
    }
    if let OversizeAction::Truncate { pointer, fetch_url_template } = &r.oversize {
        if let Err(e) = check_json_pointer(pointer) {
            v.push("request.oversize.pointer", e);
        }
        if !fetch_url_template.contains("{event_id}") {
            v.push("request.oversize.fetch_url_template", "must contain {event_id}, replaced by the event's id");
        } else if url::Url::parse(&fetch_url_template.replace("{event_id}", "evt_1")).is_err() {
            v.push("request.oversize.fetch_url_template", format!("{fetch_url_template:?} is not a URL"));
        }
    }
}

/// A DNS name as the web hooks spec's `WebHook-Request-Origin` carries it.
fn is_origin(o: &str) -> bool {
    !o.is_empty() && o.len() <= 253 && o.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
}

/// RFC 9110 token characters.
fn is_header_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// RFC 6901, pointing into the body (so not the empty pointer, which is the whole document).
fn check_json_pointer(ptr: &str) -> Result<(), String> {
    if !ptr.starts_with('/') {
        return Err(format!("{ptr:?} is not a JSON pointer to a field: it must start with '/', e.g. \"/data/text\""));
    }
    let mut chars = ptr.chars();
    while let Some(c) = chars.next() {
        if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
            return Err(format!("{ptr:?} is not a JSON pointer: '~' must be followed by 0 or 1"));
        }
    }
    Ok(())
}

fn egress(p: &Policy, v: &mut Issues) {
    let e = &p.egress;
    if e.allowed_schemes.is_empty() {
        v.push("egress.allowed_schemes", "must allow at least one scheme (\"https\")");
    }
    for (i, s) in e.allowed_schemes.iter().enumerate() {
        if s != "https" && s != "http" {
            v.push(format!("egress.allowed_schemes[{i}]"), format!("{s:?} is not a scheme webhooks are sent over (https, http)"));
        }
    }
    for (i, h) in e.blocked_hostnames.iter().enumerate() {
        if h.trim().is_empty() {
            v.push(format!("egress.blocked_hostnames[{i}]"), "must not be empty");
        }
    }
    for (i, r) in e.deny_ranges.iter().enumerate() {
        if let Err(why) = parse_cidr(r) {
            v.push(format!("egress.deny_ranges[{i}]"), why);
        }
    }
}

/// `a.b.c.d/n` or `x::/n`.
pub(crate) fn parse_cidr(text: &str) -> Result<(IpAddr, u8), String> {
    let bad = |why: &str| format!("{text:?} is not a CIDR range ({why}), e.g. \"203.0.113.0/24\" or \"2001:db8::/32\"");
    let (addr, len) = text.trim().split_once('/').ok_or_else(|| bad("no /prefix length"))?;
    let addr: IpAddr = addr.parse().map_err(|_| bad("not an IP address"))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let len: u8 = len.parse().ok().filter(|l| *l <= max).ok_or_else(|| bad(&format!("prefix length must be 0-{max}")))?;
    Ok((addr, len))
}
