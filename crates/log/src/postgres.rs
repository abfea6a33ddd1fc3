//! The production backend: PostgreSQL over plain TCP (`tokio-postgres`, no TLS: a loopback or in-cluster server).
//! One connection writes (the indexer's transactions), one serves queries (pipelined by the driver); each is
//! re-established when it drops. A batch is written with one multi-row `UNNEST` upsert per table.
//!
//! `attempts` and `events` are partitioned by UTC day: partitions are created ahead (yesterday to two days on) at
//! open and by [`PgStore::apply_retention`], and on demand for the days a batch touches (history read at the
//! first start); retention drops whole partitions.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls};

use crate::model::{
    headers_to_json, DeliveryDetail, DeliveryRow, Folded, IndexSummary, ListQuery, Page, Scope, Stats, MAX_ATTEMPTS_RETURNED,
};
use crate::schema;
use crate::sql::{self, Dialect, Param, RowGet};
use crate::{Retention, StoreError};

pub const DAY_MS: i64 = 86_400_000;
const PARTITIONED: [(&str, &str); 2] = [("attempts", "started_at_ms"), ("events", "at_ms")];
/// Serialises migrations and partition changes across processes sharing the database.
const LOCK_KEY: i64 = 0x0068_6f6f_6b6c_6f67; // "hooklog"

pub struct PgStore {
    url: String,
    /// [`WRITERS`] connections: batches written side by side each get a server backend (a core) of their own.
    writers: Vec<tokio::sync::Mutex<Client>>,
    next_writer: std::sync::atomic::AtomicUsize,
    reader: Mutex<Arc<Client>>,
    /// Days with partitions (the same days exist for both partitioned tables).
    days: Mutex<BTreeSet<i64>>,
    pub(crate) applied: Vec<u32>,
}

impl RowGet for tokio_postgres::Row {
    fn text(&self, i: usize) -> Result<String, StoreError> {
        Ok(self.try_get(i)?)
    }
    fn int(&self, i: usize) -> Result<i64, StoreError> {
        Ok(self.try_get(i)?)
    }
    fn flag(&self, i: usize) -> Result<bool, StoreError> {
        Ok(self.try_get(i)?)
    }
}

async fn connect(url: &str) -> Result<Client, StoreError> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.map_err(|e| StoreError::Open(crate::pg_message(&e)))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(error = %crate::pg_message(&e), "delivery log: PostgreSQL connection ended");
        }
    });
    Ok(client)
}

fn boxed(params: Vec<Param>) -> Vec<Box<dyn ToSql + Sync + Send>> {
    params
        .into_iter()
        .map(|p| -> Box<dyn ToSql + Sync + Send> {
            match p {
                Param::Text(s) => Box::new(s),
                Param::Int(i) => Box::new(i),
            }
        })
        .collect()
}

fn refs(b: &[Box<dyn ToSql + Sync + Send>]) -> Vec<&(dyn ToSql + Sync)> {
    b.iter().map(|p| p.as_ref() as &(dyn ToSql + Sync)).collect()
}

/// (year, month, day) of a day number since 1970-01-01 (the proleptic Gregorian calendar).
pub fn civil(days: i64) -> (i64, u32, u32) {
    let (y, m, d) = hookline_core::time::civil_from_days(days);
    // Month 1..=12 and day 1..=31 by construction.
    (y, u32::try_from(m).unwrap_or(1), u32::try_from(d).unwrap_or(1))
}

/// The day number of a civil date (inverse of [`civil`]).
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    hookline_core::time::days_from_civil(y, i64::from(m), i64::from(d))
}

pub fn partition_name(table: &str, day: i64) -> String {
    let (y, m, d) = civil(day);
    format!("{table}_d{y:04}{m:02}{d:02}")
}

fn day_of_name(table: &str, name: &str) -> Option<i64> {
    let digits = name.strip_prefix(table)?.strip_prefix("_d")?;
    if digits.len() != 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (y, md) = digits.split_at(4);
    let (m, d) = md.split_at(2);
    Some(days_from_civil(y.parse().ok()?, m.parse().ok()?, d.parse().ok()?))
}

/// Writing connections. One server backend indexes a batch on one core, and that backend is what limits the rate
/// (benchmarks.md: B-tree work); two let the indexer write two batches at once. Batches lock their rows in key
/// order (`model::fold` sorts them), so two never deadlock, and the merge rule is the same whichever lands first.
pub const WRITERS: usize = 2;

