//! The deep-transformer evaluation of issue 19, shared by the suite (`deep.rs`) and the
//! benchmark (`benches/transformers.rs`, which includes this file): each model of
//! `fixtures/deep/manifest.json` planned with `auto` at fractions of the way from the least
//! peak remat reaches to store-all's peak, from the smallest budget up (each plan offered the
//! ones below, as a sweep does), every plan bounded by the time-point relaxation and set beside
//! the best baseline that fits.
#![allow(dead_code)]

use remat_solver::bound::time_point_bound;
use remat_solver::plan::{plan_reusing, Earlier, PlanOptions, PlanReport, Status};
use remat_solver::Problem;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Deserialize)]
pub struct Manifest {
    pub budgets: Vec<f64>,
    pub time_limit_seconds: f64,
    pub gap_tolerance: f64,
    pub baseline_ratio: f64,
    pub models: Vec<DeepModel>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct DeepModel {
    pub name: String,
    pub file: String,
    pub origin: String,
    pub dims: BTreeMap<String, u64>,
    pub onnx_nodes: usize,
    pub training_nodes: usize,
}

/// One plan of the evaluation.
#[derive(Debug, Clone)]
pub struct Row {
    pub model: String,
    pub fraction: f64,
    pub budget: u64,
    pub report: PlanReport,
    /// Wall seconds of the plan (its own bound included).
    pub seconds: f64,
    /// The time-point bound (compute cost) at this budget, solved on its own with a generous
    /// limit so that a loaded machine does not cut it, and its seconds.
    pub bound: Option<f64>,
    pub bound_seconds: f64,
    /// The best baseline that fits besides store-all: name and overhead.
    pub best_baseline: Option<(String, f64)>,
}

impl Row {
    /// `(cost − bound) / cost` against the separately solved bound.
    pub fn gap(&self) -> Option<f64> {
        let cost = self.report.predicted.compute_cost;
        self.bound.map(|b| ((cost - b) / cost).max(0.0))
    }

    /// The bound as an overhead over the store-all cost.
    pub fn bound_overhead(&self) -> Option<f64> {
        self.bound.map(|b| b / self.report.store_all_cost - 1.0)
    }

    /// The plan's overhead over the best baseline's.
    pub fn ratio(&self) -> Option<f64> {
        self.best_baseline
            .as_ref()
            .filter(|(_, o)| *o > 0.0)
            .map(|(_, o)| self.report.predicted.overhead / o)
    }

    /// The least ratio any schedule can reach: the bound's overhead over the best baseline's.
    pub fn ratio_floor(&self) -> Option<f64> {
        match (&self.best_baseline, self.bound_overhead()) {
            (Some((_, o)), Some(b)) if *o > 0.0 => Some(b.max(0.0) / o),
            _ => None,
        }
    }
}

pub fn fixtures_dir() -> PathBuf {
    let here = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    here.join("..").join("fixtures")
}

pub fn manifest() -> Manifest {
    let path = fixtures_dir().join("deep").join("manifest.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The training problem of a manifest model, and the ONNX node count of its file.
pub fn problem(m: &DeepModel) -> (Problem, usize) {
    let path: &Path = &fixtures_dir().join(&m.file);
    let bytes =
        std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let opts = remat_planner::ImportOptions {
        dims: m.dims.clone(),
        ..Default::default()
    };
    let onnx_nodes = remat_planner::inspect(&bytes, &opts)
        .unwrap_or_else(|e| panic!("{}: {e}", m.name))
        .nodes;
    let model = remat_planner::load(&bytes, &opts).unwrap_or_else(|e| panic!("{}: {e}", m.name));
    let problem = model
        .training_graph()
        .unwrap_or_else(|e| panic!("{}: {e}", m.name))
        .to_problem();
    (problem, onnx_nodes)
}

/// The budget at `fraction` of the way from `least` to `full`.
pub fn budget_at(least: u64, full: u64, fraction: f64) -> u64 {
    least + ((full - least) as f64 * fraction) as u64
}

/// Plans `p` at each fraction (ascending), each offered the plans below.
pub fn evaluate(name: &str, p: &Problem, fractions: &[f64], time_limit: Duration) -> Vec<Row> {
    let least = remat_solver::budget::min_feasible_budget(p).bytes;
    let full = remat_solver::store_all_peak(p);
    let mut fractions = fractions.to_vec();
    fractions.sort_by(f64::total_cmp);
    let mut earlier: Vec<Earlier> = Vec::new();
    let mut rows = Vec::new();
    for f in fractions {
        let budget = budget_at(least, full, f);
        // Two threads, as `remat plan` and the service give on a machine of two cores or more:
        // the time-point bound runs beside the segment program on the larger models.
        let opts = PlanOptions {
            time_limit,
            threads: 2,
            ..PlanOptions::new(budget)
        };
        let start = Instant::now();
        let (schedule, report) =
            plan_reusing(p, &opts, &earlier).unwrap_or_else(|e| panic!("{name} at {f}: {e}"));
        let seconds = start.elapsed().as_secs_f64();
        let tp = time_point_bound(p, budget, Duration::from_secs(120))
            .unwrap_or_else(|e| panic!("{name} at {f}: bound: {e}"));
        assert!(!tp.infeasible || report.status == Status::Infeasible);
        let best_baseline = report
            .baselines
            .iter()
            .filter(|b| b.feasible && b.name != "store-all")
            .min_by(|a, b| a.overhead.total_cmp(&b.overhead))
            .map(|b| (b.name.clone(), b.overhead));
        if report.status != Status::Infeasible {
            earlier.push(Earlier {
                budget_bytes: budget,
                solver: report.solver.clone(),
                schedule,
            });
        }
        rows.push(Row {
            model: name.to_string(),
            fraction: f,
            budget,
            report,
            seconds,
            bound: tp.bound,
            bound_seconds: tp.seconds,
            best_baseline,
        });
    }
    rows
}
