//! `GET /v1/subscriptions/{id}/stats`: attempts per time bucket by outcome class, and attempt latency (p50, p95),
//! from the delivery log store's tries in the window; and the window's deliveries by state (`store.stats`). What
//! the portal's chart draws.

use std::sync::Arc;

use axum::extract::{Path, State};

use axum::Json;
use hookline_log::{AttemptPoint, Scope};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{ApiError, ApiQuery, ApiState};

/// The outcome classes, in the order the chart stacks them.
pub const CLASSES: [&str; 6] = ["succeeded", "retried", "failed", "dead", "cancelled", "other"];
const DEFAULT_BUCKET_MS: i64 = 60_000;
const DEFAULT_WINDOW_MS: i64 = 3 * 3_600_000;
const MAX_BUCKETS: i64 = 500;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatsQuery {
    since_ms: Option<i64>,
    until_ms: Option<i64>,
    bucket_ms: Option<i64>,
}

/// The class of one attempt: `succeeded` (2xx), `retried` (another attempt is scheduled), `failed` or `dead` (the
/// delivery ended so: the delivery states' words), `cancelled` (ended `cancelled` or `skipped`), `other`.
pub fn class_of(a: &AttemptPoint) -> usize {
    match a.final_state.as_str() {
        "succeeded" => 0,
        "failed" => 2,
        "dead" => 3,
        "cancelled" | "skipped" => 4,
        _ if a.verdict == "success" => 0,
        _ if a.verdict == "retry" => 1,
        _ => 5,
    }
}

pub async fn get(
    State(s): State<Arc<ApiState>>,
    axum::Extension(who): axum::Extension<super::auth::Principal>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<StatsQuery>,
) -> Result<Json<Value>, ApiError> {
    super::subscriptions::find(&s, &who, &id)?;
    let bucket = q.bucket_ms.unwrap_or(DEFAULT_BUCKET_MS);
    if bucket < 1_000 {
        return Err(ApiError::field("bucket_ms", "must be at least 1000 (one second)"));
    }
    let until = q.until_ms.unwrap_or_else(crate::now_ms);
    let since = q.since_ms.unwrap_or(until.saturating_sub(DEFAULT_WINDOW_MS));
    if since >= until {
        return Err(ApiError::field("until_ms", "must be after since_ms"));
    }
    // Buckets start on multiples of the bucket size, so consecutive requests line up. (Wide arithmetic: the
    // query's numbers are the client's.)
    let start = since.saturating_sub(since.rem_euclid(bucket));
    let n = (i128::from(until) - i128::from(start) + i128::from(bucket) - 1) / i128::from(bucket);
    if n > i128::from(MAX_BUCKETS) {
        return Err(ApiError::field("bucket_ms", format!("at most {MAX_BUCKETS} buckets: use a larger bucket_ms or a later since_ms")));
    }
    let n = n as usize;
    let mut counts = vec![[0u64; CLASSES.len()]; n];
    let mut durations: Vec<Vec<i64>> = vec![Vec::new(); n];
    let points = s.log.attempt_points(&id, start, until).await.map_err(ApiError::log_unavailable)?;
    let truncated = points.len() >= hookline_log::MAX_ATTEMPT_POINTS;
    for a in &points {
        let i = ((i128::from(a.started_at_ms) - i128::from(start)) / i128::from(bucket)) as usize;
        if i < n {
            counts[i][class_of(a)] += 1;
            durations[i].push(a.duration_ms.max(0));
        }
    }
    drop(points);
    let deliveries = s.log.stats(&Scope::Subscription(id.clone()), start, until).await.map_err(ApiError::log_unavailable)?;
    let by_state: Map<String, Value> = deliveries.by_state.iter().map(|(st, n)| (st.as_str().to_owned(), json!(n))).collect();
    let mut totals = [0u64; CLASSES.len()];
    let mut all_durations = Vec::new();
    let buckets: Vec<Value> = (0..n)
        .map(|i| {
            let mut by = Map::new();
            for (k, c) in CLASSES.iter().enumerate() {
                by.insert((*c).to_owned(), json!(counts[i][k]));
                totals[k] += counts[i][k];
            }
            let d = &mut durations[i];
            d.sort_unstable();
            all_durations.extend_from_slice(d);
            json!({
                "start_ms": start.saturating_add((i as i64).saturating_mul(bucket)),
                "attempts": d.len(),
                "counts": by,
                "p50_ms": percentile(d, 50),
                "p95_ms": percentile(d, 95),
            })
        })
        .collect();
    all_durations.sort_unstable();
    let totals: Map<String, Value> = CLASSES.iter().zip(totals).map(|(c, t)| ((*c).to_owned(), json!(t))).collect();
    Ok(Json(json!({
        "subscription_id": id,
        "since_ms": start,
        "until_ms": until,
        "bucket_ms": bucket,
        "classes": CLASSES,
        "buckets": buckets,
        "totals": {"attempts": all_durations.len(), "counts": totals, "p50_ms": percentile(&all_durations, 50), "p95_ms": percentile(&all_durations, 95)},
        // Only the newest tries are counted when the window holds more than the store returns at once.
        "truncated": truncated,
        "deliveries": {"total": deliveries.total, "by_state": by_state},
    })))
}

/// Nearest-rank percentile of sorted values; `None` when there are none.
fn percentile(sorted: &[i64], p: usize) -> Option<i64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p * sorted.len()).div_ceil(100).max(1);
    Some(sorted[rank - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        assert_eq!(percentile(&[], 50), None);
        assert_eq!(percentile(&[7], 95), Some(7));
        let v: Vec<i64> = (1..=100).collect();
        assert_eq!((percentile(&v, 50), percentile(&v, 95)), (Some(50), Some(95)));
        assert_eq!(percentile(&[1, 2, 3, 4], 50), Some(2));
    }

    #[test]
    fn classes_follow_the_final_state_then_the_verdict() {
        let a = |verdict: &str, fin: &str| AttemptPoint { verdict: verdict.into(), final_state: fin.into(), ..Default::default() };
        assert_eq!(CLASSES[class_of(&a("success", "succeeded"))], "succeeded");
        assert_eq!(CLASSES[class_of(&a("retry", ""))], "retried");
        assert_eq!(CLASSES[class_of(&a("retry", "failed"))], "failed", "the last retry of an exhausted schedule");
        assert_eq!(CLASSES[class_of(&a("terminal", "dead"))], "dead", "a 410 is not counted as failed");
        assert_eq!(CLASSES[class_of(&a("", "cancelled"))], "cancelled");
        assert_eq!(CLASSES[class_of(&a("terminal", ""))], "other");
    }
}
