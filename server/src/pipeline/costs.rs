//! The solver's costs of an ONNX model: the roofline's seconds, as `load` lowers them (the
//! default), the importer's FLOPs (`--cost flops`), or seconds measured on the device
//! (`remat plan --cost measured`: each op's seconds in the store-all step, and at the
//! request's budget the plans by FLOPs and by time compared in measured time).

use super::execute::exec_error;
use super::load::Loaded;
use super::solve::{plan_loaded, plan_options};
use crate::engine::document::{CostComparison, CostModel};
use crate::engine::{EngineError, ErrorKind, PlanRequest};
use remat_exec::{measured_costs, with_costs, ExecDevice};
use remat_solver::plan::Status;
use remat_solver::{simulate, Schedule, Step};

/// Runs of the store-all step whose fastest gives each op's cost.
const PROFILING_RUNS: usize = 3;

/// The roofline's cost model of a loaded ONNX model (its problem's costs are the roofline's
/// already); `None` for a node-link graph, which keeps its own costs.
pub fn roofline_costs(loaded: &Loaded) -> Option<CostModel> {
    loaded.exec.as_ref()?;
    Some(CostModel {
        kind: "roofline".to_string(),
        unit: "seconds".to_string(),
        device: super::rates::roofline().device.clone(),
        profiling_runs: 0,
        store_all_seconds: loaded.problem.base_cost(),
        rates: Some(super::rates::roofline().source.clone()),
        comparison: None,
    })
}

/// Puts the importer's FLOPs back as the problem's costs (a node-link graph keeps its own).
pub fn flops_costs(loaded: &mut Loaded) {
    if let Some(em) = &loaded.exec {
        let name = std::mem::take(&mut loaded.problem.name);
        loaded.problem = em.training.to_problem();
        loaded.problem.name = name;
    }
}

/// Replaces the problem's costs by seconds measured on `device`, and says how that changes
/// the plan at the request's budget (when it has one).
pub fn measure_costs(
    loaded: &mut Loaded,
    req: &PlanRequest,
    threads: usize,
    device: ExecDevice,
) -> Result<CostModel, EngineError> {
    let Some(em) = &loaded.exec else {
        return Err(EngineError::new(
            ErrorKind::BadInput,
            "not_runnable",
            "--cost measured needs an ONNX model: a node-link graph has no ops to run",
        ));
    };
    let costs = measured_costs(&em.model, &em.training, em.bytes, device, 0, PROFILING_RUNS)
        .map_err(exec_error)?;
    let measured = with_costs(&loaded.problem, &costs).map_err(exec_error)?;
    let mut flops = em.training.to_problem();
    flops.name = loaded.problem.name.clone();
    loaded.problem = measured;
    // The same budget planned with FLOPs: how different is the plan, and what does it cost in
    // measured seconds?
    let comparison = match req.budget {
        Some(_) => compare(loaded, flops, req, threads)?,
        None => None,
    };
    Ok(CostModel {
        kind: "measured".to_string(),
        unit: "seconds".to_string(),
        device: device.name().to_string(),
        profiling_runs: PROFILING_RUNS,
        store_all_seconds: loaded.problem.base_cost(),
        rates: None,
        comparison,
    })
}

/// Plans `loaded` (measured costs) and `flops` (the same graph with FLOPs) at the request's
/// budget and compares the two schedules in measured time; `None` when either is infeasible.
fn compare(
    loaded: &Loaded,
    flops: remat_solver::Problem,
    req: &PlanRequest,
    threads: usize,
) -> Result<Option<CostComparison>, EngineError> {
    let flops_loaded = Loaded {
        problem: flops,
        format: loaded.format,
        inspect: None,
        exec: None,
    };
    let opts = plan_options(&flops_loaded.problem, req, threads, &Default::default())?;
    let by_flops = plan_loaded(&flops_loaded, &opts)?;
    let by_time = plan_loaded(loaded, &opts)?;
    if by_flops.report.status == Status::Infeasible || by_time.report.status == Status::Infeasible {
        return Ok(None);
    }
    let as_time = |s: &Schedule| {
        simulate(&loaded.problem, s)
            .map(|st| st.overhead(&loaded.problem))
            .ok()
    };
    let counts = |s: &Schedule| {
        let mut c = vec![0u32; loaded.problem.len()];
        for step in &s.steps {
            if let Step::Compute(i) = step {
                c[*i] += 1;
            }
        }
        c
    };
    let (a, b) = (counts(&by_flops.schedule), counts(&by_time.schedule));
    Ok(Some(CostComparison {
        flops_plan_measured_overhead: as_time(&by_flops.schedule),
        measured_plan_measured_overhead: as_time(&by_time.schedule),
        nodes_computed_differently: a.iter().zip(&b).filter(|(x, y)| x != y).count(),
    }))
}
