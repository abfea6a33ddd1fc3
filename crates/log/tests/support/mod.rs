//! Stores for the tests: a SQLite file in a temporary directory, or a fresh database on the PostgreSQL server that
//! scripts/with-postgres starts (HOOKLINE_TEST_POSTGRES_URL). scripts/test sets HOOKLINE_TEST_REQUIRE_POSTGRES, and
//! then a missing server fails the PostgreSQL tests instead of skipping them.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use hookline_log::Target;

static N: AtomicU32 = AtomicU32::new(0);

pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("hookline-log-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn sqlite(dir: &TempDir) -> Target {
    Target::Sqlite(dir.0.join("log.sqlite3"))
}

/// The server's URL, or None (the test then skips, saying so) unless the run requires PostgreSQL.
pub fn postgres_admin_url() -> Option<String> {
    match std::env::var("HOOKLINE_TEST_POSTGRES_URL") {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ if std::env::var_os("HOOKLINE_TEST_REQUIRE_POSTGRES").is_some() => panic!(
            "HOOKLINE_TEST_POSTGRES_URL is not set, and this run requires PostgreSQL (HOOKLINE_TEST_REQUIRE_POSTGRES): \
             run the tests through scripts/with-postgres, as scripts/test does"
        ),
        _ => {
            eprintln!(
                "skipped: the PostgreSQL run of this test needs HOOKLINE_TEST_POSTGRES_URL \
                 (scripts/with-postgres cargo test -p hookline-log)"
            );
            None
        }
    }
}

/// A new, empty database on the test server.
pub async fn postgres() -> Option<Target> {
    let admin = postgres_admin_url()?;
    let name = format!("hl_test_{}_{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
    let url = hookline_log::postgres::create_database(&admin, &name).await.expect("the test server makes a database");
    Some(Target::Postgres(url))
}

pub mod flood;
