//! The built-in profiles walked row by row against their documents, and validation's error messages.

use rand::rngs::StdRng;
use rand::SeedableRng;

use super::*;
use crate::engine::{decide, Decision, FinalState, Next, Progress, Verdict, Wait};
use crate::outcome::Outcome;

const S: u64 = 1000;

fn profile(name: &str) -> Policy {
    builtin(name).unwrap_or_else(|| panic!("built-in {name}"))
}

fn progress(attempt: u32, try_no: u32) -> Progress {
    Progress { attempt, try_no, first_attempt_at_ms: 0, now_ms: 0, wall_clock_ms: 1_767_225_600_000 }
}

fn decide_at(p: &Policy, attempt: u32, outcome: &Outcome) -> Decision {
    decide(p, &progress(attempt, 1), outcome, &mut StdRng::seed_from_u64(7))
}

fn http(status: u16) -> Outcome {
    Outcome::http(status)
}

fn ra(status: u16, value: &str) -> Outcome {
    Outcome::Http { status, retry_after: Some(value.to_owned()) }
}

fn exact(ms: u64) -> Next {
    Next::NextAttempt(Wait { ms, min_ms: ms, max_ms: ms })
}

fn non_http() -> [Outcome; 5] {
    [Outcome::Timeout, Outcome::ConnectError, Outcome::TlsError, Outcome::EgressRefused, Outcome::InvalidUrl]
}

