//! `hookline bench --repeat` and `--against` through the real binary: bad `--against` values are refused before
//! anything starts, a repeated in-process scenario reports each figure's spread, and an A/B run really starts the
//! other executable's services (a wrapper around this binary that records how it was called).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn hookline(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hookline"))
        .args(args)
        .env_remove("HOOKLINE_CONFIG")
        .stdin(Stdio::null())
        .output()
        .expect("run hookline")
}

fn temp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("hookline-bench-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).expect("write script");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    p
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn json(out: &Output) -> Value {
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn a_bad_against_is_refused_before_anything_starts() {
    let out = hookline(&["bench", "throughput", "--against", "/nonexistent/hookline-old"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--against /nonexistent/hookline-old: no such file"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("pipeline up"), "nothing started: {}", stderr(&out));

    let dir = temp("bad");
    let other = script(&dir, "other-tool", "echo 'other-tool 1.0'");
    let out = hookline(&["bench", "isolation", "--against", other.to_str().expect("utf-8 path")]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("did not answer as hookline"), "{}", stderr(&out));

    let me = env!("CARGO_BIN_EXE_hookline");
    let out = hookline(&["bench", "fanout", "--against", me]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--against: fanout runs in-process"), "{}", stderr(&out));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_kafka_property_or_config_key_is_refused_naming_the_flag() {
    let out = hookline(&["bench", "throughput", "--kafka-property", "compression.type"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--kafka-property") && stderr(&out).contains("expected KEY=VALUE"), "{}", stderr(&out));
    let out = hookline(&["bench", "throughput", "--kafka-property", "acks=1"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--kafka-property: kafka.properties.acks: hookline sets this itself"), "{}", stderr(&out));
    let out = hookline(&["bench", "throughput", "--kafka-property", "compression.type=brotli"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--kafka-property: kafka.properties.compression.type: one of"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("pipeline up"), "nothing started: {}", stderr(&out));
    let out = hookline(&["bench", "throughput", "--set", "log.no_such_key=1"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--set log.no_such_key=1:"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("pipeline up"), "nothing started: {}", stderr(&out));
}

#[test]
fn a_repeated_scenario_reports_every_figure_with_its_spread() {
    let out = json(&hookline(&["bench", "list", "--repeat", "3", "--fanout-subscriptions", "2000"]));
    assert_eq!(out["repeat"], 3);
    assert_eq!(out["runs"].as_array().map(Vec::len), Some(3));
    let s = &out["spread"]["slowest_page_ms"];
    let (min, median, max) = (s["min"].as_f64().expect("min"), s["median"].as_f64().expect("median"), s["max"].as_f64().expect("max"));
    assert!(min <= median && median <= max, "{s}");
    assert_eq!(s["values"].as_array().map(Vec::len), Some(3));
    assert!(out["spread"]["tenant_first_page_us.p99"]["median"].is_number(), "one object down: {}", out["spread"]);
    assert!(out["slowest_page_ms"].is_number(), "the first run's figures keep their names");
}

#[test]
fn an_ab_run_starts_the_other_builds_services_in_alternating_pairs() {
    let dir = temp("ab");
    let calls = dir.join("calls");
    let me = env!("CARGO_BIN_EXE_hookline");
    let configs = dir.join("configs");
    let other = script(
        &dir,
        "hookline-other",
        &format!(
            "echo \"$@\" >> '{}'\nprintf '%s\\n' \"$HOOKLINE_BENCH_CONFIG_TOML\" >> '{}'\nexec '{me}' \"$@\"",
            calls.display(),
            configs.display()
        ),
    );
    let out = hookline(&[
        "bench",
        "latency",
        "--no-split",
        "--duration-s",
        "2",
        "--rate",
        "20",
        "--partitions",
        "2",
        "--repeat",
        "2",
        "--kafka-property",
        "compression.type=none",
        "--set",
        "log.batch_max_records=3000",
        "--against",
        other.to_str().expect("utf-8 path"),
    ]);
    let v = json(&out);
    // The property reaches the other build's services too, and the result says what the run was given.
    let configs = std::fs::read_to_string(&configs).unwrap_or_default();
    assert!(configs.contains("\"compression.type\" = \"none\""), "{configs}");
    assert!(configs.contains("batch_max_records = 3000"), "{configs}");
    assert_eq!(v["machine"]["kafka_properties"]["compression.type"], "none", "{}", v["machine"]);
    let calls = std::fs::read_to_string(&calls).unwrap_or_default();
    let count = |s: &str| calls.lines().filter(|l| l.trim() == s).count();
    assert_eq!(count("--version"), 1, "{calls}");
    // Two pairs: the other build's services started twice (the delivery log's indexer beside ingest too), its broker
    // never (the broker stays this build's).
    for role in ["ingest", "dispatcher", "retry-scheduler", "log-indexer"] {
        assert_eq!(count(&format!("bench --serve {role}")), 2, "{role}: {calls}");
    }
    assert_eq!(count("bench --serve broker"), 0, "{calls}");
    assert_eq!(v["repeat"], 2);
    assert!(v["against"]["version"].as_str().is_some_and(|s| s.starts_with("hookline ")), "{}", v["against"]);
    let ab = &v["ab"]["p50_ms"];
    assert_eq!(ab["ratio"].as_array().map(Vec::len), Some(2), "{ab}");
    assert!(ab["this"]["median"].is_number() && ab["other"]["median"].is_number(), "{ab}");
    assert_eq!(v["runs"]["other"].as_array().map(Vec::len), Some(2));
    let err = stderr(&out);
    let order: Vec<&str> = err
        .lines()
        .filter_map(|l| l.trim().strip_prefix("── pair "))
        .map(|l| if l.contains("this build") { "this" } else { "other" })
        .collect();
    assert_eq!(order, ["this", "other", "other", "this"], "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
