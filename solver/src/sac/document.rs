//! The plan documents of the `torch-sac` model: what `remat.torch.apply` reads, and the checks
//! of what `remat.torch.measure` reports.

use super::model::{overhead, simulate, SacPlan, TorchGraph, PLAN_FORMAT, VERSION};
use super::planner::{plan, Candidates, SacReport};
use crate::error::{Result, SolverError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// The plan document `remat.torch.apply` reads (docs/torch.md, "The plan").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanDocument {
    pub format: String,
    pub version: u32,
    pub execution_model: String,
    pub model: String,
    pub device: String,
    pub fingerprint: String,
    pub signature: serde_json::Value,
    pub cost_unit: String,
    pub budget_bytes: u64,
    /// `fits` or `infeasible` (then the plan is the least-peak one, at `min_peak_bytes`).
    pub status: String,
    pub min_peak_bytes: u64,
    pub unplanned_peak_bytes: u64,
    pub predicted: PredictedDoc,
    /// A lower bound on the compute cost of every plan the torch-sac planner can express whose
    /// peak fits the budget (docs/torch.md, "The planner"): the chain program's where it proves
    /// one, else the unplanned step's cost; absent from an infeasible plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lower_bound: Option<SacLowerBound>,
    /// `(compute_cost - lower_bound) / compute_cost`, with the bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gap: Option<f64>,
    pub regions: Vec<RegionDoc>,
    /// What `remat.torch.measure` measured of this plan in PyTorch, once attached (`PUT
    /// /v1/plans/{id}/validation`, or set by the caller): the fields of a plan's `validation`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation: Option<serde_json::Value>,
}

