//! The shared plan store and job queue on PostgreSQL: every replica of `remat serve` and every
//! `remat worker` on one database.
//!
//! - Jobs are rows; a post creates one unless the same model and options are done or in
//!   flight. An identical post arriving at another replica at the same moment finds the first
//!   one through a unique key (`active_key`), not by luck of timing.
//! - Workers claim queued jobs (or jobs whose lease ran out) with `FOR UPDATE SKIP LOCKED`,
//!   hold a lease they renew while they work, and write the result once: every write of a
//!   worker names it as the lease's owner, so a worker that lost its lease writes nothing.
//! - A job whose workers keep dying (its lease ran out `max_attempts` times) is failed with
//!   the reason instead of being handed out again.
//! - The schema is versioned (`migrations/`); each process applies what is missing at start,
//!   under an advisory lock.

use super::types::{now, Claim, JobStatus, Kind, NewJob, Record, Reuse, Row, StoreError};
use crate::http::error::ErrorObject;
use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres_rustls::MakeRustlsConnect;

/// The schema's versions, in order: each is applied once.
const MIGRATIONS: &[(i32, &str)] = &[(1, include_str!("migrations/0001_jobs.sql"))];

/// Where a deletion is notified (the payload: `<kind>/<id>`, the responses cache's key).
pub const DELETED_CHANNEL: &str = "remat_deleted";

/// Where a job's end is notified (done or failed; the payload: `<kind>/<id>`), so that the
/// requests waiting for it on any replica hear it at once (`http/notices.rs`).
pub const FINISHED_CHANNEL: &str = "remat_finished";

/// The advisory lock the migrations take (any constant; the same in every process).
const MIGRATION_LOCK: i64 = 0x7265_6d61_7431;

/// The advisory lock under which a post counts the queue and inserts its job.
const QUEUE_LOCK: i64 = 0x7265_6d61_7432;

const ROW_COLUMNS: &str = "id, status, model_hash, model_name, model_format, options, created_at, \
                           updated_at, summary, error, error_status";

/// A job a worker holds: what it runs and the lease it renews.
#[derive(Debug, Clone)]
pub struct Leased {
    pub id: String,
    pub kind: Kind,
    pub model: Vec<u8>,
    pub model_hash: String,
    pub model_format: String,
    /// The request as posted (`PlanRequest` JSON).
    pub request: String,
    /// How many workers have claimed it, this one included.
    pub attempts: i32,
}

/// The queue of one kind as `/metrics` reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueStats {
    pub kind: String,
    pub queued: i64,
    pub running: i64,
    /// Seconds since the oldest running job of this kind was claimed (0 when none runs).
    pub oldest_lease_seconds: f64,
    /// Seconds since the oldest queued job of this kind that only solves, and of this kind
    /// that also validates, was posted (0 when none waits): a queue no worker takes from (a
    /// validation with only `--solve` workers) shows as an age that grows.
    pub oldest_queued_seconds: [f64; 2],
}

/// Which jobs a worker takes: those that only solve, those that also run the plan, or both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Takes {
    pub solve: bool,
    pub validate: bool,
}

impl Takes {
    pub const ALL: Takes = Takes {
        solve: true,
        validate: true,
    };

    fn flags(self) -> Vec<bool> {
        let mut v = vec![];
        if self.solve {
            v.push(false);
        }
        if self.validate {
            v.push(true);
        }
        v
    }
}

/// The PostgreSQL store (a connection pool; cheap to clone).
#[derive(Clone)]
pub struct PgStore {
    pool: Pool,
    url: Arc<str>,
    /// What every connection is opened with: the URL's settings, the bounds and keepalives
    /// below, and TLS as its `sslmode` asks (`pgtls.rs`).
    config: Arc<tokio_postgres::Config>,
    tls: MakeRustlsConnect,
    closed: Arc<AtomicBool>,
    /// The bound on each operation ([`op_timeout`]).
    timeout: Duration,
}

/// The environment variable that bounds each database operation, in seconds.
pub const TIMEOUT_VAR: &str = "REMAT_DB_TIMEOUT";

/// The slowest rate at which an operation's payload (a model stored or read, a result) is
/// allowed to move on top of the bound: a 512 MiB model gets 32 s more.
const PAYLOAD_BYTES_PER_SECOND: f64 = 16.0 * 1024.0 * 1024.0;

/// The bound of an operation that moves `bytes`: `timeout` plus their time at
/// [`PAYLOAD_BYTES_PER_SECOND`].
fn limit_for(timeout: Duration, bytes: usize) -> Duration {
    timeout + Duration::from_secs_f64(bytes as f64 / PAYLOAD_BYTES_PER_SECOND)
}

/// The most bytes a worker's claim may read (a model of the largest `--body-limit` default).
const CLAIMED_MODEL_BYTES: usize = 512 << 20;

