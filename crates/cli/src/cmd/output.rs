//! How commands print: a readable, aligned table for a person at a terminal; JSON lines for scripts (stdout not a
//! terminal, or `--json`). `--format human|json` forces one (tests pin the human output with it).

use std::io::IsTerminal;

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Format {
    Human,
    Json,
}

#[derive(clap::Args, Clone, Debug, Default)]
pub struct OutputArgs {
    /// Print JSON lines (the default when stdout is not a terminal).
    #[arg(long, conflicts_with = "format")]
    json: bool,
    /// Force the output format whatever stdout is.
    #[arg(long, value_enum, hide = true)]
    format: Option<Format>,
}

impl OutputArgs {
    pub fn format(&self) -> Format {
        match (self.json, self.format) {
            (true, _) => Format::Json,
            (false, Some(f)) => f,
            (false, None) if std::io::stdout().is_terminal() => Format::Human,
            (false, None) => Format::Json,
        }
    }
}

/// `0s`, `450ms`, `12s`, `1.5s`, `5m 23s`, `2h 5m`, `1d 4h 49m`: at most three units, from the largest.
pub fn duration_ms(ms: u64) -> String {
    if ms == 0 {
        return "0s".into();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    if ms < 60_000 {
        return match ms % 1000 {
            0 => format!("{}s", ms / 1000),
            frac if frac % 100 == 0 => format!("{}.{}s", ms / 1000, frac / 100),
            frac => format!("{}.{:03}s", ms / 1000, frac).trim_end_matches('0').to_owned(),
        };
    }
    let s = ms / 1000;
    let units = [(s / 86_400, "d"), ((s % 86_400) / 3600, "h"), ((s % 3600) / 60, "m"), (s % 60, "s")];
    let first = units.iter().position(|(n, _)| *n > 0).unwrap_or(3);
    let mut parts: Vec<String> = units[first..].iter().take(3).map(|(n, u)| format!("{n}{u}")).collect();
    while parts.len() > 1 && parts.last().is_some_and(|p| p.starts_with('0')) {
        parts.pop();
    }
    parts.join(" ")
}

/// Rows aligned in columns (two spaces apart); the last column is not padded.
pub fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> =
        (0..cols).map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(cell);
                line.push_str(&" ".repeat(widths[c] - cell.chars().count() + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_naturally() {
        let cases = [
            (0, "0s"),
            (450, "450ms"),
            (12_000, "12s"),
            (1_500, "1.5s"),
            (523, "523ms"),
            (2_186, "2.186s"),
            (60_000, "1m"),
            (323_000, "5m 23s"),
            (3_600_000, "1h"),
            (3_605_000, "1h 0m 5s"),
            (103_792_186, "1d 4h 49m"),
            (86_400_000, "1d"),
        ];
        for (ms, want) in cases {
            assert_eq!(duration_ms(ms), want, "{ms}");
        }
    }

    #[test]
    fn tables_align() {
        let t = table(&[vec!["a".into(), "bb".into(), "c".into()], vec!["ddd".into(), "e".into(), "f".into()]]);
        assert_eq!(t, "a    bb  c\nddd  e   f\n");
    }
}
