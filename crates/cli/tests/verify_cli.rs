//! `hookline verify` as a receiver's developer runs it: the real binary, real files, exit codes and messages.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const TS: &str = "1614265330";
const BODY: &str = r#"{"test": 2432232314}"#;
const SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

/// A scratch directory per test, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("hookline-verify-cli-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        Scratch(dir)
    }

    fn file(&self, name: &str, contents: &[u8]) -> String {
        let path = self.0.join(name);
        std::fs::write(&path, contents).expect("write scratch file");
        path.to_string_lossy().into_owned()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn hookline(args: &[&str], stdin: Option<&[u8]>) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hookline"));
    cmd.arg("verify").args(args).env_remove("HOOKLINE_VERIFY_SECRET");
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("run hookline");
    if let Some(input) = stdin {
        child.stdin.take().expect("stdin").write_all(input).expect("write stdin");
    }
    let Output { status, stdout, stderr } = child.wait_with_output().expect("wait for hookline");
    (status.code().unwrap_or(-1), String::from_utf8_lossy(&stdout).into_owned(), String::from_utf8_lossy(&stderr).into_owned())
}

fn spec_args<'a>(body_file: &'a str, now: &'a str) -> Vec<&'a str> {
    vec![
        "--secret",
        SECRET,
        "--header",
        "webhook-id: msg_p5jXN8AQM9LWM0D4loKWxJek",
        "--header",
        "webhook-timestamp: 1614265330",
        "-H",
        "webhook-signature: v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
        "--body-file",
        body_file,
        "--now",
        now,
    ]
}

#[test]
fn a_valid_request_is_ok() {
    let s = Scratch::new("ok");
    let body = s.file("body.json", BODY.as_bytes());
    let (code, out, err) = hookline(&spec_args(&body, "1614265342"), None);
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    assert_eq!(out.trim(), "OK: signature v1 #1 matches (scheme standard-webhooks, timestamp 12 s old)");
}

#[test]
fn the_body_can_come_from_stdin_and_headers_from_a_dump() {
    let s = Scratch::new("dump");
    // As copied from `curl -v`: request line, "> " prefixes, CRLF, and a body after the blank line.
    let dump = format!(
        "> POST /hooks HTTP/1.1\r\n> Host: example.com\r\n> Content-Type: application/json\r\n\
         > Webhook-Id: {ID}\r\n> Webhook-Timestamp: {TS}\r\n> Webhook-Signature: v1a,AAAA {SIG}\r\n>\r\n\r\n{BODY}\r\n"
    );
    let headers = s.file("headers.txt", dump.as_bytes());
    let (code, out, err) =
        hookline(&["--secret", SECRET, "--headers-file", &headers, "--body-file", "-", "--now", "1614265330"], Some(BODY.as_bytes()));
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    assert_eq!(out.trim(), "OK: signature v1 #2 matches (scheme standard-webhooks, timestamp 0 s old)");
}

#[test]
fn a_tampered_body_fails() {
    let s = Scratch::new("tampered");
    let body = s.file("body.json", br#"{"test": 2432232315}"#);
    let (code, out, _) = hookline(&spec_args(&body, "1614265330"), None);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("FAIL: no signature matched: 1 v1 signature tried with 1 secret"), "{out}");
    assert!(out.contains("hint: check the secret belongs to this endpoint"), "{out}");
}

#[test]
fn a_trailing_newline_is_pointed_out() {
    let s = Scratch::new("newline");
    let body = s.file("body.json", format!("{BODY}\n").as_bytes());
    let (code, out, _) = hookline(&spec_args(&body, "1614265330"), None);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("FAIL: no signature matched"), "{out}");
    assert!(out.contains("trailing newline that was probably added by your editor"), "{out}");
}

#[test]
fn a_missing_header_is_named() {
    let s = Scratch::new("missing");
    let body = s.file("body.json", BODY.as_bytes());
    let (code, out, _) = hookline(
        &["--secret", SECRET, "-H", &format!("webhook-id: {ID}"), "-H", &format!("webhook-signature: {SIG}"), "--body-file", &body],
        None,
    );
    assert_eq!(code, 1, "{out}");
    assert_eq!(out.trim(), "FAIL: missing `webhook-timestamp` header");
}

