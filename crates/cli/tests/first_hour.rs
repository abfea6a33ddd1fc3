//! A new user's first hour, outside the dev tour: the README's blocks and the docs they lead to, the help text,
//! `hookline secrets generate-key`, `hookline topics create` against the embedded broker, and `policy simulate`'s
//! numbering of rules. Each test is something a newcomer ran into.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn hookline(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hookline")).args(args).env_remove("HOOKLINE_CONFIG").output().expect("run hookline")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The fenced code block that follows `after` in `doc`.
fn block_after<'a>(doc: &'a str, after: &str) -> &'a str {
    let at = doc.find(after).unwrap_or_else(|| panic!("no {after:?}"));
    let rest = &doc[at..];
    let start = rest.find("```sh\n").unwrap_or_else(|| panic!("no code block after {after:?}")) + 6;
    let end = rest[start..].find("```").expect("the block ends");
    &rest[start..start + end]
}

/// "session 15", "#17": the project's own bookkeeping, which means nothing to a reader.
fn bookkeeping(s: &str) -> Vec<String> {
    let mut found = Vec::new();
    let lower = s.to_ascii_lowercase();
    for (i, _) in lower.match_indices("session ") {
        if lower[i + 8..].starts_with(|c: char| c.is_ascii_digit()) {
            found.push(s[i..(i + 12).min(s.len())].to_owned());
        }
    }
    for (i, _) in s.match_indices('#') {
        let digits = s[i + 1..].chars().take_while(char::is_ascii_digit).count();
        if digits > 0 && !s[..i].ends_with('&') {
            found.push(s[i..i + 1 + digits].to_owned());
        }
    }
    found
}

#[test]
fn the_readme_the_api_reference_and_every_help_text_name_no_sessions_or_issue_numbers() {
    for doc in ["README.md", "docs/api.md", "helm/hookline/README.md"] {
        let found = bookkeeping(&read(doc));
        assert!(found.is_empty(), "{doc} names {found:?}");
    }
    // `hookline --help`, and the help of every command and subcommand under it.
    let mut queue: Vec<Vec<String>> = vec![vec![]];
    let mut seen = 0;
    while let Some(path) = queue.pop() {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("--help");
        let out = hookline(&args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        let help = text(&out.stdout);
        let found = bookkeeping(&help);
        assert!(found.is_empty(), "`hookline {}` names {found:?}", args.join(" "));
        seen += 1;
        if let Some(section) = help.split("Commands:\n").nth(1) {
            for line in section.lines().take_while(|l| l.starts_with("  ")) {
                let name = line.split_whitespace().next().unwrap_or("help");
                if name != "help" {
                    let mut sub = path.clone();
                    sub.push(name.to_owned());
                    queue.push(sub);
                }
            }
        }
    }
    assert!(seen > 20, "only {seen} help texts were found");
}

#[test]
fn the_help_summary_names_every_command_group() {
    let summary = text(&hookline(&["--help"]).stdout);
    let first = summary.lines().next().unwrap_or("");
    for group in ["dev", "topics", "policies", "filters", "dead letters", "signatures", "egress", "master keys", "delivery log", "soak"] {
        assert!(first.contains(group), "`hookline --help` does not mention {group}: {first}");
    }
    let log = text(&hookline(&["log", "--help"]).stdout);
    assert!(log.lines().next().unwrap_or("").contains("index"), "{log}");
}

#[test]
fn two_master_keys_made_the_same_day_have_different_ids() {
    let ids: Vec<String> = (0..3)
        .map(|_| {
            let out = hookline(&["secrets", "generate-key"]);
            assert!(out.status.success(), "{}", text(&out.stderr));
            let entry = text(&out.stdout);
            let (id, key) = entry.trim().split_once(':').expect("<id>:<key>");
            assert_eq!(key.len(), 44, "32 bytes in base64: {entry}");
            id.to_owned()
        })
        .collect();
    assert!(ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2], "{ids:?}");
    assert!(ids.iter().all(|id| id.starts_with("k20")), "{ids:?}");
}

