//! The one integration-test binary of `remat-server` (HiGHS, candle, axum and SQLite linked
//! once for every test).
//!
//! The CLI tests (`gate`, `validate_cli`, `web_e2e`) run the `remat` binary, which installs
//! the counting allocator itself; no test here measures the heap in this process.
// The API suite (`api.rs`) runs on both stores: the same file twice, as `api_sqlite` and
// `api_postgres` (`common::store_of` reads the module's name).
#![allow(clippy::duplicate_mod)]

mod api_pipeline;
#[path = "api.rs"]
mod api_postgres;
#[path = "api.rs"]
mod api_sqlite;
mod common;
mod deep;
mod deep_eval;
mod documents;
mod fuzz_openapi;
mod gate;
mod maximize;
mod pg;
mod replicas;
mod store_sqlite;
mod validate_cli;
mod web_e2e;
