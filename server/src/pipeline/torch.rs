//! Captured PyTorch graphs (`remat.torch-graph`, docs/torch.md): planned in the solver's torch-sac
//! execution model, whose document `remat.torch.apply` reads. The service and the CLI hand the
//! bytes here when [`ModelFormat::detect`](crate::engine::ModelFormat::detect) says so.

use super::solve::DEFAULT_FRACTIONS;
use crate::engine::document::{GraphInfo, SweepDocument};
use crate::engine::{EngineError, ErrorKind, ModelFormat, PlanRequest};
use remat_solver::sac::{self, PlanDocument, TorchGraph};
use remat_solver::{Cancel, SolverError};
use serde_json::json;

/// A torch-sac plan and whether its budget was below every plan's peak (then the document is
/// the least-peak plan and says `status: "infeasible"`).
pub struct TorchPlanned {
    pub document: PlanDocument,
    pub infeasible: bool,
}

/// Reads a captured graph; a malformed one is a 400 naming the field.
pub fn read(model: &[u8]) -> Result<TorchGraph, EngineError> {
    let text = std::str::from_utf8(ModelFormat::without_bom(model)).map_err(|e| {
        EngineError::new(
            ErrorKind::BadInput,
            "malformed_graph",
            format!("captured graph is not UTF-8: {e}"),
        )
    })?;
    TorchGraph::from_json(text)
        .map_err(|e| EngineError::new(ErrorKind::BadInput, "malformed_graph", e.to_string()))
}

/// Plans a captured graph under the request's budget (bytes, a size, a fraction of the
/// unplanned peak, or `min`). The solver options of the free model (`solver`, `validate`) do
/// not apply and are refused when given with another value than their default; so is
/// `maximize` (a captured graph has the shapes it was captured at). `time_limit` is not used:
/// the torch-sac planner's work does not depend on it. A raised `cancel` stops it after the
/// candidates are built (the plan's one long step).
pub fn plan(model: &[u8], req: &PlanRequest, cancel: &Cancel) -> Result<TorchPlanned, EngineError> {
    let graph = read(model)?;
    super::load::refuse_options(ModelFormat::TorchGraph, req)?;
    let budget_text = req.budget.as_deref().ok_or_else(|| {
        EngineError::new(
            ErrorKind::BadInput,
            "invalid_option",
            "budget is required: bytes, a size (\"2GiB\"), a fraction of the unplanned peak \
             (\"0.6x\") or \"min\"",
        )
    })?;
    // One candidate set answers both the budget ("min" is its least peak) and the plan.
    let internal =
        |e: SolverError| EngineError::new(ErrorKind::Internal, "internal", e.to_string());
    let candidates = sac::Candidates::new(&graph).map_err(internal)?;
    if cancel.is_cancelled() {
        return Err(EngineError::cancelled());
    }
    let budget = candidates
        .budget(budget_text)
        .map_err(|e| EngineError::new(ErrorKind::BadInput, "invalid_option", e.to_string()))?;
    let (plan, report) = candidates.select(budget).map_err(internal)?;
    let mut document = sac::document(&graph, &plan, &report);
    if let Some(name) = &req.name {
        document.model = name.clone();
    }
    let infeasible = document.status == "infeasible";
    Ok(TorchPlanned {
        document,
        infeasible,
    })
}

/// The sweep of a captured graph: the torch-sac plan at each of the request's `fractions` of
/// the unplanned peak (default [`DEFAULT_FRACTIONS`]), with PyTorch's step (`none`) and full
/// checkpointing (`full`) side by side ([`sac::sweep`]). The free model's options are refused
/// as for a plan; a raised `cancel` stops it between budgets.
pub fn sweep(
    model: &[u8],
    req: &PlanRequest,
    cancel: &Cancel,
) -> Result<SweepDocument, EngineError> {
    let graph = read(model)?;
    super::load::refuse_options(ModelFormat::TorchGraph, req)?;
    let fractions = if req.fractions.is_empty() {
        DEFAULT_FRACTIONS.to_vec()
    } else {
        req.fractions.clone()
    };
    let sweep = sac::sweep_within(&graph, &fractions, cancel).map_err(|e| match e {
        SolverError::InvalidArgument(m) => {
            EngineError::new(ErrorKind::BadInput, "invalid_option", m)
        }
        SolverError::Cancelled => EngineError::cancelled(),
        e => EngineError::new(ErrorKind::Internal, "internal", e.to_string()),
    })?;
    Ok(SweepDocument {
        graph: GraphInfo {
            name: req.name.clone().unwrap_or_else(|| graph.name.clone()),
            format: ModelFormat::TorchGraph,
            nodes: graph.ops.len(),
        },
        store_all_peak_bytes: sweep.unplanned_peak_bytes,
        points: sweep.points,
    })
}

