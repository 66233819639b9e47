//! `remat._remat`: the bindings `remat.torch` calls. JSON strings in and out, so the Python
//! side computes no plan figure itself and the Rust side knows nothing of torch.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use remat_solver::plan::DEFAULT_FRACTIONS;
use remat_solver::sac::{self, PlanDocument, SacPlan, TorchGraph};

fn err(e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(e.to_string())
}

fn graph_of(graph: &str) -> PyResult<TorchGraph> {
    TorchGraph::from_json(graph).map_err(err)
}

/// plan(graph, budget) -> str
///
/// Plans a captured graph (`remat.torch-graph` JSON) under `budget` ("8GiB", bytes, "0.5x" of
/// the unplanned peak, or "min") in the torch-sac model; returns the plan document (JSON).
#[pyfunction]
fn plan(py: Python<'_>, graph: &str, budget: &str) -> PyResult<String> {
    let g = graph_of(graph)?;
    // One candidate set answers both the budget ("min" is its least peak) and the plan.
    let doc = py
        .detach(|| {
            let candidates = sac::Candidates::new(&g)?;
            let budget = candidates.budget(budget)?;
            let (plan, report) = candidates.select(budget)?;
            Ok::<_, remat_solver::SolverError>(sac::document(&g, &plan, &report))
        })
        .map_err(err)?;
    serde_json::to_string(&doc).map_err(err)
}

/// sweep(graph, fractions=None) -> str
///
/// The torch-sac plans at `fractions` of the unplanned peak (None: `remat sweep`'s defaults,
/// `remat_solver::plan::DEFAULT_FRACTIONS`), as `remat sweep` gives them: per
/// budget its status, overhead, gap (to the plan's lower bound) and the overhead of
/// `none` and `full` where they fit; the overhead never rises with the budget. JSON: a list of
/// points in the order of `fractions`.
#[pyfunction]
#[pyo3(signature = (graph, fractions=None))]
fn sweep(py: Python<'_>, graph: &str, fractions: Option<Vec<f64>>) -> PyResult<String> {
    let g = graph_of(graph)?;
    let fractions = fractions.unwrap_or_else(|| DEFAULT_FRACTIONS.to_vec());
    let sweep = py.detach(|| sac::sweep(&g, &fractions)).map_err(err)?;
    serde_json::to_string(&sweep.points).map_err(err)
}

/// timeline(graph, plan=None) -> str
///
/// The simulated memory timeline: `[{"op", "rerun_of", "bytes"}]`, one point per op run.
#[pyfunction]
#[pyo3(signature = (graph, plan=None))]
fn timeline(graph: &str, plan: Option<&str>) -> PyResult<String> {
    let g = graph_of(graph)?;
    let p = plan_of(&g, plan)?;
    serde_json::to_string(&sac::timeline(&g, &p).map_err(err)?).map_err(err)
}

fn plan_of(g: &TorchGraph, plan: Option<&str>) -> PyResult<SacPlan> {
    match plan {
        Some(text) => {
            let doc: PlanDocument = serde_json::from_str(text).map_err(err)?;
            sac::plan_from_document(g, &doc).map_err(err)
        }
        None => Ok(SacPlan::default()),
    }
}

/// baseline(graph, name) -> str
///
/// The plan document of a fixed policy: "none" (nothing wrapped) or "full" (every region
/// checkpointed, nothing kept), with its simulated figures.
#[pyfunction]
fn baseline(graph: &str, name: &str) -> PyResult<String> {
    let g = graph_of(graph)?;
    let doc = sac::baseline_document(&g, name).map_err(err)?;
    serde_json::to_string(&doc).map_err(err)
}

/// simulate(graph, plan=None) -> str
///
/// The torch-sac simulator's figures (peak, cost, re-run cost per region) of a plan document on
/// its graph; without a plan, of the unplanned step.
#[pyfunction]
#[pyo3(signature = (graph, plan=None))]
fn simulate(graph: &str, plan: Option<&str>) -> PyResult<String> {
    let g = graph_of(graph)?;
    let p = plan_of(&g, plan)?;
    let stats = sac::simulate(&g, &p).map_err(err)?;
    let mut v = serde_json::to_value(&stats).map_err(err)?;
    v["overhead"] = stats.overhead().into();
    serde_json::to_string(&v).map_err(err)
}

#[pymodule]
fn _remat(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(plan, m)?)?;
    m.add_function(wrap_pyfunction!(simulate, m)?)?;
    m.add_function(wrap_pyfunction!(baseline, m)?)?;
    m.add_function(wrap_pyfunction!(timeline, m)?)?;
    m.add_function(wrap_pyfunction!(sweep, m)?)?;
    Ok(())
}