/// The bound on each database operation when [`TIMEOUT_VAR`] is not set.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The bound on each database operation: a query or transaction (waiting for a connection
/// included) that the database has not answered by then fails as unreachable (the service
/// answers 503 `database_unavailable`, a worker retries its write). [`TIMEOUT_VAR`] in seconds
/// (fractions allowed), [`DEFAULT_TIMEOUT`] when unset.
pub fn op_timeout() -> Result<Duration, StoreError> {
    match std::env::var(TIMEOUT_VAR) {
        Err(_) => Ok(DEFAULT_TIMEOUT),
        Ok(text) => parse_timeout(&text).ok_or_else(|| {
            StoreError::Unavailable(format!(
                "{TIMEOUT_VAR}={text:?}: expected a positive number of seconds"
            ))
        }),
    }
}

fn parse_timeout(text: &str) -> Option<Duration> {
    let secs: f64 = text.trim().parse().ok()?;
    (secs.is_finite() && secs > 0.0 && secs <= 86_400.0).then(|| Duration::from_secs_f64(secs))
}

/// A stored status, or the error saying the database holds one this version does not know.
fn status_of(text: &str) -> Result<JobStatus, StoreError> {
    JobStatus::parse(text)
        .ok_or_else(|| StoreError::Corrupt(format!("unknown job status {text:?}")))
}

fn pool_error(e: PoolError) -> StoreError {
    match e {
        PoolError::Backend(e) => StoreError::Postgres(e),
        PoolError::Timeout(_) => StoreError::Unavailable(
            "no connection to the database within the pool's timeout".to_string(),
        ),
        other => StoreError::Unavailable(other.to_string()),
    }
}

/// The tables and columns the migrations create, read from their `CREATE TABLE` statements:
/// each column is a line of its own that starts with the column's name.
fn schema_columns() -> Vec<(String, Vec<String>)> {
    let mut tables: Vec<(String, Vec<String>)> = vec![];
    for (_, sql) in MIGRATIONS {
        let mut current: Option<(String, Vec<String>)> = None;
        for line in sql.lines().map(str::trim) {
            if let Some(rest) = line.strip_prefix("CREATE TABLE ") {
                let name = rest.split([' ', '(']).next().unwrap_or_default();
                current = Some((name.to_string(), vec![]));
            } else if line.starts_with(");") {
                tables.extend(current.take());
            } else if let Some((_, cols)) = current.as_mut() {
                let first = line.split_whitespace().next().unwrap_or_default();
                if !first.is_empty() && !line.starts_with("--") {
                    cols.push(first.to_string());
                }
            }
        }
    }
    tables
}

