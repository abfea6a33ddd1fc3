//! `hookline policy ...`: list, show, check and simulate delivery policies. The logic lives in `hookline_core`;
//! this file only reads arguments and files and prints.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{bail, Context};
use hookline_core::policy::{self, Policy, PolicyError, BUILTIN_NAMES, DEFAULT_PROFILE};
use hookline_core::simulate;
use hookline_core::Outcome;

use super::output::{duration_ms, table, Format};

#[derive(clap::Subcommand)]
pub enum PolicyCmd {
    /// List the built-in profiles, one line each.
    List,
    /// Print a built-in profile's TOML document, to copy and edit into your own policy.
    Show {
        /// A built-in profile: standard, lucibook, fynapse, relay or gauge.
        name: String,
    },
    /// Validate a policy document. Prints OK, or every problem with the key it concerns (exit status 1).
    Check {
        /// Path to a policy TOML file (a built-in profile name is accepted too).
        file: String,
    },
    /// Show what a policy does with a sequence of responses: a timeline on a terminal, else one JSON line per HTTP
    /// try, then the delivery's fate.
    #[command(after_help = SIMULATE_HELP)]
    Simulate(SimulateArgs),
}

const SIMULATE_HELP: &str = "\
Each RESPONSE is one HTTP try's outcome, used in order; the last one repeats when they run out:
  503                                    an HTTP status (100-599)
  429:ra=120                             a status with a Retry-After of 120 seconds
  '503:ra=Wed, 21 Oct 2026 07:28:00 GMT' a status with an HTTP-date Retry-After
  timeout | connect_error | tls_error | egress_refused | invalid_url

The simulated clock starts at t = 0 with the first attempt; an HTTP-date is read against a wall clock of
2026-01-01T00:00:00Z at t = 0. A try takes no time, except a timeout, which lasts the policy's timeout.

On a terminal: an aligned timeline (attempt, when, outcome, verdict, the wait before the next try, the rule that
decided and why). When stdout is not a terminal, or with --json, one JSON line per try:
  {\"attempt\":1,\"try\":1,\"at_s\":0,\"outcome\":\"503\",\"verdict\":\"retry\",\"counts_toward_disable\":true,
   \"next_delay_s\":60,\"next_delay_min_s\":60,\"next_delay_max_s\":60,...}
then {\"final\":\"failed\",\"status\":\"failed\",\"attempts\":6}. `final` is succeeded, failed or dead; `status` is the
profile's own word for it. Exits 0 whenever the simulation ran, whatever the delivery's fate.

Example:
  hookline policy simulate --policy lucibook 503";

#[derive(clap::Args)]
pub struct SimulateArgs {
    /// A built-in profile name or the path of a policy TOML file.
    #[arg(long, value_name = "NAME|PATH", default_value = DEFAULT_PROFILE)]
    policy: String,
    /// Seed for the jitter draws: the same seed gives the same delays.
    #[arg(long, value_name = "N", default_value_t = 0)]
    seed: u64,
    /// Outcomes of successive tries (see below).
    #[arg(value_name = "RESPONSE", required = true, value_parser = parse_response)]
    responses: Vec<Outcome>,
    #[command(flatten)]
    output: super::output::OutputArgs,
}

fn parse_response(arg: &str) -> Result<Outcome, String> {
    simulate::parse_response(arg)
}

pub fn run(cmd: PolicyCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        PolicyCmd::List => list(),
        PolicyCmd::Show { name } => show(&name),
        PolicyCmd::Check { file } => check(&file),
        PolicyCmd::Simulate(args) => run_simulation(&args),
    }
}

fn list() -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    for name in BUILTIN_NAMES {
        let Some(p) = policy::builtin(name) else { bail!("built-in profile {name} failed to load (a build defect)") };
        let default = if *name == DEFAULT_PROFILE { " (default)" } else { "" };
        writeln!(out, "{:<9} {}{default}", name, p.summary())?;
    }
    Ok(ExitCode::SUCCESS)
}

fn show(name: &str) -> anyhow::Result<ExitCode> {
    let Some(text) = policy::builtin_source(name) else {
        return Err(PolicyError::UnknownProfile { name: name.to_owned() }.into());
    };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    Ok(ExitCode::SUCCESS)
}

fn check(file: &str) -> anyhow::Result<ExitCode> {
    let parsed = match read_policy_file(file)? {
        Some(text) => policy::parse(&text),
        None => match policy::builtin(file) {
            Some(p) => Ok(p),
            None => {
                let hint = hookline_core::words::did_you_mean(file, BUILTIN_NAMES.iter().copied())
                    .map_or_else(String::new, |p| format!("; did you mean {p:?}?"));
                bail!("{file}: no such file, and not a built-in profile ({}){hint}", BUILTIN_NAMES.join(", "))
            }
        },
    };
    match parsed {
        Ok(p) => {
            let shape = shape_summary(&p).map_or_else(String::new, |s| format!("; {s}"));
            println!("OK: {file} (policy {:?}{shape})", p.name);
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("{file}: invalid policy");
            for issue in e.issues() {
                eprintln!("  {issue}");
            }
            Ok(ExitCode::FAILURE)
        }
    }
}

