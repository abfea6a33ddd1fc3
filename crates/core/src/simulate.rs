//! `hookline policy simulate`: what a policy does with a given sequence of responses, with no network and a
//! simulated clock. The output contract (JSON lines) is in PRODUCT.md and `docs/policies.md`.

use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::{Serialize, Serializer};

use crate::engine::{decide, FinalState, Next, Progress, Wait};
use crate::outcome::Outcome;
use crate::policy::Policy;

/// The simulated wall clock at t = 0, 2026-01-01T00:00:00Z (Unix ms): HTTP-date `Retry-After` values are read
/// against it.
pub const WALL_CLOCK_START_MS: i64 = 1_767_225_600_000;

/// Tries after which a simulation stops even if the policy has not ended the delivery. A validated policy always
/// ends well before (at most 1000 attempts of at most 10 tries).
pub const MAX_TRIES: u32 = 100_000;

const OUTCOME_WORDS: &str = "timeout, connect_error, tls_error, egress_refused, invalid_url";

/// Parses one `<response>` argument: `503`, `429:ra=120`, `503:ra=Wed, 21 Oct 2026 07:28:00 GMT`, `timeout`,
/// `connect_error`, `tls_error`, `egress_refused` or `invalid_url`. The error names the argument and the grammar.
pub fn parse_response(arg: &str) -> Result<Outcome, String> {
    let text = arg.trim();
    let bad = |why: String| Err(format!("invalid response {arg:?}: {why}"));
    match text.to_ascii_lowercase().as_str() {
        "timeout" => return Ok(Outcome::Timeout),
        "connect_error" => return Ok(Outcome::ConnectError),
        "tls_error" => return Ok(Outcome::TlsError),
        "egress_refused" => return Ok(Outcome::EgressRefused),
        "invalid_url" => return Ok(Outcome::InvalidUrl),
        _ => {}
    }
    let (code, extra) = match text.split_once(':') {
        Some((code, extra)) => (code.trim(), Some(extra)),
        None => (text, None),
    };
    let status = match code.parse::<u16>() {
        Ok(s) if code.len() == 3 && code.bytes().all(|b| b.is_ascii_digit()) && (100..=599).contains(&s) => s,
        _ => {
            return bad(format!(
                "expected an HTTP status from 100 to 599 (\"503\"), optionally with a Retry-After value \
                 (\"429:ra=120\", \"503:ra=Wed, 21 Oct 2026 07:28:00 GMT\"), or one of {OUTCOME_WORDS}"
            ))
        }
    };
    let retry_after = match extra {
        None => None,
        Some(extra) => {
            let Some(value) = extra.trim_start().strip_prefix("ra=") else {
                return bad(format!("after \"{status}:\" expected \"ra=<Retry-After value>\", e.g. \"{status}:ra=120\""));
            };
            let value = value.trim();
            if value.is_empty() {
                return bad("the Retry-After value after \"ra=\" is empty".into());
            }
            // Any text: receivers do send garbage (`soon`, `1.5`), and what the policy does with it (ignores it,
            // and which wait applies instead) is a fair question. The try's line says it was not usable.
            Some(value.to_owned())
        }
    };
    Ok(Outcome::Http { status, retry_after })
}

/// A duration in milliseconds, written in seconds: whole numbers without a fraction (`60`), others to the
/// millisecond (`0.523`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seconds(pub u64);

impl Serialize for Seconds {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.0.is_multiple_of(1000) {
            s.serialize_u64(self.0 / 1000)
        } else {
            s.serialize_f64(self.0 as f64 / 1000.0)
        }
    }
}

/// One simulated HTTP try.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TryLine {
    pub attempt: u32,
    #[serde(rename = "try")]
    pub try_no: u32,
    /// When the try started.
    pub at_s: Seconds,
    pub outcome: String,
    pub verdict: &'static str,
    pub counts_toward_disable: bool,
    /// The wait before the next try or attempt, from the end of this one; absent when nothing follows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_delay_s: Option<Seconds>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_delay_min_s: Option<Seconds>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_delay_max_s: Option<Seconds>,
    /// Extra: the delivery's status after this try, in the profile's words (`pending`, `DEAD_LETTER`, ...).
    pub status: String,
    /// Extra: the number of the `classify` rule that decided, counted from 1 as in the delivery log (0: none).
    pub rule: usize,
    /// Extra: the response's `Retry-After` as given, and whether it could be read (an unreadable one is ignored:
    /// the schedule's wait applies).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_usable: Option<bool>,
}

/// The delivery's fate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FinalLine {
    /// `succeeded`, `failed` or `dead`.
    #[serde(rename = "final")]
    pub final_state: &'static str,
    /// The profile's own word for it.
    pub status: String,
    pub attempts: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Line {
    Try(TryLine),
    Final(FinalLine),
}