/// Refuses a database whose tables lack a column the migrations create, or the uniqueness of
/// `jobs.active_key` (one in-flight job per identical post), naming what is missing: an
/// edited or damaged schema otherwise shows as queries failing one by one, a job queued
/// forever, a generic error per request.
async fn check_schema(tx: &tokio_postgres::Transaction<'_>) -> Result<(), StoreError> {
    let have: Vec<(String, String)> = tx
        .query(
            "SELECT table_name::text, column_name::text FROM information_schema.columns
             WHERE table_schema = current_schema()",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let mut missing = vec![];
    for (table, cols) in schema_columns() {
        if !have.iter().any(|(t, _)| *t == table) {
            missing.push(format!("table {table}"));
            continue;
        }
        for c in cols {
            if !have.iter().any(|(t, col)| *t == table && *col == c) {
                missing.push(format!("column {table}.{c}"));
            }
        }
    }
    let unique = tx
        .query(
            "SELECT 1 FROM pg_indexes WHERE schemaname = current_schema() AND tablename = 'jobs'
             AND indexdef LIKE 'CREATE UNIQUE INDEX%(active_key)%'",
            &[],
        )
        .await?;
    if unique.is_empty() && !missing.iter().any(|m| m == "table jobs") {
        missing.push("the unique index on jobs.active_key".to_string());
    }
    if missing.is_empty() {
        return Ok(());
    }
    Err(StoreError::Corrupt(format!(
        "the database's schema (version {}) lacks {}: it was edited or damaged since remat \
         created it; restore it from a backup, or start on an empty database",
        MIGRATIONS.last().map_or(0, |m| m.0),
        missing.join(", ")
    )))
}

/// `url` with its password (if any) replaced by `***`, for messages and logs: the one in
/// the user info (`user:PASSWORD@`) and every `password=` parameter (a URL's query, a libpq
/// `key=value` string).
pub fn redact(url: &str) -> String {
    redact_parameters(&redact_userinfo(url))
}

fn redact_userinfo(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let Some(at) = authority.rfind('@') else {
        return url.to_string();
    };
    let userinfo = &authority[..at];
    match userinfo.find(':') {
        Some(colon) => format!(
            "{}{}:***{}",
            &url[..scheme_end + 3],
            &userinfo[..colon],
            &url[scheme_end + 3 + at..]
        ),
        None => url.to_string(),
    }
}

fn redact_parameters(s: &str) -> String {
    const KEY: &str = "password=";
    let lower = s.to_ascii_lowercase();
    let mut out = String::with_capacity(s.len());
    let mut from = 0;
    while let Some(i) = lower[from..].find(KEY).map(|i| from + i) {
        let value = i + KEY.len();
        let end = s[value..]
            .find(|c: char| c == '&' || c.is_whitespace())
            .map_or(s.len(), |e| value + e);
        out.push_str(&s[from..value]);
        out.push_str("***");
        from = end;
    }
    out.push_str(&s[from..]);
    out
}

/// Whether `db` names a PostgreSQL database (`postgres://` or `postgresql://`, the scheme in
/// any case) rather than a SQLite file.
pub fn is_postgres_url(db: &str) -> bool {
    let lower = db.trim_start().to_ascii_lowercase();
    lower.starts_with("postgres://") || lower.starts_with("postgresql://")
}

/// Refuses, for `--db`, what is neither a PostgreSQL URL nor plausibly a SQLite file path: a
/// URL of another scheme (a typo such as `postgress://`) and a libpq `key=value` connection
/// string, which would otherwise become the name of a new SQLite file (its password in the
/// file name). The message has the password redacted.
pub fn check_sqlite_path(db: &str) -> Result<(), String> {
    if let Some(scheme) = db.split_once("://").map(|(s, _)| s) {
        return Err(format!(
            "{}: a URL of scheme {scheme:?}, which remat does not know: a PostgreSQL database \
             is postgres://user:password@host:port/db (or postgresql://), a SQLite store a file path",
            redact(db)
        ));
    }
    const LIBPQ_KEYS: [&str; 6] = [
        "host=",
        "hostaddr=",
        "user=",
        "password=",
        "dbname=",
        "port=",
    ];
    let conninfo = db.split_whitespace().any(|w| {
        LIBPQ_KEYS
            .iter()
            .any(|k| w.to_ascii_lowercase().starts_with(k))
    });
    if conninfo {
        return Err(format!(
            "{}: a libpq key=value connection string, which remat does not read: give the \
             database as postgres://user:password@host:port/db",
            redact(db)
        ));
    }
    if db.trim().is_empty() {
        return Err(
            "an empty path: give the SQLite store's file (the default is remat.db), or a \
             PostgreSQL URL"
                .to_string(),
        );
    }
    // A folder or a device is no store (SQLite's own error said "unable to open database
    // file" or "disk I/O error", after the lock file beside it was made).
    if let Ok(meta) = std::fs::metadata(db) {
        if !meta.is_file() {
            return Err(format!(
                "{db}: not a regular file (a folder or a device): give the SQLite store's file"
            ));
        }
    }
    Ok(())
}

impl PgStore {
    /// A pool of at most `connections` connections to `url`; nothing is connected yet. Every
    /// operation is bounded by [`op_timeout`] (`REMAT_DB_TIMEOUT`).
    pub fn new(url: &str, connections: usize) -> Result<PgStore, StoreError> {
        PgStore::with_timeout(url, connections, op_timeout()?)
    }

    /// [`PgStore::new`] with the bound on each operation given.
    pub fn with_timeout(
        url: &str,
        connections: usize,
        timeout: Duration,
    ) -> Result<PgStore, StoreError> {
        // URL schemes are case-insensitive; tokio-postgres reads only lowercase ones.
        let url = url.trim_start();
        let lowered = match url.split_once("://") {
            Some((scheme, rest)) => format!("{}://{rest}", scheme.to_ascii_lowercase()),
            None => url.to_string(),
        };
        let tls = super::pgtls::split(&lowered).map_err(|e| match e {
            StoreError::Config(m) => StoreError::Config(format!("{}: {m}", redact(url))),
            other => other,
        })?;
        let mut config: tokio_postgres::Config =
            tls.url.parse().map_err(|e: tokio_postgres::Error| {
                StoreError::Unavailable(format!(
                    "{} is not a PostgreSQL connection URL: {e}",
                    redact(url)
                ))
            })?;
        // A database that stops answering without closing the connection (a frozen machine, a
        // network cut without a reset) is noticed by the kernel too, not only by the bound on
        // each operation, unless the URL says otherwise.
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(timeout);
        }
        if !lowered.contains("keepalives") {
            config
                .keepalives(true)
                .keepalives_idle(Duration::from_secs(15))
                .keepalives_interval(Duration::from_secs(5))
                .keepalives_retries(3);
        }
        if !lowered.contains("tcp_user_timeout") {
            config.tcp_user_timeout(timeout.max(Duration::from_secs(1)));
        }
        let manager = Manager::from_config(
            config.clone(),
            tls.tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let step = timeout.min(Duration::from_secs(5));
        let pool = Pool::builder(manager)
            .max_size(connections.max(1))
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(step))
            .create_timeout(Some(step))
            .recycle_timeout(Some(step))
            .build()
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        Ok(PgStore {
            pool,
            // The lowered URL, TLS parameters included: what a worker started from it
            // (`Workers::start`) opens must connect as this pool does.
            url: Arc::from(lowered.as_str()),
            config: Arc::new(config),
            tls: tls.tls,
            closed: Arc::new(AtomicBool::new(false)),
            timeout,
        })
    }

    /// The database's URL, its scheme in lower case (with its password: never log it;
    /// [`redact`] it).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A connection of its own, opened as the pool's are (bounds, keepalives, TLS): the
    /// listener of `http/notices.rs`.
    pub async fn connect(
        &self,
    ) -> Result<
        (
            tokio_postgres::Client,
            tokio_postgres::Connection<
                tokio_postgres::Socket,
                <MakeRustlsConnect as tokio_postgres::tls::MakeTlsConnect<
                    tokio_postgres::Socket,
                >>::Stream,
            >,
        ),
        tokio_postgres::Error,
    > {
        self.config.connect(self.tls.clone()).await
    }

    /// The bound on each operation.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool.get().await.map_err(pool_error)
    }

    /// `op`, or [`StoreError::Unavailable`] when the database has not answered it within
    /// [`PgStore::timeout`]. A connection whose answer did not come goes back to the pool (a
    /// transaction left open is rolled back), where it is used again once it answers, or
    /// dropped when it is closed (TCP keepalives and `tcp_user_timeout` close a dead one).
    async fn bounded<T>(
        &self,
        op: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.bounded_for(0, op).await
    }

    /// [`PgStore::bounded`] for an operation that moves `bytes` (a model, a result): the bound
    /// plus their time at [`PAYLOAD_BYTES_PER_SECOND`], so that a large upload is not taken
    /// for a database that stopped answering.
    async fn bounded_for<T>(
        &self,
        bytes: usize,
        op: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let limit = limit_for(self.timeout, bytes);
        match tokio::time::timeout(limit, op).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Unavailable(format!(
                "the database did not answer within {} s ({TIMEOUT_VAR}{})",
                limit.as_secs_f64(),
                if bytes > 0 {
                    format!(", with {bytes} bytes to move")
                } else {
                    String::new()
                }
            ))),
        }
    }

    /// Applies the schema versions the database lacks (each process at start; concurrent
    /// starts wait on one advisory lock). Returns the versions applied.
    pub async fn migrate(&self) -> Result<Vec<i32>, StoreError> {
        self.bounded(async {
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
                .await?;
            // "relation ... already exists, skipping" at every start is no news.
            tx.batch_execute("SET LOCAL client_min_messages = warning")
                .await?;
            tx.batch_execute(
                "CREATE TABLE IF NOT EXISTS remat_migrations (
                     version    INTEGER PRIMARY KEY,
                     applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
            )
            .await?;
            let done: Vec<i32> = tx
                .query("SELECT version FROM remat_migrations", &[])
                .await?
                .iter()
                .map(|r| r.get(0))
                .collect();
            let mut applied = vec![];
            for &(version, sql) in MIGRATIONS {
                if done.contains(&version) {
                    continue;
                }
                tx.batch_execute(sql).await?;
                tx.execute(
                    "INSERT INTO remat_migrations (version) VALUES ($1)",
                    &[&version],
                )
                .await?;
                applied.push(version);
            }
            if let Some(newest) = done.iter().max() {
                if *newest > MIGRATIONS.last().map_or(0, |m| m.0) {
                    return Err(StoreError::Corrupt(format!(
                        "the database's schema is at version {newest}, newer than this remat knows ({}); upgrade remat",
                        MIGRATIONS.last().map_or(0, |m| m.0)
                    )));
                }
            }
            check_schema(&tx).await?;
            tx.commit().await?;
            Ok(applied)
        })
        .await
    }

    /// Refuses every later write of this process (a replica shutting down).
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Creates the job (and stores the model, once per hash), unless a job of the same kind
    /// and cache key that `reuse` takes exists (done or in flight, or in flight only): then
    /// that job's id. `QueueFull` when `queue` jobs are waiting already. `None` when this
    /// process is shutting down.
    #[allow(clippy::too_many_arguments)]
    pub async fn claim(
        &self,
        job: &NewJob<'_>,
        reuse: Reuse,
        model: &[u8],
        request: &str,
        validate: bool,
        queue: usize,
    ) -> Result<Option<Claim>, StoreError> {
        self.bounded_for(model.len(), async {
            if self.is_closed() {
                return Ok(None);
            }
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            let kind = job.kind.as_str();
            if reuse == Reuse::Any {
                let existing = tx
                    .query_opt(
                        "SELECT id FROM jobs WHERE cache_key = $1 AND kind = $2 AND status <> 'failed'
                         ORDER BY seq DESC LIMIT 1",
                        &[&job.cache_key, &kind],
                    )
                    .await?;
                if let Some(row) = existing {
                    return Ok(Some(Claim::Existing(row.get(0))));
                }
            }
            tx.execute(
                "INSERT INTO models (hash, format, bytes) VALUES ($1, $2, $3) ON CONFLICT (hash) DO NOTHING",
                &[&job.model_hash, &job.model_format, &model],
            )
            .await?;
            // The count and the insert under one lock, held to the commit, so that posts arriving
            // together on any replicas never pass `--queue` (they passed it by a quarter).
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&QUEUE_LOCK])
                .await?;
            let waiting: i64 = tx
                .query_one("SELECT count(*) FROM jobs WHERE status = 'queued'", &[])
                .await?
                .get(0);
            if waiting >= i64::try_from(queue).unwrap_or(i64::MAX) {
                // Returning without a commit rolls the model's row back too.
                return Ok(Some(Claim::QueueFull));
            }
            // In flight, one job per key: a post that may take one (`Any`, `InFlight`) follows it.
            let active_key = (reuse != Reuse::Never).then_some(job.cache_key);
            let inserted = tx
                .query_opt(
                    "INSERT INTO jobs (id, kind, model_hash, model_name, model_format, options, request,
                                       validate, cache_key, active_key, status, created_at, updated_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'queued', $11, $11)
                     ON CONFLICT (active_key) DO NOTHING
                     RETURNING id",
                    &[
                        &job.id,
                        &kind,
                        &job.model_hash,
                        &job.model_name,
                        &job.model_format,
                        &job.options,
                        &request,
                        &validate,
                        &job.cache_key,
                        &active_key,
                        &job.created_at,
                    ],
                )
                .await?;
            let claim = match inserted {
                Some(_) => Claim::Created,
                None => {
                    // An identical post (another replica's) is in flight: follow it.
                    let row = tx
                        .query_one(
                            "SELECT id FROM jobs WHERE active_key = $1",
                            &[&job.cache_key],
                        )
                        .await?;
                    Claim::Existing(row.get(0))
                }
            };
            tx.commit().await?;
            Ok(Some(claim))
        })
        .await
    }

    fn row(r: &tokio_postgres::Row) -> Result<Row, StoreError> {
        let status: String = r.get(1);
        Ok(Row {
            id: r.get(0),
            status: status_of(&status)?,
            model_hash: r.get(2),
            model_name: r.get(3),
            model_format: r.get(4),
            options: r.get(5),
            created_at: r.get(6),
            updated_at: r.get(7),
            summary: r.get(8),
            error: r.get(9),
            error_status: r
                .get::<_, Option<i32>>(10)
                .map(|s| u16::try_from(s).unwrap_or(500)),
        })
    }

    /// One job of `kind`, with its engine document.
    pub async fn get(&self, kind: Kind, id: &str) -> Result<Option<Record>, StoreError> {
        self.bounded(async {
            let client = self.client().await?;
            let sql = format!("SELECT {ROW_COLUMNS}, result FROM jobs WHERE id = $1 AND kind = $2");
            let stmt = client.prepare_cached(&sql).await?;
            match client.query_opt(&stmt, &[&id, &kind.as_str()]).await? {
                Some(r) => Ok(Some(Record {
                    row: Self::row(&r)?,
                    result: r.get(11),
                })),
                None => Ok(None),
            }
        })
        .await
    }

    /// The status of one job of `kind` (`None` when there is none): what a waiting request
    /// polls.
    pub async fn status(&self, kind: Kind, id: &str) -> Result<Option<JobStatus>, StoreError> {
        self.bounded(async {
            let client = self.client().await?;
            let stmt = client
                .prepare_cached("SELECT status FROM jobs WHERE id = $1 AND kind = $2")
                .await?;
            match client.query_opt(&stmt, &[&id, &kind.as_str()]).await? {
                Some(r) => Ok(Some(status_of(r.get(0))?)),
                None => Ok(None),
            }
        })
        .await
    }

    /// Jobs of `kind`, newest first, optionally of one model.
    pub async fn list(
        &self,
        kind: Kind,
        model: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Row>, StoreError> {
        self.bounded(async {
            let client = self.client().await?;
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let rows = match model {
                Some(hash) => {
                    let sql = format!(
                        "SELECT {ROW_COLUMNS} FROM jobs WHERE kind = $1 AND model_hash = $2 ORDER BY seq DESC LIMIT $3"
                    );
                    client.query(&sql, &[&kind.as_str(), &hash, &limit]).await?
                }
                None => {
                    let sql = format!(
                        "SELECT {ROW_COLUMNS} FROM jobs WHERE kind = $1 ORDER BY seq DESC LIMIT $2"
                    );
                    client.query(&sql, &[&kind.as_str(), &limit]).await?
                }
            };
            rows.iter().map(Self::row).collect()
        })
        .await
    }

    /// Every plan of one model, oldest first.
    pub async fn history(&self, model_hash: &str) -> Result<Vec<Row>, StoreError> {
        self.bounded(async {
            let client = self.client().await?;
            let sql = format!(
                "SELECT {ROW_COLUMNS} FROM jobs WHERE kind = 'plan' AND model_hash = $1 ORDER BY seq ASC"
            );
            let rows = client.query(&sql, &[&model_hash]).await?;
            rows.iter().map(Self::row).collect()
        })
        .await
    }

    /// Replaces the document of a finished job of `kind` (a validation attached to it); false
    /// when there is no such job done. Every replica drops its cached response when this
    /// commits, as for a deletion (`http/notices.rs`): its next read asks the database.
    pub async fn replace_result(
        &self,
        kind: Kind,
        id: &str,
        result: &str,
    ) -> Result<bool, StoreError> {
        self.bounded_for(result.len(), async {
            if self.is_closed() {
                return Ok(false);
            }
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            let n = tx
                .execute(
                    "UPDATE jobs SET result = $3, updated_at = $4 WHERE id = $1 AND kind = $2 AND status = 'done'",
                    &[&id, &kind.as_str(), &result, &now()],
                )
                .await?;
            if n == 0 {
                return Ok(false);
            }
            commit_with_notice(tx, kind, id).await?;
            Ok(true)
        })
        .await
    }

    /// Deletes a job of `kind` (and its model, when no other job has it); false when there is
    /// none. A worker running it finds nothing to write to.
    pub async fn delete(&self, kind: Kind, id: &str) -> Result<bool, StoreError> {
        self.bounded(async {
            if self.is_closed() {
                return Ok(false);
            }
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            let deleted = tx
                .query_opt(
                    "DELETE FROM jobs WHERE id = $1 AND kind = $2 RETURNING model_hash",
                    &[&id, &kind.as_str()],
                )
                .await?;
            let Some(row) = deleted else {
                return Ok(false);
            };
            let hash: String = row.get(0);
            tx.execute(
                "DELETE FROM models WHERE hash = $1 AND NOT EXISTS (SELECT 1 FROM jobs WHERE model_hash = $1)",
                &[&hash],
            )
            .await?;
            commit_with_notice(tx, kind, id).await?;
            Ok(true)
        })
        .await
    }

    /// Fails the jobs whose lease ran out after `max_attempts` claims (their workers died
    /// under them each time), then claims the oldest job that is queued or whose lease ran
    /// out, for `owner`, for `lease`.
    pub async fn claim_next(
        &self,
        owner: &str,
        takes: Takes,
        lease: Duration,
        max_attempts: i32,
    ) -> Result<Option<Leased>, StoreError> {
        self.bounded_for(CLAIMED_MODEL_BYTES, async {
            let mut client = self.client().await?;
            let stamp = now();
            let exhausted = serde_json::to_string(&worker_lost_error(max_attempts))
                .map_err(|e| StoreError::Corrupt(e.to_string()))?;
            client
                .execute(
                    "WITH lost AS (
                         UPDATE jobs SET status = 'failed', error = $1, error_status = 500, active_key = NULL,
                                         lease_owner = NULL, lease_until = NULL, updated_at = $2
                         WHERE status IN ('solving', 'validating') AND lease_until < now() AND attempts >= $3
                         RETURNING kind, id)
                     SELECT pg_notify($4, kind || '/' || id) FROM lost",
                    &[&exhausted, &stamp, &max_attempts, &FINISHED_CHANNEL],
                )
                .await?;
            let tx = client.transaction().await?;
            let seconds = lease.as_secs_f64();
            let claimed = tx
                .query_opt(
                    "WITH next AS (
                         SELECT seq FROM jobs
                         WHERE (status = 'queued' OR (status IN ('solving', 'validating') AND lease_until < now()))
                           AND validate = ANY($1)
                         ORDER BY seq
                         LIMIT 1
                         FOR UPDATE SKIP LOCKED)
                     UPDATE jobs SET status = 'solving', lease_owner = $2, leased_at = now(),
                                     lease_until = now() + make_interval(secs => $3),
                                     attempts = attempts + 1, updated_at = $4
                     FROM next WHERE jobs.seq = next.seq
                     RETURNING jobs.id, jobs.kind, jobs.model_hash, jobs.model_format, jobs.request, jobs.attempts",
                    &[&takes.flags(), &owner, &seconds, &stamp],
                )
                .await?;
            let Some(row) = claimed else {
                tx.commit().await?;
                return Ok(None);
            };
            let hash: String = row.get(2);
            let model = tx
                .query_one("SELECT bytes FROM models WHERE hash = $1", &[&hash])
                .await?;
            tx.commit().await?;
            let kind: String = row.get(1);
            Ok(Some(Leased {
                id: row.get(0),
                kind: Kind::parse(&kind)
                    .ok_or_else(|| StoreError::Corrupt(format!("unknown job kind {kind:?}")))?,
                model: model.get(0),
                model_hash: hash,
                model_format: row.get(3),
                request: row.get(4),
                attempts: row.get(5),
            }))
        })
        .await
    }

    /// Extends `owner`'s lease on job `id`; false when it is not `owner`'s any more (it ran
    /// out and another worker took the job, or the job was deleted).
    pub async fn renew(&self, id: &str, owner: &str, lease: Duration) -> Result<bool, StoreError> {
        self.bounded(async {
            let client = self.client().await?;
            let n = client
                .execute(
                    "UPDATE jobs SET lease_until = now() + make_interval(secs => $3)
                     WHERE id = $1 AND lease_owner = $2 AND status IN ('solving', 'validating')",
                    &[&id, &owner, &lease.as_secs_f64()],
                )
                .await?;
            Ok(n > 0)
        })
        .await
    }

    /// The phase of a job `owner` holds; false when it does not hold it.
    pub async fn set_phase(
        &self,
        id: &str,
        owner: &str,
        status: JobStatus,
    ) -> Result<bool, StoreError> {
        self.bounded(async {
            let client = self.client().await?;
            let n = client
                .execute(
                    "UPDATE jobs SET status = $3, updated_at = $4
                     WHERE id = $1 AND lease_owner = $2 AND status IN ('solving', 'validating')",
                    &[&id, &owner, &status.as_str(), &now()],
                )
                .await?;
            Ok(n > 0)
        })
        .await
    }

    /// Stores the result of a job `owner` holds, once, and notifies its end on
    /// [`FINISHED_CHANNEL`]; false when it does not hold it (the result is then not stored:
    /// another worker's is, or will be).
    pub async fn finish(
        &self,
        id: &str,
        owner: &str,
        result: &str,
        summary: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.end_held(
            "status = 'done', result = $3, summary = $4",
            id,
            owner,
            &result,
            &summary,
            result.len(),
        )
        .await
    }

    /// Stores the error of a job `owner` holds, once, and notifies its end on
    /// [`FINISHED_CHANNEL`]; false when it does not hold it.
    pub async fn fail(
        &self,
        id: &str,
        owner: &str,
        status: u16,
        error: &ErrorObject,
    ) -> Result<bool, StoreError> {
        let text = serde_json::to_string(error).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        self.end_held(
            "status = 'failed', error = $3, error_status = $4",
            id,
            owner,
            &text,
            &i32::from(status),
            0,
        )
        .await
    }

    /// Ends job `id` if `owner` holds it: `set` (its columns from `$3` and `$4`), the lease
    /// released, and its key notified on [`FINISHED_CHANNEL`] when the update commits; false
    /// when `owner` does not hold it (nothing is written or notified).
    async fn end_held(
        &self,
        set: &str,
        id: &str,
        owner: &str,
        third: &(dyn tokio_postgres::types::ToSql + Sync),
        fourth: &(dyn tokio_postgres::types::ToSql + Sync),
        payload: usize,
    ) -> Result<bool, StoreError> {
        self.bounded_for(payload, async {
            let client = self.client().await?;
            let statement = format!(
                "WITH ended AS (
                     UPDATE jobs SET {set}, updated_at = $5,
                                     active_key = NULL, lease_owner = NULL, lease_until = NULL
                     WHERE id = $1 AND lease_owner = $2 AND status IN ('solving', 'validating')
                     RETURNING kind, id)
                 SELECT pg_notify($6, kind || '/' || id) FROM ended"
            );
            let n = client
                .execute(
                    &statement,
                    &[&id, &owner, third, fourth, &now(), &FINISHED_CHANNEL],
                )
                .await?;
            Ok(n > 0)
        })
        .await
    }

    /// Waiting and running jobs per kind, and the age of the oldest running job's claim.
    /// Puts the jobs that the workers named `name/<index>` hold back in the queue (a process
    /// stopping at once, on a second signal): another worker takes each at once rather than
    /// when its lease runs out; the claim is not counted against its attempts, as no worker
    /// died. Returns how many.
    pub async fn give_back(&self, name: &str) -> Result<u64, StoreError> {
        self.bounded(async {
            let client = self.client().await?;
            let owners = format!("{}/%", like_escape(name));
            Ok(client
                .execute(
                    "UPDATE jobs SET status = 'queued', lease_owner = NULL, leased_at = NULL,
                                     lease_until = NULL, attempts = GREATEST(attempts - 1, 0),
                                     updated_at = $2
                     WHERE lease_owner LIKE $1 AND status IN ('solving', 'validating')",
                    &[&owners, &now()],
                )
                .await?)
        })
        .await
    }

    pub async fn queue_stats(&self) -> Result<Vec<QueueStats>, StoreError> {
        self.bounded(async {
            let client = self.client().await?;
            let rows = client
                .query(
                    "SELECT kind,
                            count(*) FILTER (WHERE status = 'queued'),
                            count(*) FILTER (WHERE status IN ('solving', 'validating')),
                            COALESCE(EXTRACT(EPOCH FROM now() - min(leased_at)
                                     FILTER (WHERE status IN ('solving', 'validating')))::float8, 0),
                            COALESCE(EXTRACT(EPOCH FROM now() - min(created_at::timestamptz)
                                     FILTER (WHERE status = 'queued' AND NOT validate))::float8, 0),
                            COALESCE(EXTRACT(EPOCH FROM now() - min(created_at::timestamptz)
                                     FILTER (WHERE status = 'queued' AND validate))::float8, 0)
                     FROM jobs WHERE status IN ('queued', 'solving', 'validating')
                     GROUP BY kind",
                    &[],
                )
                .await?;
            Ok(rows
                .iter()
                .map(|r| QueueStats {
                    kind: r.get(0),
                    queued: r.get(1),
                    running: r.get(2),
                    oldest_lease_seconds: r.get(3),
                    oldest_queued_seconds: [r.get(4), r.get(5)],
                })
                .collect())
        })
        .await
    }
}

