//! Event-type filters of subscriptions: exact (`invoice.paid`), everything (`*`), or a prefix wildcard
//! (`message.*` matches `message.received` and `message.read.v2`, not `message` itself).

/// Whether any of `patterns` matches `event_type`. An empty filter matches nothing.
pub fn matches_any<P: AsRef<str>>(patterns: &[P], event_type: &str) -> bool {
    patterns.iter().any(|p| matches(p.as_ref(), event_type))
}

pub fn matches(pattern: &str, event_type: &str) -> bool {
    match key(pattern) {
        Key::All => true,
        Key::Exact(name) => name == event_type,
        Key::Prefix(prefix) => event_type.len() > prefix.len() && event_type.starts_with(prefix),
        Key::Never => false,
    }
}

/// What a pattern matches, in a form an index can key on. [`matches`] is defined through it, so an index
/// built from `key` agrees with the linear filter by construction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key<'a> {
    /// `*`: every event type.
    All,
    /// Exactly this event type (any pattern not ending in `*`, even one with a `*` inside, is literal).
    Exact(&'a str),
    /// Event types longer than this prefix that start with it; the prefix ends with `.`.
    Prefix(&'a str),
    /// Nothing: a trailing `*` not preceded by `.` (such patterns are refused on save, but may be stored).
    Never,
}

pub fn key(pattern: &str) -> Key<'_> {
    if pattern == "*" {
        return Key::All;
    }
    match pattern.strip_suffix('*') {
        Some(prefix) if prefix.ends_with('.') => Key::Prefix(prefix),
        Some(_) => Key::Never,
        None => Key::Exact(pattern),
    }
}

/// The prefixes an index probes for `event_type`: each one ending in `.` that leaves at least one byte after it.
pub fn dot_prefixes(event_type: &str) -> impl Iterator<Item = &str> + '_ {
    event_type.match_indices('.').map(|(i, _)| &event_type[..=i]).filter(move |p| p.len() < event_type.len())
}

/// The routing rule: a subscription receives an event when both have the same tenant (an event without a tenant
/// goes only to subscriptions without one) and its filter matches the event's type.
pub fn delivers<P: AsRef<str>>(sub_tenant: &str, patterns: &[P], event_tenant: &str, event_type: &str) -> bool {
    sub_tenant == event_tenant && matches_any(patterns, event_type)
}

/// Longest accepted tenant id.
pub const MAX_TENANT_LEN: usize = 128;

/// Checks a tenant id (on publish and on subscription create): up to [`MAX_TENANT_LEN`] bytes of ASCII letters,
/// digits, `-`, `_`, `.` and `:`. Empty means "no tenant".
pub fn validate_tenant(tenant: &str) -> Result<(), String> {
    if tenant.len() > MAX_TENANT_LEN {
        return Err(format!("{} bytes is over the limit of {MAX_TENANT_LEN}", tenant.len()));
    }
    match tenant.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))) {
        Some(c) => Err(format!("{c:?} is not allowed; use ASCII letters, digits, `-`, `_`, `.` and `:`")),
        None => Ok(()),
    }
}

/// Checks a pattern for use in a subscription: non-empty, no whitespace, `*` only alone or as a final `.*`.
pub fn validate(pattern: &str) -> Result<(), String> {
    if pattern.is_empty() {
        return Err("an event type pattern must not be empty".into());
    }
    if pattern.chars().any(char::is_whitespace) {
        return Err(format!("event type pattern {pattern:?} contains whitespace"));
    }
    let stars = pattern.matches('*').count();
    if stars == 0 || pattern == "*" || (stars == 1 && pattern.ends_with(".*") && pattern.len() > 2) {
        Ok(())
    } else {
        Err(format!("event type pattern {pattern:?}: `*` may only stand alone or end a prefix as `.*`"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let cases = [
            ("*", "anything.at.all", true),
            ("invoice.paid", "invoice.paid", true),
            ("invoice.paid", "invoice.paid.v2", false),
            ("message.*", "message.received", true),
            ("message.*", "message.read.v2", true),
            ("message.*", "message", false),
            ("message.*", "message.", false),
            ("message.*", "messages.received", false),
        ];
        for (pattern, event_type, want) in cases {
            assert_eq!(matches(pattern, event_type), want, "{pattern} vs {event_type}");
        }
        assert!(!matches_any::<&str>(&[], "x"));
        assert!(matches_any(&["a", "b.*"], "b.c"));
    }

    #[test]
    fn validation() {
        for ok in ["*", "a", "a.b", "a.*", "a.b.*"] {
            assert!(validate(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a*", "*.a", "a.*.b", ".*", "a b", "a.**"] {
            assert!(validate(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn keys_and_prefixes() {
        assert_eq!(key("*"), Key::All);
        assert_eq!(key("a.b"), Key::Exact("a.b"));
        assert_eq!(key("a.*.c"), Key::Exact("a.*.c"));
        assert_eq!(key("a.*"), Key::Prefix("a."));
        assert_eq!(key(".*"), Key::Prefix("."));
        assert_eq!(key("a*"), Key::Never);
        assert_eq!(key("a.**"), Key::Never);
        assert_eq!(dot_prefixes("a.b.c").collect::<Vec<_>>(), ["a.", "a.b."]);
        assert_eq!(dot_prefixes("a.").count(), 0);
        assert_eq!(dot_prefixes("..").collect::<Vec<_>>(), ["."]);
        assert_eq!(dot_prefixes("plain").count(), 0);
    }

    #[test]
    fn tenants_route_only_to_their_own() {
        let all = ["*".to_string()];
        assert!(delivers("a", &all, "a", "x"));
        assert!(!delivers("a", &all, "b", "x"));
        assert!(!delivers("a", &all, "", "x"));
        assert!(!delivers("", &all, "a", "x"));
        assert!(delivers("", &all, "", "x"));
    }

    #[test]
    fn tenant_validation() {
        for ok in ["", "acme", "org_1.eu-west:2", &"t".repeat(MAX_TENANT_LEN)] {
            assert!(validate_tenant(ok).is_ok(), "{ok}");
        }
        for bad in ["a b", "a/b", "é", "a\n", &"t".repeat(MAX_TENANT_LEN + 1)] {
            assert!(validate_tenant(bad).is_err(), "{bad}");
        }
    }
}
