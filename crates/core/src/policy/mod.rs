//! Policies: the document (`document.rs`), the built-in profiles (`profiles/*.toml`), parsing and validation.
//!
//! A policy reaches the engine only through [`parse`], [`builtin`] or [`resolve`], all of which validate, so the
//! engine can rely on a total classification and a bounded schedule. `docs/policies.md` is the reference.

mod document;
pub(crate) mod matcher;
mod validate;

use std::fmt;
use std::sync::OnceLock;

pub use document::*;
pub use validate::validate;

use crate::engine::{FinalState, Wait};

/// Names of the built-in profiles, the default first.
pub const BUILTIN_NAMES: &[&str] = &["standard", "lucibook", "fynapse", "relay", "gauge"];

/// The profile used when a subscription names none.
pub const DEFAULT_PROFILE: &str = "standard";

/// The most attempts a policy may allow (and so the longest `policy simulate` output, micro-retries aside).
pub const MAX_ATTEMPTS_LIMIT: u32 = 1000;

/// The longest wait a policy may state (`waits_s`, `exponential.initial_s`/`max_s`, `retry_after.max_s`): 30 days.
pub const MAX_WAIT_S: f64 = 30.0 * 86_400.0;
/// The longest window (`max_window_s`, `disable.after_failing_for_s`): 400 days.
pub const MAX_WINDOW_S: f64 = 400.0 * 86_400.0;
/// The longest `attempt.timeout_ms`: 10 minutes.
pub const MAX_TIMEOUT_MS: u64 = 600_000;

/// The embedded TOML text of each built-in profile, in `BUILTIN_NAMES` order.
const BUILTIN_SOURCES: [(&str, &str); 5] = [
    ("standard", include_str!("profiles/standard.toml")),
    ("lucibook", include_str!("profiles/lucibook.toml")),
    ("fynapse", include_str!("profiles/fynapse.toml")),
    ("relay", include_str!("profiles/relay.toml")),
    ("gauge", include_str!("profiles/gauge.toml")),
];

/// One thing wrong with a policy, at a key path such as `classify[2].when[0]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issue {
    pub path: String,
    pub message: String,
}

impl fmt::Display for Issue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// The text is not TOML, or has an unknown key or a wrong type. The message is toml's, which names the key,
    /// line and column.
    #[error("invalid policy document: {0}")]
    Syntax(String),
    /// The document parsed but breaks a rule; every issue found, each naming its key path.
    #[error("{}", join_issues(.0))]
    Invalid(Vec<Issue>),
    #[error("unknown policy profile {name:?}{}: the built-in profiles are {}", profile_hint(name), BUILTIN_NAMES.join(", "))]
    UnknownProfile { name: String },
}

impl PolicyError {
    /// The individual problems (one for syntax errors and unknown profiles), without the "invalid policy
    /// document" a caller that lists them under its own heading would repeat.
    pub fn issues(&self) -> Vec<String> {
        match self {
            PolicyError::Invalid(issues) => issues.iter().map(ToString::to_string).collect(),
            PolicyError::Syntax(message) => vec![message.clone()],
            other => vec![other.to_string()],
        }
    }
}

/// ` (did you mean "standard"?)` for a name one typo away from a built-in profile.
fn profile_hint(name: &str) -> String {
    crate::words::did_you_mean(name, BUILTIN_NAMES.iter().copied()).map_or_else(String::new, |p| format!(" (did you mean {p:?}?)"))
}

fn join_issues(issues: &[Issue]) -> String {
    match issues {
        [] => "invalid policy".to_owned(),
        [one] => one.to_string(),
        many => {
            let list: Vec<String> = many.iter().map(ToString::to_string).collect();
            format!("{} problems: {}", many.len(), list.join("; "))
        }
    }
}

/// Parses a policy document and validates it.
pub fn parse(toml_text: &str) -> Result<Policy, PolicyError> {
    let policy: Policy = toml::from_str(toml_text).map_err(|e| PolicyError::Syntax(crate::words::reword(e.to_string().trim_end())))?;
    validate(&policy)?;
    Ok(policy)
}

/// The built-in profile called `name`.
pub fn builtin(name: &str) -> Option<Policy> {
    static PARSED: OnceLock<Vec<(&'static str, Policy)>> = OnceLock::new();
    let parsed = PARSED.get_or_init(|| {
        BUILTIN_SOURCES
            .iter()
            // The profiles are part of the binary and tested; one that failed to parse would be a build defect, and
            // leaving it out (so it reads as unknown) is safer than panicking in a dispatcher.
            .filter_map(|(n, text)| parse(text).ok().map(|p| (*n, p)))
            .collect()
    });
    parsed.iter().find(|(n, _)| *n == name).map(|(_, p)| p.clone())
}

/// The embedded TOML of a built-in profile, comments included (what `hookline policy show` prints).
pub fn builtin_source(name: &str) -> Option<&'static str> {
    BUILTIN_SOURCES.iter().find(|(n, _)| *n == name).map(|(_, text)| *text)
}

