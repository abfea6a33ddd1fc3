//! Event-type filters of subscriptions: exact (`invoice.paid`), everything (`*`), or a prefix wildcard
//! (`message.*` matches `message.received` and `message.read.v2`, not `message` itself).

/// Whether any of `patterns` matches `event_type`. An empty filter matches nothing.
pub fn matches_any(patterns: &[String], event_type: &str) -> bool {
    patterns.iter().any(|p| matches(p, event_type))
}

pub fn matches(pattern: &str, event_type: &str) -> bool {
    if pattern == "*" {
        return true;
    }
    match pattern.strip_suffix('*') {
        Some(prefix) => prefix.ends_with('.') && event_type.len() > prefix.len() && event_type.starts_with(prefix),
        None => pattern == event_type,
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
        assert!(!matches_any(&[], "x"));
        assert!(matches_any(&["a".into(), "b.*".into()], "b.c"));
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
}
