//! The one integration-test binary of `remat-server` (HiGHS, candle, axum and SQLite linked
//! once for every test).
//!
//! The CLI tests (`gate`, `validate_cli`, `web_e2e`) run the `remat` binary, which installs
//! the counting allocator itself; no test here measures the heap in this process.

mod api;
mod api_pipeline;
mod common;
mod documents;
mod fuzz_openapi;
mod gate;
mod validate_cli;
mod web_e2e;