/// The `infeasible_budget` error of an infeasible torch-sac plan (the service's 422; the CLI
/// prints the plan and exits 3).
pub fn infeasible_error(doc: &PlanDocument) -> EngineError {
    EngineError::new(
        ErrorKind::Unprocessable,
        "infeasible_budget",
        format!(
            "budget {} bytes is infeasible: the least peak a torch-sac plan reaches is {} bytes",
            doc.budget_bytes, doc.min_peak_bytes
        ),
    )
    .with_details(json!({
        "budget_bytes": doc.budget_bytes,
        "min_feasible_budget_bytes": doc.min_peak_bytes,
    }))
}

/// A one-screen summary of a torch-sac plan for the CLI.
pub fn summary(doc: &PlanDocument) -> String {
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0));
    let p = &doc.predicted;
    let wrapped: Vec<&sac::RegionDoc> = doc.regions.iter().filter(|r| r.wrapped).collect();
    let mut out = format!(
        "{} ({}, torch-sac): {}\n  budget {}  predicted peak {}  unplanned {}  least reachable {}\n  overhead {:+.2}% ({} {})\n  {} of {} regions checkpointed, {} ops kept\n",
        doc.model,
        doc.device,
        doc.status,
        mib(doc.budget_bytes),
        mib(p.peak_bytes),
        mib(doc.unplanned_peak_bytes),
        mib(doc.min_peak_bytes),
        p.overhead * 100.0,
        p.compute_cost - p.base_cost,
        doc.cost_unit,
        wrapped.len(),
        doc.regions.len(),
        wrapped.iter().map(|r| r.keep.len()).sum::<usize>(),
    );
    if let (Some(b), Some(gap)) = (&doc.lower_bound, doc.gap) {
        out.push_str(&format!(
            "  lower bound {:+.2}% ({}), gap {:.2}%\n",
            b.overhead * 100.0,
            b.source,
            gap * 100.0
        ));
    }
    for r in wrapped {
        let keep: Vec<String> = r.keep.iter().map(|(op, i)| format!("{op}#{i}")).collect();
        let calls = doc.regions.iter().filter(|o| o.fqn == r.fqn).count();
        let call = if calls > 1 {
            format!(", call {} of {calls}", r.call + 1)
        } else {
            String::new()
        };
        out.push_str(&format!(
            "    {} ({}{call}): keep [{}]\n",
            r.fqn,
            r.class_name,
            keep.join(", ")
        ));
    }
    if let Some(v) = &doc.validation {
        let num = |k: &str| v[k].as_f64();
        let verdict = match v["ok"].as_bool() {
            Some(true) => "passed",
            Some(false) => "FAILED",
            None => "unknown",
        };
        out.push_str(&format!(
            "  measured in PyTorch ({}): {verdict}; peak {}",
            v["device"].as_str().unwrap_or("?"),
            v["measured_peak_bytes"]
                .as_u64()
                .map_or("?".to_string(), mib)
        ));
        if let (Some(m), Some(p)) = (num("measured_peak_bytes"), num("predicted_peak_bytes")) {
            if p > 0.0 {
                out.push_str(&format!(" ({:+.2}% of predicted)", (m / p - 1.0) * 100.0));
            }
        }
        if let Some(e) = num("grad_max_rel_err") {
            out.push_str(&format!(", max gradient error {e:.1e}"));
            // Nondeterministic kernels: what the unplanned step differs from itself by.
            if let Some(r) = num("grad_reference_rel_err").filter(|r| *r > 0.0) {
                out.push_str(&format!(" (the unplanned step against itself {r:.1e})"));
            }
        }
        if let Some(o) = num("measured_overhead") {
            out.push_str(&format!(", overhead {:+.2}%", o * 100.0));
            if let Some(s) = num("measured_step_overhead") {
                out.push_str(&format!(" (ops at their least {:+.2}%)", s * 100.0));
            }
        }
        out.push('\n');
        for problem in v["problems"].as_array().into_iter().flatten() {
            out.push_str(&format!(
                "    problem: {}\n",
                problem.as_str().unwrap_or("?")
            ));
        }
    }
    out
}