impl Line {
    /// The line as printed: one JSON object, fields in contract order.
    pub fn to_json(&self) -> String {
        // Serialising these plain structs cannot fail; an empty object would be the visible symptom if it did.
        serde_json::to_string(self).unwrap_or_else(|_| "{}".to_owned())
    }
}

/// Runs `policy` against `responses` (consumed in order, the last repeating), drawing jitter from a `StdRng`
/// seeded with `seed`. A try takes no simulated time except a timeout, which lasts the policy's `timeout_ms`.
/// Returns one line per try and a final line. An empty `responses` is read as a single `200`.
pub fn simulate(policy: &Policy, responses: &[Outcome], seed: u64) -> Vec<Line> {
    let mut rng = StdRng::seed_from_u64(seed);
    let ok = Outcome::http(200);
    let mut lines = Vec::new();
    let (mut attempt, mut try_no, mut start_ms) = (1u32, 1u32, 0u64);
    for n in 0..MAX_TRIES {
        let outcome = responses.get(n as usize).or_else(|| responses.last()).unwrap_or(&ok);
        let took = if matches!(outcome, Outcome::Timeout) { policy.attempt.timeout_ms } else { 0 };
        let end_ms = start_ms.saturating_add(took);
        let end = i64::try_from(end_ms).unwrap_or(i64::MAX);
        let progress =
            Progress { attempt, try_no, first_attempt_at_ms: 0, now_ms: end, wall_clock_ms: WALL_CLOCK_START_MS.saturating_add(end) };
        let d = decide(policy, &progress, outcome, &mut rng);
        let (wait, status) = match d.next {
            Next::MicroRetry(w) | Next::NextAttempt(w) => (Some(w), policy.status_words.pending.clone()),
            Next::Final(s) => (None, policy.status_word(s).to_owned()),
        };
        lines.push(Line::Try(TryLine {
            attempt,
            try_no,
            at_s: Seconds(start_ms),
            outcome: outcome.token(),
            verdict: d.verdict.as_str(),
            counts_toward_disable: d.counts_toward_disable,
            next_delay_s: wait.map(|w: Wait| Seconds(w.ms)),
            next_delay_min_s: wait.map(|w| Seconds(w.min_ms)),
            next_delay_max_s: wait.map(|w| Seconds(w.max_ms)),
            status,
            // Counted from 1, as the delivery log and the portal count (0: no rule decided).
            rule: policy.classify.get(d.rule).map_or(0, |_| d.rule.saturating_add(1)),
            retry_after: match outcome {
                Outcome::Http { retry_after, .. } => retry_after.clone(),
                _ => None,
            },
            retry_after_usable: match outcome {
                Outcome::Http { retry_after: Some(v), .. } => Some(crate::retry_after::parse(v, progress.wall_clock_ms).is_some()),
                _ => None,
            },
        }));
        match d.next {
            Next::MicroRetry(_) => try_no = try_no.saturating_add(1),
            Next::NextAttempt(_) => {
                attempt = attempt.saturating_add(1);
                try_no = 1;
            }
            Next::Final(s) => return finish(policy, lines, s, attempt),
        }
        start_ms = end_ms.saturating_add(wait.map_or(0, |w| w.ms));
    }
    // Only an unvalidated policy that never ends gets here.
    finish(policy, lines, policy.exhausted.state(), attempt)
}