fn run_simulation(args: &SimulateArgs) -> anyhow::Result<ExitCode> {
    let policy = load(&args.policy)?;
    let lines = simulate::simulate(&policy, &args.responses, args.seed);
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    match args.output.format() {
        Format::Json => {
            for line in &lines {
                writeln!(out, "{}", line.to_json())?;
            }
        }
        Format::Human => out.write_all(timeline(&policy, &lines).as_bytes())?,
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// The simulation for a person: one aligned row per try, then the fate in words.
fn timeline(policy: &Policy, lines: &[simulate::Line]) -> String {
    let mut rows = vec![["attempt", "at", "outcome", "verdict", "next in", "rule", "why"].map(String::from).to_vec()];
    let mut fate = String::new();
    let s = |v: simulate::Seconds| duration_ms(v.0);
    for line in lines {
        match line {
            simulate::Line::Try(t) => {
                // `rule` counts from 1 (0: none), as the delivery log does.
                let rule = t.rule.checked_sub(1).and_then(|i| policy.classify.get(i));
                let mut why: Vec<String> = Vec::new();
                if let Some(note) = rule.map(|r| r.note.as_str()).filter(|n| !n.is_empty()) {
                    why.push(note.to_owned());
                }
                if t.counts_toward_disable {
                    why.push("counts toward disable".into());
                }
                let next = match (t.next_delay_s, t.next_delay_min_s, t.next_delay_max_s) {
                    (Some(d), Some(lo), Some(hi)) if lo != hi => format!("{} ({}–{})", s(d), s(lo), s(hi)),
                    (Some(d), _, _) => s(d),
                    _ => "-".into(),
                };
                if t.next_delay_s.is_none() && t.verdict == "retry" {
                    why.push(format!("nothing left to try: {}", t.status));
                } else if t.next_delay_s.is_none() && t.verdict == "terminal" {
                    why.push(format!("ends the delivery: {}", t.status));
                }
                let attempt = if t.try_no > 1 { format!("{}.{}", t.attempt, t.try_no) } else { t.attempt.to_string() };
                rows.push(vec![
                    attempt,
                    s(t.at_s),
                    t.outcome.clone(),
                    t.verdict.to_owned(),
                    next,
                    rule.map_or_else(|| "-".to_owned(), |r| format!("{}: {}", t.rule, r.when.join(" "))),
                    why.join("; "),
                ]);
            }
            simulate::Line::Final(f) => {
                let word = if f.status == f.final_state { String::new() } else { format!(" (the profile says {})", f.status) };
                let plural = if f.attempts == 1 { "" } else { "s" };
                fate = format!("{}{word} after {} attempt{plural}\n", f.final_state, f.attempts);
            }
        }
    }
    let legend = if rows.iter().any(|r| r[0].contains('.')) { "(1.2: attempt 1, try 2, a micro-retry inside the attempt)\n" } else { "" };
    let shape = shape_summary(policy).map_or_else(String::new, |s| format!(" ({s})"));
    format!("policy {}{shape}\n\n{}{legend}\n{fate}", policy.name, table(&rows))
}

/// What a policy's requests look like beyond hookline's default shape (a CloudEvents format, a CloudEvents
/// handshake), for `check` and the timeline; `None` for the default.
fn shape_summary(p: &Policy) -> Option<String> {
    let mut parts = Vec::new();
    match p.request.format {
        policy::RequestFormat::Envelope => {}
        policy::RequestFormat::CloudeventsBinary => parts.push("requests: CloudEvents, binary mode".to_owned()),
        policy::RequestFormat::CloudeventsStructured => parts.push("requests: CloudEvents, structured mode".to_owned()),
    }
    if let Some(origin) = p.verification.as_ref().and_then(|v| v.cloudevents_origin()) {
        parts.push(format!("verification: CloudEvents handshake as {origin}"));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// `--policy`: a built-in name first (a file called `gauge` in the working directory does not shadow it), else a
/// path.
fn load(spec: &str) -> anyhow::Result<Policy> {
    if let Some(p) = policy::builtin(spec) {
        return Ok(p);
    }
    match read_policy_file(spec)? {
        Some(text) => policy::parse(&text).with_context(|| format!("--policy {spec}: invalid policy")),
        None => {
            let hint = hookline_core::words::did_you_mean(spec, BUILTIN_NAMES.iter().copied())
                .map_or_else(String::new, |p| format!("; did you mean {p:?}?"));
            bail!("--policy {spec:?}: not a built-in profile ({}) and no such file{hint}", BUILTIN_NAMES.join(", "))
        }
    }
}

/// The file's text, or `None` if there is no file at `path`.
fn read_policy_file(path: &str) -> anyhow::Result<Option<String>> {
    let p = Path::new(path);
    if !p.is_file() {
        return Ok(None);
    }
    std::fs::read_to_string(p).map(Some).with_context(|| format!("cannot read policy file {path}"))
}
