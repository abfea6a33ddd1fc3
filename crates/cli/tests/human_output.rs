//! The human output of `policy simulate`, `topics list` and `egress check`, pinned as plain strings (forced with
//! the hidden `--format human`, as a terminal would get it), and the JSON lines scripts get without a terminal.

use std::process::{Command, Output};

fn hookline(args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hookline"));
    cmd.args(args);
    // The operator's environment must not change what is pinned here.
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("HOOKLINE_")) {
        cmd.env_remove(k);
    }
    cmd.output().expect("run hookline")
}

fn stdout_of(args: &[&str]) -> String {
    let o = hookline(args);
    assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn simulate_prints_a_timeline_on_a_terminal() {
    let got = stdout_of(&["policy", "simulate", "--format", "human", "--policy", "lucibook", "503"]);
    let want = "\
policy lucibook

attempt  at       outcome  verdict  next in  rule    why
1        0s       503      retry    1m       5: 503  counts toward disable
2        1m       503      retry    5m       5: 503  counts toward disable
3        6m       503      retry    30m      5: 503  counts toward disable
4        36m      503      retry    2h       5: 503  counts toward disable
5        2h 36m   503      retry    12h      5: 503  counts toward disable
6        14h 36m  503      retry    -        5: 503  counts toward disable; nothing left to try: failed

failed after 6 attempts
";
    assert_eq!(got, want);
}

#[test]
fn simulate_shows_micro_retries_jitter_bounds_and_the_profiles_word() {
    let got = stdout_of(&[
        "policy",
        "simulate",
        "--format",
        "human",
        "--policy",
        "fynapse",
        "--seed",
        "7",
        "connect_error",
        "503",
        "429:ra=120",
        "200",
    ]);
    let want = "\
policy fynapse

attempt  at       outcome        verdict  next in            rule                          why
1        0s       connect_error  retry    254ms (200ms–2s)   4: connect_error 502 503 504  counts toward disable
1.2      254ms    503            retry    27.685s (24s–36s)  4: connect_error 502 503 504  counts toward disable
2        27.939s  429            retry    2m 6s (2m–2m 12s)  6: any                        counts toward disable
3        2m 34s   200            success  -                  1: 2xx
(1.2: attempt 1, try 2, a micro-retry inside the attempt)

succeeded (the profile says DELIVERED) after 3 attempts
";
    assert_eq!(got, want);
}

#[test]
fn simulate_json_is_the_contract_whatever_the_flag() {
    let contract = r#"{"attempt":1,"try":1,"at_s":0,"outcome":"503","verdict":"retry","counts_toward_disable":true,"next_delay_s":60,"next_delay_min_s":60,"next_delay_max_s":60"#;
    // Not a terminal (a pipe, here): JSON lines by default, and the same with --json or --format json.
    for extra in [&[][..], &["--json"][..], &["--format", "json"][..]] {
        let mut args = vec!["policy", "simulate", "--policy", "lucibook"];
        args.extend_from_slice(extra);
        args.push("503");
        let out = stdout_of(&args);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 7, "{extra:?}: {out}");
        assert!(lines[0].starts_with(contract), "{extra:?}: {}", lines[0]);
        assert_eq!(lines[6], r#"{"final":"failed","status":"failed","attempts":6}"#);
    }
}

#[test]
fn a_bad_status_is_refused_and_an_unreadable_retry_after_is_simulated_as_ignored() {
    let o = hookline(&["policy", "simulate", "999"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("invalid response \"999\""), "{err}");
    // Receivers send garbage Retry-After values: the simulation takes one and shows the policy ignoring it.
    let out = stdout_of(&["policy", "simulate", "--policy", "lucibook", "429:ra=abc"]);
    let first = out.lines().next().unwrap_or_default();
    assert!(first.contains(r#""retry_after":"abc","retry_after_usable":false"#), "{out}");
}

#[test]
fn topics_list_prints_a_table_on_a_terminal() {
    let got = stdout_of(&["topics", "list", "--format", "human"]);
    let mut lines = got.lines();
    assert_eq!(lines.next(), Some("topic                    partitions  cleanup.policy  retention       co-partitioned"));
    assert_eq!(lines.next(), Some("hookline.events          12          delete          30d             no"));
    assert_eq!(lines.next(), Some("hookline.deliveries      12          delete          7d              yes (by subscription id)"));
    assert!(got.contains("\nhookline.subscriptions   12          compact         broker default  yes (by subscription id)\n"), "{got}");
    // JSON lines keep their documented key order.
    let json = stdout_of(&["topics", "list", "--json"]);
    assert_eq!(
        json.lines().next(),
        Some(r#"{"topic":"hookline.events","partitions":12,"cleanup.policy":"delete","retention.ms":2592000000,"co_partitioned":false}"#)
    );
}

#[test]
fn egress_check_prints_a_table_on_a_terminal() {
    let got = stdout_of(&["egress", "check", "--format", "human", "https://10.0.0.7/", "https://0x7f.1/", "http://example.com/"]);
    let want = "\
url                  verdict  outcome         addresses  reason
https://10.0.0.7/    refused  egress_refused  -          10.0.0.7 is private (RFC 1918)
https://0x7f.1/      refused  egress_refused  -          127.0.0.1 is loopback
http://example.com/  refused  egress_refused  -          scheme http is not allowed (allowed: https)
";
    assert_eq!(got, want);
}

#[test]
fn help_lists_every_command_and_documents_every_flag() {
    let top = stdout_of(&["--help"]);
    for cmd in ["bench", "soak", "dev", "topics", "policy", "verify", "egress"] {
        assert!(top.contains(&format!("\n  {cmd} ")), "`{cmd}` missing from --help:\n{top}");
    }
    assert!(top.lines().next().is_some_and(|l| l.contains("bench") && l.contains("soak")), "{top}");
    let topics = stdout_of(&["topics", "list", "--help"]);
    let config_line = topics.lines().find(|l| l.contains("--config")).expect("--config listed");
    assert!(config_line.trim().len() > "--config <FILE>".len(), "undocumented: {topics}");
}

#[test]
fn profiles_cite_their_platform_not_files_outside_the_repository() {
    for name in ["lucibook", "fynapse", "relay", "gauge"] {
        let text = stdout_of(&["policy", "show", name]);
        let first = text.lines().next().unwrap_or("");
        assert!(!text.contains("seeds/"), "{name}: {first}");
        assert!(first.contains("reproduces") && first.contains("document"), "{name}: {first}");
    }
}
