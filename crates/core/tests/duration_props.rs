//! Fuzz-style property test of every duration a policy states: arbitrary numbers (huge, negative, NaN, inf, tiny)
//! written into a policy document, through `parse` (validation), the engine and `policy simulate`. Never a panic;
//! an accepted policy's waits stay within the documented caps, and no retry is ever due before the attempt that
//! asks for it ended (a wait of 1e16 s once wrapped the due time into the past and the retry went at once).
//! `PROPTEST_CASES` overrides the case count.

use hookline_core::policy::{self, Policy, MAX_TIMEOUT_MS, MAX_WAIT_S, MAX_WINDOW_S};
use hookline_core::simulate::{simulate, Line};
use hookline_core::{decide, decide_lost_attempt, due_at_ms, Next, Outcome, Progress};
use proptest::prelude::*;
use rand::SeedableRng;

/// A number as TOML writes it: anything from NaN to 1e308, negative, tiny, or an integer of any size.
fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => prop::sample::select(vec![
            "nan", "inf", "-inf", "0", "-0.0", "1e308", "-1e308", "1e16", "1e19", "5e-324", "1e-300", "0.0005", "0.001",
            "1", "2592000", "2592000.001", "34560000", "34560001", "600000", "600001", "9223372036854775807",
        ])
        .prop_map(str::to_owned),
        1 => any::<f64>().prop_map(|f| if f.is_finite() { format!("{f:e}") } else { "nan".to_owned() }),
        4 => (0.001f64..5e6).prop_map(|f| format!("{f}")),
        1 => any::<i64>().prop_map(|n| n.to_string()),
        2 => (1u64..700_000).prop_map(|n| n.to_string()),
    ]
}

/// An integer field: TOML integers only (a float or an out-of-range integer is a syntax error, which is fine).
fn integer() -> impl Strategy<Value = String> {
    prop_oneof![
        1 => any::<i64>().prop_map(|n| n.to_string()),
        6 => (1u64..700_000).prop_map(|n| n.to_string()),
        1 => prop::sample::select(vec!["0", "1", "600000", "600001", "9223372036854775807", "-1", "1e3"]).prop_map(str::to_owned),
    ]
}

#[derive(Debug, Clone)]
struct Numbers {
    waits: Vec<String>,
    exponential: Option<(String, String, String)>,
    window: Option<String>,
    jitter: Option<String>,
    timeout_ms: String,
    micro: Option<(String, String)>,
    retry_after: (u8, String, String),
    failing_for: Option<String>,
    tolerance: String,
}

/// Mostly a value in range, a quarter of the time an arbitrary one: most documents then have one or two
/// arbitrary durations and still pass validation often enough to reach the engine.
fn or_arbitrary(
    plausible: impl Strategy<Value = String> + 'static,
    arbitrary: impl Strategy<Value = String> + 'static,
) -> BoxedStrategy<String> {
    prop_oneof![3 => plausible, 1 => arbitrary].boxed()
}

fn float_in(lo: f64, hi: f64) -> impl Strategy<Value = String> {
    prop_oneof![
        1 => Just(format!("{lo}")),
        1 => Just(format!("{hi}")),
        6 => (lo..=hi).prop_map(|f| format!("{f}")),
    ]
}

fn int_in(lo: u64, hi: u64) -> impl Strategy<Value = String> {
    (lo..=hi).prop_map(|n| n.to_string())
}

fn numbers() -> impl Strategy<Value = Numbers> {
    let wait = || or_arbitrary(float_in(0.001, MAX_WAIT_S), number());
    (
        prop::collection::vec(wait(), 1..5),
        prop::option::of((wait(), or_arbitrary(float_in(1.0, 10.0), number()), wait())),
        prop::option::of(or_arbitrary(float_in(0.001, MAX_WINDOW_S), number())),
        prop::option::of(or_arbitrary(float_in(0.0, 0.99), number())),
        or_arbitrary(int_in(1, MAX_TIMEOUT_MS), integer()),
        prop::option::of((or_arbitrary(int_in(0, 1000), integer()), or_arbitrary(int_in(1000, 60_000), integer()))),
        (0u8..3, wait(), or_arbitrary(float_in(0.0, 1.0), number())),
        prop::option::of(or_arbitrary(float_in(0.001, MAX_WINDOW_S), number())),
        or_arbitrary(int_in(1, 2_592_000), integer()),
    )
        .prop_map(|(waits, exponential, window, jitter, timeout_ms, micro, retry_after, failing_for, tolerance)| Numbers {
            waits,
            exponential,
            window,
            jitter,
            timeout_ms,
            micro,
            retry_after,
            failing_for,
            tolerance,
        })
}

