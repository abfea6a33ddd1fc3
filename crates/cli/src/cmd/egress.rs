//! `hookline egress check URL...`: asks the egress guard about URLs, through the same code the dispatcher runs
//! before every attempt (parse and judge the URL, resolve the host with the system resolver, judge every
//! address), without sending anything.

use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use hookline_core::egress::{EgressGuard, EgressSettings, Refusal, Target};
use hookline_core::policy::{self, Policy};
use hookline_dispatcher::connector::{resolve_target, SystemResolver};

use super::output::Format;

const CHECK_ABOUT: &str = "\
Judge URLs the way the dispatcher does before every attempt, without sending anything: parse each URL (WHATWG),
refuse disallowed schemes, user info, bad ports and blocked host names, resolve the host with the system
resolver, and refuse it if ANY address is non-public (IANA special-purpose ranges, IPv4 embedded in IPv6, cloud
metadata addresses) or in a denied range.

On a terminal, prints a table (URL, verdict, the attempt's outcome, addresses, reason). When stdout is not a
terminal, or with --json, one JSON line per URL. Exits 0, whatever the verdicts:
  {\"url\":\"https://10.0.0.7/\",\"allowed\":false,\"reason\":\"10.0.0.7 is private (RFC 1918)\",
   \"addresses\":[],\"outcome\":\"egress_refused\"}
`outcome` is what a delivery attempt would record: egress_refused, invalid_url, or connect_error when the name
does not resolve. Bad arguments or an invalid config exit 2.

The rules are the policy's `egress` table plus the config file's `[egress]` table (HOOKLINE_EGRESS__* overrides
apply) plus the flags below.

Examples:
  hookline egress check https://hooks.example.com/in 'https://0x7f.1/' 'https://[::ffff:169.254.169.254]/'
  hookline egress check --allow-http --allow-range 127.0.0.0/8 http://127.0.0.1:8080/hook";

#[derive(clap::Subcommand)]
pub enum EgressCmd {
    /// Judge URLs as the dispatcher would, without sending anything.
    #[command(long_about = CHECK_ABOUT)]
    Check(CheckArgs),
}

#[derive(clap::Args)]
pub struct CheckArgs {
    /// URLs to judge.
    #[arg(required = true, value_name = "URL")]
    urls: Vec<String>,

    /// Policy whose egress rules apply: a built-in profile name or a policy TOML file.
    #[arg(long, value_name = "NAME|PATH", default_value = policy::DEFAULT_PROFILE)]
    policy: String,

    /// The shared config file, whose `[egress]` table applies.
    #[arg(long, value_name = "PATH", env = "HOOKLINE_CONFIG")]
    config: Option<PathBuf>,

    /// Treat this CIDR range as reachable although non-public (like `egress.allow_ranges`). Repeatable.
    #[arg(long = "allow-range", value_name = "CIDR")]
    allow_ranges: Vec<String>,

    /// Allow plain http (like `egress.allow_http`).
    #[arg(long)]
    allow_http: bool,

    /// How long to wait for each name to resolve.
    #[arg(long, value_name = "SECONDS", default_value = "5", value_parser = super::numbers::seconds_up_to(3600.0))]
    resolve_timeout: Duration,

    #[command(flatten)]
    output: super::output::OutputArgs,
}

pub fn run(cmd: EgressCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        EgressCmd::Check(args) => check(args),
    }
}

fn load_policy(name_or_path: &str) -> anyhow::Result<Policy> {
    if let Some(p) = policy::builtin(name_or_path) {
        return Ok(p);
    }
    let path = std::path::Path::new(name_or_path);
    if path.is_file() {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        return policy::parse(&text).with_context(|| format!("policy {}", path.display()));
    }
    Err(policy::PolicyError::UnknownProfile { name: name_or_path.to_owned() }.into())
}

/// The config's egress settings with the flags added, each bad value blamed on where it came from: the flag, the
/// config (file or `HOOKLINE_EGRESS__*`), or the policy.
fn guard(args: &CheckArgs, policy: &Policy) -> anyhow::Result<EgressGuard> {
    let config = hookline_service::Config::load(args.config.as_deref(), std::env::vars())?;
    for range in &args.allow_ranges {
        let alone = EgressSettings { allow_ranges: vec![range.clone()], ..Default::default() };
        if let Err(e) = alone.validate() {
            anyhow::bail!("--allow-range {range}: {}", e.message);
        }
    }
    EgressGuard::new(&config.egress, &Default::default()).map_err(|e| {
        let from = if args.config.is_some() { "the config file or a HOOKLINE_EGRESS__* variable" } else { "a HOOKLINE_EGRESS__* variable" };
        anyhow::anyhow!("{e} (from {from})")
    })?;
    let mut s = config.egress;
    s.allow_ranges.extend(args.allow_ranges.iter().cloned());
    s.allow_http |= args.allow_http;
    EgressGuard::new(&s, &policy.egress).map_err(|e| anyhow::anyhow!("{e} (from policy {:?})", policy.name))
}

fn check(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let policy = load_policy(&args.policy)?;
    let guard = guard(&args, &policy)?;
    for w in guard.startup_warnings() {
        eprintln!("WARNING: {w}");
    }
    let timeout = args.resolve_timeout;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let verdicts: Vec<Verdict<'_>> = args.urls.iter().map(|url| rt.block_on(judge(&guard, url, timeout))).collect();
    match args.output.format() {
        Format::Json => {
            for v in &verdicts {
                writeln!(out, "{}", serde_json::to_string(v)?)?;
            }
        }
        Format::Human => out.write_all(verdict_table(&verdicts).as_bytes())?,
    }
    out.flush()?;
    // A lookup that timed out still occupies a blocking thread; do not wait for it on the way out.
    rt.shutdown_background();
    Ok(ExitCode::SUCCESS)
}

/// One output line. Field order is the documented one: url, allowed, reason, addresses (outcome is extra).
#[derive(serde::Serialize)]
struct Verdict<'a> {
    url: &'a str,
    allowed: bool,
    reason: Option<String>,
    addresses: Vec<IpAddr>,
    /// What a delivery attempt would record: `egress_refused`, `invalid_url`, `connect_error`; null if allowed.
    outcome: Option<String>,
}

