//! `remat-solver`: checkpoint scheduling as pure optimization.
//!
//! A [`Problem`] is a DAG of values in a topological order; a [`Schedule`] is a sequence of
//! `Compute` / `Free` steps; [`simulate`] is the one function that validates a schedule and
//! scores it. Every algorithm returns a schedule and every figure comes from `simulate`.
//!
//! Architecture invariant: this crate knows nothing of ONNX, tensors or HTTP.
//!
//! The modules are layered, each using only those above it:
//! `problem`, `schedule` (and `io`, `cancel`) → `baselines`, `dp`, `search`, `ilp` → `budget` → `plan`.
//!
//! # Example
//!
//! A training step of a three-layer chain: forward `a → b → c`, the loss, and one backward node
//! per layer that reads the layer's input and the incoming gradient. [`plan::plan`] finds a
//! schedule within 90% of the store-all peak, and [`simulate`] checks it and gives its figures.
//!
//! ```
//! use remat_solver::plan::{plan, PlanOptions, Status};
//! use remat_solver::{simulate, store_all_peak, Node, NodeKind, Problem};
//!
//! let node = |id: &str, bytes: u64, deps: Vec<usize>, kind: NodeKind| Node {
//!     id: id.to_string(),
//!     name: id.to_string(),
//!     cost: 1.0,
//!     bytes,
//!     deps,
//!     kind,
//!     required: true,
//! };
//! let problem = Problem::new(
//!     "tiny",
//!     vec![
//!         node("a", 100, vec![], NodeKind::Forward),
//!         node("b", 100, vec![0], NodeKind::Forward),
//!         node("c", 100, vec![1], NodeKind::Forward),
//!         node("loss", 4, vec![2], NodeKind::Loss),
//!         node("grad_c", 4, vec![1, 2, 3], NodeKind::Backward),
//!         node("grad_b", 4, vec![0, 1, 4], NodeKind::Backward),
//!         node("grad_a", 4, vec![0, 5], NodeKind::Backward),
//!     ],
//!     0,
//! )?;
//! let store_all = store_all_peak(&problem);
//! let budget = store_all * 9 / 10;
//! let (schedule, report) = plan(&problem, &PlanOptions::new(budget))?;
//! assert_ne!(report.status, Status::Infeasible);
//!
//! // The report's figures are the simulator's.
//! let stats = simulate(&problem, &schedule)?;
//! assert!(stats.peak_bytes <= budget);
//! assert_eq!(stats.peak_bytes, report.predicted.peak_bytes);
//! // Fitting the budget costs recomputation.
//! assert!(stats.recomputations > 0);
//! assert!(stats.overhead(&problem) > 0.0);
//! # Ok::<(), remat_solver::SolverError>(())
//! ```

pub mod cancel;
pub mod error;
pub mod io;
pub mod problem;
pub mod schedule;
pub mod sysmem;

pub use cancel::Cancel;
pub use error::{Result, SolverError};
pub use problem::{Node, NodeId, NodeKind, Problem};
pub use schedule::{simulate, store_all, store_all_peak, with_frees, Schedule, Stats, Step};

// Schedule generators: the baselines, the chain DP, the local search over retention horizons.
pub mod baselines;
pub mod dp;
pub mod search;
pub mod segments;
// The exact MILP (Checkmate) through good_lp + HiGHS.
#[cfg(feature = "highs")]
mod highs_run;
#[cfg(feature = "highs")]
pub mod ilp;
// The time-point relaxation: a lower bound for every schedule that scales to deep models.
#[cfg(feature = "highs")]
pub mod bound;
// Budget tools on top of the generators: the minimum feasible budget, peak descent, pruning.
pub mod budget;
// Algorithm choice, the plan report, the budget sweep.
pub mod plan;
// The `torch-sac` execution model: PyTorch's checkpoint with a selective policy per region.
pub mod sac;
#[cfg(test)]
mod testutil;
