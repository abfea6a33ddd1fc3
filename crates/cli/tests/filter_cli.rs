//! `hookline filter test` run as users run it: the real binary, its output and exit status.

use std::process::{Command, Output};

use serde_json::{json, Value};

fn hookline(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hookline")).args(args).output().expect("run hookline")
}

const FILTER: &str =
    r#"{"all":[{"path":"data.amount","gte":100},{"any":[{"path":"data.currency","eq":"EUR"},{"path":"type","prefix":"refund."}]}]}"#;

#[test]
fn json_output_says_match_or_not_and_why_with_the_exit_status() {
    let o = hookline(&[
        "filter",
        "test",
        "--filter",
        FILTER,
        "--event",
        r#"{"id":"e1","type":"order.created","data":{"amount":250,"currency":"EUR"}}"#,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["matched"], true);

    let o = hookline(&[
        "filter",
        "test",
        "--json",
        "--filter",
        FILTER,
        "--event",
        r#"{"id":"e2","type":"order.created","data":{"amount":20}}"#,
    ]);
    assert_eq!(o.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["matched"], false);
    let steps = v["steps"].as_array().unwrap();
    assert_eq!(steps[1], json!({"location": "filter.all[0]", "test": "data.amount gte 100", "actual": 20, "matched": false}));
    let currency = steps.iter().find(|s| s["location"] == "filter.all[1].any[0]").unwrap();
    assert_eq!(currency["actual"], Value::Null, "absent in the event");
}

#[test]
fn human_output_and_files() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("filter_cli");
    std::fs::create_dir_all(&dir).unwrap();
    let event = dir.join("event.json");
    std::fs::write(&event, r#"{"id":"e3","type":"refund.issued","data":{"amount":100}}"#).unwrap();
    let at = format!("@{}", event.display());
    let o = hookline(&["filter", "test", "--format", "human", "--filter", FILTER, "--event", &at]);
    assert_eq!(o.status.code(), Some(0));
    let text = String::from_utf8(o.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "match");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("yes") && l.contains("filter.all[0]") && l.contains("data.amount gte 100") && l.contains("event has 100")),
        "{text}"
    );
    assert!(
        lines.iter().any(|l| l.contains("no") && l.contains("data.currency eq \"EUR\"") && l.contains("absent in the event")),
        "{text}"
    );
}

#[test]
fn bad_arguments_name_the_flag_and_the_place() {
    let o = hookline(&["filter", "test", "--filter", r#"{"all":[{"path":"amount","gt":1}]}"#, "--event", "{}"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--filter") && err.contains("filter.all[0].path"), "{err}");
    let o = hookline(&["filter", "test", "--filter", r#"{"path":"type","exists":true}"#, "--event", "[1]"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--event"));
    let o = hookline(&["filter", "test", "--filter", r#"{"path":"type","exists":true}"#, "--event", "@/nonexistent/event.json"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--event: reading /nonexistent/event.json"));
}