impl PgStore {
    pub async fn open(url: &str, now_ms: i64) -> Result<Self, StoreError> {
        let mut writer = connect(url).await?;
        let applied = migrate(&mut writer).await?;
        let reader = connect(url).await?;
        let mut writers = vec![tokio::sync::Mutex::new(writer)];
        for _ in 1..WRITERS {
            writers.push(tokio::sync::Mutex::new(connect(url).await?));
        }
        let store = Self {
            url: url.to_owned(),
            writers,
            next_writer: std::sync::atomic::AtomicUsize::new(0),
            reader: Mutex::new(Arc::new(reader)),
            days: Mutex::new(BTreeSet::new()),
            applied,
        };
        {
            let mut w = store.writers[0].lock().await;
            let days = existing_days(&w).await?;
            *store.days.lock().unwrap_or_else(|e| e.into_inner()) = days;
            let today = now_ms.div_euclid(DAY_MS);
            store.ensure_days(&mut w, (today - 1..=today + 2).collect()).await?;
        }
        Ok(store)
    }

    async fn reader(&self) -> Result<Arc<Client>, StoreError> {
        let current = self.reader.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if !current.is_closed() {
            return Ok(current);
        }
        let fresh = Arc::new(connect(&self.url).await?);
        *self.reader.lock().unwrap_or_else(|e| e.into_inner()) = fresh.clone();
        Ok(fresh)
    }

