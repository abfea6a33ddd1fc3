//! `hookline log migrate` and `hookline bench log` through the real binary, on a SQLite file (the PostgreSQL
//! backend is covered by crates/log's conformance suite).

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

fn hookline(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_hookline"));
    c.args(args).env_remove("HOOKLINE_CONFIG").env_remove("HOOKLINE_LOG_URL");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run hookline")
}

fn temp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("hookline-log-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn json(out: &Output) -> Value {
    assert_eq!(out.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn migrate_applies_once_then_reports_the_version() {
    let dir = temp("migrate");
    let url = format!("sqlite:{}", dir.join("nested/log.sqlite3").display());
    let first = json(&hookline(&["log", "migrate", "--url", &url, "--json"], &[]));
    assert_eq!((first["applied"].clone(), first["schema_version"].clone()), (serde_json::json!([1, 2, 3, 4]), serde_json::json!(4)));
    let again = json(&hookline(&["log", "migrate", "--url", &url, "--json"], &[]));
    assert_eq!(again["applied"], serde_json::json!([]));
    let human = hookline(&["log", "migrate", "--url", &url, "--format", "human"], &[]);
    assert!(String::from_utf8_lossy(&human.stdout).contains("schema version 4, nothing to apply"));
    // Without --url: the config's [log] table, with its environment overrides.
    let path = dir.join("other.sqlite3");
    let from_env = json(&hookline(&["log", "migrate", "--json"], &[("HOOKLINE_LOG__SQLITE_PATH", path.to_str().unwrap())]));
    assert_eq!(from_env["location"], path.to_str().unwrap());
    assert!(path.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_store_settings_are_named() {
    let out = hookline(&["log", "migrate", "--url", "mysql://h/db"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--url"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = hookline(&["log", "migrate"], &[("HOOKLINE_LOG__STORE", "postgres")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("log.postgres_url"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn bench_log_prints_one_json_line_with_the_figures() {
    let out = hookline(&["bench", "log", "--log-attempts", "4000", "--log-queries", "20"], &[]);
    let line = json(&out);
    assert_eq!(line["scenario"], "log");
    let sqlite = &line["sqlite"];
    assert!(sqlite["attempts_per_s"].as_f64().unwrap() > 0.0, "{line}");
    for q in ["list_by_subscription", "search_by_event_id", "filtered_list"] {
        assert!(sqlite["query_p99_ms"][q].as_f64().unwrap() >= 0.0, "{q}: {line}");
    }
    assert!(sqlite["api_start_s"].as_f64().unwrap() < 60.0);
    assert!(line.get("postgres").is_none(), "no --postgres-url, no PostgreSQL figures");
}