/// The wait after `attempt` for an outcome that is retried on the plain schedule.
fn wait_after(p: &Policy, attempt: u32, outcome: &Outcome) -> Wait {
    match decide_at(p, attempt, outcome).next {
        Next::NextAttempt(w) => w,
        other => panic!("{}: after attempt {attempt} of {outcome}: {other:?}", p.name),
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Built-ins, parsing, resolving.

#[test]
fn every_builtin_parses_validates_and_names_itself() {
    assert_eq!(BUILTIN_NAMES[0], DEFAULT_PROFILE);
    for name in BUILTIN_NAMES {
        let src = builtin_source(name).expect("embedded");
        let parsed = parse(src).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(parsed.name, *name);
        assert_eq!(builtin(name), Some(parsed));
        assert!(src.starts_with('#'), "{name}.toml starts with a comment naming its document");
        assert!(!profile(name).description.is_empty());
    }
    assert_eq!(builtin("nope"), None);
}

#[test]
fn each_platform_profile_names_its_platform_and_document() {
    // By name and title: the platform's own documents are not shipped in this repository.
    for (name, platform, document) in [
        ("lucibook", "LuciBook", "\"Delivery and retries\""),
        ("fynapse", "Fynapse", "\"Delivery and Retries\""),
        ("relay", "Relay", "\"Delivery and retries\""),
        ("gauge", "Gauge", "\"Delivery, retries and ordering\""),
    ] {
        let first = builtin_source(name).unwrap().lines().next().unwrap();
        assert!(first.contains(platform) && first.contains(document) && !first.contains("seeds/"), "{name}: {first}");
    }
}

#[test]
fn resolve_prefers_inline_then_named_then_default() {
    assert_eq!(resolve("", "").unwrap().name, "standard");
    assert_eq!(resolve("  ", " \n").unwrap().name, "standard");
    assert_eq!(resolve("gauge", "").unwrap().name, "gauge");
    let inline = builtin_source("relay").unwrap().replace("name = \"relay\"", "name = \"my-relay\"");
    assert_eq!(resolve("gauge", &inline).unwrap().name, "my-relay");
    let err = resolve("lucibok", "").unwrap_err();
    assert_eq!(err, PolicyError::UnknownProfile { name: "lucibok".into() });
    assert_eq!(
        err.to_string(),
        "unknown policy profile \"lucibok\" (did you mean \"lucibook\"?): the built-in profiles are standard, lucibook, fynapse, relay, gauge"
    );
    // An inline document that is invalid is an error, not a silent fallback to the named profile.
    assert!(resolve("gauge", "name = 1").is_err());
}

#[test]
fn unknown_keys_are_rejected_with_their_line() {
    let src = builtin_source("gauge").unwrap().replace("[attempt]\n", "[attempt]\nretries = 3\n");
    let err = parse(&src).unwrap_err().to_string();
    assert!(err.contains("retries") && err.contains("line"), "{err}");
    let src = builtin_source("gauge").unwrap().replace("verdict = \"success\"", "verdict = \"ok\"");
    let err = parse(&src).unwrap_err().to_string();
    assert!(err.contains("ok") && err.contains("line"), "{err}");
}

#[test]
fn status_words_and_helpers() {
    let f = profile("fynapse");
    assert_eq!(f.status_word(FinalState::Succeeded), "DELIVERED");
    assert_eq!(f.status_word(FinalState::Dead), "DEAD_LETTER");
    assert_eq!(f.status_word(FinalState::Failed), "DEAD_LETTER");
    assert_eq!(f.status_word(FinalState::Cancelled), "CANCELLED");
    assert_eq!(f.status_words.pending, "PENDING");
    let l = profile("lucibook");
    assert_eq!(l.status_word(FinalState::Failed), "failed");
    assert_eq!(l.max_attempts(), Some(6));
    assert_eq!(l.scheduled_wait(0), None);
    assert_eq!(l.scheduled_wait(1), Some(Wait { ms: 60 * S, min_ms: 60 * S, max_ms: 60 * S }));
    assert_eq!(l.scheduled_wait(6), None);
    assert_eq!(profile("relay").max_attempts(), Some(11));
}

// ---------------------------------------------------------------------------------------------------------------
// LuciBook.

#[test]
fn lucibook_schedule_is_measured_from_the_previous_attempt_and_ends_failed() {
    let p = profile("lucibook");
    // "Delivery is retried at (seconds after the previous attempt): 60, 300, 1800, 7200, 43200."
    for (attempt, secs) in [(1, 60), (2, 300), (3, 1800), (4, 7200), (5, 43200)] {
        for outcome in [http(500), http(503), Outcome::Timeout, http(404)] {
            assert_eq!(decide_at(&p, attempt, &outcome).next, exact(secs * S), "attempt {attempt}, {outcome}");
        }
    }
    // "up to len(schedule) + 1 total attempts" ... "its status stays failed, it is not marked dead".
    let d = decide_at(&p, 6, &http(500));
    assert_eq!((d.verdict, d.next), (Verdict::Retry, Next::Final(FinalState::Failed)));
}

#[test]
fn lucibook_classification_table() {
    let p = profile("lucibook");
    // (outcome, verdict, counts toward auto-pause, final state if terminal)
    let rows: Vec<(Outcome, Verdict, bool, Option<FinalState>)> = vec![
        (http(200), Verdict::Success, false, Some(FinalState::Succeeded)),
        (http(204), Verdict::Success, false, Some(FinalState::Succeeded)),
        (http(299), Verdict::Success, false, Some(FinalState::Succeeded)),
        (http(429), Verdict::Retry, false, None),
        (http(500), Verdict::Retry, true, None),
        (http(502), Verdict::Retry, true, None),
        (http(599), Verdict::Retry, true, None),
        (http(503), Verdict::Retry, true, None),
        (ra(503, "120"), Verdict::Retry, true, None),
        (Outcome::Timeout, Verdict::Retry, true, None),
        (Outcome::ConnectError, Verdict::Retry, true, None),
        (Outcome::TlsError, Verdict::Retry, true, None),
        (http(410), Verdict::Terminal, true, Some(FinalState::Dead)),
        (Outcome::EgressRefused, Verdict::Terminal, true, Some(FinalState::Dead)),
        (Outcome::InvalidUrl, Verdict::Terminal, true, Some(FinalState::Dead)),
        // "anything other than a 2xx ... is retried"
        (http(100), Verdict::Retry, true, None),
        (http(301), Verdict::Retry, true, None),
        (http(400), Verdict::Retry, true, None),
        (http(404), Verdict::Retry, true, None),
        (http(411), Verdict::Retry, true, None),
    ];
    for (outcome, verdict, counts, fin) in rows {
        let d = decide_at(&p, 1, &outcome);
        assert_eq!((d.verdict, d.counts_toward_disable), (verdict, counts), "{outcome}");
        match fin {
            Some(s) => assert_eq!(d.next, Next::Final(s), "{outcome}"),
            None => assert!(matches!(d.next, Next::NextAttempt(_)), "{outcome}: {:?}", d.next),
        }
    }
}

#[test]
fn lucibook_retry_after_is_clamped_into_the_scheduled_wait_and_12_hours() {
    let p = profile("lucibook");
    // "clamped into [schedule[attempt], 43200] seconds — i.e. never faster than that attempt's own scheduled
    // wait, and never slower than 12 hours"
    let rows = [
        // (attempt, Retry-After, wait s)
        (1, "120", 120),
        (1, "10", 60),
        (1, "0", 60),
        (1, "60", 60),
        (1, "43200", 43200),
        (1, "100000", 43200),
        (2, "200", 300),
        (3, "3600", 3600),
        (4, "3600", 7200),
        (5, "50000", 43200),
        (5, "1", 43200),
        // An HTTP-date 2 h after the clock.
        (1, "Thu, 01 Jan 2026 02:00:00 GMT", 7200),
        // An HTTP-date in the past: "now", so the scheduled wait.
        (2, "Wed, 31 Dec 2025 00:00:00 GMT", 300),
        // Unusable values fall back to the schedule.
        (1, "soon", 60),
        (1, "1.5", 60),
    ];
    for status in [429, 503] {
        for (attempt, value, secs) in rows {
            let d = decide_at(&p, attempt, &ra(status, value));
            assert_eq!(d.next, exact(secs * S), "{status} Retry-After {value:?} after attempt {attempt}");
        }
    }
    // Other 5xx: "retried on the schedule" — Retry-After plays no part.
    assert_eq!(decide_at(&p, 1, &ra(500, "600")).next, exact(60 * S));
    assert_eq!(decide_at(&p, 1, &ra(502, "600")).next, exact(60 * S));
}

#[test]
fn lucibook_429_uses_up_an_attempt() {
    // A 429 never counts toward auto-pause, but it is still one of the six attempts: an endpoint answering 429
    // forever is not retried forever.
    let p = profile("lucibook");
    assert!(matches!(decide_at(&p, 5, &ra(429, "120")).next, Next::NextAttempt(_)));
    let d = decide_at(&p, 6, &ra(429, "120"));
    assert_eq!((d.counts_toward_disable, d.next), (false, Next::Final(FinalState::Failed)));
}

#[test]
fn lucibook_request_and_disable() {
    let p = profile("lucibook");
    assert_eq!((p.attempt.timeout_ms, p.attempt.response_cap_bytes), (5000, 65536));
    let d = p.disable.as_ref().unwrap();
    assert_eq!((d.after_consecutive_failures, d.after_failing_for_s), (Some(50), None));
    assert_eq!((d.action, d.reason.as_str(), d.notify), (DisableAction::Pause, "consecutive_failures", true));
    assert_eq!(p.inactive, InactiveAction::Hold);
    assert_eq!(p.exhausted, FinalKind::Failed);
    assert_eq!((p.request.signature, p.request.signature_tolerance_s), (SignatureScheme::StandardWebhooks, 300));
    assert_eq!(p.egress.allowed_schemes, ["https"]);
    assert!(p.micro_retries.is_none() && p.follow_ups.is_empty());
}

// ---------------------------------------------------------------------------------------------------------------
// Fynapse.

#[test]
fn fynapse_non_retryable_list_is_dead_letter_and_everything_else_retries() {
    let p = profile("fynapse");
    // "The following responses are treated as permanent failures: 400, 401, 402, 405, 406, 409, 410, 413"
    for status in [400, 401, 402, 405, 406, 409, 410, 413] {
        let d = decide_at(&p, 1, &http(status));
        assert_eq!((d.verdict, d.next), (Verdict::Terminal, Next::Final(FinalState::Dead)), "{status}");
        assert_eq!(p.status_word(FinalState::Dead), "DEAD_LETTER");
    }
    // "408 (timeout)", "Any other non-2xx status not listed above", "Network errors or timeouts"
    let retried = [100, 301, 304, 403, 404, 407, 408, 411, 412, 414, 422, 429, 499, 500, 501, 502, 503, 504, 599];
    for status in retried {
        let d = decide_at(&p, 1, &http(status));
        assert_eq!(d.verdict, Verdict::Retry, "{status}");
        assert!(matches!(d.next, Next::NextAttempt(_) | Next::MicroRetry(_)), "{status}: {:?}", d.next);
    }
    for outcome in [Outcome::Timeout, Outcome::ConnectError, Outcome::TlsError] {
        assert_eq!(decide_at(&p, 1, &outcome).verdict, Verdict::Retry, "{outcome}");
    }
    for outcome in [Outcome::EgressRefused, Outcome::InvalidUrl] {
        assert_eq!(decide_at(&p, 1, &outcome).next, Next::Final(FinalState::Dead), "{outcome}");
    }
    for status in [200, 201, 204, 299] {
        let d = decide_at(&p, 1, &http(status));
        assert_eq!(d.next, Next::Final(FinalState::Succeeded));
        assert_eq!(p.status_word(FinalState::Succeeded), "DELIVERED");
    }
}

#[test]
fn fynapse_backoff_starts_at_30_s_triples_and_caps_at_4_h_with_20_percent_jitter() {
    let p = profile("fynapse");
    let bases = [30, 90, 270, 810, 2430, 7290, 14400, 14400, 14400, 14400, 14400, 14400, 14400, 14400, 14400, 14400, 14400, 14400, 14400];
    for (i, base) in bases.into_iter().enumerate() {
        let attempt = i as u32 + 1;
        let w = wait_after(&p, attempt, &http(500));
        assert_eq!((w.min_ms, w.max_ms), (base * 800, base * 1200), "after attempt {attempt}");
        assert!((w.min_ms..=w.max_ms).contains(&w.ms));
        assert_eq!(p.scheduled_wait(attempt).map(|w| w.ms), Some(base * S));
    }
    // "Up to 20 attempts total"
    assert_eq!(decide_at(&p, 20, &http(500)).next, Next::Final(FinalState::Dead));
}

#[test]
fn fynapse_retry_window_is_72_hours_from_the_first_attempt() {
    let p = profile("fynapse");
    let hour = 3_600_000i64;
    let at = |now_ms: i64| Progress { attempt: 10, try_no: 2, first_attempt_at_ms: 1_000, now_ms, wall_clock_ms: 0 };
    let mut rng = StdRng::seed_from_u64(1);
    // 4 h ± 20% still fits with 5 h left...
    assert!(matches!(decide(&p, &at(1_000 + 67 * hour), &http(500), &mut rng).next, Next::NextAttempt(_)));
    // ...but not with 2 h left: the delivery is dead-lettered now rather than retried after the window.
    assert_eq!(decide(&p, &at(1_000 + 70 * hour), &http(500), &mut rng).next, Next::Final(FinalState::Dead));
}

#[test]
fn fynapse_micro_retries_once_for_transient_failures_only() {
    let p = profile("fynapse");
    let mut rng = StdRng::seed_from_u64(3);
    // "Up to 2 attempts total", "Delay: randomized between 200 ms and 2000 ms", "transient network issues",
    // "brief service interruptions"
    for outcome in [Outcome::ConnectError, http(502), http(503), http(504)] {
        for seed in 0..50 {
            let d = decide(&p, &progress(1, 1), &outcome, &mut StdRng::seed_from_u64(seed));
            match d.next {
                Next::MicroRetry(w) => {
                    assert_eq!((w.min_ms, w.max_ms), (200, 2000));
                    assert!((200..=2000).contains(&w.ms));
                }
                other => panic!("{outcome}: {other:?}"),
            }
        }
        // The second try is the last one inside the attempt: then the queue-level schedule.
        let d = decide(&p, &progress(1, 2), &outcome, &mut rng);
        assert!(matches!(d.next, Next::NextAttempt(w) if w.min_ms == 24_000 && w.max_ms == 36_000), "{outcome}");
    }
    // Not for a timeout (the deadline was spent), a TLS failure, or an application error.
    for outcome in [Outcome::Timeout, Outcome::TlsError, http(500), http(408), http(429)] {
        assert!(matches!(decide(&p, &progress(1, 1), &outcome, &mut rng).next, Next::NextAttempt(_)), "{outcome}");
    }
    // A receiver that asks for a specific wait gets it instead of a quick retry.
    let d = decide(&p, &progress(1, 1), &ra(503, "120"), &mut rng);
    assert!(matches!(d.next, Next::NextAttempt(w) if w.min_ms == 120_000 && w.max_ms == 132_000), "{:?}", d.next);
    // An unusable header does not suppress the micro-retry.
    assert!(matches!(decide(&p, &progress(1, 1), &ra(503, "later"), &mut rng).next, Next::MicroRetry(_)));
}

#[test]
fn fynapse_retry_after_is_the_base_plus_up_to_10_percent() {
    let p = profile("fynapse");
    // "Fynapse uses that value as the base delay", "Adds a small positive jitter (~+10%)"
    for (status, value, lo, hi) in [
        (500, "100", 100_000, 110_000),
        (429, "10", 10_000, 11_000),
        (408, "1", 1_000, 1_100),
        (503, "3600", 3_600_000, 3_960_000),
        // Shorter than the schedule: the receiver's value still rules.
        (429, "0", 0, 0),
        // An HTTP-date an hour ahead.
        (500, "Thu, 01 Jan 2026 01:00:00 GMT", 3_600_000, 3_960_000),
    ] {
        for seed in 0..20 {
            let d = decide(&p, &progress(3, 2), &ra(status, value), &mut StdRng::seed_from_u64(seed));
            match d.next {
                Next::NextAttempt(w) => {
                    assert_eq!((w.min_ms, w.max_ms), (lo, hi), "{status} {value}");
                    assert!((lo..=hi).contains(&w.ms));
                }
                other => panic!("{status} {value}: {other:?}"),
            }
        }
    }
    // Longer than the window: capped at the window, which a second into the delivery no longer fits — dead-lettered.
    let late = Progress { now_ms: 1_000, ..progress(1, 2) };
    let d = decide(&p, &late, &ra(500, "300000"), &mut StdRng::seed_from_u64(1));
    assert_eq!(d.next, Next::Final(FinalState::Dead));
    // Terminal responses ignore it.
    assert_eq!(decide_at(&p, 1, &ra(410, "10")).next, Next::Final(FinalState::Dead));
}

#[test]
fn fynapse_request_shape_and_inactive() {
    let p = profile("fynapse");
    assert_eq!(p.request.idempotency_key_header.as_deref(), Some("Idempotency-Key"));
    assert_eq!(p.inactive, InactiveAction::Cancel);
    assert_eq!(p.attempt.timeout_ms, 30_000);
    assert!(p.disable.is_none());
    let m = p.micro_retries.as_ref().unwrap();
    assert_eq!((m.max_tries, m.delay_min_ms, m.delay_max_ms), (2, 200, 2000));
}

// ---------------------------------------------------------------------------------------------------------------
// Relay.

#[test]
fn relay_delay_table_row_by_row() {
    let p = profile("relay");
    // | Retry | Scheduled delay |: retry n follows attempt n.
    let table = [(1, 2), (2, 4), (3, 8), (4, 16), (5, 32), (6, 64), (7, 128), (8, 256), (9, 512), (10, 600)];
    for (retry, secs) in table {
        assert_eq!(decide_at(&p, retry, &http(503)).next, exact(secs * S), "retry {retry}");
    }
    // "one immediate attempt and then up to 10 retries": attempt 11 is the last, then dead.
    assert_eq!(decide_at(&p, 11, &http(503)).next, Next::Final(FinalState::Dead));
    // "roughly 27 minutes"
    let total: u64 = table.iter().map(|(_, s)| s).sum();
    assert_eq!(total, 1622);
    assert_eq!(p.attempt.timeout_ms, 10_000);
}

#[test]
fn relay_result_table() {
    let p = profile("relay");
    let retry = |o: &Outcome| {
        let d = decide_at(&p, 1, o);
        d.verdict == Verdict::Retry && matches!(d.next, Next::NextAttempt(_))
    };
    let dead = |o: &Outcome| {
        let d = decide_at(&p, 1, o);
        d.verdict == Verdict::Terminal && d.next == Next::Final(FinalState::Dead)
    };
    // "HTTP 2xx — Succeed" (not "schedules the next retry", as the paragraph above the table says)
    for s in [200, 202, 204, 299] {
        assert_eq!(decide_at(&p, 1, &http(s)).next, Next::Final(FinalState::Succeeded), "{s}");
    }
    // "HTTP 429 — Retry", "HTTP 5xx — Retry", "Response timeout — Retry", "Temporary connection or network failure"
    for o in [http(429), http(500), http(502), http(503), http(599), Outcome::Timeout, Outcome::ConnectError, Outcome::TlsError] {
        assert!(retry(&o), "{o}");
    }
    // "Invalid URL or unsafe destination — Terminal", "HTTP 3xx — Terminal", "Any other HTTP response — Terminal"
    for o in [Outcome::InvalidUrl, Outcome::EgressRefused, http(300), http(301), http(302), http(307), http(308)] {
        assert!(dead(&o), "{o}");
    }
    for s in [100, 101, 400, 401, 404, 408, 410, 413, 418, 451, 499] {
        assert!(dead(&http(s)), "{s}");
    }
    // Retry-After is not part of Relay's policy.
    assert_eq!(decide_at(&p, 1, &ra(429, "100")).next, exact(2 * S));
}

#[test]
fn relay_dead_message_received_emits_message_failed() {
    let p = profile("relay");
    assert_eq!(p.follow_ups, [FollowUp { on_event_type: "message.received".into(), emit_event_type: "message.failed".into() }]);
    assert!(p.disable.is_none());
    assert_eq!(p.exhausted, FinalKind::Dead);
    assert_eq!(p.inactive, InactiveAction::Skip);
}

// ---------------------------------------------------------------------------------------------------------------
// Gauge.

#[test]
fn gauge_schedule_table_row_by_row() {
    let p = profile("gauge");
    // | 2 | 30 seconds after attempt 1 failed | 3 | 5 minutes later | 4 | 1 hour later | 5 | 6 hours later |
    for (attempt, secs) in [(1, 30), (2, 300), (3, 3600), (4, 21600)] {
        assert_eq!(decide_at(&p, attempt, &http(500)).next, exact(secs * S), "after attempt {attempt}");
    }
    // "Then dead: no more automatic attempts"
    assert_eq!(decide_at(&p, 5, &http(500)).next, Next::Final(FinalState::Dead));
    // "So an event survives a little over seven hours of downtime on its own."
    let total: u64 = (1..5).map(|a| p.scheduled_wait(a).unwrap().ms).sum();
    assert!((7 * 3_600_000..8 * 3_600_000).contains(&total), "{total}");
}

#[test]
fn gauge_everything_but_2xx_is_a_counted_retry() {
    let p = profile("gauge");
    for s in [200, 204, 299] {
        assert_eq!(decide_at(&p, 1, &http(s)).next, Next::Final(FinalState::Succeeded));
    }
    let mut others: Vec<Outcome> = [100, 301, 302, 304, 400, 404, 410, 429, 500, 503].map(http).to_vec();
    others.extend(non_http());
    for o in others {
        let d = decide_at(&p, 1, &o);
        assert_eq!((d.verdict, d.counts_toward_disable), (Verdict::Retry, true), "{o}");
        assert_eq!(d.next, exact(30 * S), "{o}");
    }
}

#[test]
fn gauge_request_shape_disable_and_inactive() {
    let p = profile("gauge");
    let r = &p.request;
    assert_eq!(r.signature, SignatureScheme::Gauge);
    assert_eq!(r.event_id_header.as_deref(), Some("Gauge-Event-Id"));
    assert_eq!(r.event_type_header.as_deref(), Some("Gauge-Event-Type"));
    assert_eq!(r.attempt_header.as_deref(), Some("Gauge-Delivery-Attempt"));
    assert_eq!(r.webhook_id_header.as_deref(), Some("Gauge-Webhook-Id"));
    assert_eq!(r.body_style, BodyStyle::CamelCase);
    assert_eq!(r.body_limit_bytes, 65536);
    assert!(matches!(&r.oversize, OversizeAction::Truncate { pointer, fetch_url_template }
        if pointer == "/data/text" && fetch_url_template.contains("{event_id}")));
    assert_eq!(p.attempt.timeout_ms, 10_000);
    let d = p.disable.as_ref().unwrap();
    assert_eq!((d.after_consecutive_failures, d.after_failing_for_s), (None, Some(259_200.0)));
    assert_eq!((d.action, d.reason.as_str(), d.notify), (DisableAction::Disable, "consecutive_failures", true));
    assert_eq!(p.inactive, InactiveAction::Skip);
}

// ---------------------------------------------------------------------------------------------------------------
// Standard (hookline's default).

#[test]
fn standard_schedule_is_never_early_and_at_most_10_percent_late() {
    let p = profile("standard");
    for (attempt, secs) in [(1, 5), (2, 300), (3, 1800), (4, 7200), (5, 18000), (6, 36000), (7, 36000)] {
        let w = wait_after(&p, attempt, &http(500));
        assert_eq!((w.min_ms, w.max_ms), (secs * S, secs * 1100), "after attempt {attempt}");
        assert!((w.min_ms..=w.max_ms).contains(&w.ms));
    }
    assert_eq!(decide_at(&p, 8, &http(500)).next, Next::Final(FinalState::Failed));
}

#[test]
fn standard_classification() {
    let p = profile("standard");
    assert_eq!(decide_at(&p, 1, &http(410)).next, Next::Final(FinalState::Dead));
    assert_eq!(decide_at(&p, 1, &Outcome::EgressRefused).next, Next::Final(FinalState::Dead));
    assert_eq!(decide_at(&p, 1, &Outcome::InvalidUrl).next, Next::Final(FinalState::Dead));
    for o in [http(301), http(400), http(404), http(429), http(500), Outcome::Timeout, Outcome::ConnectError, Outcome::TlsError] {
        let d = decide_at(&p, 1, &o);
        assert_eq!((d.verdict, d.counts_toward_disable), (Verdict::Retry, true), "{o}");
    }
    // Retry-After on 429/503: later than the schedule when asked, within 12 h; never earlier.
    let w = wait_after(&p, 1, &ra(429, "600"));
    assert_eq!((w.ms, w.min_ms, w.max_ms), (600 * S, 600 * S, 600 * S));
    let w = wait_after(&p, 1, &ra(503, "1"));
    assert_eq!((w.min_ms, w.max_ms), (5 * S, 5500));
    assert_eq!(wait_after(&p, 1, &ra(429, "999999")).ms, 43200 * S);
    assert_eq!(wait_after(&p, 1, &ra(500, "600")).min_ms, 5 * S);
    let d = p.disable.as_ref().unwrap();
    assert_eq!((d.after_failing_for_s, d.action), (Some(432_000.0), DisableAction::Disable));
    assert_eq!((p.inactive, p.exhausted), (InactiveAction::Hold, FinalKind::Failed));
    assert_eq!((p.attempt.timeout_ms, p.request.body_limit_bytes), (15_000, 1_048_576));
}

// ---------------------------------------------------------------------------------------------------------------
// Validation: every error names its key.

const MINIMAL: &str = r#"
name = "t"
exhausted = "failed"
inactive = "hold"

[schedule]
waits_s = [1, 2]

[attempt]
timeout_ms = 1000
response_cap_bytes = 1000

[[classify]]
when = ["2xx"]
verdict = "success"

[[classify]]
when = ["any"]
verdict = "retry"
counts_toward_disable = true

[request]
signature = "none"
body_limit_bytes = 1000
oversize = { action = "dead" }
"#;

fn minimal() -> Policy {
    parse(MINIMAL).expect("the minimal policy is valid")
}

fn issue(p: &Policy) -> String {
    validate(p).expect_err("invalid").to_string()
}

#[test]
fn minimal_policy_gets_defaults() {
    let p = minimal();
    assert_eq!(p.max_attempts(), Some(3));
    assert_eq!(p.egress.allowed_schemes, ["https"]);
    assert_eq!(p.request.signature_tolerance_s, 300);
    assert_eq!(p.status_word(FinalState::Dead), "dead");
}

#[test]
fn validation_errors_name_the_key() {
    type Mutation = fn(&mut Policy);
    let cases: Vec<(Mutation, &str)> = vec![
        (|p| p.name.clear(), "name: must not be empty"),
        (
            |p| p.schedule.exponential = Some(Exponential { initial_s: 1.0, multiplier: 2.0, max_s: 10.0 }),
            "schedule: give either waits_s or exponential, not both",
        ),
        (|p| p.schedule.waits_s = None, "schedule: give the waits"),
        (|p| p.schedule.waits_s = Some(vec![]), "schedule.waits_s: must list at least one wait"),
        (|p| p.schedule.waits_s = Some(vec![1.0, -2.0]), "schedule.waits_s[1]: must be a number of seconds"),
        (|p| p.schedule.waits_s = Some(vec![f64::NAN]), "schedule.waits_s[0]"),
        (|p| p.schedule.waits_s = Some(vec![f64::INFINITY]), "schedule.waits_s[0]"),
        (|p| p.schedule.max_attempts = Some(4), "schedule.max_attempts: 4 attempts need 3 waits but waits_s lists 2"),
        (|p| p.schedule.max_attempts = Some(0), "schedule.max_attempts: must be at least 1"),
        (|p| p.schedule.max_window_s = Some(0.0), "schedule.max_window_s: must be a positive number of seconds"),
        (|p| p.schedule.jitter = Some(Jitter { mode: JitterMode::PlusMinus, ratio: 1.0 }), "schedule.jitter.ratio"),
        (|p| p.schedule.jitter = Some(Jitter { mode: JitterMode::Plus, ratio: -0.1 }), "schedule.jitter.ratio"),
        (|p| p.attempt.timeout_ms = 0, "attempt.timeout_ms: must be greater than 0"),
        (|p| p.classify[1].when = vec!["5xxx".into()], "classify[1].when[0]: unknown matcher \"5xxx\""),
        (|p| p.classify[1].when.clear(), "classify[1].when: must list at least one matcher"),
        (
            |p| p.classify[1].when = vec!["5xx".into()],
            "classify: no rule matches statuses 100-199, statuses 300-499, timeout, connect_error, tls_error, egress_refused, invalid_url",
        ),
        (|p| p.classify.insert(1, p.classify[0].clone()), "classify[1]: never applies"),
        (|p| p.classify[0].counts_toward_disable = true, "classify[0].counts_toward_disable: a success cannot count"),
        (|p| p.classify[1].micro_retry = true, "classify[1].micro_retry: needs a [micro_retries] table"),
        (
            |p| p.classify[0].retry_after = RetryAfterUse::Clamp { max_s: 10.0 },
            "classify[0].retry_after: only a retry rule can use Retry-After",
        ),
        (|p| p.classify[1].retry_after = RetryAfterUse::Clamp { max_s: -1.0 }, "classify[1].retry_after.max_s: must be a positive number"),
        (|p| p.classify[1].terminal_state = Some(FinalKind::Dead), "classify[1].terminal_state: only a terminal rule"),
        (|p| p.classify.clear(), "classify: must have at least one rule"),
        (
            |p| p.micro_retries = Some(MicroRetries { max_tries: 2, delay_min_ms: 500, delay_max_ms: 100 }),
            "micro_retries.delay_min_ms: must not exceed delay_max_ms",
        ),
        (|p| p.micro_retries = Some(MicroRetries { max_tries: 0, delay_min_ms: 1, delay_max_ms: 1 }), "micro_retries.max_tries"),
        (
            |p| {
                p.disable = Some(DisableRule {
                    after_consecutive_failures: None,
                    after_failing_for_s: None,
                    action: DisableAction::Pause,
                    reason: "x".into(),
                    notify: true,
                })
            },
            "disable: give after_consecutive_failures, after_failing_for_s, or both",
        ),
        (
            |p| {
                p.disable = Some(DisableRule {
                    after_consecutive_failures: Some(0),
                    after_failing_for_s: None,
                    action: DisableAction::Pause,
                    reason: "x".into(),
                    notify: true,
                })
            },
            "disable.after_consecutive_failures: must be at least 1",
        ),
        (
            |p| {
                p.disable = Some(DisableRule {
                    after_consecutive_failures: Some(3),
                    after_failing_for_s: None,
                    action: DisableAction::Pause,
                    reason: "".into(),
                    notify: true,
                })
            },
            "disable.reason: must not be empty",
        ),
        (
            |p| {
                p.request.oversize =
                    OversizeAction::Truncate { pointer: "data/text".into(), fetch_url_template: "https://x.example/{event_id}".into() }
            },
            "request.oversize.pointer: \"data/text\" is not a JSON pointer",
        ),
        (
            |p| {
                p.request.oversize =
                    OversizeAction::Truncate { pointer: "/a~2b".into(), fetch_url_template: "https://x.example/{event_id}".into() }
            },
            "request.oversize.pointer",
        ),
        (
            |p| p.request.oversize = OversizeAction::Truncate { pointer: "/text".into(), fetch_url_template: "https://x.example/".into() },
            "request.oversize.fetch_url_template: must contain {event_id}",
        ),
        (|p| p.request.event_id_header = Some("Event Id".into()), "request.event_id_header: \"Event Id\" is not a valid HTTP header name"),
        (|p| p.request.body_limit_bytes = 0, "request.body_limit_bytes: must be greater than 0"),
        (
            |p| p.egress.deny_ranges = vec!["10.0.0.0/8".into(), "10.0.0.0/33".into()],
            "egress.deny_ranges[1]: \"10.0.0.0/33\" is not a CIDR range",
        ),
        (|p| p.egress.deny_ranges = vec!["fd00::".into()], "egress.deny_ranges[0]"),
        (|p| p.egress.deny_ranges = vec!["example.com/8".into()], "egress.deny_ranges[0]"),
        (|p| p.egress.allowed_schemes = vec!["ftp".into()], "egress.allowed_schemes[0]"),
        (|p| p.egress.allowed_schemes.clear(), "egress.allowed_schemes: must allow at least one scheme"),
        (|p| p.status_words.dead.clear(), "status_words.dead: must not be empty"),
        (|p| p.follow_ups.push(FollowUp { on_event_type: "".into(), emit_event_type: "x".into() }), "follow_ups[0].on_event_type"),
    ];
    for (mutate, want) in cases {
        let mut p = minimal();
        mutate(&mut p);
        let got = issue(&p);
        assert!(got.contains(want), "want {want:?} in {got:?}");
    }
}

/// A wait of 1e16 s or 1e308 s used to pass and wrap the due time into the past (the retry went at once).
#[test]
fn waits_timeouts_and_windows_are_capped() {
    let with = |edit: &str| MINIMAL.replace("waits_s = [1, 2]", edit);
    for (doc, want) in [
        (with("waits_s = [1e16]"), "schedule.waits_s[0]: must be at most 2592000 seconds"),
        (with("waits_s = [1e308, 1]"), "schedule.waits_s[0]: must be at most 2592000"),
        (with("waits_s = [1, 2592000.5]"), "schedule.waits_s[1]: must be at most"),
        (
            with("exponential = { initial_s = 3e6, multiplier = 2, max_s = 3e6 }\nmax_attempts = 3"),
            "schedule.exponential.initial_s: must be at most",
        ),
        (
            with("exponential = { initial_s = 1, multiplier = 2, max_s = 1e300 }\nmax_attempts = 3"),
            "schedule.exponential.max_s: must be at most 2592000",
        ),
        (with("waits_s = [1, 2]\nmax_window_s = 34560001"), "schedule.max_window_s: must be at most 34560000"),
        (MINIMAL.replace("timeout_ms = 1000", "timeout_ms = 600001"), "attempt.timeout_ms: must be at most 600000"),
        (
            MINIMAL
                .replace("counts_toward_disable = true", "counts_toward_disable = true\nretry_after = { mode = \"clamp\", max_s = 1e16 }"),
            "classify[1].retry_after.max_s: must be at most",
        ),
        (
            MINIMAL.replace(
                "oversize = { action = \"dead\" }",
                "oversize = { action = \"dead\" }\nsignature_tolerance_s = 9223372036854775807",
            ),
            "request.signature_tolerance_s: must be at most",
        ),
        (
            format!("{MINIMAL}\n[disable]\nafter_failing_for_s = 1e20\naction = \"pause\"\nreason = \"r\"\n"),
            "disable.after_failing_for_s: must be at most 34560000",
        ),
    ] {
        let err = parse(&doc).expect_err(&doc).to_string();
        assert!(err.contains(want), "want {want:?} in {err:?}");
    }
    // The caps themselves are accepted.
    for doc in [with("waits_s = [2592000]\nmax_window_s = 34560000"), MINIMAL.replace("timeout_ms = 1000", "timeout_ms = 600000")] {
        parse(&doc).unwrap_or_else(|e| panic!("{e}\n{doc}"));
    }
}

#[test]
fn cidr_ranges_of_both_families_are_accepted() {
    let mut p = minimal();
    p.egress.deny_ranges = vec!["203.0.113.0/24".into(), "2001:db8::/32".into(), "0.0.0.0/0".into(), "::/0".into()];
    assert_eq!(validate(&p), Ok(()));
}

#[test]
fn exponential_schedules_must_end() {
    let mut p = minimal();
    p.schedule.waits_s = None;
    p.schedule.exponential = Some(Exponential { initial_s: 1.0, multiplier: 2.0, max_s: 60.0 });
    assert!(issue(&p).contains("schedule: set max_attempts or max_window_s"), "{}", issue(&p));
    // A window alone is enough when waits fill it within the attempt limit...
    p.schedule.max_window_s = Some(3600.0);
    assert_eq!(validate(&p), Ok(()));
    assert_eq!(p.max_attempts(), None);
    // ...but not when the window allows thousands of attempts.
    p.schedule.exponential = Some(Exponential { initial_s: 0.01, multiplier: 1.0, max_s: 60.0 });
    assert!(issue(&p).contains("schedule.max_window_s: with waits this short"), "{}", issue(&p));
    // Receiver-chosen waits need a count.
    p.schedule.exponential = Some(Exponential { initial_s: 1.0, multiplier: 2.0, max_s: 60.0 });
    p.classify[1].retry_after = RetryAfterUse::BasePlusJitter { jitter_ratio: 0.1, max_s: 60.0 };
    assert!(issue(&p).contains("classify[1].retry_after: base_plus_jitter"), "{}", issue(&p));
    p.schedule.max_attempts = Some(5);
    assert_eq!(validate(&p), Ok(()));
    // Multiplier below 1 and max below initial.
    p.schedule.exponential = Some(Exponential { initial_s: 10.0, multiplier: 0.5, max_s: 5.0 });
    let err = issue(&p);
    assert!(err.contains("schedule.exponential.multiplier") && err.contains("schedule.exponential.max_s"), "{err}");
}

#[test]
fn all_problems_are_reported_at_once() {
    let mut p = minimal();
    p.attempt.timeout_ms = 0;
    p.classify[1].when = vec!["5xxx".into()];
    let err = validate(&p).unwrap_err();
    assert_eq!(err.issues().len(), 2);
    assert!(err.to_string().starts_with("2 problems: "), "{err}");
}

#[test]
fn a_disable_rule_needs_a_counted_outcome() {
    let mut p = minimal();
    p.classify[1].counts_toward_disable = false;
    p.disable = Some(DisableRule {
        after_consecutive_failures: Some(3),
        after_failing_for_s: None,
        action: DisableAction::Pause,
        reason: "r".into(),
        notify: true,
    });
    assert!(issue(&p).contains("disable: no classify rule has counts_toward_disable = true"));
}

#[test]
fn toml_syntax_errors_keep_line_and_column() {
    let err = parse("name = \"x\"\n[schedule\n").unwrap_err();
    assert!(matches!(err, PolicyError::Syntax(_)));
    assert!(err.to_string().contains("line 2"), "{err}");
    // A wrong type names the key.
    let err = parse(&MINIMAL.replace("timeout_ms = 1000", "timeout_ms = \"1s\"")).unwrap_err().to_string();
    assert!(err.contains("timeout_ms"), "{err}");
}

mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn parse_never_panics_on_any_text(text in "\\PC{0,400}") {
            let _ = parse(&text);
        }

        /// Builtins with one number replaced by anything: parsing, validating and deciding never panic.
        #[test]
        fn parse_and_decide_never_panic_on_mutated_profiles(
            which in 0usize..5, nth in 0usize..40, value in prop_oneof![
                any::<i64>().prop_map(|n| n.to_string()),
                any::<f64>().prop_map(|f| format!("{f:?}")),
                Just("nan".to_owned()), Just("inf".to_owned()), Just("-inf".to_owned()), Just("0".to_owned()),
            ],
            status in 0u16..1000, attempt in 0u32..30, seed in any::<u64>(),
        ) {
            let src = builtin_source(BUILTIN_NAMES[which]).unwrap();
            let mutated = replace_nth_number(src, nth, &value);
            if let Ok(p) = parse(&mutated) {
                let _ = decide(&p, &progress(attempt, 1), &http(status), &mut StdRng::seed_from_u64(seed));
                let _ = crate::simulate::simulate(&p, &[http(status), Outcome::Timeout], seed);
            }
        }
    }

    /// Replaces the `nth` run of digits after an `=` (a value, never a key) with `value`.
    fn replace_nth_number(src: &str, nth: usize, value: &str) -> String {
        let mut out = String::with_capacity(src.len());
        let mut seen = 0;
        for line in src.lines() {
            match line.split_once('=') {
                Some((key, rhs)) if !line.trim_start().starts_with('#') && rhs.trim().starts_with(|c: char| c.is_ascii_digit()) => {
                    if seen == nth {
                        out.push_str(&format!("{key}= {value}"));
                    } else {
                        out.push_str(line);
                    }
                    seen += 1;
                }
                _ => out.push_str(line),
            }
            out.push('\n');
        }
        out
    }
}