    /// A writing connection: a free one, else the next in turn (reconnected when it dropped).
    async fn writer(&self) -> Result<tokio::sync::MutexGuard<'_, Client>, StoreError> {
        let free = self.writers.iter().find_map(|w| w.try_lock().ok());
        let mut w = match free {
            Some(w) => w,
            None => {
                let i = self.next_writer.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % self.writers.len();
                self.writers[i].lock().await
            }
        };
        if w.is_closed() {
            *w = connect(&self.url).await?;
        }
        Ok(w)
    }

    /// Creates the partitions of `days` that do not exist yet (known ones cost nothing).
    async fn ensure_days(&self, w: &mut Client, days: BTreeSet<i64>) -> Result<(), StoreError> {
        let missing: Vec<i64> = {
            let known = self.days.lock().unwrap_or_else(|e| e.into_inner());
            days.into_iter().filter(|d| !known.contains(d)).collect()
        };
        if missing.is_empty() {
            return Ok(());
        }
        let tx = w.transaction().await?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_KEY]).await?;
        for day in &missing {
            for (table, _) in PARTITIONED {
                let from = day.saturating_mul(DAY_MS);
                let to = from.saturating_add(DAY_MS);
                tx.batch_execute(&format!(
                    "CREATE TABLE IF NOT EXISTS {} PARTITION OF {table} FOR VALUES FROM ({from}) TO ({to})",
                    partition_name(table, *day)
                ))
                .await?;
            }
        }
        tx.commit().await?;
        self.days.lock().unwrap_or_else(|e| e.into_inner()).extend(missing);
        Ok(())
    }

    pub async fn schema_version(&self) -> Result<u32, StoreError> {
        let r = self.reader().await?;
        current_version(&r).await
    }

    pub async fn index(&self, f: &Folded) -> Result<IndexSummary, StoreError> {
        let mut w = self.writer().await?;
        let days: BTreeSet<i64> =
            f.attempts.iter().map(|a| a.started_at_ms).chain(f.events.iter().map(|e| e.at_ms)).map(|ms| ms.div_euclid(DAY_MS)).collect();
        self.ensure_days(&mut w, days).await?;
        let tx = w.transaction().await?;
        // Shared with every other batch, exclusive for partition DDL (created ahead, dropped by retention), taken
        // before any table lock: a batch holding its tables' locks and a CREATE TABLE … PARTITION OF waiting on
        // them (and holding the other table's) deadlocked with two writers.
        tx.execute("SELECT pg_advisory_xact_lock_shared($1)", &[&LOCK_KEY]).await?;
        if !f.events.is_empty() {
            let ids: Vec<&str> = f.events.iter().map(|e| e.event_id.as_str()).collect();
            let at: Vec<i64> = f.events.iter().map(|e| e.at_ms).collect();
            let types: Vec<&str> = f.events.iter().map(|e| e.event_type.as_str()).collect();
            let tenants: Vec<&str> = f.events.iter().map(|e| e.tenant.as_str()).collect();
            let payloads: Vec<&[u8]> = f.events.iter().map(|e| e.payload.as_slice()).collect();
            tx.execute(
                "INSERT INTO events (event_id, at_ms, event_type, tenant, payload) \
                 SELECT * FROM UNNEST($1::text[], $2::int8[], $3::text[], $4::text[], $5::bytea[]) \
                 ON CONFLICT (tenant, event_id, at_ms) DO NOTHING",
                &[&ids, &at, &types, &tenants, &payloads],
            )
            .await?;
        }
        if !f.attempts.is_empty() {
            let a = &f.attempts;
            let text = |g: fn(&crate::model::AttemptRow) -> &str| a.iter().map(g).collect::<Vec<&str>>();
            let int = |g: fn(&crate::model::AttemptRow) -> i64| a.iter().map(g).collect::<Vec<i64>>();
            let req: Vec<String> = a.iter().map(|x| headers_to_json(&x.request_headers)).collect();
            let resp: Vec<String> = a.iter().map(|x| headers_to_json(&x.response_headers)).collect();
            let counts: Vec<bool> = a.iter().map(|x| x.counts_toward_disable).collect();
            let q = format!(
                "INSERT INTO attempts AS a ({}) SELECT * FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::int8[], \
                 $5::int8[], $6::text[], $7::int8[], $8::text[], $9::int8[], $10::text[], $11::text[], $12::text[], \
                 $13::text[], $14::text[], $15::text[], $16::bool[], $17::int8[], $18::text[], $19::text[], $20::text[], \
                 $21::int8[], $22::text[], $23::text[], $24::int8[], $25::text[]) {}",
                sql::ATTEMPT_COLS,
                sql::attempt_merge(Dialect::Postgres)
            );
            tx.execute(
                &q,
                &[
                    &text(|x| &x.delivery_id),
                    &text(|x| &x.run_id),
                    &int(|x| i64::from(x.attempt)),
                    &int(|x| i64::from(x.try_no)),
                    &int(|x| x.started_at_ms),
                    &text(|x| &x.subscription_id),
                    &int(|x| x.duration_ms),
                    &text(|x| &x.outcome),
                    &int(|x| i64::from(x.http_status)),
                    &text(|x| &x.reason),
                    &req,
                    &text(|x| &x.body_ref),
                    &resp,
                    &text(|x| &x.response_excerpt),
                    &text(|x| &x.verdict),
                    &counts,
                    &int(|x| x.next_due_at_ms),
                    &text(|x| &x.final_state),
                    &text(|x| &x.status_word),
                    &text(|x| &x.policy),
                    &int(|x| i64::from(x.concludes_attempt)),
                    &text(|x| &x.traceparent),
                    &text(|x| x.decided_by.map_or("", |d| d.as_str())),
                    &int(|x| i64::from(x.rule)),
                    &text(|x| &x.rule_when),
                ],
            )
            .await?;
        }
        if !f.deliveries.is_empty() {
            let d = &f.deliveries;
            let text = |g: fn(&DeliveryRow) -> &str| d.iter().map(g).collect::<Vec<&str>>();
            let int = |g: fn(&DeliveryRow) -> i64| d.iter().map(g).collect::<Vec<i64>>();
            let q = format!(
                "INSERT INTO deliveries AS d ({}) SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], \
                 $5::text[], $6::text[], $7::text[], $8::int8[], $9::int8[], $10::int8[], $11::int8[], $12::text[], \
                 $13::text[], $14::text[]) {}",
                sql::DELIVERY_COLS,
                sql::delivery_merge(Dialect::Postgres)
            );
            tx.execute(
                &q,
                &[
                    &text(|x| &x.delivery_id),
                    &text(|x| &x.subscription_id),
                    &text(|x| &x.tenant),
                    &text(|x| &x.event_id),
                    &text(|x| &x.event_type),
                    &text(|x| x.state.as_str()),
                    &text(|x| &x.status_word),
                    &int(|x| x.first_at_ms),
                    &int(|x| x.last_at_ms),
                    &int(|x| i64::from(x.attempts_made)),
                    &int(|x| i64::from(x.last_http_status)),
                    &text(|x| &x.last_outcome),
                    &text(|x| &x.run_id),
                    &text(|x| &x.dead_letter_reason),
                ],
            )
            .await?;
        }
        if let Some(p) = f.progress {
            tx.execute(
                "INSERT INTO store_meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                &[&crate::model::PROGRESS_KEY, &p.encode()],
            )
            .await?;
        }
        tx.commit().await?;
        Ok(IndexSummary { attempts: f.attempts.len(), deliveries: f.deliveries.len(), events: f.events.len(), skipped: f.skipped })
    }

    pub async fn store_id(&self) -> Result<String, StoreError> {
        let r = self.reader().await?;
        Ok(r.query_one("SELECT value FROM store_meta WHERE key = 'store_id'", &[]).await?.try_get(0)?)
    }

    pub async fn progress(&self) -> Result<Option<crate::model::Progress>, StoreError> {
        let r = self.reader().await?;
        let row = r.query_opt("SELECT value FROM store_meta WHERE key = $1", &[&crate::model::PROGRESS_KEY]).await?;
        Ok(row.and_then(|row| row.try_get::<_, String>(0).ok()).and_then(|v| crate::model::Progress::decode(&v)))
    }

    pub async fn delivery(&self, id: String) -> Result<Option<DeliveryDetail>, StoreError> {
        let r = self.reader().await?;
        let q = format!("SELECT {} FROM deliveries WHERE delivery_id = $1", sql::DELIVERY_COLS);
        // The lower time bound lets the planner skip partitions older than the delivery.
        let qa = format!(
            "SELECT {} FROM attempts WHERE delivery_id = $1 AND started_at_ms >= $2 ORDER BY started_at_ms, attempt, try_no LIMIT $3",
            sql::ATTEMPT_COLS
        );
        let Some(row) = r.query_opt(&q, &[&id]).await? else { return Ok(None) };
        let mut delivery = sql::delivery(&row)?;
        // The reader connection is shared (no transaction of its own), so each statement sees the indexer's latest
        // commit: the attempts are taken as one snapshot with the summary once the summary read after them is the
        // one read before (the indexer writes an attempt and its summary in one transaction). A few tries at most.
        let mut tries = 0u32;
        let attempts = loop {
            let attempts = r
                .query(&qa, &[&id, &delivery.first_at_ms, &(MAX_ATTEMPTS_RETURNED as i64)])
                .await?
                .iter()
                .map(sql::attempt)
                .collect::<Result<Vec<_>, _>>()?;
            let Some(row) = r.query_opt(&q, &[&id]).await? else { return Ok(None) };
            let after = sql::delivery(&row)?;
            tries = tries.saturating_add(1);
            let same =
                (after.last_at_ms, after.attempts_made, after.state) == (delivery.last_at_ms, delivery.attempts_made, delivery.state);
            delivery = after;
            if same || tries >= 3 {
                break attempts;
            }
        };
        let event = event(&r, &delivery.tenant, &delivery.event_id).await?;
        Ok(Some(DeliveryDetail { delivery, attempts, event }))
    }

    pub async fn event(&self, tenant: String, event_id: String) -> Result<Option<hookline_core::model::Event>, StoreError> {
        let r = self.reader().await?;
        event(&r, &tenant, &event_id).await
    }

    pub async fn by_event_id(&self, event_id: String, tenant: Option<String>, limit: usize) -> Result<Vec<DeliveryRow>, StoreError> {
        let r = self.reader().await?;
        let limit = limit as i64;
        let rows = match tenant {
            Some(t) => {
                let q = format!(
                    "SELECT {} FROM deliveries WHERE event_id = $1 AND tenant = $2 ORDER BY first_at_ms DESC, delivery_id DESC LIMIT $3",
                    sql::DELIVERY_COLS
                );
                r.query(&q, &[&event_id, &t, &limit]).await?
            }
            None => {
                let q = format!(
                    "SELECT {} FROM deliveries WHERE event_id = $1 ORDER BY first_at_ms DESC, delivery_id DESC LIMIT $2",
                    sql::DELIVERY_COLS
                );
                r.query(&q, &[&event_id, &limit]).await?
            }
        };
        rows.iter().map(sql::delivery).collect()
    }

    pub async fn list(&self, query: ListQuery) -> Result<Page, StoreError> {
        let r = self.reader().await?;
        let q = sql::list(Dialect::Postgres, &query);
        let params = boxed(q.params);
        let items = r.query(&q.text, &refs(&params)).await?.iter().map(sql::delivery).collect::<Result<Vec<_>, _>>()?;
        Ok(crate::page(items, query.page_size()))
    }

    pub async fn attempt_rows(&self, q: sql::Query) -> Result<Vec<crate::AttemptRow>, StoreError> {
        let r = self.reader().await?;
        let params = boxed(q.params);
        r.query(&q.text, &refs(&params)).await?.iter().map(sql::attempt).collect()
    }

    pub async fn attempt_points(&self, q: sql::Query) -> Result<Vec<crate::AttemptPoint>, StoreError> {
        let r = self.reader().await?;
        let params = boxed(q.params);
        r.query(&q.text, &refs(&params)).await?.iter().map(sql::attempt_point).collect()
    }

    /// Rows of `(text, text, count)`.
    pub async fn keyed_counts(&self, q: sql::Query) -> Result<Vec<(String, String, i64)>, StoreError> {
        let r = self.reader().await?;
        let params = boxed(q.params);
        r.query(&q.text, &refs(&params))
            .await?
            .iter()
            .map(|row| Ok((row.try_get::<_, String>(0)?, row.try_get::<_, String>(1)?, row.try_get::<_, i64>(2)?)))
            .collect()
    }

    pub async fn stats(&self, scope: Scope, since_ms: i64, until_ms: i64) -> Result<Stats, StoreError> {
        let r = self.reader().await?;
        let q = sql::stats(Dialect::Postgres, &scope, since_ms, until_ms);
        let params = boxed(q.params);
        let counts = r
            .query(&q.text, &refs(&params))
            .await?
            .iter()
            .map(|row| Ok((row.try_get::<_, String>(0)?, row.try_get::<_, i64>(1)?)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        crate::stats(since_ms, until_ms, counts)
    }

    /// Drops the day partitions wholly older than `cutoff_ms`, deletes deliveries last seen before it, and
    /// creates the partitions ahead of `now_ms`.
    pub async fn apply_retention(&self, cutoff_ms: i64, now_ms: i64) -> Result<Retention, StoreError> {
        let mut w = self.writer().await?;
        let today = now_ms.div_euclid(DAY_MS);
        self.ensure_days(&mut w, (today - 1..=today + 2).collect()).await?;
        let old: Vec<i64> = {
            let known = self.days.lock().unwrap_or_else(|e| e.into_inner());
            known.iter().copied().filter(|d| d.saturating_add(1).saturating_mul(DAY_MS) <= cutoff_ms).collect()
        };
        let tx = w.transaction().await?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_KEY]).await?;
        for day in &old {
            for (table, _) in PARTITIONED {
                tx.batch_execute(&format!("DROP TABLE IF EXISTS {}", partition_name(table, *day))).await?;
            }
        }
        let deliveries = tx.execute("DELETE FROM deliveries WHERE last_at_ms < $1", &[&cutoff_ms]).await?;
        tx.commit().await?;
        let mut known = self.days.lock().unwrap_or_else(|e| e.into_inner());
        for d in &old {
            known.remove(d);
        }
        Ok(Retention { attempts: 0, events: 0, deliveries, partitions_dropped: old.len() as u64 * PARTITIONED.len() as u64 })
    }

    /// The day partitions that exist (for tests and operators).
    pub async fn partition_days(&self) -> Result<BTreeSet<i64>, StoreError> {
        let r = self.reader().await?;
        existing_days(&r).await
    }
}