/// A subscription's policy: its inline document if it has one, else the built-in profile it names (the default
/// when it names none).
pub fn resolve(name: &str, inline_toml: &str) -> Result<Policy, PolicyError> {
    if !inline_toml.trim().is_empty() {
        return parse(inline_toml);
    }
    let name = name.trim();
    let name = if name.is_empty() { DEFAULT_PROFILE } else { name };
    builtin(name).ok_or_else(|| PolicyError::UnknownProfile { name: name.to_owned() })
}

/// A built-in profile, parsed once per process and shared: every subscription on it holds this one copy.
pub fn builtin_shared(name: &str) -> Option<std::sync::Arc<Policy>> {
    static SHARED: OnceLock<Vec<(&'static str, std::sync::Arc<Policy>)>> = OnceLock::new();
    let shared =
        SHARED.get_or_init(|| BUILTIN_SOURCES.iter().filter_map(|(n, _)| builtin(n).map(|p| (*n, std::sync::Arc::new(p)))).collect());
    shared.iter().find(|(n, _)| *n == name).map(|(_, p)| p.clone())
}

/// [`resolve`], with a built-in profile shared ([`builtin_shared`]); an inline document is parsed anew.
pub fn resolve_shared(name: &str, inline_toml: &str) -> Result<std::sync::Arc<Policy>, PolicyError> {
    if !inline_toml.trim().is_empty() {
        return parse(inline_toml).map(std::sync::Arc::new);
    }
    let name = name.trim();
    let name = if name.is_empty() { DEFAULT_PROFILE } else { name };
    builtin_shared(name).ok_or_else(|| PolicyError::UnknownProfile { name: name.to_owned() })
}

/// Seconds (as policies write them) to whole milliseconds, rounded; NaN and negatives are 0, huge values saturate.
pub(crate) fn secs_to_ms(s: f64) -> u64 {
    if s.is_nan() || s <= 0.0 {
        0
    } else {
        // `as` saturates at u64::MAX for large and infinite values.
        (s * 1000.0).round() as u64
    }
}

impl FinalKind {
    pub fn state(self) -> FinalState {
        match self {
            FinalKind::Failed => FinalState::Failed,
            FinalKind::Dead => FinalState::Dead,
        }
    }
}

impl Policy {
    /// The profile's own word for a final state (Fynapse: `DELIVERED`, `DEAD_LETTER`).
    pub fn status_word(&self, s: FinalState) -> &str {
        let w = &self.status_words;
        match s {
            FinalState::Succeeded => &w.succeeded,
            FinalState::Failed => &w.failed,
            FinalState::Dead => &w.dead,
            FinalState::Cancelled => &w.cancelled,
        }
    }

    /// Total attempts allowed, the first included: explicit, or implied by an explicit list of waits. `None` for
    /// an exponential schedule bounded only by its window.
    pub fn max_attempts(&self) -> Option<u32> {
        self.schedule
            .max_attempts
            .or_else(|| self.schedule.waits_s.as_ref().map(|w| u32::try_from(w.len()).unwrap_or(u32::MAX).saturating_add(1)))
    }

    /// The scheduled wait after attempt `after_attempt` ends, before jitter and Retry-After: `ms` is the base
    /// wait and `min_ms..=max_ms` the range jitter draws from. `None` when no further attempt is scheduled.
    /// The window (`max_window_s`) is not checked here: it depends on the clock, see `engine::decide`.
    pub fn scheduled_wait(&self, after_attempt: u32) -> Option<Wait> {
        if after_attempt == 0 || self.max_attempts().is_some_and(|max| after_attempt >= max) {
            return None;
        }
        let s = &self.schedule;
        let base_s = if let Some(waits) = &s.waits_s {
            *waits.get(usize::try_from(after_attempt - 1).ok()?)?
        } else {
            let e = s.exponential.as_ref()?;
            let exp = i32::try_from(after_attempt - 1).unwrap_or(i32::MAX);
            // powi may reach infinity for long schedules; min() then yields the cap.
            (e.initial_s * e.multiplier.powi(exp)).min(e.max_s)
        };
        let base = secs_to_ms(base_s);
        let (min_ms, max_ms) = match &s.jitter {
            None => (base, base),
            Some(j) => {
                let r = if j.ratio.is_finite() { j.ratio.clamp(0.0, 1.0) } else { 0.0 };
                let hi = secs_to_ms(base_s * (1.0 + r)).max(base);
                match j.mode {
                    JitterMode::PlusMinus => (secs_to_ms(base_s * (1.0 - r)).min(base), hi),
                    JitterMode::Plus => (base, hi),
                }
            }
        };
        Some(Wait { ms: base, min_ms, max_ms })
    }

    /// A one-line summary for `hookline policy list`.
    pub fn summary(&self) -> &str {
        if self.description.is_empty() {
            &self.name
        } else {
            &self.description
        }
    }
}

#[cfg(test)]
mod tests;
