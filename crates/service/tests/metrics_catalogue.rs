//! docs/metrics.md lists exactly the metrics the code emits: every `counter!("…")`, `gauge!("…")` and
//! `histogram!("…")` in `crates/*/src` has a row in the catalogue, and every row is emitted somewhere.
//! (scripts/check-deploy runs the same check, plus the alerts and dashboard against the catalogue.)

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Metric name → first file emitting it.
fn emitted() -> BTreeMap<String, String> {
    let mut files = Vec::new();
    for krate in std::fs::read_dir(workspace().join("crates")).expect("crates/").flatten() {
        rust_files(&krate.path().join("src"), &mut files);
    }
    let mut found = BTreeMap::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("readable source");
        for mac in ["counter!(", "gauge!(", "histogram!("] {
            for (at, _) in text.match_indices(mac) {
                let rest = text[at + mac.len()..].trim_start();
                if let Some(lit) = rest.strip_prefix('"') {
                    if let Some(end) = lit.find('"') {
                        let rel = file.strip_prefix(workspace()).unwrap_or(&file).display().to_string();
                        found.entry(lit[..end].to_owned()).or_insert(rel);
                    }
                }
            }
        }
    }
    found
}

/// Names in the first column of the catalogue's tables: "| `hookline_…` |".
fn catalogued() -> Vec<String> {
    let doc = std::fs::read_to_string(workspace().join("docs/metrics.md")).expect("docs/metrics.md");
    doc.lines()
        .filter_map(|l| l.trim_start().strip_prefix('|')?.trim_start().strip_prefix('`'))
        .filter_map(|l| l.split_once('`').map(|(name, _)| name.to_owned()))
        .filter(|n| n.starts_with("hookline_"))
        .collect()
}

#[test]
fn every_emitted_metric_is_catalogued_and_every_catalogued_metric_is_emitted() {
    let code = emitted();
    let doc = catalogued();
    assert!(code.len() >= 10, "the source scan found only {code:?}");
    let missing: Vec<String> = code.iter().filter(|(n, _)| !doc.contains(n)).map(|(n, f)| format!("{n} (emitted in {f})")).collect();
    let stale: Vec<&String> = doc.iter().filter(|n| !code.contains_key(*n)).collect();
    assert!(missing.is_empty(), "metrics emitted but not listed in docs/metrics.md: {missing:?}");
    assert!(stale.is_empty(), "metrics listed in docs/metrics.md but emitted nowhere in crates/*/src: {stale:?}");
}

/// The hookline.toml in deploy/kubernetes/configmap.yaml (the Helm chart rendered with default values) loads.
#[test]
fn rendered_kubernetes_config_loads() {
    let manifest = std::fs::read_to_string(workspace().join("deploy/kubernetes/configmap.yaml")).expect("configmap");
    let mut toml = String::new();
    for line in manifest.lines().skip_while(|l| !l.trim_start().starts_with("hookline.toml: |")).skip(1) {
        match line.strip_prefix("    ") {
            Some(body) => toml.push_str(body),
            None if line.trim().is_empty() => {}
            None => break,
        }
        toml.push('\n');
    }
    assert!(toml.contains("[kafka]"), "no hookline.toml found in configmap.yaml");
    let config = hookline_service::Config::from_toml_with_env(&toml, "deploy/kubernetes/configmap.yaml", Vec::new())
        .unwrap_or_else(|e| panic!("{e}\n---\n{toml}"));
    assert_eq!(config.dispatcher.group_id, "hookline-dispatcher");
    assert_eq!(config.dispatcher.health_addr.port(), 9091);
    assert_eq!(config.retry_scheduler.health_addr.port(), 9092);
    assert_eq!(config.ingest.listen_addr.port(), 8080);
}
