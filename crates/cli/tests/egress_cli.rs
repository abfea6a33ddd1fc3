//! `hookline egress check` through the real binary. Nothing here needs public DNS: URLs are IP literals,
//! blocked names, or names under `.invalid` (which never resolve).

use std::process::{Command, Output};

use serde_json::Value;

const HOSTILE: &str = include_str!("../../core/src/egress/hostile_urls.tsv");

fn hookline(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hookline"))
        .args(args)
        // The operator's environment must not change the verdicts under test.
        .env_remove("HOOKLINE_CONFIG")
        .env_remove("HOOKLINE_EGRESS__ALLOW_RANGES")
        .env_remove("HOOKLINE_EGRESS__ALLOW_HTTP")
        .output()
        .expect("run hookline")
}

fn lines(out: &Output) -> Vec<Value> {
    assert_eq!(out.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}")))
        .collect()
}

fn check(args: &[&str]) -> Vec<Value> {
    let mut all = vec!["egress", "check"];
    all.extend_from_slice(args);
    lines(&hookline(&all))
}

#[test]
fn hostile_table_is_refused_with_its_reason() {
    let rows: Vec<Vec<&str>> =
        HOSTILE.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')).map(|l| l.split('\t').collect()).collect();
    assert!(rows.len() >= 60, "{} rows", rows.len());
    // `--` so that URLs are never taken for options.
    let mut args = vec!["--"];
    args.extend(rows.iter().map(|r| r[0]));
    let out = check(&args);
    assert_eq!(out.len(), rows.len(), "one line per URL");
    let mut failures = Vec::new();
    for (row, line) in rows.iter().zip(&out) {
        let (url, outcome, fragment) = (row[0], row[1], row[2]);
        let reason = line["reason"].as_str().unwrap_or_default();
        if line["url"] != url
            || line["allowed"] != false
            || line["outcome"] != outcome
            || !reason.contains(fragment)
            || line["addresses"] != Value::Array(vec![])
        {
            failures.push(format!("{url:?}: {line}, want {outcome} containing {fragment:?}"));
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn public_ip_literals_are_allowed() {
    let out = check(&["https://93.184.216.34/", "https://[2606:4700::1111]:8443/in", "https://[::ffff:8.8.8.8]/"]);
    let addrs: Vec<&Value> = out.iter().map(|l| &l["addresses"]).collect();
    for l in &out {
        assert_eq!(l["allowed"], true, "{l}");
        assert_eq!(l["reason"], Value::Null, "{l}");
    }
    assert_eq!(addrs[0], &serde_json::json!(["93.184.216.34"]));
    assert_eq!(addrs[1], &serde_json::json!(["2606:4700::1111"]));
}

#[test]
fn output_fields_in_documented_order() {
    let out = hookline(&["egress", "check", "https://10.0.0.7/"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with(r#"{"url":"https://10.0.0.7/","allowed":false,"reason":"10.0.0.7 is private (RFC 1918)","addresses":[]"#),
        "{text}"
    );
}

#[test]
fn loopback_needs_the_allow_list_and_http() {
    let url = "http://127.0.0.1:8080/hook";
    // The scheme, and what the address would get under https too.
    assert_eq!(check(&[url])[0]["reason"], "scheme http is not allowed (allowed: https); and 127.0.0.1 is loopback");
    assert_eq!(check(&["--allow-http", url])[0]["reason"], "127.0.0.1 is loopback");
    let out = hookline(&["egress", "check", "--allow-http", "--allow-range", "127.0.0.0/8", url, "http://10.0.0.1/"]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let l = lines(&out);
    assert_eq!(l[0]["allowed"], true, "{}", l[0]);
    assert_eq!(l[0]["addresses"], serde_json::json!(["127.0.0.1"]));
    assert_eq!(l[1]["reason"], "10.0.0.1 is private (RFC 1918)");
    assert!(stderr.contains("WARNING: egress allow-list in use: 127.0.0.0/8"), "the allow-list is announced: {stderr}");
}

#[test]
fn unresolvable_names_are_reported_not_allowed() {
    let l = &check(&["--resolve-timeout", "3", "https://does-not-exist.invalid/"])[0];
    assert_eq!(l["allowed"], false);
    assert_eq!(l["outcome"], "connect_error");
    assert!(l["reason"].as_str().unwrap().starts_with("resolving does-not-exist.invalid failed"), "{l}");
}

#[test]
fn config_file_and_policy_rules_apply() {
    let dir = std::env::temp_dir().join(format!("hookline-egress-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("hookline.toml");
    std::fs::write(&config, "[egress]\ndeny_ranges = [\"93.184.216.0/24\"]\nblocked_hostnames = [\"*.corp.example\"]\n").unwrap();
    let out = check(&["--config", config.to_str().unwrap(), "https://93.184.216.34/", "https://a.corp.example/"]);
    assert_eq!(out[0]["reason"], "93.184.216.34 is in a range denied by the operator (93.184.216.0/24)");
    assert_eq!(out[1]["reason"], "a.corp.example is a blocked hostname");
    // Every built-in profile is https-only.
    for profile in ["standard", "lucibook", "fynapse", "relay", "gauge"] {
        let l = &check(&["--policy", profile, "http://93.184.216.34/"])[0];
        assert_eq!(l["reason"], "scheme http is not allowed (allowed: https)", "{profile}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_arguments_exit_2_naming_the_problem() {
    let out = hookline(&["egress", "check", "--allow-range", "10.0.0.0/33", "https://93.184.216.34/"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(r#"--allow-range 10.0.0.0/33: "10.0.0.0/33" is not a CIDR range"#), "{stderr}");
    // The flag is named as the culprit, not "--allow-range, the config file, or policy".
    let out = hookline(&["egress", "check", "--allow-range", "127.0.0/8", "https://93.184.216.34/"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--allow-range 127.0.0/8: ") && !stderr.contains("config file"), "{stderr}");
    let out = hookline(&["egress", "check", "--policy", "nope", "https://93.184.216.34/"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown policy profile"));
    let out = hookline(&["egress", "check"]);
    assert_eq!(out.status.code(), Some(2), "a URL is required");
}

#[test]
fn an_http_url_to_a_refused_address_is_refused_for_both() {
    let v = check(&["http://169.254.169.254/latest/meta-data/"]);
    let reason = v[0]["reason"].as_str().unwrap();
    assert_eq!(v[0]["allowed"], false);
    assert!(reason.starts_with("scheme http is not allowed"), "{reason}");
    assert!(reason.contains("169.254.169.254") && reason.contains("metadata"), "the address is not named as refused: {reason}");
    // An allowed address behind a refused scheme: only the scheme.
    let v = check(&["http://93.184.216.34/"]);
    let reason = v[0]["reason"].as_str().unwrap();
    assert!(!reason.contains("; and"), "{reason}");
}