fn document(n: &Numbers) -> String {
    let schedule = match &n.exponential {
        Some((i, m, x)) => format!("exponential = {{ initial_s = {i}, multiplier = {m}, max_s = {x} }}\nmax_attempts = 6\n"),
        None => format!("waits_s = [{}]\n", n.waits.join(", ")),
    };
    let window = n.window.as_ref().map(|w| format!("max_window_s = {w}\n")).unwrap_or_default();
    let jitter = n.jitter.as_ref().map(|r| format!("jitter = {{ mode = \"plus_minus\", ratio = {r} }}\n")).unwrap_or_default();
    let micro = n
        .micro
        .as_ref()
        .map(|(lo, hi)| format!("[micro_retries]\nmax_tries = 2\ndelay_min_ms = {lo}\ndelay_max_ms = {hi}\n"))
        .unwrap_or_default();
    let micro_rule = if n.micro.is_some() { "micro_retry = true\n" } else { "" };
    let retry_after = match n.retry_after {
        (0, _, _) => String::new(),
        (1, ref max, _) => format!("retry_after = {{ mode = \"clamp\", max_s = {max} }}\n"),
        (_, ref max, ref r) => format!("retry_after = {{ mode = \"base_plus_jitter\", jitter_ratio = {r}, max_s = {max} }}\n"),
    };
    let disable = n
        .failing_for
        .as_ref()
        .map(|s| format!("[disable]\nafter_failing_for_s = {s}\naction = \"pause\"\nreason = \"r\"\n"))
        .unwrap_or_default();
    format!(
        "name = \"p\"\nexhausted = \"failed\"\ninactive = \"hold\"\n\n[schedule]\n{schedule}{window}{jitter}\n\
         [attempt]\ntimeout_ms = {}\nresponse_cap_bytes = 1000\n\n{micro}\n\
         [[classify]]\nwhen = [\"2xx\"]\nverdict = \"success\"\n\n\
         [[classify]]\nwhen = [\"any\"]\nverdict = \"retry\"\ncounts_toward_disable = true\n{micro_rule}{retry_after}\n\
         [request]\nsignature = \"none\"\nbody_limit_bytes = 1000\noversize = {{ action = \"dead\" }}\nsignature_tolerance_s = {}\n\n{disable}",
        n.timeout_ms, n.tolerance
    )
}

const MAX_WAIT_MS: u64 = (MAX_WAIT_S * 1000.0) as u64;

/// Every wait an accepted policy can produce, checked at several clocks, and `policy simulate` against the engine.
fn check(p: &Policy, seed: u64) -> Result<(), TestCaseError> {
    prop_assert!(p.attempt.timeout_ms <= MAX_TIMEOUT_MS);
    if let Some(w) = p.schedule.max_window_s {
        prop_assert!(w <= MAX_WINDOW_S);
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let outcomes = [
        Outcome::http(503),
        Outcome::Timeout,
        Outcome::Http { status: 429, retry_after: Some("99999999999999999999999".into()) },
        Outcome::Http { status: 503, retry_after: Some("Fri, 31 Dec 9999 23:59:59 GMT".into()) },
        Outcome::Http { status: 503, retry_after: Some("0".into()) },
    ];
    let clocks = [0i64, 1_767_225_600_000, i64::MAX / 2, i64::MAX - 1];
    let last = p.max_attempts().unwrap_or(20).min(20);
    for attempt in 1..=last {
        for &ended in &clocks {
            for try_no in [1, 2] {
                let progress =
                    Progress { attempt, try_no, first_attempt_at_ms: ended.saturating_sub(1000), now_ms: ended, wall_clock_ms: ended };
                for o in &outcomes {
                    if let Next::NextAttempt(w) | Next::MicroRetry(w) = decide(p, &progress, o, &mut rng).next {
                        // Jitter stays below +100%, so twice the cap bounds every wait.
                        prop_assert!(w.ms <= 2 * MAX_WAIT_MS, "wait {} ms over the cap (attempt {attempt}, {o:?})", w.ms);
                        prop_assert!(w.min_ms <= w.ms && w.ms <= w.max_ms, "{w:?}");
                        prop_assert!(due_at_ms(ended, w.ms) >= ended, "due before the attempt ended");
                        // `ended + wait.ms as i64`, as the dispatcher computed it, turned such a wait negative.
                        prop_assert!(i64::try_from(w.ms).is_ok(), "a wait of {} ms wraps to a negative i64", w.ms);
                    }
                }
            }
            if let Next::NextAttempt(w) = decide_lost_attempt(p, attempt, ended.saturating_sub(5), ended, &mut rng).next {
                prop_assert!(w.ms <= 2 * MAX_WAIT_MS && due_at_ms(ended, w.ms) >= ended, "{w:?}");
            }
        }
    }
    // `policy simulate` runs the same engine: each try starts when the previous one ended plus its wait.
    let lines = simulate(p, &outcomes, seed);
    let tries: Vec<_> = lines.iter().filter_map(|l| if let Line::Try(t) = l { Some(t) } else { None }).collect();
    prop_assert!(matches!(lines.last(), Some(Line::Final(_))));
    for pair in tries.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let took = if a.outcome == "timeout" { p.attempt.timeout_ms } else { 0 };
        let delay = a.next_delay_s.expect("a try followed by another names its wait").0;
        prop_assert!(delay <= 2 * MAX_WAIT_MS);
        prop_assert_eq!(b.at_s.0, a.at_s.0 + took + delay, "simulate's next try is not the end plus the wait");
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(3_000),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn arbitrary_policy_durations_never_panic_or_wrap_a_due_time(n in numbers(), seed in any::<u64>()) {
        let doc = document(&n);
        if let Ok(p) = policy::parse(&doc) {
            check(&p, seed)?;
        }
    }
}

/// The generator reaches accepted policies too, or the property above would check nothing.
#[test]
fn the_document_template_is_a_valid_policy() {
    let n = Numbers {
        waits: vec!["1".into(), "2592000".into()],
        exponential: None,
        window: Some("34560000".into()),
        jitter: Some("0.5".into()),
        timeout_ms: "600000".into(),
        micro: Some(("10".into(), "20".into())),
        retry_after: (1, "60".into(), "0".into()),
        failing_for: Some("60".into()),
        tolerance: "300".into(),
    };
    let p = policy::parse(&document(&n)).unwrap_or_else(|e| panic!("{e}\n{}", document(&n)));
    check(&p, 1).unwrap();
    let mut huge = n;
    huge.waits = vec!["1e16".into()];
    let err = policy::parse(&document(&huge)).unwrap_err().to_string();
    assert!(err.contains("schedule.waits_s[0]"), "{err}");
}