#[test]
fn a_too_old_timestamp_says_by_how_much_and_whether_the_signature_matches() {
    let s = Scratch::new("old");
    let body = s.file("body.json", BODY.as_bytes());
    // 1h 3m after the timestamp.
    let (code, out, _) = hookline(&spec_args(&body, "1614269110"), None);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("FAIL: timestamp too old: 1h 3m old, tolerance 300 s"), "{out}");
    assert!(out.contains("the signature itself matches"), "{out}");
    assert!(out.contains("--now 1614265330"), "{out}");
    // A wider tolerance accepts it.
    let mut args = spec_args(&body, "1614269110");
    args.extend(["--tolerance-s", "4000"]);
    let (code, out, _) = hookline(&args, None);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("timestamp 1h 3m old"), "{out}");
}

#[test]
fn rotation_and_gauge() {
    let s = Scratch::new("gauge");
    let t: i64 = 1_767_225_600_123;
    let body = br#"{"id":"evt_1"}"#;
    let new = "whsec_aGVsbG8gd29ybGQ=";
    let hex = hookline_core::sign::gauge_signature_hex(new, t, body).expect("sign");
    let body_file = s.file("body.json", body);
    let (code, out, err) = hookline(
        &[
            "--secret",
            "an-old-plain-secret",
            "--secret",
            new,
            "--scheme",
            "gauge",
            "-H",
            &format!("Gauge-Signature: t={t},v1={hex}"),
            "--body-file",
            &body_file,
            "--now",
            "1767225610",
        ],
        None,
    );
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    assert_eq!(out.trim(), "OK: signature v1 #1 matches secret #2 (scheme gauge, timestamp 9.8 s old)");
}

#[test]
fn bad_arguments_exit_2_naming_the_argument() {
    let s = Scratch::new("args");
    let body = s.file("body.json", BODY.as_bytes());
    let header = format!("webhook-id: {ID}");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["-H", &header, "--body-file", &body], "--secret"),
        (vec!["--secret", SECRET, "-H", &header], "--body-file"),
        (vec!["--secret", SECRET, "-H", "no colon here", "--body-file", &body], "--header"),
        (vec!["--secret", SECRET, "--body-file", &body], "--header"),
        (vec!["--secret", SECRET, "-H", &header, "--body-file", "/nonexistent/body.json"], "--body-file"),
        (vec!["--secret", SECRET, "--headers-file", "/nonexistent/h.txt", "--body-file", &body], "--headers-file"),
        (vec!["--secret", SECRET, "-H", &header, "--body-file", &body, "--scheme", "hmac"], "--scheme"),
        (vec!["--secret", SECRET, "-H", &header, "--body-file", &body, "--tolerance-s", "abc"], "--tolerance-s"),
    ];
    for (args, names) in cases {
        let (code, out, err) = hookline(&args, None);
        assert_eq!(code, 2, "{args:?}\nstdout: {out}\nstderr: {err}");
        assert!(err.contains(names), "{args:?} should name {names}: {err}");
    }
    // A secret that cannot be decoded is an argument problem too, and the message does not echo it.
    let mut args = spec_args(&body, "1614265330");
    args[1] = "whsec_%%%not-base64";
    let (code, _, err) = hookline(&args, None);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--secret #1: the part after `whsec_` is not valid base64"), "{err}");
    assert!(!err.contains("%%%not-base64"), "{err}");
}

#[test]
fn help_explains_the_command() {
    let (code, out, _) = hookline(&["--help"], None);
    assert_eq!(code, 0);
    for needle in ["--secret", "--headers-file", "--body-file", "--tolerance-s", "--now", "exits 1", "Standard Webhooks"] {
        assert!(out.contains(needle), "help lacks {needle}: {out}");
    }
}
