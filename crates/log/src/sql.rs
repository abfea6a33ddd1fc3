//! SQL shared by both backends: column lists, the delivery merge (the same rule as `model::fold`'s), the list and
//! stats queries with their filters, and reading rows. Only placeholders and two function names differ.

use crate::model::{AttemptRow, DeliveryRow, DeliveryState, ListQuery, Scope};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

impl Dialect {
    pub fn ph(self, n: usize) -> String {
        match self {
            Dialect::Sqlite => format!("?{n}"),
            Dialect::Postgres => format!("${n}"),
        }
    }

    fn least(self) -> &'static str {
        match self {
            Dialect::Sqlite => "min",
            Dialect::Postgres => "LEAST",
        }
    }

    fn greatest(self) -> &'static str {
        match self {
            Dialect::Sqlite => "max",
            Dialect::Postgres => "GREATEST",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Param {
    Text(String),
    Int(i64),
}

pub struct Query {
    pub text: String,
    pub params: Vec<Param>,
}

pub const DELIVERY_COLS: &str = "delivery_id, subscription_id, tenant, event_id, event_type, state, status_word, \
     first_at_ms, last_at_ms, attempts_made, last_http_status, last_outcome, run_id, dead_letter_reason";

pub const ATTEMPT_COLS: &str = "delivery_id, run_id, attempt, try_no, started_at_ms, subscription_id, duration_ms, \
     outcome, http_status, reason, request_headers, body_ref, response_headers, response_excerpt, verdict, \
     counts_toward_disable, next_due_at_ms, final_state, status_word, policy, concludes_attempt, traceparent, \
     decided_by, rule, rule_when";

pub const ATTEMPT_KEY: &str = "delivery_id, run_id, attempt, try_no, started_at_ms";

/// `ON CONFLICT (delivery_id) DO UPDATE SET ...` for `INSERT INTO deliveries AS d`: identity fields are kept once
/// known (a newer non-empty value wins), the latest record's fields come from whichever side is newer, first and
/// last times widen, the attempt count only grows. Re-indexing a record therefore changes nothing.
pub fn delivery_merge(d: Dialect) -> String {
    let newer = "excluded.last_at_ms >= d.last_at_ms";
    let mut sets = Vec::new();
    for f in ["subscription_id", "tenant", "event_id", "event_type", "dead_letter_reason"] {
        sets.push(format!("{f} = CASE WHEN excluded.{f} <> '' AND (d.{f} = '' OR {newer}) THEN excluded.{f} ELSE d.{f} END"));
    }
    for f in ["state", "status_word", "last_http_status", "last_outcome", "run_id"] {
        sets.push(format!("{f} = CASE WHEN {newer} THEN excluded.{f} ELSE d.{f} END"));
    }
    sets.push(format!("first_at_ms = {}(d.first_at_ms, excluded.first_at_ms)", d.least()));
    sets.push(format!("last_at_ms = {}(d.last_at_ms, excluded.last_at_ms)", d.greatest()));
    sets.push(format!("attempts_made = {}(d.attempts_made, excluded.attempts_made)", d.greatest()));
    format!("ON CONFLICT (delivery_id) DO UPDATE SET {}", sets.join(", "))
}

pub fn attempt_merge(d: Dialect) -> String {
    format!(
        "ON CONFLICT ({ATTEMPT_KEY}) DO UPDATE SET concludes_attempt = {}(a.concludes_attempt, excluded.concludes_attempt)",
        d.greatest()
    )
}

fn scope_filter(scope: &Scope) -> (&'static str, String) {
    match scope {
        Scope::Subscription(id) => ("subscription_id", id.clone()),
        Scope::Tenant(id) => ("tenant", id.clone()),
    }
}

/// Newest first by `(first_at_ms, delivery_id)`, one more row than the page to tell whether another follows. The
/// cursor is a keyset bound written so both databases use the index range (`first_at_ms <= x`) and filter only
/// the rows that share the cursor's millisecond.
pub fn list(d: Dialect, q: &ListQuery) -> Query {
    let mut params = Vec::new();
    let push = |p: Param, params: &mut Vec<Param>| {
        params.push(p);
        d.ph(params.len())
    };
    let (col, id) = scope_filter(&q.scope);
    let mut sql = format!("SELECT {DELIVERY_COLS} FROM deliveries WHERE {col} = {}", push(Param::Text(id), &mut params));
    if let Some(state) = q.state {
        sql += &format!(" AND state = {}", push(Param::Text(state.as_str().into()), &mut params));
    }
    if let Some(status) = q.http_status {
        sql += &format!(" AND last_http_status = {}", push(Param::Int(i64::from(status)), &mut params));
    }
    if let Some(t) = &q.event_type {
        sql += &format!(" AND event_type = {}", push(Param::Text(t.clone()), &mut params));
    }
    if let Some(since) = q.since_ms {
        sql += &format!(" AND first_at_ms >= {}", push(Param::Int(since), &mut params));
    }
    if let Some(until) = q.until_ms {
        sql += &format!(" AND first_at_ms < {}", push(Param::Int(until), &mut params));
    }
    if let Some(c) = &q.after {
        let at = push(Param::Int(c.first_at_ms), &mut params);
        let at2 = push(Param::Int(c.first_at_ms), &mut params);
        let id = push(Param::Text(c.delivery_id.clone()), &mut params);
        sql += &format!(" AND first_at_ms <= {at} AND (first_at_ms < {at2} OR delivery_id < {id})");
    }
    let limit = push(Param::Int(q.page_size() as i64 + 1), &mut params);
    sql += &format!(" ORDER BY first_at_ms DESC, delivery_id DESC LIMIT {limit}");
    Query { text: sql, params }
}

pub fn stats(d: Dialect, scope: &Scope, since_ms: i64, until_ms: i64) -> Query {
    let (col, id) = scope_filter(scope);
    Query {
        text: format!(
            "SELECT state, count(*) FROM deliveries WHERE {col} = {} AND first_at_ms >= {} AND first_at_ms < {} GROUP BY state",
            d.ph(1),
            d.ph(2),
            d.ph(3)
        ),
        params: vec![Param::Text(id), Param::Int(since_ms), Param::Int(until_ms)],
    }
}

/// `subscription_id, state, count(*)` of several subscriptions' deliveries first attempted in a window: one query
/// for a page of subscriptions (bounded by the page size), each answered from the `(subscription_id, state, ...)`
/// index.
pub fn stats_of_subscriptions(d: Dialect, ids: &[String], since_ms: i64, until_ms: i64) -> Query {
    let mut params: Vec<Param> = ids.iter().map(|i| Param::Text(i.clone())).collect();
    let list = (1..=ids.len()).map(|n| d.ph(n)).collect::<Vec<_>>().join(", ");
    params.push(Param::Int(since_ms));
    let since = d.ph(params.len());
    params.push(Param::Int(until_ms));
    let until = d.ph(params.len());
    Query {
        text: format!(
            "SELECT subscription_id, state, count(*) FROM deliveries WHERE subscription_id IN ({list}) \
             AND first_at_ms >= {since} AND first_at_ms < {until} GROUP BY subscription_id, state"
        ),
        params,
    }
}

/// `subscription_id, state, last_at_ms` of each of `ids`' latest succeeded delivery (by first attempt): one probe of
/// the `deliveries_by_subscription_state` index per id, in one statement.
pub fn last_successes(d: Dialect, ids: &[String]) -> Query {
    let mut params: Vec<Param> = vec![Param::Text(DeliveryState::Succeeded.as_str().to_owned())];
    let state = d.ph(1);
    let branches: Vec<String> = ids
        .iter()
        .map(|id| {
            params.push(Param::Text(id.clone()));
            format!(
                "SELECT * FROM (SELECT subscription_id, state, last_at_ms FROM deliveries WHERE subscription_id = {} \
                 AND state = {state} ORDER BY first_at_ms DESC, delivery_id DESC LIMIT 1) AS s{}",
                d.ph(params.len()),
                params.len()
            )
        })
        .collect();
    Query { text: branches.join(" UNION ALL "), params }
}

/// `started_at_ms, duration_ms, verdict, final_state` of a subscription's tries in a window (the
/// `attempts_by_subscription` index), newest first so a cut keeps the recent ones.
pub fn attempt_points(d: Dialect, subscription_id: &str, since_ms: i64, until_ms: i64) -> Query {
    Query {
        text: format!(
            "SELECT started_at_ms, duration_ms, verdict, final_state FROM attempts \
             WHERE subscription_id = {} AND started_at_ms >= {} AND started_at_ms < {} ORDER BY started_at_ms DESC LIMIT {}",
            d.ph(1),
            d.ph(2),
            d.ph(3),
            d.ph(4)
        ),
        params: vec![
            Param::Text(subscription_id.to_owned()),
            Param::Int(since_ms),
            Param::Int(until_ms),
            Param::Int(crate::model::MAX_ATTEMPT_POINTS as i64),
        ],
    }
}

/// The latest try of each of `ids` (a page's deliveries, bounded by the page size): one query, each delivery's
/// maximum found through the primary key. `since_ms` (the page's oldest first attempt) lets PostgreSQL skip older
/// partitions. A delivery may return more than one row (tries that share the millisecond).
pub fn last_attempts(d: Dialect, ids: &[String], since_ms: i64) -> Query {
    let mut params: Vec<Param> = ids.iter().map(|i| Param::Text(i.clone())).collect();
    let list = (1..=ids.len()).map(|n| d.ph(n)).collect::<Vec<_>>().join(", ");
    params.push(Param::Int(since_ms));
    let since = d.ph(params.len());
    Query {
        text: format!(
            "SELECT {ATTEMPT_COLS} FROM attempts a WHERE a.delivery_id IN ({list}) AND a.started_at_ms >= {since} \
             AND a.started_at_ms = (SELECT max(b.started_at_ms) FROM attempts b WHERE b.delivery_id = a.delivery_id AND b.started_at_ms >= {since})"
        ),
        params,
    }
}

/// A row of [`attempt_points`].
pub fn attempt_point(r: &impl RowGet) -> Result<crate::model::AttemptPoint, crate::StoreError> {
    Ok(crate::model::AttemptPoint { started_at_ms: r.int(0)?, duration_ms: r.int(1)?, verdict: r.text(2)?, final_state: r.text(3)? })
}

/// Column access shared by the two drivers' rows.
pub trait RowGet {
    fn text(&self, i: usize) -> Result<String, crate::StoreError>;
    fn int(&self, i: usize) -> Result<i64, crate::StoreError>;
    fn flag(&self, i: usize) -> Result<bool, crate::StoreError>;
}

fn u32_of(v: i64) -> u32 {
    u32::try_from(v.max(0)).unwrap_or(u32::MAX)
}

fn u16_of(v: i64) -> u16 {
    u16::try_from(v).unwrap_or(0)
}

fn state_of(text: String) -> Result<DeliveryState, crate::StoreError> {
    text.parse().map_err(|e: crate::model::UnknownState| crate::StoreError::Corrupt(e.to_string()))
}

/// A row of `SELECT {DELIVERY_COLS}`.
pub fn delivery(r: &impl RowGet) -> Result<DeliveryRow, crate::StoreError> {
    Ok(DeliveryRow {
        delivery_id: r.text(0)?,
        subscription_id: r.text(1)?,
        tenant: r.text(2)?,
        event_id: r.text(3)?,
        event_type: r.text(4)?,
        state: state_of(r.text(5)?)?,
        status_word: r.text(6)?,
        first_at_ms: r.int(7)?,
        last_at_ms: r.int(8)?,
        attempts_made: u32_of(r.int(9)?),
        last_http_status: u16_of(r.int(10)?),
        last_outcome: r.text(11)?,
        run_id: r.text(12)?,
        dead_letter_reason: r.text(13)?,
    })
}

/// A row of `SELECT {ATTEMPT_COLS}`.
pub fn attempt(r: &impl RowGet) -> Result<AttemptRow, crate::StoreError> {
    Ok(AttemptRow {
        delivery_id: r.text(0)?,
        run_id: r.text(1)?,
        attempt: u32_of(r.int(2)?),
        try_no: u32_of(r.int(3)?),
        started_at_ms: r.int(4)?,
        subscription_id: r.text(5)?,
        duration_ms: r.int(6)?,
        outcome: r.text(7)?,
        http_status: u16_of(r.int(8)?),
        reason: r.text(9)?,
        request_headers: crate::model::headers_from_json(&r.text(10)?),
        body_ref: r.text(11)?,
        response_headers: crate::model::headers_from_json(&r.text(12)?),
        response_excerpt: r.text(13)?,
        verdict: r.text(14)?,
        counts_toward_disable: r.flag(15)?,
        next_due_at_ms: r.int(16)?,
        final_state: r.text(17)?,
        status_word: r.text(18)?,
        policy: r.text(19)?,
        concludes_attempt: u32_of(r.int(20)?),
        traceparent: r.text(21)?,
        // A word this version does not know reads as none rather than failing the whole delivery.
        decided_by: hookline_core::DecidedBy::parse(&r.text(22)?),
        rule: u32_of(r.int(23)?),
        rule_when: r.text(24)?,
    })
}
