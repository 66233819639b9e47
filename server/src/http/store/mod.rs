//! The plan store: the embedded SQLite file (the default, one process) or PostgreSQL (any
//! number of replicas and workers on one database). [`Store`] is what the handlers read and
//! write through; the queue that runs jobs is [`crate::http::jobs`] for SQLite and the
//! database itself for PostgreSQL ([`crate::http::workers`]).

mod pgtls;
mod postgres;
mod sqlite;
mod types;

pub use postgres::{
    check_sqlite_path, is_postgres_url, redact, worker_lost_error, Leased, PgStore, QueueStats,
    Takes, DELETED_CHANNEL, FINISHED_CHANNEL,
};
pub use sqlite::SqliteStore;
pub use types::{
    interrupted_error, now, postgres_unreachable, Claim, JobStatus, Kind, NewJob, Record, Reuse,
    Row, StoreError,
};

use std::sync::Arc;

/// The store a service runs on.
#[derive(Clone)]
pub enum Store {
    Sqlite(Arc<SqliteStore>),
    Postgres(PgStore),
}

impl Store {
    /// A SQLite store in memory (tests).
    pub fn in_memory() -> Result<Store, StoreError> {
        Ok(Store::Sqlite(Arc::new(SqliteStore::open_in_memory()?)))
    }

    pub fn is_postgres(&self) -> bool {
        matches!(self, Store::Postgres(_))
    }

    /// One job of `kind`, with its engine document.
    pub async fn get(&self, kind: Kind, id: &str) -> Result<Option<Record>, StoreError> {
        match self {
            Store::Sqlite(s) => Ok(s.get(kind, id)?),
            Store::Postgres(p) => p.get(kind, id).await,
        }
    }

    /// Jobs of `kind`, newest first, optionally of one model.
    pub async fn list(
        &self,
        kind: Kind,
        model: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Row>, StoreError> {
        match self {
            Store::Sqlite(s) => Ok(s.list(kind, model, limit)?),
            Store::Postgres(p) => p.list(kind, model, limit).await,
        }
    }

    /// Every plan of one model, oldest first.
    pub async fn history(&self, model_hash: &str) -> Result<Vec<Row>, StoreError> {
        match self {
            Store::Sqlite(s) => Ok(s.history(model_hash)?),
            Store::Postgres(p) => p.history(model_hash).await,
        }
    }

    /// Replaces the document of a finished job of `kind`; false when there is no such job done.
    pub async fn replace_result(
        &self,
        kind: Kind,
        id: &str,
        result: &str,
    ) -> Result<bool, StoreError> {
        match self {
            Store::Sqlite(s) => Ok(s.replace_result(kind, id, result)?),
            Store::Postgres(p) => p.replace_result(kind, id, result).await,
        }
    }

    /// Deletes a job of `kind`; false when there is none.
    pub async fn delete(&self, kind: Kind, id: &str) -> Result<bool, StoreError> {
        match self {
            Store::Sqlite(s) => Ok(s.delete(kind, id)?),
            Store::Postgres(p) => p.delete(kind, id).await,
        }
    }

    /// Refuses every later write of this process.
    pub fn close(&self) {
        match self {
            Store::Sqlite(s) => s.close(),
            Store::Postgres(p) => p.close(),
        }
    }

    pub fn is_closed(&self) -> bool {
        match self {
            Store::Sqlite(s) => s.is_closed(),
            Store::Postgres(p) => p.is_closed(),
        }
    }
}
