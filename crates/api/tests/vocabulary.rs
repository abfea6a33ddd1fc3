//! docs/api.md's vocabulary table is the one list of words: checked here against the code (core's lists and
//! enums), the OpenAPI document and the portal's sources, so a renamed or added word cannot drift apart.

use std::collections::BTreeMap;

use hookline_core::subscription::{Activity, Health};
use hookline_core::vocabulary::{DeadLetterReason, DELIVERY_STATES, ENDPOINT_CONDITIONS};
use hookline_core::Verdict;
use serde_json::Value;

fn read(rel: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The rows of the first table under `heading`: first cell → the `code` words of the last cell.
fn table_under(doc: &str, heading: &str) -> BTreeMap<String, Vec<String>> {
    let start = doc.find(heading).unwrap_or_else(|| panic!("no {heading:?} in docs/api.md"));
    let mut rows = BTreeMap::new();
    let mut in_table = false;
    for line in doc[start..].lines().skip(1) {
        if line.starts_with('|') {
            in_table = true;
            let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
            if cells[0] == "Concept" || cells[0] == "Reason" || cells[0].starts_with("---") {
                continue;
            }
            let words = |cell: &str| cell.split('`').skip(1).step_by(2).map(str::to_owned).collect::<Vec<_>>();
            rows.insert(cells[0].to_owned(), words(cells[cells.len() - 1]));
            if heading.contains("reasons") {
                // Here the reasons are in the first cell and the row's key is each of them.
                let reasons = words(cells[0]);
                rows.remove(cells[0]);
                for r in reasons {
                    rows.insert(r, vec![cells[cells.len() - 1].to_owned()]);
                }
            }
        } else if in_table {
            break;
        }
    }
    rows
}

/// The words of an enum (a nullable field's enum also lists `null`, which is no word).
fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .filter(|x| !x.is_null())
        .map(|x| x.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn the_vocabulary_table_is_the_codes_words() {
    let doc = read("../../docs/api.md");
    let table = table_under(&doc, "## Vocabulary");
    let own = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    assert_eq!(table["delivery state"], own(&DELIVERY_STATES));
    let activities = [Activity::Active, Activity::Paused, Activity::Disabled, Activity::PendingVerification];
    assert_eq!(table["subscription state"], activities.iter().map(|a| a.word().to_owned()).collect::<Vec<_>>());
    assert_eq!(table["endpoint condition"], own(&ENDPOINT_CONDITIONS));
    assert_eq!(table["endpoint health"], Health::ALL.iter().map(|h| h.word().to_owned()).collect::<Vec<_>>());
    assert_eq!(table["credential kind"], own(&hookline_api::auth::CREDENTIAL_KINDS));
    assert_eq!(table["verification"], own(&hookline_core::vocabulary::VERIFICATION_STATES));
    assert_eq!(table["attempt verdict"], own(&[Verdict::Success.as_str(), Verdict::Retry.as_str(), Verdict::Terminal.as_str()]));
    assert_eq!(table["dead-letter reason"], own(&DeadLetterReason::words()));
    assert_eq!(table["chart class"], own(&hookline_api::STATS_CLASSES));
}

#[test]
fn the_dead_letter_reasons_table_says_which_are_redrivable() {
    let doc = read("../../docs/api.md");
    let table = table_under(&doc, "### Dead-letter reasons");
    let documented: Vec<&String> = table.keys().collect();
    let mut words: Vec<String> = DeadLetterReason::words().into_iter().map(str::to_owned).collect();
    words.sort();
    assert_eq!(documented, words.iter().collect::<Vec<_>>(), "every reason the code writes, and no other");
    for (reason, cell) in &table {
        let redrivable = cell[0].starts_with("yes");
        assert_eq!(redrivable, DeadLetterReason::delivery_reason(reason).is_some(), "{reason}: {cell:?}");
    }
}

#[test]
fn the_openapi_document_uses_the_same_words() {
    let doc: Value = serde_json::from_str(&read("src/openapi.json")).unwrap();
    let schemas = &doc["components"]["schemas"];
    let own = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    assert_eq!(strings(&schemas["DeliveryBase"]["properties"]["state"]["enum"]), own(&DELIVERY_STATES));
    assert_eq!(strings(&doc["components"]["parameters"]["State"]["schema"]["enum"]), own(&DELIVERY_STATES));
    assert_eq!(strings(&schemas["Subscription"]["properties"]["endpoint_condition"]["enum"]), own(&ENDPOINT_CONDITIONS));
    assert_eq!(
        strings(&schemas["Subscription"]["properties"]["health"]["enum"]),
        Health::ALL.iter().map(|h| h.word().to_owned()).collect::<Vec<_>>()
    );
    assert_eq!(strings(&schemas["Whoami"]["properties"]["kind"]["enum"]), own(&hookline_api::auth::CREDENTIAL_KINDS));
    assert_eq!(
        strings(&schemas["Subscription"]["properties"]["verification"]["enum"]),
        own(&hookline_core::vocabulary::VERIFICATION_STATES)
    );
    let words: Vec<String> = [Activity::Active, Activity::Paused, Activity::Disabled, Activity::PendingVerification]
        .iter()
        .map(|a| a.word().to_owned())
        .collect();
    assert_eq!(strings(&schemas["Subscription"]["properties"]["state"]["enum"]), words);
    assert_eq!(strings(&schemas["RedriveRequest"]["properties"]["reason"]["enum"]), own(&DeadLetterReason::delivery_words()));
    let sub = &schemas["Subscription"]["properties"];
    assert!(sub.get("disabledReason").is_none() && sub.get("disabled_reason").is_some(), "one field for the reason");
    let delivery = &schemas["DeliveryBase"]["properties"];
    assert!(delivery.get("status").is_none() && delivery.get("platform_status").is_some(), "one field per concept");
    let text = doc.to_string();
    for retired in ["ENDPOINT_CONDITION_", "disabledReason", "terminal_response", "failed (final)"] {
        assert!(!text.contains(retired), "the OpenAPI document still says {retired:?}");
    }
}

#[test]
fn the_portal_uses_the_same_words() {
    let app = read("portal/app.js");
    let chart = read("portal/chart.js");
    let html = read("portal/index.html");
    for (name, src) in [("app.js", &app), ("chart.js", &chart), ("index.html", &html)] {
        for retired in ["failed (final)", "disabledReason", "ENDPOINT_CONDITION_", "d.status", "status: $("] {
            assert!(!src.contains(retired), "portal/{name} still says {retired:?}");
        }
    }
    // The chart labels every class the stats return, by its own word.
    let labels = chart.lines().find(|l| l.starts_with("const LABELS")).expect("LABELS in chart.js");
    for class in hookline_api::STATS_CLASSES {
        assert!(labels.contains(&format!("{class}: '{class}'")), "chart.js labels {class} otherwise: {labels}");
    }
    // The log filter offers exactly the delivery states.
    let options: Vec<&str> = html
        .split("<select id=\"f-status\">")
        .nth(1)
        .and_then(|rest| rest.split("</select>").next())
        .expect("the state filter")
        .split("value=\"")
        .skip(1)
        .filter_map(|o| o.split('"').next())
        .filter(|v| !v.is_empty())
        .collect();
    assert_eq!(options, DELIVERY_STATES);
}