/// `s` with LIKE's wildcards and escape character escaped.
fn like_escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('%', "\\%")
        .replace('_', "\\_")
}

/// The error of a job that stopped `attempts` workers in a row (each died while running it).
pub fn worker_lost_error(attempts: i32) -> ErrorObject {
    ErrorObject {
        code: "worker_lost".to_string(),
        message: format!(
            "the job was claimed {attempts} times and its worker stopped (killed or crashed) each \
             time before it finished; it is not retried again"
        ),
        details: serde_json::json!({ "attempts": attempts }),
    }
}

/// Commits `tx` with a notice on [`DELETED_CHANNEL`] of the job's cache key: every replica drops
/// its cached response to the job when the change commits (`http/notices.rs`).
async fn commit_with_notice(
    tx: deadpool_postgres::Transaction<'_>,
    kind: Kind,
    id: &str,
) -> Result<(), StoreError> {
    let key = format!("{}/{id}", kind.as_str());
    tx.execute("SELECT pg_notify($1, $2)", &[&DELETED_CHANNEL, &key])
        .await?;
    tx.commit().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{check_sqlite_path, is_postgres_url, redact};

    /// A large model gets time to move on top of the bound: 512 MiB at 16 MiB/s, 32 s more; an
    /// operation without payload has the bound alone.
    #[test]
    fn an_operation_moving_a_model_gets_its_bytes_time_on_top_of_the_bound() {
        use std::time::Duration;
        let ten = Duration::from_secs(10);
        assert_eq!(super::limit_for(ten, 0), ten);
        assert_eq!(super::limit_for(ten, 512 << 20), Duration::from_secs(42));
    }

    #[test]
    fn passwords_are_redacted_from_urls() {
        assert_eq!(
            redact("postgres://remat:s3cr3t@db.example:5432/plans?sslmode=disable"),
            "postgres://remat:***@db.example:5432/plans?sslmode=disable"
        );
        assert_eq!(
            redact("postgres://remat@db/plans"),
            "postgres://remat@db/plans"
        );
        assert_eq!(redact("postgresql://db/plans"), "postgresql://db/plans");
        assert_eq!(
            redact("postgres://u:p@ss:w@host/db"),
            "postgres://u:***@host/db"
        );
        assert_eq!(redact("remat.db"), "remat.db");
        assert!(is_postgres_url("postgresql://x/y") && is_postgres_url("postgres://x"));
        assert!(!is_postgres_url("remat.db") && !is_postgres_url("/var/lib/remat.db"));
    }

    /// A password in a query string, in a libpq string or behind a mistyped scheme is never
    /// printed; an uppercase scheme is PostgreSQL's; what is no file path is refused.
    #[test]
    fn every_password_form_is_redacted_and_odd_stores_refused() {
        assert_eq!(
            redact("postgres://remat@db/plans?sslmode=disable&password=s3cret&x=1"),
            "postgres://remat@db/plans?sslmode=disable&password=***&x=1"
        );
        assert_eq!(
            redact("host=db user=remat PASSWORD=s3cret dbname=plans"),
            "host=db user=remat PASSWORD=*** dbname=plans"
        );
        assert_eq!(
            redact("postgress://remat:s3cret@db/plans"),
            "postgress://remat:***@db/plans"
        );
        assert!(is_postgres_url("PostgreSQL://remat:pw@db/plans"));
        assert!(is_postgres_url("POSTGRES://db/plans"));
        let typo = check_sqlite_path("postgress://remat:s3cret@db/plans").expect_err("a URL");
        assert!(
            typo.contains("scheme \"postgress\"") && !typo.contains("s3cret"),
            "{typo}"
        );
        let kv = check_sqlite_path("host=db user=remat password=s3cret dbname=plans")
            .expect_err("a libpq string");
        assert!(
            kv.contains("libpq key=value") && !kv.contains("s3cret"),
            "{kv}"
        );
        assert!(check_sqlite_path("remat.db").is_ok());
        // An empty path (REMAT_DB= set but empty) and a folder or a device are no store.
        assert!(check_sqlite_path("").unwrap_err().contains("an empty path"));
        assert!(check_sqlite_path(".")
            .unwrap_err()
            .contains("not a regular file"));
        assert!(check_sqlite_path("/dev/null")
            .unwrap_err()
            .contains("not a regular file"));
        assert!(check_sqlite_path("/var/lib/remat/plans v2.db").is_ok());
    }
}