fn verdict_table(verdicts: &[Verdict<'_>]) -> String {
    let mut rows = vec![["url", "verdict", "outcome", "addresses", "reason"].map(String::from).to_vec()];
    for v in verdicts {
        let addresses: Vec<String> = v.addresses.iter().map(IpAddr::to_string).collect();
        rows.push(vec![
            v.url.to_owned(),
            if v.allowed { "allowed" } else { "refused" }.to_owned(),
            v.outcome.clone().unwrap_or_else(|| "-".into()),
            if addresses.is_empty() { "-".into() } else { addresses.join(" ") },
            v.reason.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    super::output::table(&rows)
}

/// The same steps as `connector::precheck`, keeping the addresses for the report when a check fails.
async fn judge<'a>(guard: &EgressGuard, url: &'a str, timeout: Duration) -> Verdict<'a> {
    let refused = |r: Refusal, addresses: Vec<IpAddr>| Verdict {
        url,
        allowed: false,
        reason: Some(r.reason),
        addresses,
        outcome: Some(r.kind.to_string()),
    };
    let target = match guard.check_url(url) {
        Ok(t) => t,
        Err(mut r) => {
            // A refused scheme is checked first; say too whether the address would be refused under https, so
            // that `http://169.254.169.254/` is not taken for "only the scheme is wrong".
            let Some(https) = url.strip_prefix("http://").map(|rest| format!("https://{rest}")).filter(|_| r.reason.starts_with("scheme "))
            else {
                return refused(r, Vec::new());
            };
            let (also, addresses) = match guard.check_url(&https) {
                Err(r2) => (Some(r2.reason), Vec::new()),
                Ok(t) => match destination(guard, &t, timeout).await {
                    Judged::Refused(r2, addrs) => (Some(r2.reason), addrs),
                    Judged::Allowed(_) => (None, Vec::new()),
                    Judged::Unresolved(_) => (None, Vec::new()),
                },
            };
            if let Some(also) = also {
                r.reason = format!("{}; and {also}", r.reason);
            }
            return refused(r, addresses);
        }
    };
    match destination(guard, &target, timeout).await {
        Judged::Allowed(addrs) => Verdict { url, allowed: true, reason: None, addresses: addrs, outcome: None },
        Judged::Refused(r, addrs) => refused(r, addrs),
        Judged::Unresolved(why) => Verdict {
            url,
            allowed: false,
            reason: Some(format!("resolving {} failed: {why}", target.host)),
            addresses: Vec::new(),
            outcome: Some("connect_error".into()),
        },
    }
}

/// Where a target's name leads, judged.
enum Judged {
    Allowed(Vec<IpAddr>),
    Refused(Refusal, Vec<IpAddr>),
    /// The name did not resolve: why.
    Unresolved(String),
}

async fn destination(guard: &EgressGuard, target: &Target, timeout: Duration) -> Judged {
    let addrs = match tokio::time::timeout(timeout, resolve_target(&SystemResolver, target)).await {
        Ok(Ok(a)) => a,
        Ok(Err(e)) => return Judged::Unresolved(e.to_string()),
        Err(_) => return Judged::Unresolved(format!("no answer within {timeout:?}")),
    };
    match guard.check_resolved(target, &addrs) {
        Ok(()) => Judged::Allowed(addrs),
        Err(r) => Judged::Refused(r, addrs),
    }
}
