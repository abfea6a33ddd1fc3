//! A full run's output holds no secret: `hookline dev --log debug`, with a master key and a portal-link
//! key of the test's own, through tenants, an API key, a portal link, a subscription with a given secret, a
//! rotation, a published and delivered event, refused credentials and a refused secret, custom headers carrying
//! credentials; then every byte it printed (stdout and stderr) and a scrape of `/metrics` are searched for every
//! one of those secrets.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

const MASTER_KEY: &str = "bm8tc2VjcmV0LWluLWxvZ3MtbWFzdGVyLWtleS0wMDE="; // 32 bytes
const LINK_SECRET: &str = "portal-link-secret-that-must-not-be-logged";
const SUB_SECRET: &str = "whsec_bm8tc2VjcmV0LWluLWxvZ3MtcGxlYXNlLTAxMjM=";
/// Custom header values: credentials under names no list would guess.
const HEADER_CRED: &str = "partner-cred-not-for-logs-5a1c";
const HEADER_BEARER: &str = "Bearer partner-token-not-for-logs-77e2";

fn http(base: &str, method: &str, path: &str, token: &str, body: Option<&str>) -> (u16, String) {
    let authority = base.strip_prefix("http://").unwrap();
    let mut stream = TcpStream::connect(authority).expect("connect to the API");
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let body = body.unwrap_or("");
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read the answer");
    let status = answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
    (status, body)
}

fn field(json: &str, name: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"));
    v[name].as_str().unwrap_or_else(|| panic!("no {name} in {json}")).to_owned()
}

