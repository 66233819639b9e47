//! The one integration-test binary of `remat-exec`.

mod run;

/// The executor's tests read the real heap peak.
#[global_allocator]
static ALLOC: remat_exec::Counting = remat_exec::Counting;

/// The package's directory: cargo's at run time, else the build's. A test binary built in
/// another clone that shares the cargo target folder (as CI's does) is reused here unchanged,
/// with that clone's path in `env!`.
pub fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), Into::into)
}
