//! `--repeat N` and `--against PATH`, for every scenario, around its one run ([`super::one`]).
//!
//! `--repeat N`: the scenario runs N times; every numeric figure of its JSON object (top level, and one object
//! down as `a.b`) is reported with its min / median / max under `spread`, the first run's object stays the
//! scenario's own keys, and the target is met only if every run met it.
//!
//! `--against PATH`: N pairs, each one run of this build's services and one of the other build's, in the order
//! this, other, other, this, … so that a host whose speed drifts over the session weighs on both builds alike.
//! Each figure is reported per build (min / median / max) and as the ratio this ÷ other per pair, with its min and
//! median: a pair's two runs are next to each other in time, so the ratio compares builds on the same host state.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{json, Map, Value};

use super::stats::spread;
use super::{round, BenchArgs, Scenario};

/// The other build of an A/B run.
pub struct Other {
    pub path: PathBuf,
    /// What it answered to `--version`.
    pub version: String,
}

/// Scenarios whose figures come from the services (the ones `--against` swaps); fanout, list and log run in the
/// bench's own process.
pub fn supports_against(s: Scenario) -> bool {
    !matches!(s, Scenario::Fanout | Scenario::List | Scenario::Log)
}

/// The other build exists and answers `--version` as hookline (within 10 s).
pub fn check_against(path: &Path) -> anyhow::Result<Other> {
    let shown = path.display();
    let meta = std::fs::metadata(path).with_context(|| format!("--against {shown}: no such file"))?;
    anyhow::ensure!(meta.is_file(), "--against {shown}: not a file");
    let path = std::fs::canonicalize(path).with_context(|| format!("--against {shown}"))?;
    let mut child = Command::new(&path)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("--against {shown}: cannot run it"))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!("--against {shown}: `--version` did not answer within 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        let _ = stdout.by_ref().take(4096).read_to_string(&mut out);
    }
    let version = out.trim().to_owned();
    anyhow::ensure!(
        status.success() && version.starts_with("hookline "),
        "--against {shown}: `--version` did not answer as hookline ({status}, {version:?})"
    );
    Ok(Other { path, version })
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Build {
    This,
    Other,
}

/// The builds of pair `i` in the order they run: this, other, then other, this, …
fn pair_order(i: usize) -> [Build; 2] {
    if i.is_multiple_of(2) {
        [Build::This, Build::Other]
    } else {
        [Build::Other, Build::This]
    }
}

/// Runs scenario `s` once, `--repeat` times, or in `--repeat` pairs against `other`.
pub async fn run(args: &BenchArgs, s: Scenario, other: Option<&Other>) -> anyhow::Result<(Map<String, Value>, bool)> {
    let n = args.repeat.max(1);
    let paired = other.filter(|_| supports_against(s));
    if other.is_some() && paired.is_none() {
        eprintln!("  --against: {} runs in-process, so it runs unpaired", s.name());
    }
    match paired {
        None if n == 1 => super::one(args, s).await,
        None => {
            let mut runs = Vec::with_capacity(n);
            let mut met = Vec::with_capacity(n);
            for i in 0..n {
                eprintln!("  ── repeat {} of {n}", i + 1);
                let (m, ok) = super::one(args, s).await?;
                runs.push(m);
                met.push(ok);
            }
            Ok(summarise_repeats(runs, &met))
        }
        Some(o) => {
            let (mut this, mut that, mut met) = (Vec::new(), Vec::new(), Vec::new());
            for i in 0..n {
                for b in pair_order(i) {
                    let label = match b {
                        Build::This => "this build".to_owned(),
                        Build::Other => format!("other build, {} ({})", o.version, o.path.display()),
                    };
                    eprintln!("  ── pair {} of {n}: {label}", i + 1);
                    let mut a = args.clone();
                    a.services_exe = (b == Build::Other).then(|| o.path.clone());
                    let (m, ok) = super::one(&a, s).await?;
                    match b {
                        Build::This => {
                            this.push(m);
                            met.push(ok);
                        }
                        Build::Other => that.push(m),
                    }
                }
            }
            Ok(summarise_pairs(this, that, &met, o))
        }
    }
}