/// An event is (tenant, id): the one of the delivery's own tenant, never another tenant's of the same id.
async fn event(c: &Client, tenant: &str, event_id: &str) -> Result<Option<hookline_core::model::Event>, StoreError> {
    if event_id.is_empty() {
        return Ok(None);
    }
    let row = c
        .query_opt("SELECT payload FROM events WHERE tenant = $1 AND event_id = $2 ORDER BY at_ms DESC LIMIT 1", &[&tenant, &event_id])
        .await?;
    row.map(|r| crate::decode_event(&r.try_get::<_, Vec<u8>>(0)?)).transpose()
}

async fn existing_days(c: &Client) -> Result<BTreeSet<i64>, StoreError> {
    let rows = c
        .query(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent \
             JOIN pg_namespace n ON n.oid = p.relnamespace WHERE p.relname = 'attempts' AND n.nspname = current_schema()",
            &[],
        )
        .await?;
    let mut days = BTreeSet::new();
    for r in rows {
        let name: String = r.try_get(0)?;
        if let Some(d) = day_of_name("attempts", &name) {
            days.insert(d);
        }
    }
    Ok(days)
}

async fn current_version(c: &Client) -> Result<u32, StoreError> {
    let exists: bool = c.query_one("SELECT to_regclass('schema_migrations') IS NOT NULL", &[]).await?.try_get(0)?;
    if !exists {
        return Ok(0);
    }
    let v: i64 = c.query_one("SELECT COALESCE(MAX(version), 0) FROM schema_migrations", &[]).await?.try_get(0)?;
    Ok(u32::try_from(v).unwrap_or(u32::MAX))
}

