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
    assert_eq!(
        (first["applied"].clone(), first["schema_version"].clone()),
        (serde_json::json!([1, 2, 3, 4, 5, 6, 7]), serde_json::json!(7))
    );
    let again = json(&hookline(&["log", "migrate", "--url", &url, "--json"], &[]));
    assert_eq!(again["applied"], serde_json::json!([]));
    let human = hookline(&["log", "migrate", "--url", &url, "--format", "human"], &[]);
    assert!(String::from_utf8_lossy(&human.stdout).contains("schema version 7, nothing to apply"));
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

/// `hookline log index` beside a SQLite file that ingest (here: this test, as ingest's API would) has open: the
/// standalone process writes it, the other reads what it wrote, and SIGTERM stops it with exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_indexer_fills_the_sqlite_file_ingest_reads_and_stops_on_sigterm() {
    let dir = std::env::temp_dir().join(format!("hookline-cli-index-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let path = dir.join("delivery-log.sqlite3");
    let store = hookline_log::LogStore::open(&hookline_log::Target::Sqlite(path.clone())).await.expect("ingest's side opens the file");
    let path_env = path.to_str().expect("a UTF-8 temp path");
    standalone_indexer_fills(&store, &[("HOOKLINE_LOG__SQLITE_PATH", path_env)], "dlv_standalone_sqlite").await;
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `hookline log index` on its own (ingest would run with `log.run_indexer = false`): records produced to the
/// topics end up in the PostgreSQL store, and SIGTERM stops it with exit 0. Needs scripts/with-postgres.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_indexer_fills_a_postgres_store_and_stops_on_sigterm() {
    let admin = match std::env::var("HOOKLINE_TEST_POSTGRES_URL") {
        Ok(u) if !u.trim().is_empty() => u,
        _ if std::env::var_os("HOOKLINE_TEST_REQUIRE_POSTGRES").is_some() => {
            panic!("HOOKLINE_TEST_POSTGRES_URL is not set: run through scripts/with-postgres")
        }
        _ => {
            eprintln!("skipped: needs HOOKLINE_TEST_POSTGRES_URL (scripts/with-postgres cargo test -p hookline-cli --test log_cli)");
            return;
        }
    };
    let name = format!("hl_cli_index_{}", std::process::id());
    let url = hookline_log::postgres::create_database(&admin, &name).await.expect("the test server makes a database");
    let store = hookline_log::LogStore::open(&hookline_log::Target::Postgres(url.clone())).await.expect("the store opens");
    standalone_indexer_fills(&store, &[("HOOKLINE_LOG__STORE", "postgres"), ("HOOKLINE_LOG__POSTGRES_URL", &url)], "dlv_standalone1").await;
}

/// Produces one attempt of `delivery_id`, runs `hookline log index` with `store_env` until `store` holds the
/// delivery, then stops it with SIGTERM: it must exit 0 and have printed where its health routes are.
async fn standalone_indexer_fills(store: &hookline_log::LogStore, store_env: &[(&str, &str)], delivery_id: &str) {
    let topics = hookline_kafka::Topics::new("hookline.");
    let broker = hookline_kafka::mock::DevBroker::start(&topics, 2, 2).expect("mock broker");
    let settings = hookline_service::Config::dev(&broker.bootstrap_servers(), 2, "log-index-test-token-0123456789");
    let producer = hookline_kafka::client::producer(&settings.kafka, "log-index-test").expect("producer");
    let now = hookline_service::now_ms();
    let rec = hookline_core::model::AttemptRecord {
        delivery_id: delivery_id.into(),
        subscription_id: "sub_a".into(),
        event_id: "evt_standalone1".into(),
        attempt: 1,
        r#try: 1,
        started_at_ms: now,
        outcome: "200".into(),
        http_status: 200,
        final_state: "succeeded".into(),
        phase: hookline_core::model::AttemptPhase::Finished as i32,
        ..Default::default()
    };
    hookline_kafka::produce::send(&producer, topics.attempts(), "sub_a", &prost::Message::encode_to_vec(&rec)).await.expect("produced");

    let child = std::process::Command::new(env!("CARGO_BIN_EXE_hookline"))
        .args(["log", "index", "--health-addr", "127.0.0.1:0"])
        .env_remove("HOOKLINE_CONFIG")
        .env("HOOKLINE_KAFKA__BOOTSTRAP_SERVERS", broker.bootstrap_servers())
        .env("HOOKLINE_LOG__RUN_INDEXER", "false")
        .envs(store_env.iter().copied())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("hookline log index starts");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let found = loop {
        if let Some(d) = store.delivery(delivery_id).await.unwrap() {
            break d;
        }
        assert!(std::time::Instant::now() < deadline, "the standalone indexer never wrote the delivery");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert_eq!((found.delivery.state.as_str(), found.delivery.event_id.as_str()), ("succeeded", "evt_standalone1"));
    // SIGTERM: the indexer stops cleanly.
    let pid = child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let status = tokio::task::spawn_blocking(move || child.wait_with_output()).await.unwrap().unwrap();
    assert_eq!(status.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&status.stderr));
    assert!(String::from_utf8_lossy(&status.stderr).contains("health and metrics on http://127.0.0.1:"));
}