#[test]
fn nothing_secret_is_printed_during_a_full_run() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hookline"))
        .args(["dev", "--port", "0", "--log", "debug"])
        .env_remove("HOOKLINE_CONFIG")
        .env_remove("RUST_LOG")
        .env("HOOKLINE_SECRETS__KEYS", format!("[\"logtest:{MASTER_KEY}\"]"))
        .env("HOOKLINE_INGEST__PORTAL__LINK_SECRET", LINK_SECRET)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start hookline dev");
    let output = Arc::new(Mutex::new(String::new()));
    let (tx, rx) = mpsc::channel::<String>();
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let out = output.clone();
    let readers = [
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                out.lock().unwrap().push_str(&line);
                out.lock().unwrap().push('\n');
                let _ = tx.send(line);
            }
        }),
        {
            let out = output.clone();
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = BufReader::new(stderr).read_to_string(&mut s);
                out.lock().unwrap().push_str(&s);
            })
        },
    ];
    let stop = |child: &mut std::process::Child| {
        // SIGTERM: the services drain and log their shutdown, which is searched too.
        let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline && child.try_wait().ok().flatten().is_none() {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
    };

    let deadline = Instant::now() + Duration::from_secs(180);
    let mut hl = None;
    let mut receiver = None;
    while let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        if let Some(rest) = line.strip_prefix("export HL=") {
            hl = rest.split_whitespace().next().map(str::to_owned);
            receiver = rest.split_whitespace().find_map(|w| w.strip_prefix("RECEIVER=")).map(str::to_owned);
        }
        if line.starts_with("Watch this terminal") {
            break;
        }
    }
    let (Some(hl), Some(receiver)) = (hl, receiver) else {
        stop(&mut child);
        panic!("hookline dev did not start:\n{}", output.lock().unwrap());
    };
    let admin = "dev-token-not-for-production";

    let (status, body) = http(&hl, "POST", "/v1/tenants", admin, Some(r#"{"id":"acme","name":"Acme"}"#));
    assert_eq!(status, 201, "{body}");
    let (status, body) = http(&hl, "POST", "/v1/tenants/acme/api-keys", admin, Some(r#"{"name":"ci"}"#));
    assert_eq!(status, 201, "{body}");
    let api_key = field(&body, "key");
    let (status, body) = http(&hl, "POST", "/v1/tenants/acme/portal-links", admin, None);
    assert_eq!(status, 201, "{body}");
    let link_token = field(&body, "url").split("#token=").nth(1).unwrap().to_owned();
    let sub_body = format!(
        r#"{{"url":"{receiver}/ok","event_types":["secret.test"],"secret":"{SUB_SECRET}","headers":{{"X-Custom-Cred":"{HEADER_CRED}","Authorization":"{HEADER_BEARER}"}}}}"#
    );
    let (status, body) = http(&hl, "POST", "/v1/subscriptions", &api_key, Some(&sub_body));
    assert_eq!(status, 201, "{body}");
    let sub = field(&body, "id");
    let (status, body) = http(&hl, "POST", &format!("/v1/subscriptions/{sub}/rotate-secret"), &link_token, Some(r#"{"overlap_s":60}"#));
    assert_eq!(status, 200, "{body}");
    let rotated = field(&body, "secret");
    let (status, body) = http(&hl, "POST", "/v1/events", &api_key, Some(r#"{"id":"evt_secret_1","type":"secret.test","data":{"n":1}}"#));
    assert_eq!(status, 202, "{body}");
    let (status, _) = http(&hl, "GET", "/v1/subscriptions", &link_token, None);
    assert_eq!(status, 200);
    // Refused: a forged key, an altered link, and a secret that cannot be used (its error names it, not its value).
    // One character near the end changed to another, never to itself (a link's last character is one of 16, so
    // "replace the last with A" left 1 link in 16 unchanged and valid), and not the last one (base64 padding bits).
    let alter = |t: &str| {
        let mut c: Vec<char> = t.chars().collect();
        let i = c.len() - 5;
        c[i] = if c[i] == 'A' { 'B' } else { 'A' };
        c.into_iter().collect::<String>()
    };
    let forged = alter(&api_key);
    assert_eq!(http(&hl, "GET", "/v1/subscriptions", &forged, None).0, 401);
    let altered = alter(&link_token);
    assert_eq!(http(&hl, "GET", "/v1/subscriptions", &altered, None).0, 401);
    let bad_secret = "whsec_!!not-base64-but-secret-anyway!!";
    let (status, body) = http(
        &hl,
        "POST",
        "/v1/subscriptions",
        admin,
        Some(&format!(r#"{{"url":"{receiver}/ok","event_types":["x"],"secret":"{bad_secret}"}}"#)),
    );
    assert_eq!(status, 422, "{body}");
    assert!(!body.contains(bad_secret), "the error body quotes the secret: {body}");

    // The event arrives, signed (with both secrets during the overlap).
    let until = Instant::now() + Duration::from_secs(60);
    let mut delivered = false;
    while let Ok(line) = rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
        if line.starts_with("webhook on /ok") && line.contains("evt_secret_1") {
            delivered = true;
            break;
        }
    }
    // What a scrape of /metrics shows is searched too.
    let (status, metrics) = http(&hl, "GET", "/metrics", admin, None);
    assert_eq!(status, 200);
    output.lock().unwrap().push_str(&metrics);
    stop(&mut child);
    for r in readers {
        let _ = r.join();
    }
    let all = output.lock().unwrap().clone();
    assert!(delivered, "the event was not delivered:\n{all}");
    assert!(all.contains("DEBUG") || all.contains("debug"), "the run logged at debug level");
    for (what, secret) in [
        ("the master key", MASTER_KEY),
        ("the portal-link key", LINK_SECRET),
        ("the subscription's secret", SUB_SECRET),
        ("the subscription's secret (base64 part)", &SUB_SECRET["whsec_".len()..]),
        ("the rotated secret", rotated.as_str()),
        ("the API key", api_key.as_str()),
        ("the API key (random part)", &api_key["hlk_".len()..]),
        ("the portal link's token", link_token.as_str()),
        ("the refused secret", bad_secret),
        ("a custom header's value", HEADER_CRED),
        ("the custom Authorization header's value", HEADER_BEARER),
    ] {
        if let Some(at) = all.find(secret) {
            let line = all[..at].rsplit('\n').next().unwrap_or("");
            panic!("{what} was printed, in a line starting: {line:?}");
        }
    }
}
