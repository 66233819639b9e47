//! `remat-server`: the `remat` binary's library — the planning pipeline that joins planner,
//! solver and executor, the documents it produces, the CI gate, and the HTTP service with its
//! plan store. The binary (`src/main.rs`, `src/cli/`) parses arguments and prints.
//!
//! Architecture invariant: this is the only crate that knows HTTP and the store.
//!
//! The modules are layered, each using only those before it: `engine` (the seam: options,
//! errors, documents) → `pipeline` (the real engine) → `text`, `gate`; and `engine` → `http`,
//! which never sees the pipeline.

pub mod engine;
pub mod pipeline;

pub mod gate;
pub mod text;

// The HTTP service: routes, jobs, store.
pub mod http;

/// Bytes for humans: "512 B", "1.5 GiB" (the planner's formatter, so every output agrees).
pub use remat_planner::inspect::human_bytes;