/// Applies what is missing in one transaction under an advisory lock, so concurrent openers apply each migration
/// once (the second one waits, then finds nothing to do).
async fn migrate(c: &mut Client) -> Result<Vec<u32>, StoreError> {
    let known = schema::latest(schema::POSTGRES);
    let tx = c.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_KEY]).await?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at_ms BIGINT NOT NULL)",
    )
    .await?;
    let v: i64 = tx.query_one("SELECT COALESCE(MAX(version), 0) FROM schema_migrations", &[]).await?.try_get(0)?;
    let current = u32::try_from(v).unwrap_or(u32::MAX);
    if current > known {
        return Err(StoreError::SchemaTooNew { found: current, known });
    }
    let mut applied = Vec::new();
    for (version, name, text) in schema::POSTGRES {
        if *version <= current {
            continue;
        }
        tx.batch_execute(text).await?;
        tx.execute(
            "INSERT INTO schema_migrations (version, name, applied_at_ms) VALUES ($1, $2, $3)",
            &[&i64::from(*version), name, &hookline_service::now_ms()],
        )
        .await?;
        applied.push(*version);
    }
    tx.commit().await?;
    Ok(applied)
}

/// Makes a new, empty database `name` on the server `server_url` points at (a URL naming a database the user may
/// connect to, e.g. `…/postgres`), dropping one of that name first; returns the new database's URL. For scratch
/// stores: tests and `hookline bench log`. `name` must be a plain identifier (it is not quoted).
pub async fn create_database(server_url: &str, name: &str) -> Result<String, StoreError> {
    let (base, _) =
        server_url.rsplit_once('/').ok_or_else(|| StoreError::Target(format!("{server_url:?} names no database (…/postgres)")))?;
    let (client, connection) = tokio_postgres::connect(server_url, NoTls).await.map_err(|e| StoreError::Open(crate::pg_message(&e)))?;
    let task = tokio::spawn(connection);
    client.batch_execute(&format!("DROP DATABASE IF EXISTS {name}")).await?;
    client.batch_execute(&format!("CREATE DATABASE {name}")).await?;
    drop(client);
    let _ = task.await;
    Ok(format!("{base}/{name}"))
}