/// Every numeric figure of a scenario's object: numbers at the top level and one object down (`a.b`), in the
/// object's order. Arrays, strings and booleans are not figures.
fn figures(m: &Map<String, Value>) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    for (k, v) in m {
        match v {
            Value::Number(x) => out.extend(x.as_f64().map(|x| (k.clone(), x))),
            Value::Object(inner) => {
                for (k2, v2) in inner {
                    if let Some(x) = v2.as_f64() {
                        out.push((format!("{k}.{k2}"), x));
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// The value of figure `key` in each run (NaN where a run lacks it).
fn column(runs: &[Vec<(String, f64)>], key: &str) -> Vec<f64> {
    runs.iter().map(|r| r.iter().find(|(k, _)| k == key).map_or(f64::NAN, |(_, v)| *v)).collect()
}

/// 4 significant digits (figures span 0.0004 CPU-s to 100,000 deliveries).
fn sig(v: f64) -> f64 {
    if v == 0.0 || !v.is_finite() {
        return v;
    }
    let digits = 3 - v.abs().log10().floor() as i32;
    round(v, digits.clamp(0, 12))
}

fn spread_json(v: &[f64]) -> Value {
    match spread(v) {
        Some((min, median, max)) => json!({"min": sig(min), "median": sig(median), "max": sig(max)}),
        None => Value::Null,
    }
}

fn num(v: f64) -> String {
    if v.is_nan() {
        "-".into()
    } else {
        sig(v).to_string()
    }
}

fn spread_text(v: &[f64]) -> String {
    match spread(v) {
        Some((min, median, max)) => format!("{} ({}–{})", num(median), num(min), num(max)),
        None => "-".into(),
    }
}

/// N runs of one build: the first run's object, plus `repeat`, `repeats_met`, `spread` and every run's object.
fn summarise_repeats(runs: Vec<Map<String, Value>>, met: &[bool]) -> (Map<String, Value>, bool) {
    let n = runs.len();
    let figs: Vec<_> = runs.iter().map(figures).collect();
    let mut spread_m = Map::new();
    eprintln!("\n  {:<52} {:>30}", format!("figure ({n} repeats)"), "median (min–max)");
    eprintln!("  {}", "─".repeat(84));
    for (key, _) in figs.first().map(Vec::as_slice).unwrap_or_default() {
        let col = column(&figs, key);
        eprintln!("  {key:<52} {:>30}", spread_text(&col));
        let mut o = spread_json(&col);
        if let Value::Object(m) = &mut o {
            m.insert("values".into(), json!(col.iter().map(|v| sig(*v)).collect::<Vec<_>>()));
        }
        spread_m.insert(key.clone(), o);
    }
    let met_n = met.iter().filter(|m| **m).count();
    eprintln!("  targets met in {met_n} of {n} repeats");
    let mut out = runs.first().cloned().unwrap_or_default();
    out.insert("repeat".into(), json!(n));
    out.insert("repeats_met".into(), json!(met_n));
    out.insert("spread".into(), Value::Object(spread_m));
    out.insert("runs".into(), Value::Array(runs.into_iter().map(Value::Object).collect()));
    (out, met_n == n && n > 0)
}

/// N pairs: this build's first run's object, plus `against`, `repeat`, `repeats_met` (this build's), `ab` (per
/// figure: each build's spread, the ratio this ÷ other per pair, its min and median) and every run's object.
fn summarise_pairs(
    this: Vec<Map<String, Value>>,
    that: Vec<Map<String, Value>>,
    met: &[bool],
    other: &Other,
) -> (Map<String, Value>, bool) {
    let n = this.len().min(that.len());
    let (ft, fo): (Vec<_>, Vec<_>) = (this.iter().map(figures).collect(), that.iter().map(figures).collect());
    let mut ab = Map::new();
    eprintln!("\n  A/B against {} ({}), {n} pairs; ratio = this ÷ other, per pair", other.version, other.path.display());
    eprintln!("  {:<44} {:>22} {:>22} {:>16}", "figure", "this: median (min–max)", "other: median (min–max)", "ratio min / med");
    eprintln!("  {}", "─".repeat(108));
    for (key, _) in ft.first().map(Vec::as_slice).unwrap_or_default() {
        let (t, o) = (column(&ft, key), column(&fo, key));
        let ratios: Vec<f64> =
            t.iter().zip(&o).map(|(t, o)| if *o != 0.0 && o.is_finite() && t.is_finite() { t / o } else { f64::NAN }).collect();
        let (rmin, rmed) = spread(&ratios).map_or((f64::NAN, f64::NAN), |(a, b, _)| (a, b));
        eprintln!("  {key:<44} {:>22} {:>22} {:>16}", spread_text(&t), spread_text(&o), format!("{} / {}", num(rmin), num(rmed)));
        ab.insert(
            key.clone(),
            json!({
                "this": spread_json(&t),
                "other": spread_json(&o),
                "ratio": ratios.iter().map(|r| sig(*r)).collect::<Vec<_>>(),
                "ratio_min": sig(rmin),
                "ratio_median": sig(rmed),
            }),
        );
    }
    let met_n = met.iter().filter(|m| **m).count();
    eprintln!("  this build met its targets in {met_n} of {n} runs");
    let mut out = this.first().cloned().unwrap_or_default();
    out.insert("against".into(), json!({"path": other.path.display().to_string(), "version": other.version}));
    out.insert("repeat".into(), json!(n));
    out.insert("repeats_met".into(), json!(met_n));
    out.insert("ab".into(), Value::Object(ab));
    let objs = |v: Vec<Map<String, Value>>| Value::Array(v.into_iter().map(Value::Object).collect());
    out.insert("runs".into(), json!({"this": objs(this), "other": objs(that)}));
    (out, met_n == n && n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => panic!("an object"),
        }
    }

    #[test]
    fn pairs_alternate_which_build_goes_first() {
        let order: Vec<Build> = (0..4).flat_map(pair_order).collect();
        use Build::*;
        assert_eq!(order, [This, Other, Other, This, This, Other, Other, This]);
    }

    #[test]
    fn figures_are_the_numbers_at_the_top_and_one_object_down() {
        let m = obj(json!({"rate": 5.0, "ok": true, "name": "x", "list": [1, 2], "cpu": {"dispatcher": 0.05, "deep": {"x": 1}}}));
        let mut f = figures(&m);
        f.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(f, [("cpu.dispatcher".to_owned(), 0.05), ("rate".to_owned(), 5.0)]);
    }

    #[test]
    fn repeats_report_each_figure_spread_and_meet_the_target_only_if_every_run_did() {
        let runs = vec![obj(json!({"ratio": 0.95})), obj(json!({"ratio": 0.85})), obj(json!({"ratio": 1.05}))];
        let (out, met) = summarise_repeats(runs.clone(), &[true, false, true]);
        assert!(!met, "one repeat missed");
        assert_eq!(out["ratio"], json!(0.95), "the first run's figures keep their names");
        assert_eq!(out["spread"]["ratio"], json!({"min": 0.85, "median": 0.95, "max": 1.05, "values": [0.95, 0.85, 1.05]}));
        assert_eq!(out["repeats_met"], json!(2));
        assert_eq!(out["runs"].as_array().map(Vec::len), Some(3));
        assert!(summarise_repeats(runs, &[true, true, true]).1);
    }

    #[test]
    fn pairs_report_both_builds_and_the_ratio_per_pair() {
        let other = Other { path: "/x/hookline-old".into(), version: "hookline 0.1.0".into() };
        let this = vec![obj(json!({"per_s": 110.0, "mb": 50.0})), obj(json!({"per_s": 90.0, "mb": 50.0}))];
        let that = vec![obj(json!({"per_s": 100.0, "mb": 0.0})), obj(json!({"per_s": 100.0, "mb": 100.0}))];
        let (out, met) = summarise_pairs(this, that, &[true, true], &other);
        assert!(met);
        let ab = &out["ab"]["per_s"];
        assert_eq!(ab["ratio"], json!([1.1, 0.9]));
        assert_eq!((ab["ratio_min"].as_f64(), ab["ratio_median"].as_f64()), (Some(0.9), Some(0.9)));
        assert_eq!(ab["this"], json!({"min": 90.0, "median": 90.0, "max": 110.0}));
        assert_eq!(ab["other"]["max"], json!(100.0));
        // A zero on the other side gives no ratio for that pair (never inf), the other pairs still count.
        assert_eq!(out["ab"]["mb"]["ratio"], json!([null, 0.5]));
        assert_eq!(out["ab"]["mb"]["ratio_median"], json!(0.5));
        assert_eq!(out["against"]["version"], json!("hookline 0.1.0"));
        assert_eq!(out["runs"]["other"].as_array().map(Vec::len), Some(2));
        assert!(!summarise_pairs(vec![obj(json!({"a": 1}))], vec![obj(json!({"a": 1}))], &[false], &other).1);
    }

    #[test]
    fn significant_digits() {
        assert_eq!(sig(0.000_432_19), 0.000_432_2);
        assert_eq!(sig(12_345.6), 12_346.0);
        assert_eq!(sig(0.9512), 0.9512);
        assert!(sig(f64::NAN).is_nan());
    }

    #[test]
    fn the_other_build_must_exist_and_answer_as_hookline() {
        let missing = check_against(Path::new("/nonexistent/hookline-old")).err().map(|e| format!("{e:#}"));
        assert!(missing.as_deref().is_some_and(|e| e.contains("--against /nonexistent/hookline-old: no such file")), "{missing:?}");
        let dir = std::env::temp_dir().join(format!("hookline-against-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let script = |name: &str, body: &str| {
            use std::os::unix::fs::PermissionsExt;
            let p = dir.join(name);
            std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).expect("write script");
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
            p
        };
        let not_hookline = check_against(&script("other-tool", "echo 'other-tool 1.0'")).err().map(|e| format!("{e:#}"));
        assert!(not_hookline.as_deref().is_some_and(|e| e.contains("did not answer as hookline")), "{not_hookline:?}");
        let failing = check_against(&script("broken", "echo 'hookline 0.1.0'; exit 3")).err().map(|e| format!("{e:#}"));
        assert!(failing.as_deref().is_some_and(|e| e.contains("did not answer as hookline")), "{failing:?}");
        let ok = check_against(&script("hookline-old", "echo 'hookline 0.1.0'")).expect("answers as hookline");
        assert_eq!(ok.version, "hookline 0.1.0");
        assert!(check_against(&dir).err().is_some_and(|e| e.to_string().contains("not a file")));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
