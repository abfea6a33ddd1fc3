//! `hookline dlq tail` against the embedded broker: dead letters of both formats, filters, the newest N,
//! readable lines, `--json` documents and `--follow`.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use hookline_core::dead_letter::DlqFormat;
use hookline_core::model::{DeadLetter, Event};
use hookline_kafka::mock::DevBroker;
use hookline_kafka::Topics;
use serde_json::Value;

fn delivery(sub: &str, reason: &str, event_id: &str, tenant: &str, at_ms: i64) -> DeadLetter {
    DeadLetter {
        reason: reason.into(),
        detail: "HTTP 503".into(),
        final_state: "dead".into(),
        status_word: "dead".into(),
        subscription_id: sub.into(),
        delivery_id: format!("dlv_{event_id}"),
        event: Some(Event {
            id: event_id.into(),
            r#type: "order.paid".into(),
            tenant: tenant.into(),
            data_json: br#"{"n":1}"#.to_vec().into(),
            ..Default::default()
        }),
        attempts: 3,
        last_outcome: "503".into(),
        last_http_status: 503,
        at_ms,
        ..Default::default()
    }
}

struct Setup {
    broker: DevBroker,
    config: PathBuf,
    producer: hookline_kafka::client::Producer,
    _dir: TempDir,
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Setup {
    async fn send(&self, dl: &DeadLetter, format: DlqFormat) {
        let (value, headers) = hookline_kafka::dead_letters::record(dl, format);
        hookline_kafka::produce::send_with_headers(&self.producer, "hookline.dlq", &dl.subscription_id, &value, Some(headers))
            .await
            .expect("produced");
    }
}

async fn setup() -> Setup {
    let topics = Topics::new("hookline.");
    let broker = DevBroker::start(&topics, 2, 2).expect("mock broker");
    let dir = std::env::temp_dir().join(format!("hookline-dlq-tail-{}-{:x}", std::process::id(), rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("hookline.toml");
    std::fs::write(&config, format!("[kafka]\nbootstrap_servers = \"{}\"\n", broker.bootstrap_servers())).unwrap();
    let settings = hookline_service::Config::dev(&broker.bootstrap_servers(), 2, "dlq-tail-test-token-0123456789");
    let producer = hookline_kafka::client::producer(&settings.kafka, "dlq-tail-test").expect("producer");
    let s = Setup { broker, config, producer, _dir: TempDir(dir) };
    // Oldest first: a JSON delivery dead letter, a protobuf one, an unreadable input event.
    s.send(&delivery("sub_a", "retries_exhausted", "evt_1", "acme", 1_767_225_600_000), DlqFormat::Json).await;
    s.send(&delivery("sub_b", "terminal_outcome", "evt_2", "", 1_767_225_601_000), DlqFormat::Protobuf).await;
    let input = DeadLetter {
        reason: "invalid_json".into(),
        detail: "expected value".into(),
        raw: b"{nope".to_vec().into(),
        source_topic: "hookline.events".into(),
        source_partition: 1,
        source_offset: 4,
        at_ms: 1_767_225_602_000,
        ..Default::default()
    };
    s.send(&input, DlqFormat::Json).await;
    s
}

fn tail(s: &Setup, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hookline"))
        .args(["dlq", "tail", "--config"])
        .arg(&s.config)
        .args(args)
        .env_remove("HOOKLINE_CONFIG")
        .output()
        .expect("hookline runs")
}

fn docs(out: &Output) -> Vec<Value> {
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"))).collect()
}

fn field(docs: &[Value], f: &str) -> Vec<String> {
    docs.iter().map(|d| d[f].as_str().unwrap_or("-").to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_prints_documents_of_both_formats_filtered() {
    let s = setup().await;
    // The broker runs on librdkafka's own threads: a blocking wait for the child here holds nothing up.
    let run = |args: &[&str]| tail(&s, args);

    let all = docs(&run(&["--json", "--from-beginning"]));
    // Two partitions: sort by write time for the comparison.
    let mut reasons: Vec<(String, String)> =
        all.iter().map(|d| (d["dead_lettered_at"].as_str().unwrap().to_owned(), d["reason"].as_str().unwrap().to_owned())).collect();
    reasons.sort();
    assert_eq!(reasons.iter().map(|r| r.1.as_str()).collect::<Vec<_>>(), ["retries_exhausted", "terminal_outcome", "invalid_json"]);
    assert!(all.iter().all(|d| d["schema"] == "hookline.dead_letter.v1"), "a protobuf record is printed as the document too: {all:?}");
    let pb = all.iter().find(|d| d["reason"] == "terminal_outcome").unwrap();
    assert_eq!((pb["subscription_id"].as_str(), pb["event"]["payload"]["n"].as_i64()), (Some("sub_b"), Some(1)));
    assert_eq!(pb["last_attempt"]["http_status"], 503);

    // The newest only, by default the last 10 in write order.
    assert_eq!(field(&docs(&run(&["--json"])), "reason"), ["retries_exhausted", "terminal_outcome", "invalid_json"]);
    assert_eq!(field(&docs(&run(&["--json", "-n", "1"])), "reason"), ["invalid_json"]);
    assert_eq!(field(&docs(&run(&["--json", "--reason", "terminal_outcome"])), "subscription_id"), ["sub_b"]);
    assert_eq!(field(&docs(&run(&["--json", "--subscription", "sub_a"])), "reason"), ["retries_exhausted"]);
    assert_eq!(field(&docs(&run(&["--json", "--tenant", "acme"])), "subscription_id"), ["sub_a"]);
    assert_eq!(field(&docs(&run(&["--json", "--event-type", "order.paid", "-n", "1"])), "reason"), ["terminal_outcome"]);
    assert!(docs(&run(&["--json", "--subscription", "sub_a", "--reason", "terminal_outcome"])).is_empty());

    let human = run(&["--format", "human", "--subscription", "sub_a"]);
    assert!(human.status.success());
    assert_eq!(
        String::from_utf8_lossy(&human.stdout),
        "2026-01-01T00:00:00.000Z  retries_exhausted  sub=sub_a  tenant=acme  type=order.paid  event=evt_1  attempts=3  last=503  HTTP 503\n"
    );

    // A reason that is not in the vocabulary names the flag and the words.
    let bad = run(&["--reason", "terminal_response"]);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && err.contains("--reason") && err.contains("retries_exhausted"), "{err}");
    drop(s.producer);
    std::mem::forget(s.broker);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_prints_new_dead_letters_as_they_arrive() {
    let s = setup().await;
    let mut child = Command::new(env!("CARGO_BIN_EXE_hookline"))
        .args(["dlq", "tail", "--json", "--follow", "-n", "0", "--reason", "lease_expired", "--config"])
        .arg(&s.config)
        .env_remove("HOOKLINE_CONFIG")
        .stdout(Stdio::piped())
        .spawn()
        .expect("hookline runs");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    // The follower is past the end only once it is assigned; records written before that are not newer than
    // `-n 0` asked for, so keep writing until one shows up (bounded).
    let mut got = None;
    for i in 0..60 {
        s.send(&delivery("sub_f", "lease_expired", &format!("evt_f{i}"), "", 1_767_225_700_000 + i), DlqFormat::Protobuf).await;
        if let Ok(line) = tokio::task::block_in_place(|| rx.recv_timeout(Duration::from_millis(500))) {
            got = Some(line);
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let line = got.expect("the follower printed a new dead letter");
    let doc: Value = serde_json::from_str(&line).unwrap();
    assert_eq!((doc["reason"].as_str(), doc["subscription_id"].as_str()), (Some("lease_expired"), Some("sub_f")));
    drop(s.producer);
    std::mem::forget(s.broker);
}