/// Drops a database made by [`create_database`], closing its connections; best effort (a scratch store).
pub async fn drop_database(server_url: &str, name: &str) {
    if let Ok((client, connection)) = tokio_postgres::connect(server_url, NoTls).await {
        let task = tokio::spawn(connection);
        let _ = client.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await;
        drop(client);
        let _ = task.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn day_numbers_and_dates_agree() {
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(days_from_civil(2026, 12, 1)), (2026, 12, 1));
        assert_eq!(civil(days_from_civil(2024, 2, 29)), (2024, 2, 29));
        assert_eq!(days_from_civil(2000, 3, 1) - days_from_civil(2000, 2, 28), 2, "2000 is a leap year");
        for d in [-1000, -1, 0, 1, 19_000, 20_423, 100_000] {
            let (y, m, dd) = civil(d);
            assert_eq!(days_from_civil(y, m, dd), d);
        }
        assert_eq!(partition_name("attempts", days_from_civil(2026, 1, 5)), "attempts_d20260105");
        assert_eq!(day_of_name("attempts", "attempts_d20260105"), Some(days_from_civil(2026, 1, 5)));
        assert_eq!(day_of_name("attempts", "attempts_default"), None);
        assert_eq!(day_of_name("attempts", "events_d20260105"), None);
    }
}