#[test]
fn docs_quote_every_profile_verbatim() {
    // docs/policies.md shows each profile's TOML next to its interpretations; they must not drift apart.
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/policies.md");
    let docs = std::fs::read_to_string(&path).expect("docs/policies.md");
    for name in BUILTIN_NAMES {
        let toml = builtin_source(name).unwrap().trim_end();
        assert!(docs.contains(toml), "docs/policies.md does not show the current {name}.toml");
        assert!(docs.contains(&format!("## `{name}`")), "no section for {name}");
    }
}

/// The CloudEvents options parse from their documented spellings, and every misuse names its key.
#[test]
fn cloudevents_request_format_and_handshake_options() {
    let doc = MINIMAL.replace(
        "signature = \"none\"",
        "signature = \"standard_webhooks\"\nformat = \"cloudevents_binary\"\ncloudevents_source = \"https://hooks.example.com/{tenant}\"",
    ) + "\n[verification]\nmethod = \"cloudevents\"\norigin = \"hooks.example.com\"\n";
    let p = parse(&doc).expect("valid");
    assert_eq!(p.request.format, RequestFormat::CloudeventsBinary);
    assert_eq!(p.request.cloudevents_source.as_deref(), Some("https://hooks.example.com/{tenant}"));
    let v = p.verification.as_ref().expect("[verification]");
    assert_eq!((v.method, v.cloudevents_origin()), (VerificationMethod::Cloudevents, Some("hooks.example.com")));
    assert_eq!(minimal().request.format, RequestFormat::Envelope, "the envelope stays the default");
    let structured = parse(&MINIMAL.replace("signature = \"none\"", "signature = \"none\"\nformat = \"cloudevents_structured\"")).unwrap();
    assert_eq!(structured.request.format, RequestFormat::CloudeventsStructured);
    let err = parse(&MINIMAL.replace("signature = \"none\"", "signature = \"none\"\nformat = \"cloudevents\"")).unwrap_err().to_string();
    assert!(err.contains("cloudevents_binary"), "an unknown format lists the known ones: {err}");

    type Mutation = fn(&mut Policy);
    let ce = |p: &mut Policy| p.request.format = RequestFormat::CloudeventsBinary;
    let handshake =
        |origin: Option<&str>| Verification { method: VerificationMethod::Cloudevents, timeout_ms: 5000, origin: origin.map(String::from) };
    let cases: Vec<(Mutation, &str)> = vec![
        (|p| p.request.cloudevents_source = Some("/x".into()), "request.cloudevents_source: is only used with a CloudEvents format"),
        (
            |p| {
                p.request.format = RequestFormat::CloudeventsStructured;
                p.request.cloudevents_source = Some("/a b".into());
            },
            "request.cloudevents_source: \"/a b\" is not a URI-reference",
        ),
        (
            |p| {
                p.request.format = RequestFormat::CloudeventsBinary;
                p.request.body_style = BodyStyle::CamelCase;
            },
            "request.body_style: names the fields of hookline's envelope",
        ),
        (
            |p| p.verification = Some(Verification { method: VerificationMethod::Cloudevents, timeout_ms: 5000, origin: None }),
            "verification.origin: is required with method = \"cloudevents\"",
        ),
        (
            |p| {
                p.verification =
                    Some(Verification { method: VerificationMethod::Cloudevents, timeout_ms: 5000, origin: Some("https://x".into()) })
            },
            "verification.origin: \"https://x\" is not a DNS name",
        ),
        (
            |p| {
                p.verification =
                    Some(Verification { method: VerificationMethod::Challenge, timeout_ms: 5000, origin: Some("x.example".into()) })
            },
            "verification.origin: is only used with method = \"cloudevents\"",
        ),
    ];
    for (mutate, want) in cases {
        let mut p = minimal();
        mutate(&mut p);
        let got = issue(&p);
        assert!(got.contains(want), "want {want:?}, got {got:?}");
    }
    let mut ok = minimal();
    ce(&mut ok);
    ok.verification = Some(handshake(Some("events.example.com")));
    validate(&ok).expect("binary mode with a handshake is valid");
}

/// The policy example of docs/operations.md ("CloudEvents to receivers") is valid and says what the text says.
#[test]
fn the_cloudevents_policy_example_of_the_operations_guide_is_valid() {
    let doc = include_str!("../../../../docs/operations.md");
    let section = doc.split("### CloudEvents to receivers").nth(1).expect("the section exists");
    let block = section.split("```toml\n").nth(1).and_then(|b| b.split("```").next()).expect("a toml block");
    let p = parse(block).expect("the example is a valid policy");
    assert_eq!(p.request.format, RequestFormat::CloudeventsBinary);
    assert_eq!(p.verification.as_ref().and_then(|v| v.cloudevents_origin()), Some("hooks.example.com"));
}
