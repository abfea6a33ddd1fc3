//! The reliability suite's crash and fault tests: `hookline soak` runs the broker and the three service binaries
//! as separate processes (two dispatchers), publishes through the API while injecting one family of faults, and
//! reports. Each test asserts what a user relies on: every accepted delivery reached a final state (`missing` = 0),
//! the state its endpoint implies, every failed or dead delivery was dead-lettered, and duplicates stayed within
//! an in-flight window per rebalance the faults caused (none at all after a SIGTERM drain or request errors), and
//! the delivery log store holds every finished delivery in its final state (`log_missing` = 0).
//!
//! The service binaries must be built next to `hookline` (`cargo build --workspace --bins`; scripts/test does).
//! The tests run one at a time: each starts five processes on a small machine.

use std::process::Command;
use std::sync::Mutex;

use serde_json::Value;

static SERIAL: Mutex<()> = Mutex::new(());

/// Events per test: ~1.6 deliveries each, published at 250/s, so faults land while deliveries are flowing.
const EVENTS: &str = "1500";
const RATE: &str = "250";
const MAX_IN_FLIGHT: u64 = 1_000;

fn soak(faults: &[&str]) -> Value {
    soak_with(faults, &[])
}

fn soak_with(faults: &[&str], extra: &[&str]) -> Value {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hookline"));
    cmd.args(["soak", "--events", EVENTS, "--rate", RATE, "--fault-every-s", "2", "--max-in-flight", &MAX_IN_FLIGHT.to_string()]);
    for f in faults {
        cmd.args(["--fault", f]);
    }
    cmd.args(extra);
    let out = cmd.output().expect("run hookline soak");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or_else(|| panic!("no report from hookline soak; stderr:\n{stderr}"));
    let report: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("report {line:?}: {e}; stderr:\n{stderr}"));
    println!("{line}");
    let n = |k: &str| report[k].as_u64().unwrap_or_else(|| panic!("{k} in {report}"));
    assert_eq!(n("missing"), 0, "accepted deliveries without a final state: {report}");
    // The indexer (inside ingest, killed with it by kill-ingest) left nothing out of the delivery log.
    assert_eq!(n("log_missing"), 0, "finished deliveries missing from the delivery log store: {report}");
    assert!(report["log_lag_s"].as_f64().is_some_and(|s| s < 30.0), "{report}");
    assert_eq!(n("events_rejected"), 0, "every event was accepted in the end: {report}");
    assert_eq!(n("events_accepted"), EVENTS.parse::<u64>().unwrap(), "{report}");
    assert!(n("accepted") >= n("events_accepted"), "{report}");
    assert_eq!(n("final_states"), n("accepted"), "{report}");
    assert_eq!(n("unexpected_final"), 0, "a delivery ended in a state its endpoint does not imply: {report}");
    assert_eq!(n("missing_dead_letters"), 0, "a failed or dead delivery has no dead letter: {report}");
    assert!(report["unexpected_exits"].as_array().unwrap().is_empty(), "a service crashed on its own: {report}");
    for f in faults {
        assert!(report["faults"].as_array().unwrap().iter().any(|l| l["fault"] == *f), "{f} was applied: {report}");
    }
    // A crash redoes at most what was taken and not yet committed: per rebalance it causes, each dispatcher's
    // in-flight window.
    assert_eq!(n("duplicate_bound"), n("rebalances") * n("dispatchers") * MAX_IN_FLIGHT, "{report}");
    assert!(n("duplicates") <= n("duplicate_bound"), "duplicates beyond the in-flight windows: {report}");
    assert!(out.status.success(), "hookline soak failed: {report}\nstderr:\n{stderr}");
    report
}

#[test]
fn kill_9_of_a_dispatcher_mid_delivery_repeatedly_loses_nothing() {
    let r = soak(&["kill-dispatcher"]);
    assert!(r["faults"].as_array().unwrap().len() >= 2, "killed more than once: {r}");
}

#[test]
fn kill_9_of_the_retry_scheduler_holding_records_loses_nothing() {
    soak(&["kill-scheduler"]);
}

#[test]
fn kill_9_of_ingest_mid_fan_out_loses_nothing() {
    let r = soak(&["kill-ingest"]);
    // The publisher saw refused connections while ingest was down and retried them.
    assert!(r["publish_retries"].as_u64().unwrap() > 0, "{r}");
}

#[test]
fn a_dispatcher_frozen_past_its_session_timeout_loses_nothing() {
    soak(&["stop-dispatcher"]);
}

/// One dispatcher: with two, the survivor's eager rebalance (all its partitions revoked when the other leaves or
/// rejoins) redoes its own in-flight work. That is a rebalance cost, not a drain one (docs/reliability.md).
#[test]
fn sigterm_of_each_binary_drains_without_duplicates() {
    let r = soak_with(&["term-dispatcher", "term-scheduler", "term-ingest"], &["--dispatchers", "1"]);
    assert_eq!(r["duplicates"], 0, "{r}");
    assert_eq!(r["duplicate_finals"], 0, "{r}");
    for l in r["faults"].as_array().unwrap() {
        assert_eq!(l["exit_code"], 0, "SIGTERM exits 0: {l}");
    }
}

#[test]
fn broker_outage_and_request_errors_lose_nothing() {
    soak(&["broker-down", "produce-errors", "fetch-errors", "commit-errors"]);
}

#[test]
fn a_slow_broker_and_failing_group_requests_lose_nothing() {
    soak(&["broker-slow", "group-errors"]);
}