#[test]
fn the_readmes_separate_services_block_keeps_its_key_and_says_what_the_embedded_broker_needs() {
    let readme = read("README.md");
    let section = &readme[readme.find("## Running the services separately").expect("the section")..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |e| e + 3)];
    // The master key is written once: pasting the block again (a restart) must not make another.
    assert!(!section.contains("KEYS=\"[\\\"$("), "a new key at every paste:\n{section}");
    let setup = block_after(section, "In a second terminal");
    let key_line = setup.lines().find(|l| l.contains("secrets generate-key")).expect("a key is made");
    assert!(key_line.starts_with("[ -f ") && key_line.contains("||"), "made even when it exists: {key_line}");
    for wanted in ["HOOKLINE_SECRETS__KEYS_FILE=", "HOOKLINE_KAFKA__OFFSETS_BY_TIME=false", ":8080", ":9091", ":9092"] {
        assert!(setup.contains(wanted), "no {wanted} in:\n{setup}");
    }
    // And a next step: a receiver and a subscription for it.
    let next = block_after(section, "Then a receiver");
    assert!(next.contains("/v1/subscriptions") && next.contains("/v1/events") && next.contains("do_POST"), "{next}");
    // The broker's own message says the same.
    let broker = read("crates/cli/src/cmd/dev_broker.rs");
    assert!(broker.contains("HOOKLINE_KAFKA__OFFSETS_BY_TIME=false"));
}

