//! Every numeric flag of the CLI, fed arbitrary numbers (huge, negative, NaN, inf, tiny, fractions, garbage) through
//! the real binary: never a panic (exit 101). Commands that finish at once (`egress check` on an IP literal,
//! `policy simulate`, `verify`) run with the value; commands that would start a pipeline (`dev`, `bench`, `soak`,
//! `topics create`) get an unknown flag after it, so only the parsing runs, which is where their bounds are. An
//! out-of-range value is a usage error (exit 2) that names the flag. The number of cases is bounded so the file
//! runs in seconds (`PROPTEST_CASES` overrides it).

use std::process::{Command, Output, Stdio};

use proptest::prelude::*;

fn hookline(args: &[String]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hookline"))
        .args(args)
        .env_remove("HOOKLINE_CONFIG")
        .env_remove("HOOKLINE_VERIFY_SECRET")
        .env_remove("HOOKLINE_EGRESS__ALLOW_RANGES")
        .env_remove("HOOKLINE_EGRESS__ALLOW_HTTP")
        .stdin(Stdio::null())
        .output()
        .expect("run hookline")
}

/// (the command before the flag, the flag, what follows the value; whether it runs with the value).
fn flags() -> Vec<(Vec<&'static str>, &'static str, Vec<&'static str>, bool)> {
    let body = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let verify = vec![
        "--secret",
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "-H",
        "webhook-id: msg_1",
        "-H",
        "webhook-timestamp: 1614265330",
        "-H",
        "webhook-signature: v1,x",
        "--body-file",
        body,
    ];
    let parse_only = || vec!["--no-such-flag"];
    vec![
        (vec!["egress", "check"], "--resolve-timeout", vec!["https://203.0.113.7/hook"], true),
        (vec!["policy", "simulate"], "--seed", vec!["503", "200"], true),
        (vec!["verify"], "--tolerance-s", [verify.clone(), vec!["--now", "1614265330"]].concat(), true),
        (vec!["verify"], "--now", verify, true),
        (vec!["dev"], "--demo", parse_only(), false),
        (vec!["dev"], "--port", parse_only(), false),
        (vec!["dev"], "--partitions", parse_only(), false),
        (vec!["dev"], "--demo-timeout-s", parse_only(), false),
        (vec!["topics", "create"], "--timeout-s", parse_only(), false),
        (vec!["bench", "throughput"], "--replication-factor", parse_only(), false),
        (vec!["bench", "throughput"], "--partitions", parse_only(), false),
        (vec!["bench", "throughput"], "--events", parse_only(), false),
        (vec!["bench", "throughput"], "--duration-s", parse_only(), false),
        (vec!["bench", "throughput"], "--fanout", parse_only(), false),
        (vec!["bench", "throughput"], "--concurrency", parse_only(), false),
        (vec!["bench", "throughput"], "--raw-s", parse_only(), false),
        (vec!["bench", "throughput"], "--kafka-floor-records", parse_only(), false),
        (vec!["bench", "throughput"], "--dns-cache-ttl-s", parse_only(), false),
        (vec!["bench", "throughput"], "--window", parse_only(), false),
        (vec!["bench", "throughput"], "--rate", parse_only(), false),
        (vec!["bench", "throughput"], "--max-wait-s", parse_only(), false),
        (vec!["bench", "throughput"], "--per-wait", parse_only(), false),
        (vec!["bench", "throughput"], "--isolation-s", parse_only(), false),
        (vec!["bench", "throughput"], "--in-flight", parse_only(), false),
        (vec!["bench", "throughput"], "--repeat", parse_only(), false),
        (vec!["soak"], "--events", parse_only(), false),
        (vec!["soak"], "--rate", parse_only(), false),
        (vec!["soak"], "--fault-every-s", parse_only(), false),
        (vec!["soak"], "--dispatchers", parse_only(), false),
        (vec!["soak"], "--max-in-flight", parse_only(), false),
        (vec!["soak"], "--partitions", parse_only(), false),
        (vec!["soak"], "--session-timeout-ms", parse_only(), false),
        (vec!["soak"], "--settle-timeout-s", parse_only(), false),
    ]
}

/// Runs one flag with one value; fails on a panic, or on a refusal that does not name the flag.
fn run_one(index: usize, value: &str) -> Result<(), TestCaseError> {
    let all = flags();
    let (cmd, flag, rest, _) = &all[index % all.len()];
    let mut args: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
    // `--flag=value`, so a value starting with `-` is read as the value.
    args.push(format!("{flag}={value}"));
    args.extend(rest.iter().map(|s| s.to_string()));
    let out = hookline(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    prop_assert_ne!(out.status.code(), Some(101), "{:?} panicked: {}", args, stderr);
    prop_assert!(out.status.code().is_some(), "{:?} was killed: {}", args, stderr);
    prop_assert!(!stderr.contains("panicked"), "{:?}: {}", args, stderr);
    if out.status.code() == Some(2) && !stderr.contains("--no-such-flag") {
        prop_assert!(stderr.contains(flag), "{:?}: the refusal does not name {}: {}", args, flag, stderr);
    }
    Ok(())
}

const EDGES: &[&str] = &[
    "0",
    "-0",
    "1",
    "-1",
    "0.5",
    "1e-300",
    "5e-324",
    "1e300",
    "-1e300",
    "1e308",
    "1e16",
    "1.8e19",
    "inf",
    "-inf",
    "NaN",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775808",
    "9223372036854775807",
    "4294967296",
    "65536",
    "99999999999999999999999999",
    "",
    " ",
    "x",
    "0x10",
    "1_000",
];

#[test]
fn every_numeric_flag_takes_edge_values_without_a_panic() {
    for i in 0..flags().len() {
        for v in EDGES {
            run_one(i, v).unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

#[test]
fn the_resolve_timeout_that_panicked_is_a_usage_error_naming_the_flag() {
    let out = hookline(&["egress", "check", "--resolve-timeout", "1e300", "https://203.0.113.7/"].map(String::from));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--resolve-timeout") && stderr.contains("at most 3600"), "{stderr}");
    let out = hookline(&["egress", "check", "--resolve-timeout", "0.25", "https://203.0.113.7/"].map(String::from));
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
}

fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<f64>().prop_map(|f| f.to_string()),
        any::<f64>().prop_map(|f| format!("{f:e}")),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        (0u32..400, any::<bool>()).prop_map(|(e, neg)| format!("{}1e{e}", if neg { "-" } else { "" })),
        "-?[0-9]{0,25}(\\.[0-9]{0,5})?",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(96),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn numeric_flags_never_panic(index in 0usize..64, value in number()) {
        run_one(index, &value)?;
    }
}
