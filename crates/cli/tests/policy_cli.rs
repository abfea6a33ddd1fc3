//! `hookline policy ...` run as users run it: the real binary, its stdout, stderr and exit status.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

fn hookline(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hookline")).args(args).output().expect("run hookline")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs `policy simulate` and returns its JSON lines, asserting it exited 0.
fn simulate(args: &[&str]) -> Vec<Value> {
    let mut all = vec!["policy", "simulate"];
    all.extend_from_slice(args);
    let o = hookline(&all);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    stdout(&o).lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"))).collect()
}

/// A scratch file under the target directory, unique per test.
fn scratch(name: &str, contents: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("policy_cli");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path
}

fn delays(lines: &[Value]) -> Vec<Value> {
    lines.iter().filter(|l| l.get("attempt").is_some()).map(|l| l.get("next_delay_s").cloned().unwrap_or(Value::Null)).collect()
}

#[test]
fn lucibook_503_is_six_attempts_then_failed() {
    let lines = simulate(&["--policy", "lucibook", "503"]);
    assert_eq!(lines.len(), 7);
    let want_at = [0, 60, 360, 2160, 9360, 52560];
    let want_delay = [60, 300, 1800, 7200, 43200];
    for (i, line) in lines[..6].iter().enumerate() {
        assert_eq!(line["attempt"], i as u64 + 1);
        assert_eq!(line["try"], 1);
        assert_eq!(line["at_s"], want_at[i]);
        assert_eq!(line["outcome"], "503");
        assert_eq!(line["verdict"], "retry");
        assert_eq!(line["counts_toward_disable"], true);
        if let Some(d) = want_delay.get(i) {
            assert_eq!(
                (&line["next_delay_s"], &line["next_delay_min_s"], &line["next_delay_max_s"]),
                (&Value::from(*d), &Value::from(*d), &Value::from(*d))
            );
        } else {
            for key in ["next_delay_s", "next_delay_min_s", "next_delay_max_s"] {
                assert!(line.get(key).is_none(), "{key} on the last try: {line}");
            }
        }
    }
    assert_eq!(lines[6], serde_json::json!({"final": "failed", "status": "failed", "attempts": 6}));
}

#[test]
fn output_is_exactly_the_contract_line_format() {
    let o = hookline(&["policy", "simulate", "--policy", "lucibook", "503"]);
    let first = stdout(&o).lines().next().unwrap().to_owned();
    assert!(
        first.starts_with(r#"{"attempt":1,"try":1,"at_s":0,"outcome":"503","verdict":"retry","counts_toward_disable":true,"next_delay_s":60,"next_delay_min_s":60,"next_delay_max_s":60"#),
        "{first}"
    );
    assert_eq!(stdout(&o).lines().last().unwrap(), r#"{"final":"failed","status":"failed","attempts":6}"#);
}

#[test]
fn lucibook_429_backs_off_without_counting_and_clamps_retry_after() {
    let lines = simulate(&["--policy", "lucibook", "429:ra=10", "429:ra=120", "429:ra=999999", "200"]);
    assert_eq!(lines[0]["counts_toward_disable"], false);
    // "never faster than that attempt's own scheduled wait, and never slower than 12 hours"
    assert_eq!(delays(&lines)[..3], [Value::from(60), Value::from(300), Value::from(43200)]);
    assert_eq!(lines[3]["verdict"], "success");
    assert_eq!(lines.last().unwrap(), &serde_json::json!({"final": "succeeded", "status": "succeeded", "attempts": 4}));
}

#[test]
fn lucibook_410_and_egress_refusals_are_dead_at_once() {
    for response in ["410", "egress_refused", "invalid_url"] {
        let lines = simulate(&["--policy", "lucibook", response]);
        assert_eq!(lines.len(), 2, "{response}");
        assert_eq!(lines[0]["verdict"], "terminal");
        assert_eq!(lines[1], serde_json::json!({"final": "dead", "status": "dead", "attempts": 1}));
    }
}

#[test]
fn http_date_retry_after_is_read_against_the_simulated_clock() {
    // 07:28 on 21 Oct 2026 is 25342080 s after 2026-01-01T00:00:00Z; LuciBook clamps it to 12 h.
    let lines = simulate(&["--policy", "lucibook", "503:ra=Wed, 21 Oct 2026 07:28:00 GMT", "200"]);
    assert_eq!(lines[0]["next_delay_s"], 43200);
    // Fynapse uses it as the base delay, plus 0-10%.
    let lines = simulate(&["--policy", "fynapse", "503:ra=Thu, 01 Jan 2026 01:00:00 GMT", "200"]);
    assert_eq!((&lines[0]["next_delay_min_s"], &lines[0]["next_delay_max_s"]), (&Value::from(3600), &Value::from(3960)));
    let d = lines[0]["next_delay_s"].as_f64().unwrap();
    assert!((3600.0..=3960.0).contains(&d));
    assert_eq!(lines[1]["at_s"], lines[0]["next_delay_s"]);
}

#[test]
fn fynapse_micro_retries_and_dead_letters() {
    let lines = simulate(&["--policy", "fynapse", "--seed", "9", "503"]);
    let last = lines.last().unwrap();
    assert_eq!(last, &serde_json::json!({"final": "dead", "status": "DEAD_LETTER", "attempts": 20}));
    // Two tries per attempt: the micro-retry after 200-2000 ms, then the exponential schedule (±20%).
    assert_eq!(lines[0]["try"], 1);
    assert_eq!((&lines[0]["next_delay_min_s"], &lines[0]["next_delay_max_s"]), (&Value::from(0.2), &Value::from(2)));
    assert_eq!((&lines[1]["attempt"], &lines[1]["try"]), (&Value::from(1), &Value::from(2)));
    assert_eq!((&lines[1]["next_delay_min_s"], &lines[1]["next_delay_max_s"]), (&Value::from(24), &Value::from(36)));
    assert_eq!((&lines[3]["next_delay_min_s"], &lines[3]["next_delay_max_s"]), (&Value::from(72), &Value::from(108)));
    // The seed decides the draws, reproducibly.
    assert_eq!(simulate(&["--policy", "fynapse", "--seed", "9", "503"]), lines);
    // Non-retryable: DEAD_LETTER at once; success: DELIVERED.
    assert_eq!(simulate(&["--policy", "fynapse", "409"])[1], serde_json::json!({"final": "dead", "status": "DEAD_LETTER", "attempts": 1}));
    assert_eq!(
        simulate(&["--policy", "fynapse", "200"])[1],
        serde_json::json!({"final": "succeeded", "status": "DELIVERED", "attempts": 1})
    );
    // A timeout is not micro-retried and lasts the 30 s deadline.
    let lines = simulate(&["--policy", "fynapse", "timeout", "200"]);
    assert_eq!(lines[0]["try"], 1);
    assert_eq!(lines[1]["attempt"], 2);
    let at = lines[1]["at_s"].as_f64().unwrap();
    assert!((30.0 + 24.0..=30.0 + 36.0).contains(&at), "{at}");
}

#[test]
fn relay_runs_its_delay_table_then_dead() {
    let lines = simulate(&["--policy", "relay", "500"]);
    let want: Vec<Value> = [2, 4, 8, 16, 32, 64, 128, 256, 512, 600].into_iter().map(Value::from).chain([Value::Null]).collect();
    assert_eq!(delays(&lines), want);
    assert_eq!(lines.last().unwrap(), &serde_json::json!({"final": "dead", "status": "dead", "attempts": 11}));
    // A redirect is terminal.
    let lines = simulate(&["--policy", "relay", "302"]);
    assert_eq!((lines.len(), &lines[0]["verdict"]), (2, &Value::from("terminal")));
}

#[test]
fn relay_timeouts_take_ten_seconds_each() {
    let lines = simulate(&["--policy", "relay", "timeout"]);
    // Attempt n starts after n-1 timeouts of 10 s and the waits before it.
    assert_eq!(lines[1]["at_s"], 12);
    assert_eq!(lines[2]["at_s"], 26);
    assert_eq!(lines[10]["at_s"], 1622 + 100);
}

#[test]
fn gauge_runs_its_five_row_schedule_then_dead() {
    let lines = simulate(&["--policy", "gauge", "connect_error"]);
    let at: Vec<Value> = lines.iter().filter_map(|l| l.get("at_s").cloned()).collect();
    // Attempt 1 immediately, then 30 s, 5 min, 1 h and 6 h after the previous attempt.
    assert_eq!(at, [0, 30, 330, 3930, 25530].map(Value::from));
    assert_eq!(lines.last().unwrap(), &serde_json::json!({"final": "dead", "status": "dead", "attempts": 5}));
}

#[test]
fn standard_is_the_default_and_its_jitter_is_reported() {
    let lines = simulate(&["503"]);
    assert_eq!(lines.last().unwrap(), &serde_json::json!({"final": "failed", "status": "failed", "attempts": 8}));
    assert_eq!((&lines[0]["next_delay_min_s"], &lines[0]["next_delay_max_s"]), (&Value::from(5), &Value::from(5.5)));
}

#[test]
fn bad_arguments_exit_non_zero_naming_the_argument() {
    for (args, needle) in [
        (vec!["--policy", "lucibook", "5033"], "5033"),
        (vec!["--policy", "lucibook", "503", "teapot"], "teapot"),
        (vec!["--policy", "lucibook", "429:ra="], "429:ra="),
        (vec!["--policy", "lucibook", "503:retry=5"], "503:retry=5"),
        (vec!["--policy", "lucibok", "503"], "lucibok"),
        (vec!["--policy", "lucibook", "--seed", "x", "503"], "x"),
        (vec!["--policy", "lucibook"], "RESPONSE"),
    ] {
        let mut all = vec!["policy", "simulate"];
        all.extend(args.iter().copied());
        let o = hookline(&all);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(o.stdout.is_empty(), "{args:?} printed {}", stdout(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn an_invalid_policy_file_is_refused_by_simulate_and_check_with_the_key() {
    let text = stdout(&hookline(&["policy", "show", "gauge"]));
    let bad = text.replace("waits_s = [30, 300, 3600, 21600]", "waits_s = [30, -300, 3600, 21600]");
    assert_ne!(bad, text);
    let path = scratch("bad-gauge.toml", &bad);
    let path = path.to_str().unwrap();

    let o = hookline(&["policy", "check", path]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("schedule.waits_s[1]"), "{}", stderr(&o));

    let o = hookline(&["policy", "simulate", "--policy", path, "503"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("schedule.waits_s[1]"), "{}", stderr(&o));

    let typo = scratch("typo.toml", &text.replace("max_attempts = 5", "max_attempt = 5"));
    let o = hookline(&["policy", "check", typo.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("max_attempt") && stderr(&o).contains("line"), "{}", stderr(&o));
}

#[test]
fn show_prints_a_document_that_checks_and_simulates_as_the_builtin() {
    for name in ["standard", "lucibook", "fynapse", "relay", "gauge"] {
        let o = hookline(&["policy", "show", name]);
        assert!(o.status.success());
        let text = stdout(&o);
        assert!(text.starts_with('#') && text.contains(&format!("name = \"{name}\"")), "{name}");
        let path = scratch(&format!("{name}.toml"), &text);
        let path = path.to_str().unwrap();
        let o = hookline(&["policy", "check", path]);
        assert!(o.status.success() && stdout(&o).starts_with("OK"), "{name}: {}", stderr(&o));
        assert_eq!(simulate(&["--policy", path, "--seed", "5", "500"]), simulate(&["--policy", name, "--seed", "5", "500"]));
    }
    let o = hookline(&["policy", "show", "nope"]);
    assert!(!o.status.success() && stderr(&o).contains("nope") && stderr(&o).contains("lucibook"));
}

#[test]
fn list_names_every_profile_with_a_summary() {
    let o = hookline(&["policy", "list"]);
    assert!(o.status.success());
    let out = stdout(&o);
    let names: Vec<&str> = out.lines().filter_map(|l| l.split_whitespace().next()).collect();
    assert_eq!(names, ["standard", "lucibook", "fynapse", "relay", "gauge"]);
    assert!(out.lines().all(|l| l.len() > 30));
}

#[test]
fn every_command_has_help() {
    for args in [
        vec!["policy", "--help"],
        vec!["policy", "list", "--help"],
        vec!["policy", "show", "--help"],
        vec!["policy", "check", "--help"],
        vec!["policy", "simulate", "--help"],
    ] {
        let o = hookline(&args);
        assert!(o.status.success(), "{args:?}");
        assert!(stdout(&o).contains("Usage:"), "{args:?}");
    }
    assert!(stdout(&hookline(&["policy", "simulate", "--help"])).contains("429:ra=120"));
}

#[test]
fn policy_mistakes_are_answered_in_plain_words_with_a_suggestion() {
    let text = stdout(&hookline(&["policy", "show", "gauge"]));
    assert!(text.contains("max_attempts = 5") && text.contains("timeout_ms = "), "the profile changed:\n{text}");
    let typo = scratch("typo-attemps.toml", &text.replace("max_attempts = 5", "max_attemps = 5"));
    let o = hookline(&["policy", "check", typo.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("did you mean `max_attempts`?"), "{err}");
    assert_eq!(err.matches("invalid policy").count(), 1, "said twice:\n{err}");

    let timeout = text.lines().find(|l| l.trim_start().starts_with("timeout_ms = ")).unwrap();
    let wrong = scratch("timeout-string.toml", &text.replace(timeout, "timeout_ms = \"10s\""));
    let err = stderr(&hookline(&["policy", "check", wrong.to_str().unwrap()]));
    assert!(err.contains("expected a whole number") && !err.contains("u64"), "{err}");

    let err = stderr(&hookline(&["policy", "simulate", "--policy", "stanard", "503"]));
    assert!(err.contains("did you mean \"standard\"?"), "{err}");
    let err = stderr(&hookline(&["policy", "check", "stanard"]));
    assert!(err.contains("did you mean \"standard\"?"), "{err}");

    // The services' settings too: a word where a number goes.
    let out = Command::new(env!("CARGO_BIN_EXE_hookline"))
        .args(["topics", "list"])
        .env_remove("HOOKLINE_CONFIG")
        .env("HOOKLINE_DISPATCHER__MAX_IN_FLIGHT", "lots")
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(
        err.contains("HOOKLINE_DISPATCHER__MAX_IN_FLIGHT") && err.contains("expected a whole number") && !err.contains("usize"),
        "{err}"
    );
}

/// `check` names a CloudEvents shape, so a policy that changes what receivers get says so; a misspelt format is
/// refused naming the ones there are.
#[test]
fn check_names_a_cloudevents_request_shape() {
    let builtin = hookline_core::policy::builtin_source("standard").unwrap();
    let doc = builtin.replace("[request]\n", "[request]\nformat = \"cloudevents_structured\"\n");
    assert_ne!(doc, builtin, "the standard profile has a [request] table");
    let path = scratch("ce.toml", &doc);
    let o = hookline(&["policy", "check", path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("(policy \"standard\"; requests: CloudEvents, structured mode)"), "{}", stdout(&o));
    let o = hookline(&["policy", "check", "standard"]);
    assert_eq!(stdout(&o).trim(), "OK: standard (policy \"standard\")");
    let path = scratch("ce-typo.toml", &builtin.replace("[request]\n", "[request]\nformat = \"cloudevent\"\n"));
    let o = hookline(&["policy", "check", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("cloudevents_binary"), "{}", stderr(&o));
}