/// A torch-sac lower bound and where it comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SacLowerBound {
    pub compute_cost: f64,
    /// `compute_cost / base_cost - 1`: the least overhead any plan fitting the budget has.
    pub overhead: f64,
    /// `chain_program`: the chain program with held bytes rounded down, exact (additive values,
    /// exact shape), on its relaxation for the keepable ops it does not enumerate;
    /// `pinned_chain_program`: the same on the graph with the tensors whose lives several
    /// regions decide pinned, at the budget plus their bytes; `unplanned_step`: the step's own
    /// cost, which every plan runs at least.
    pub source: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PredictedDoc {
    pub peak_bytes: u64,
    pub compute_cost: f64,
    pub base_cost: f64,
    /// `compute_cost / base_cost - 1`.
    pub overhead: f64,
    /// The part of `compute_cost` that is checkpointing's own work, where the captured graph
    /// prices it (`wrap_cost`); 0 otherwise.
    #[serde(default)]
    pub wrap_cost: f64,
    pub forward_end_bytes: u64,
    pub peak_op: usize,
    pub peak_in_rerun_of: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegionDoc {
    pub fqn: String,
    /// Which call of the module, from 0 (a module run more than once per step is a region
    /// per call; `remat.torch.apply` counts the calls of each step).
    #[serde(default)]
    pub call: usize,
    #[serde(rename = "class")]
    pub class_name: String,
    pub wrapped: bool,
    /// Kept ops as `[aten op, occurrence]`: the policy's `MUST_SAVE` keys.
    pub keep: Vec<(String, usize)>,
    /// The ops the policy sees, in order (a run that differs is refused).
    pub ops: Vec<String>,
    pub rerun_cost: f64,
    /// The op by which the region writes one of its inputs or a buffer in place (the captured
    /// graph's `writes_input`): never wrapped, and `remat.torch.apply` refuses a plan (an
    /// edited one) that wraps it, as a re-run would write it a second time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writes_input: Option<String>,
}

/// Parses a budget for a captured graph: bytes or a size (`"8GiB"`), `"0.5x"` of the
/// unplanned peak, or `"min"` (the least peak the model can reach).
pub fn parse_torch_budget(graph: &TorchGraph, budget: &str) -> Result<u64> {
    if budget.trim().eq_ignore_ascii_case("min") {
        return Candidates::new(graph)?.budget(budget);
    }
    let unplanned = simulate(graph, &SacPlan::default())?.peak_bytes;
    crate::plan::parse_budget(budget, unplanned)
}

/// Plans `graph` under `budget` and writes the document `remat.torch.apply` reads.
pub fn plan_document(graph: &TorchGraph, budget: u64) -> Result<PlanDocument> {
    let (p, report) = plan(graph, budget)?;
    Ok(document(graph, &p, &report))
}

/// The document of a fixed policy, for comparison: `"none"` (no region wrapped: PyTorch's own
/// step) or `"full"` (every region wrapped, nothing kept: plain per-block checkpointing).
pub fn baseline_document(graph: &TorchGraph, name: &str) -> Result<PlanDocument> {
    let p = match name {
        "none" => SacPlan::default(),
        "full" => SacPlan::full(graph),
        other => {
            return Err(SolverError::InvalidArgument(format!(
                "unknown torch-sac baseline {other:?}: use \"none\" or \"full\""
            )))
        }
    };
    let predicted = simulate(graph, &p)?;
    let unplanned = simulate(graph, &SacPlan::default())?.peak_bytes;
    let report = SacReport {
        budget_bytes: predicted.peak_bytes,
        status: "fits",
        min_peak_bytes: Candidates::new(graph)?.least_peak(),
        unplanned_peak_bytes: unplanned,
        predicted,
        moves: 0,
        lower_bound: None,
    };
    Ok(document(graph, &p, &report))
}

/// Checks that `validation` (what `remat.torch.measure` returns) is a measurement of the plan
/// `doc`: an object with the device (`torch-cpu`, `torch-cuda`, ...), the figures a plan's
/// `validation` has, the plan's own predicted peak, and, where it says them, the plan's
/// fingerprint and budget. Errors name the field.
pub fn check_validation(doc: &PlanDocument, validation: &serde_json::Value) -> Result<()> {
    let bad = |field: &str, why: String| {
        Err(SolverError::InvalidArgument(format!(
            "validation field `{field}`: {why}"
        )))
    };
    let Some(v) = validation.as_object() else {
        return Err(SolverError::InvalidArgument(
            "validation: expected a JSON object (what remat.torch.measure returns)".into(),
        ));
    };
    match v.get("device").and_then(|d| d.as_str()) {
        Some(d) if d.starts_with("torch-") && d.len() > "torch-".len() => {}
        Some(d) => {
            return bad(
                "device",
                format!("expected torch-cpu or torch-cuda, got {d:?}"),
            )
        }
        None => return bad("device", "missing or not a string".into()),
    }
    for field in ["ran", "ok"] {
        if !v.get(field).is_some_and(|x| x.is_boolean()) {
            return bad(field, "missing or not true/false".into());
        }
    }
    let whole = |field: &str| v.get(field).and_then(|x| x.as_u64());
    if whole("measured_peak_bytes").is_none() {
        return bad(
            "measured_peak_bytes",
            "missing or not a whole number of bytes".into(),
        );
    }
    match whole("predicted_peak_bytes") {
        Some(p) if p == doc.predicted.peak_bytes => {}
        Some(p) => {
            return bad(
                "predicted_peak_bytes",
                format!(
                    "{p} is not this plan's predicted peak ({} bytes): it measured another plan",
                    doc.predicted.peak_bytes
                ),
            )
        }
        None => {
            return bad(
                "predicted_peak_bytes",
                "missing or not a whole number".into(),
            )
        }
    }
    match v.get("grad_max_rel_err").and_then(|x| x.as_f64()) {
        Some(e) if e.is_finite() && e >= 0.0 => {}
        _ => return bad("grad_max_rel_err", "missing or not a number ≥ 0".into()),
    }
    // A step's time relative to the unplanned one's: above -1 (a step takes some time).
    if !v
        .get("measured_overhead")
        .and_then(|x| x.as_f64())
        .is_some_and(|o| o.is_finite() && o > -1.0)
    {
        return bad(
            "measured_overhead",
            "missing or not a number above -1".into(),
        );
    }
    // Optional (`measure` with `op_rounds=0` leaves it out); shown beside the overhead when given.
    if let Some(x) = v.get("measured_step_overhead").filter(|x| !x.is_null()) {
        if !x.as_f64().is_some_and(|o| o.is_finite() && o > -1.0) {
            return bad("measured_step_overhead", "not a number above -1".into());
        }
    }
    if let Some(f) = v.get("fingerprint").filter(|f| !f.is_null()) {
        if f.as_str() != Some(doc.fingerprint.as_str()) {
            return bad(
                "fingerprint",
                format!(
                    "{f} is not this plan's ({:?}): it measured another model",
                    doc.fingerprint
                ),
            );
        }
    }
    if let Some(b) = v.get("budget_bytes").filter(|b| !b.is_null()) {
        if b.as_u64() != Some(doc.budget_bytes) {
            return bad(
                "budget_bytes",
                format!("{b} is not this plan's budget ({} bytes)", doc.budget_bytes),
            );
        }
    }
    // The figures must say what `ok` says (`remat.torch.measure`'s rules, docs/torch.md): a
    // measurement edited to pass, or assembled by hand, is not stored as passed.
    let measured = whole("measured_peak_bytes").unwrap_or(0);
    let predicted = doc.predicted.peak_bytes;
    let peak_rel = if predicted > 0 {
        measured as f64 / predicted as f64 - 1.0
    } else {
        0.0
    };
    if let Some(x) = v.get("peak_rel_diff").filter(|x| !x.is_null()) {
        if !x
            .as_f64()
            .is_some_and(|d| (d - peak_rel).abs() <= 1e-9 * (1.0 + peak_rel.abs()))
        {
            return bad(
                "peak_rel_diff",
                format!("{x} is not measured_peak_bytes / predicted_peak_bytes - 1 ({peak_rel})"),
            );
        }
    }
    if v.get("ok").and_then(|x| x.as_bool()) == Some(true) {
        let num = |field: &str| v.get(field).and_then(|x| x.as_f64());
        let failed = if doc.status == "fits" && measured > doc.budget_bytes {
            Some(format!(
                "the measured peak {measured} bytes is above the budget {} bytes",
                doc.budget_bytes
            ))
        } else if peak_rel.abs() > MEASURED_PEAK_TOLERANCE {
            Some(format!(
                "the measured peak differs from the predicted one by {:+.2}%",
                100.0 * peak_rel
            ))
        } else {
            // The most any parameter may differ by: the tolerance, or SPREAD_FACTOR times
            // what the unplanned run differs from itself by (its largest over parameters).
            let allowed = num("grad_tolerance")
                .map(|t| t.max(GRAD_SPREAD_FACTOR * num("grad_reference_rel_err").unwrap_or(0.0)));
            match (num("grad_max_rel_err"), allowed) {
                (Some(e), Some(a)) if e > a => Some(format!(
                    "the largest gradient error {e:e} is above what measure allows ({a:e})"
                )),
                _ => None,
            }
        };
        if let Some(why) = failed {
            return bad(
                "ok",
                format!("true, but {why}: the measurement failed its checks"),
            );
        }
    }
    Ok(())
}

/// How far a measured peak may be from the predicted one in a measurement that passed
/// (`remat.torch.measure`: 2%).
const MEASURED_PEAK_TOLERANCE: f64 = 0.02;

/// `remat.torch.measure`'s `SPREAD_FACTOR`: a gradient may differ from the unplanned run's by
/// this many times what the unplanned run differs from itself by.
const GRAD_SPREAD_FACTOR: f64 = 8.0;

/// The plan document of `p`.
pub fn document(graph: &TorchGraph, p: &SacPlan, report: &SacReport) -> PlanDocument {
    let s = &report.predicted;
    let regions = graph
        .regions
        .iter()
        .enumerate()
        .map(|(r, reg)| {
            let kept = p.wrapped.get(&r);
            let ops = &graph.ops[reg.first_op..=reg.last_op];
            RegionDoc {
                fqn: reg.fqn.clone(),
                call: reg.call,
                class_name: reg.class_name.clone(),
                wrapped: kept.is_some(),
                keep: kept
                    .into_iter()
                    .flatten()
                    .filter_map(|&j| Some((graph.ops[j].op.clone(), graph.ops[j].occurrence?)))
                    .collect(),
                ops: ops
                    .iter()
                    .filter(|o| o.occurrence.is_some())
                    .map(|o| o.op.clone())
                    .collect(),
                rerun_cost: s.rerun_cost.get(&r).copied().unwrap_or(0.0),
                writes_input: reg.writes_input.clone(),
            }
        })
        .collect();
    PlanDocument {
        format: PLAN_FORMAT.into(),
        version: VERSION,
        execution_model: "torch-sac".into(),
        model: graph.name.clone(),
        device: graph.device.clone(),
        fingerprint: graph.fingerprint.clone(),
        signature: graph.signature.clone(),
        cost_unit: graph.cost_unit.clone(),
        budget_bytes: report.budget_bytes,
        status: report.status.into(),
        min_peak_bytes: report.min_peak_bytes,
        unplanned_peak_bytes: report.unplanned_peak_bytes,
        predicted: PredictedDoc {
            peak_bytes: s.peak_bytes,
            compute_cost: s.compute_cost,
            base_cost: s.base_cost,
            overhead: s.overhead(),
            wrap_cost: s.wrap_cost,
            forward_end_bytes: s.forward_end_bytes,
            peak_op: s.peak_op,
            peak_in_rerun_of: s.peak_in_rerun_of.map(|r| graph.region_label(r)),
        },
        lower_bound: report.lower_bound.map(|b| SacLowerBound {
            compute_cost: b.compute_cost,
            overhead: overhead(b.compute_cost, s.base_cost),
            source: b.source.into(),
        }),
        gap: report
            .lower_bound
            .map(|b| crate::plan::gap(s.compute_cost, b.compute_cost)),
        regions,
        validation: None,
    }
}

/// Reads a plan document back into a [`SacPlan`] for `graph`: the fingerprint must match and
/// every kept `[op, occurrence]` must name an op of its region.
pub fn plan_from_document(graph: &TorchGraph, doc: &PlanDocument) -> Result<SacPlan> {
    if doc.fingerprint != graph.fingerprint {
        return Err(SolverError::InvalidArgument(format!(
            "the plan is for fingerprint {} ({}), the graph has {} ({})",
            doc.fingerprint, doc.model, graph.fingerprint, graph.name
        )));
    }
    let mut p = SacPlan::default();
    for rd in &doc.regions {
        if !rd.wrapped {
            continue;
        }
        let r = graph
            .regions
            .iter()
            .position(|g| g.fqn == rd.fqn && g.call == rd.call)
            .ok_or_else(|| {
                let call = if rd.call > 0 {
                    format!(" (its call {})", rd.call + 1)
                } else {
                    String::new()
                };
                SolverError::InvalidArgument(format!(
                    "the plan wraps region {:?}{call}, which the graph lacks",
                    rd.fqn
                ))
            })?;
        let reg = &graph.regions[r];
        let mut kept = BTreeSet::new();
        for (op, occ) in &rd.keep {
            let j = (reg.first_op..=reg.last_op)
                .find(|&j| graph.ops[j].op == *op && graph.ops[j].occurrence == Some(*occ))
                .ok_or_else(|| {
                    SolverError::InvalidArgument(format!(
                        "the plan keeps {op} #{occ} in region {:?}, which runs no such op",
                        graph.region_label(r)
                    ))
                })?;
            kept.insert(j);
        }
        p.wrapped.insert(r, kept);
    }
    Ok(p)
}
