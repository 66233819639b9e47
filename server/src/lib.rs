//! `remat-server`: the `remat` binary's library — the CLI's commands, the planning pipeline that
//! joins planner and solver, and the HTTP service with its plan store.
//!
//! Architecture invariant: this is the only crate that knows HTTP and the store.

pub mod engine;
pub mod gate;
pub mod pipeline;

// The HTTP service: routes, jobs, store.
pub mod http;

/// Bytes for humans: "512 B", "1.50 GiB".
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = b as f64;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < UNITS.len() {
        x /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{x:.2} {}", UNITS[u])
    }
}