fn finish(policy: &Policy, mut lines: Vec<Line>, state: FinalState, attempts: u32) -> Vec<Line> {
    lines.push(Line::Final(FinalLine { final_state: state.as_str(), status: policy.status_word(state).to_owned(), attempts }));
    lines
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::policy::builtin;

    fn run(profile: &str, responses: &[&str], seed: u64) -> Vec<String> {
        let p = builtin(profile).unwrap();
        let responses: Vec<Outcome> = responses.iter().map(|r| parse_response(r).unwrap()).collect();
        simulate(&p, &responses, seed).iter().map(Line::to_json).collect()
    }

    fn tries(lines: &[Line]) -> Vec<&TryLine> {
        lines.iter().filter_map(|l| if let Line::Try(t) = l { Some(t) } else { None }).collect()
    }

    /// An unreadable Retry-After is ignored: the schedule's wait applies, and the line says the value was unusable.
    #[test]
    fn an_unreadable_retry_after_is_shown_ignored() {
        let policy = crate::policy::builtin("lucibook").unwrap();
        let lines = simulate(&policy, &[parse_response("429:ra=soon").unwrap()], 0);
        let first = tries(&lines)[0].clone();
        let plain = simulate(&policy, &[parse_response("429").unwrap()], 0);
        assert_eq!(first.next_delay_s, tries(&plain)[0].next_delay_s, "the wait of no Retry-After at all");
        assert_eq!((first.retry_after.as_deref(), first.retry_after_usable), (Some("soon"), Some(false)));
        let json = lines[0].to_json();
        assert!(json.contains(r#""retry_after":"soon","retry_after_usable":false"#), "{json}");
        let usable = simulate(&policy, &[parse_response("429:ra=120").unwrap()], 0);
        assert_eq!(tries(&usable)[0].retry_after_usable, Some(true));
    }

    #[test]
    fn parses_the_response_grammar() {
        let ok = |s: u16, ra: Option<&str>| Ok(Outcome::Http { status: s, retry_after: ra.map(str::to_owned) });
        let cases: Vec<(&str, Result<Outcome, String>)> = vec![
            ("503", ok(503, None)),
            ("200", ok(200, None)),
            (" 429:ra=120 ", ok(429, Some("120"))),
            ("503:ra=Wed, 21 Oct 2026 07:28:00 GMT", ok(503, Some("Wed, 21 Oct 2026 07:28:00 GMT"))),
            ("timeout", Ok(Outcome::Timeout)),
            ("connect_error", Ok(Outcome::ConnectError)),
            ("tls_error", Ok(Outcome::TlsError)),
            ("egress_refused", Ok(Outcome::EgressRefused)),
            ("invalid_url", Ok(Outcome::InvalidUrl)),
            ("TIMEOUT", Ok(Outcome::Timeout)),
            // Any Retry-After text is taken: the simulation shows the policy ignoring what it cannot read.
            ("429:ra=soon", ok(429, Some("soon"))),
            ("429:ra=1.5", ok(429, Some("1.5"))),
        ];
        for (arg, want) in cases {
            assert_eq!(parse_response(arg), want, "{arg}");
        }
        for bad in ["", "5033", "99", "600", "abc", "503:", "503:ra=", "503:retry=5", "50x", "+503", "timeout:ra=5", "-1"] {
            let err = parse_response(bad).unwrap_err();
            assert!(err.starts_with(&format!("invalid response {bad:?}")), "{err}");
        }
    }

    #[test]
    fn lucibook_503_runs_the_whole_schedule_and_stays_failed() {
        let lines = run("lucibook", &["503"], 0);
        let want = [
            r#"{"attempt":1,"try":1,"at_s":0,"outcome":"503","verdict":"retry","counts_toward_disable":true,"next_delay_s":60,"next_delay_min_s":60,"next_delay_max_s":60,"status":"pending","rule":5}"#,
            r#"{"attempt":2,"try":1,"at_s":60,"outcome":"503","verdict":"retry","counts_toward_disable":true,"next_delay_s":300,"next_delay_min_s":300,"next_delay_max_s":300,"status":"pending","rule":5}"#,
            r#"{"attempt":3,"try":1,"at_s":360,"outcome":"503","verdict":"retry","counts_toward_disable":true,"next_delay_s":1800,"next_delay_min_s":1800,"next_delay_max_s":1800,"status":"pending","rule":5}"#,
            r#"{"attempt":4,"try":1,"at_s":2160,"outcome":"503","verdict":"retry","counts_toward_disable":true,"next_delay_s":7200,"next_delay_min_s":7200,"next_delay_max_s":7200,"status":"pending","rule":5}"#,
            r#"{"attempt":5,"try":1,"at_s":9360,"outcome":"503","verdict":"retry","counts_toward_disable":true,"next_delay_s":43200,"next_delay_min_s":43200,"next_delay_max_s":43200,"status":"pending","rule":5}"#,
            r#"{"attempt":6,"try":1,"at_s":52560,"outcome":"503","verdict":"retry","counts_toward_disable":true,"status":"failed","rule":5}"#,
            r#"{"final":"failed","status":"failed","attempts":6}"#,
        ];
        assert_eq!(lines, want);
    }

    #[test]
    fn responses_are_consumed_in_order_and_the_last_repeats() {
        let lines = run("gauge", &["500", "timeout", "204"], 0);
        assert_eq!(lines.len(), 4);
        assert!(lines[0].contains(r#""at_s":0,"outcome":"500""#));
        // A try takes no time, except a timeout, which lasts the policy's 10 s.
        assert!(lines[1].contains(r#""at_s":30,"outcome":"timeout""#), "{}", lines[1]);
        assert!(lines[2].contains(r#""at_s":340,"outcome":"204","verdict":"success""#), "{}", lines[2]);
        assert_eq!(lines[3], r#"{"final":"succeeded","status":"succeeded","attempts":3}"#);
    }

    #[test]
    fn fynapse_micro_retries_then_dead_letters() {
        let p = builtin("fynapse").unwrap();
        let lines = simulate(&p, &[Outcome::http(503)], 42);
        let t = tries(&lines);
        // 20 attempts of 2 tries each.
        assert_eq!(t.len(), 40);
        for pair in t.chunks(2) {
            assert_eq!((pair[0].try_no, pair[1].try_no), (1, 2));
            assert_eq!(pair[0].attempt, pair[1].attempt);
            assert_eq!((pair[0].next_delay_min_s, pair[0].next_delay_max_s), (Some(Seconds(200)), Some(Seconds(2000))));
        }
        assert_eq!(t[1].next_delay_min_s, Some(Seconds(24_000)));
        assert_eq!(t[39].next_delay_s, None);
        assert_eq!(t[39].status, "DEAD_LETTER");
        assert_eq!(lines.last().unwrap().to_json(), r#"{"final":"dead","status":"DEAD_LETTER","attempts":20}"#);
        // Fractional seconds print to the millisecond.
        let micro = serde_json::to_value(&lines[0]).unwrap();
        let s = micro["next_delay_s"].as_f64().unwrap();
        assert!((0.2..=2.0).contains(&s) && (s * 1000.0).fract() == 0.0, "{s}");
        // The same seed gives the same run; another seed another.
        assert_eq!(simulate(&p, &[Outcome::http(503)], 42), lines);
        assert_ne!(simulate(&p, &[Outcome::http(503)], 43), lines);
    }

    #[test]
    fn http_date_retry_after_is_read_against_the_simulated_clock() {
        // 2 h after 2026-01-01T00:00:00Z, sent at t = 0: 7200 s; sent again at t = 7200 (now in the past): the
        // scheduled wait.
        let lines = run("lucibook", &["429:ra=Thu, 01 Jan 2026 02:00:00 GMT"], 0);
        assert!(lines[0].contains(r#""counts_toward_disable":false,"next_delay_s":7200,"#), "{}", lines[0]);
        assert!(lines[1].contains(r#""at_s":7200,"#) && lines[1].contains(r#""next_delay_s":300,"#), "{}", lines[1]);
        assert_eq!(lines.last().unwrap(), r#"{"final":"failed","status":"failed","attempts":6}"#);
    }

    #[test]
    fn relay_and_gauge_end_dead() {
        let relay = run("relay", &["500"], 0);
        assert_eq!(relay.len(), 12);
        assert_eq!(relay[11], r#"{"final":"dead","status":"dead","attempts":11}"#);
        assert!(relay[10].contains(r#""at_s":1622,"#), "{}", relay[10]);
        assert_eq!(run("relay", &["301"], 0)[1], r#"{"final":"dead","status":"dead","attempts":1}"#);
        let gauge = run("gauge", &["connect_error"], 0);
        assert_eq!(gauge.len(), 6);
        assert!(gauge[4].contains(r#""attempt":5,"try":1,"at_s":25530,"#), "{}", gauge[4]);
        assert_eq!(gauge[5], r#"{"final":"dead","status":"dead","attempts":5}"#);
    }

    #[test]
    fn seconds_print_whole_or_to_the_millisecond() {
        let j = |ms| serde_json::to_string(&Seconds(ms)).unwrap();
        assert_eq!(j(60_000), "60");
        assert_eq!(j(0), "0");
        assert_eq!(j(523), "0.523");
        assert_eq!(j(1_500), "1.5");
        assert_eq!(j(28_801), "28.801");
    }

    proptest! {
        #[test]
        fn parse_response_never_panics(arg in "\\PC{0,60}") {
            let _ = parse_response(&arg);
        }

        #[test]
        fn parse_response_never_panics_near_the_grammar(code in "[0-9+-]{0,5}", sep in "[:=ra ]{0,4}", rest in "\\PC{0,20}") {
            let _ = parse_response(&format!("{code}{sep}{rest}"));
        }

        /// Every simulation of a built-in ends with exactly one final line, and times only move forward.
        #[test]
        fn simulations_end_and_time_moves_forward(
            which in 0usize..5, codes in proptest::collection::vec(100u16..600, 1..5), timeout in any::<bool>(), seed in any::<u64>(),
        ) {
            let p = builtin(crate::policy::BUILTIN_NAMES[which]).unwrap();
            let mut responses: Vec<Outcome> = codes.into_iter().map(Outcome::http).collect();
            if timeout { responses.insert(0, Outcome::Timeout); }
            let lines = simulate(&p, &responses, seed);
            prop_assert!(matches!(lines.last(), Some(Line::Final(_))));
            let t = tries(&lines);
            prop_assert_eq!(t.len() + 1, lines.len());
            for w in t.windows(2) {
                prop_assert!(w[1].at_s.0 >= w[0].at_s.0 + w[0].next_delay_s.map_or(0, |s| s.0));
            }
        }
    }
}