#[test]
fn topics_create_against_the_embedded_broker_keeps_to_its_timeout_and_says_why() {
    let mut broker = Command::new(env!("CARGO_BIN_EXE_hookline"))
        .args(["dev-broker", "--partitions", "1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the broker");
    let mut first = String::new();
    BufReader::new(broker.stdout.take().unwrap()).read_line(&mut first).unwrap();
    let v: serde_json::Value = serde_json::from_str(&first).expect(&first);
    let bootstrap = v["bootstrap_servers"].as_str().unwrap().to_owned();
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_hookline"))
        .args(["topics", "create", "--timeout-s", "3"])
        .env_remove("HOOKLINE_CONFIG")
        .env("HOOKLINE_KAFKA__BOOTSTRAP_SERVERS", &bootstrap)
        .env("HOOKLINE_KAFKA__PARTITIONS", "1")
        .env("HOOKLINE_KAFKA__EVENT_PARTITIONS", "1")
        .env("HOOKLINE_KAFKA__REPLICATION_FACTOR", "1")
        .output()
        .expect("run topics create");
    let took = started.elapsed();
    let _ = broker.kill();
    let _ = broker.wait();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(took < Duration::from_secs(10), "--timeout-s 3 took {took:?}: {stdout}{stderr}");
    if out.status.success() {
        // A broker that answers: every topic is there.
        assert!(stdout.lines().all(|l| l.contains("\"created\"") || l.contains("\"exists\"")), "{stdout}");
    } else {
        assert!(stderr.contains("within 3 s (--timeout-s)"), "{stderr}");
        assert!(stderr.contains("creates hookline's topics itself"), "{stderr}");
        assert!(!stderr.contains("OperationTimedOut"), "librdkafka's words: {stderr}");
    }
}

/// Whether a `when` entry of a built-in profile (`503`, `500-599`, `5xx`, `any`) matches a status.
fn entry_matches(entry: &str, status: u16) -> bool {
    if entry == "any" {
        return true;
    }
    if let Some((lo, hi)) = entry.split_once('-') {
        return lo.parse::<u16>().is_ok_and(|lo| lo <= status) && hi.parse::<u16>().is_ok_and(|hi| status <= hi);
    }
    if let Some(class) = entry.strip_suffix("xx") {
        return class.parse::<u16>().is_ok_and(|c| c == status / 100);
    }
    entry.parse::<u16>().is_ok_and(|s| s == status)
}

#[test]
fn policy_simulate_numbers_rules_from_1_as_the_delivery_log_does() {
    for (profile, status) in [("lucibook", 503), ("fynapse", 410), ("standard", 200), ("gauge", 500)] {
        let out = hookline(&["policy", "simulate", "--policy", profile, "--json", &status.to_string()]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let first: serde_json::Value = serde_json::from_str(text(&out.stdout).lines().next().unwrap()).unwrap();
        let rule = first["rule"].as_u64().expect("a rule number") as usize;
        // The delivery log's `rule.number`: the position of the first `classify` rule that matches, from 1.
        let policy = hookline_core::policy::builtin(profile).unwrap();
        let expected = policy.classify.iter().position(|r| r.when.iter().any(|w| entry_matches(w, status))).map(|i| i + 1);
        assert_eq!(Some(rule), expected, "{profile} {status}: {first}");
        let human = text(&hookline(&["policy", "simulate", "--policy", profile, "--format", "human", &status.to_string()]).stdout);
        assert!(human.contains(&format!(" {rule}: ")), "{profile} {status}: the timeline shows another number:\n{human}");
    }
}

#[test]
fn the_readme_says_what_scripts_test_installs_and_the_script_times_each_stage() {
    let readme = read("README.md");
    let script = read("scripts/test");
    // Every package any stage installs is named in the README.
    let mut installed: Vec<String> = Vec::new();
    for file in ["scripts/test", "scripts/with-postgres", "scripts/test-portal"] {
        for line in read(file).lines().filter(|l| l.contains("apt-get install")) {
            let after = line.split("install -y").nth(1).expect("apt-get install -y");
            installed.extend(after.split_whitespace().map(str::to_owned));
        }
    }
    assert!(installed.len() >= 7, "{installed:?}");
    for pkg in installed.iter().map(String::as_str).chain(["npm ci", "pip", "tansu"]) {
        assert!(readme.contains(&format!("`{pkg}`")) || readme.contains(pkg), "the README does not say scripts/test installs {pkg}");
    }
    // Each command of the script is announced as a numbered stage, and each stage's time is printed.
    let commands = [
        "./scripts/install-tansu",
        "cargo build --workspace",
        "./scripts/with-postgres cargo test",
        "./scripts/check-deploy",
        "./scripts/test-portal",
    ];
    let lines: Vec<&str> = script.lines().collect();
    for c in commands {
        // Where it runs (a stage's own announcement may name it too).
        let at = lines
            .iter()
            .position(|l| l.contains(c) && !l.starts_with("stage "))
            .unwrap_or_else(|| panic!("scripts/test no longer runs {c}"));
        assert!(lines[..at].iter().rev().take(6).any(|l| l.starts_with("stage ")), "{c} is not announced as a stage");
    }
    assert!(script.contains("done in $(took"), "stages are not timed");
    let out = Command::new("bash").arg("-n").arg(repo().join("scripts/test")).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn operations_md_walks_through_a_helm_install_and_the_chart_has_a_readme() {
    let ops = read("docs/operations.md");
    let at = ops.find("## Install on Kubernetes with Helm").expect("a Helm install section");
    let section = &ops[at..at + ops[at + 3..].find("\n## ").expect("the next section")];
    for step in ["docker build", "docker push", "kubectl -n hookline create secret", "helm install", "/v1/subscriptions", "/v1/events"] {
        assert!(section.contains(step), "the walkthrough lacks `{step}`");
    }
    // Every value it sets exists in the chart.
    let values = read("helm/hookline/values.yaml");
    for set in section.split("--set ").skip(1) {
        let key = set.split('=').next().unwrap();
        let leaf = key.rsplit('.').next().unwrap();
        assert!(values.contains(&format!("{leaf}:")), "--set {key}: no such value in values.yaml");
    }
    let chart = read("helm/hookline/README.md");
    assert!(chart.contains("helm install") && chart.contains("operations.md#install-on-kubernetes-with-helm"), "{chart}");
}

#[test]
fn each_service_says_in_its_help_where_it_listens_and_what_it_needs() {
    // Next to this hookline, as `hookline soak` finds them (scripts/test builds every binary first).
    let dir = PathBuf::from(env!("CARGO_BIN_EXE_hookline")).parent().unwrap().to_owned();
    for (bin, port, needs) in [
        ("hookline-ingest", "8080", &["kafka.bootstrap_servers", "ingest.api_tokens", "secrets.keys"][..]),
        ("hookline-dispatcher", "9091", &["kafka.bootstrap_servers", "secrets.keys"][..]),
        ("hookline-retry-scheduler", "9092", &["kafka.bootstrap_servers"][..]),
    ] {
        let path = dir.join(bin);
        assert!(path.is_file(), "{} not found: build the binaries first (`cargo build --workspace --bins`)", path.display());
        let out = Command::new(&path).arg("--help").output().expect("run --help");
        let help = text(&out.stdout);
        assert!(out.status.success(), "{bin}: {}", text(&out.stderr));
        assert!(help.lines().count() > 8, "{bin} --help is one sentence:\n{help}");
        for wanted in [port, "docs/configuration.md"].iter().chain(needs) {
            assert!(help.contains(wanted), "{bin} --help does not name {wanted}:\n{help}");
        }
    }
}
