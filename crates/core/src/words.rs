//! Parser messages in a reader's words: "did you mean `max_attempts`?" for a key or name that is one typo away, and
//! "a whole number" where serde says `u64`. Used by the policy parser, the config loader and the CLI.

/// The candidate closest to `word`, if it is close enough to be the one meant (a typo or two).
pub fn did_you_mean<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates.into_iter().map(|c| (edit_distance(word, c), c)).filter(|(d, c)| *d > 0 && *d <= 2.max(c.len() / 4)).min().map(|(_, c)| c)
}

/// Adds "did you mean `x`?" to serde's "unknown field `y`, expected one of `a`, `b`" (or "unknown variant") when a
/// known one is close, and rewords Rust type names.
pub fn reword(message: &str) -> String {
    let message = plain_types(message);
    let lines: Vec<String> = message.split('\n').map(|line| hint_line(line).unwrap_or_else(|| line.to_owned())).collect();
    lines.join("\n")
}

/// One line with its hint, when it names an unknown field or variant that is a typo of a known one.
fn hint_line(line: &str) -> Option<String> {
    for prefix in ["unknown field `", "unknown variant `"] {
        let Some(rest) = line.split(prefix).nth(1) else {
            continue;
        };
        let Some((unknown, expected)) = rest.split_once('`') else {
            continue;
        };
        let known: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
        if let Some(k) = did_you_mean(unknown, known) {
            return Some(format!("{}; did you mean `{k}`?", line.trim_end()));
        }
    }
    None
}

/// serde's Rust type names as a reader says them: `expected u64` → `expected a whole number`.
pub fn plain_types(message: &str) -> String {
    let mut out = message.to_owned();
    for (rust, plain) in [
        ("expected u64", "expected a whole number"),
        ("expected u32", "expected a whole number"),
        ("expected u16", "expected a whole number"),
        ("expected u8", "expected a whole number"),
        ("expected usize", "expected a whole number"),
        ("expected i64", "expected a whole number"),
        ("expected i32", "expected a whole number"),
        ("expected f64", "expected a number"),
        ("expected f32", "expected a number"),
        ("expected a boolean", "expected true or false"),
    ] {
        // Whole words only (`u64` but not `u64s`).
        let mut rebuilt = String::with_capacity(out.len());
        let mut rest = out.as_str();
        while let Some(i) = rest.find(rust) {
            let after = &rest[i + rust.len()..];
            rebuilt.push_str(&rest[..i]);
            if after.starts_with(|c: char| c.is_ascii_alphanumeric()) {
                rebuilt.push_str(rust);
            } else {
                rebuilt.push_str(plain);
            }
            rest = after;
        }
        rebuilt.push_str(rest);
        out = rebuilt;
    }
    out
}

/// Levenshtein distance (keys and names are short).
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typo_gets_a_suggestion_and_a_stranger_does_not() {
        assert_eq!(did_you_mean("max_attemps", ["waits_s", "max_attempts", "jitter"]), Some("max_attempts"));
        assert_eq!(did_you_mean("stanard", ["standard", "lucibook", "fynapse", "relay", "gauge"]), Some("standard"));
        assert_eq!(did_you_mean("bogus", ["standard", "lucibook"]), None);
        assert_eq!(did_you_mean("standard", ["standard"]), None, "an exact match is no typo");
    }

    #[test]
    fn serde_messages_are_reworded() {
        assert_eq!(
            reword("unknown field `max_attemps`, expected one of `waits_s`, `max_attempts`"),
            "unknown field `max_attemps`, expected one of `waits_s`, `max_attempts`; did you mean `max_attempts`?"
        );
        assert_eq!(plain_types("invalid type: string \"10s\", expected u64"), "invalid type: string \"10s\", expected a whole number");
        assert_eq!(plain_types("expected usize"), "expected a whole number");
        assert_eq!(plain_types("expected u64s"), "expected u64s");
    }
}
