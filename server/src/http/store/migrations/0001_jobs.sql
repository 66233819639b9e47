-- remat's plan store and job queue on PostgreSQL, version 1.
-- Applied by `remat serve --db postgres://...` and `remat worker` at start, once, under an
-- advisory lock (store/postgres.rs, `migrate`).

-- The models posted, by content hash: a worker on any machine reads the bytes from here.
CREATE TABLE models (
    hash       TEXT PRIMARY KEY,
    format     TEXT NOT NULL,
    bytes      BYTEA NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Plan and sweep jobs: the same columns as the embedded SQLite store, plus what a shared
-- queue needs: the request a worker runs, whether it validates, and the lease.
CREATE TABLE jobs (
    seq          BIGSERIAL PRIMARY KEY,
    id           TEXT NOT NULL UNIQUE,
    kind         TEXT NOT NULL,
    model_hash   TEXT NOT NULL REFERENCES models (hash),
    model_name   TEXT,
    model_format TEXT NOT NULL,
    options      TEXT NOT NULL,
    request      TEXT NOT NULL,
    validate     BOOLEAN NOT NULL,
    cache_key    TEXT NOT NULL,
    -- The cache key while the job is in flight (NULL for a refresh, and once it ends): at
    -- most one in-flight job per identical post, whichever replica receives it.
    active_key   TEXT UNIQUE,
    status       TEXT NOT NULL,
    created_at   TEXT NOT NULL,
    updated_at   TEXT NOT NULL,
    summary      TEXT,
    result       TEXT,
    error        TEXT,
    error_status INTEGER,
    -- How many workers have claimed it; the one holding it and until when.
    attempts     INTEGER NOT NULL DEFAULT 0,
    lease_owner  TEXT,
    leased_at    TIMESTAMPTZ,
    lease_until  TIMESTAMPTZ
);

CREATE INDEX jobs_model ON jobs (model_hash, kind, seq);
CREATE INDEX jobs_cache ON jobs (cache_key, seq);
CREATE INDEX jobs_open ON jobs (seq) WHERE status IN ('queued', 'solving', 'validating');
