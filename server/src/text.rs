//! The documents as text: what `remat plan`, `remat sweep` and `remat validate` print without
//! `--json`.

use crate::engine::document::{CostModel, PlanDocument, SweepDocument, ValidationReport};
use crate::human_bytes;
use remat_exec::Validation;
use remat_solver::plan::Status;
use std::fmt::Write as _;

/// A plan: the model, status, budget, figures, gap, baselines, and the cost model and the run
/// when the document has them.
pub fn plan_summary(doc: &PlanDocument) -> String {
    let r = &doc.report;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "model      {} ({} nodes)",
        doc.graph.info.name, doc.graph.info.nodes
    );
    if let Some(m) = &doc.maximize {
        let limit = m.max_overhead.map_or("any overhead".to_string(), |o| {
            format!("overhead at most {}", limit_percent(o))
        });
        let next = match m.next_value {
            Some(n) => format!("{}={n} does not", m.dim),
            None => format!("the search stops at {}", m.value),
        };
        let _ = writeln!(
            s,
            "maximize   {}={} fits in {} at {limit}; {next} ({} values tried)",
            m.dim,
            m.value,
            human_bytes(m.budget_bytes),
            m.probes.len()
        );
        for p in &m.probes {
            let _ = writeln!(s, "  {}={:<8} {}", m.dim, p.value, p.reason);
        }
    }
    let _ = writeln!(s, "status     {} ({})", r.status, r.solver);
    if let Some(from) = r.reused_from_budget_bytes {
        let _ = writeln!(
            s,
            "           from the schedule found at the budget {}, less what this budget need not recompute (nothing found here was cheaper)",
            human_bytes(from)
        );
    }
    let _ = writeln!(
        s,
        "budget     {} (store-all peak {})",
        human_bytes(r.budget_bytes),
        human_bytes(r.store_all_peak_bytes)
    );
    if r.status != Status::Infeasible {
        let _ = writeln!(
            s,
            "peak       {}  overhead {:+.2}%  solved in {:.2}s",
            human_bytes(r.predicted.peak_bytes),
            100.0 * r.predicted.overhead,
            r.solve_seconds
        );
        if let (Some(gap), Some(lb)) = (r.gap, &r.lower_bound) {
            let _ = writeln!(
                s,
                "gap        {:.2}% to the lower bound ({})",
                100.0 * gap,
                lb.source.as_str()
            );
        }
        if let Some(ob) = &r.order_bound {
            let cost = r.predicted.compute_cost;
            let _ = writeln!(
                s,
                "in order   {} (the graph's order only: schedules that first compute the nodes \
                 in another order are not bounded by it)",
                if ob.source == remat_solver::plan::BoundSource::Exact {
                    "optimal among the schedules in the graph's order (MILP)".to_string()
                } else {
                    format!(
                        "{:.2}% to the {} bound",
                        100.0 * remat_solver::plan::gap(cost, ob.compute_cost),
                        ob.source.as_str()
                    )
                }
            );
        }
    }
    let _ = writeln!(s, "baselines");
    for b in &r.baselines {
        let _ = writeln!(
            s,
            "  {:<12} peak {:>12}  overhead {:>+8.2}%  {}",
            b.name,
            human_bytes(b.peak_bytes),
            100.0 * b.overhead,
            if b.feasible { "fits" } else { "over budget" }
        );
    }
    costs_and_run(doc, &mut s);
    s
}

/// A sweep: the model, then a row per budget, smallest first: the budget (bytes and as a
/// fraction of the store-all or unplanned peak), the plan's overhead, status, gap and what it
/// is against, the solver (and the budget whose schedule it reused), and the cheapest baseline
/// that fits.
pub fn sweep_summary(doc: &SweepDocument) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "model      {} ({} nodes)  peak without a plan {}",
        doc.graph.name,
        doc.graph.nodes,
        human_bytes(doc.store_all_peak_bytes)
    );
    let mut points: Vec<_> = doc.points.iter().collect();
    points.sort_by_key(|p| p.budget_bytes);
    let pct = |o: Option<f64>| o.map_or("—".to_string(), |o| format!("{:+.2}%", 100.0 * o));
    // Each row's cells first: the gap and solver columns are as wide as their widest cell
    // (a solver "search (from 106.8 KiB)" pushed the rest of its row out of line).
    let rows: Vec<[String; 5]> = points
        .iter()
        .map(|p| {
            let gap = match (p.gap, &p.bound_source) {
                (Some(g), Some(b)) => format!("{:.2}% ({b})", 100.0 * g),
                (Some(g), None) => format!("{:.2}%", 100.0 * g),
                _ => "—".to_string(),
            };
            let solver = match (p.reused_from_budget_bytes, p.min_feasible_budget_bytes) {
                (Some(b), _) => format!("{} (from {})", p.solver, human_bytes(b)),
                (None, Some(least)) => format!("{} (least {})", p.solver, human_bytes(least)),
                (None, None) => p.solver.clone(),
            };
            let best = p
                .baselines
                .iter()
                .filter_map(|(name, o)| o.map(|o| (name, o)))
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .map_or("none fits".to_string(), |(name, o)| {
                    format!("{name} {:+.2}%", 100.0 * o)
                });
            let figures = format!(
                "{:>12}  {:>5.3}x  {:>9}",
                human_bytes(p.budget_bytes),
                p.fraction,
                pct(p.overhead)
            );
            [figures, p.status.as_str().to_string(), gap, solver, best]
        })
        .collect();
    let width = |i: usize, least: usize| {
        rows.iter()
            .map(|r| r[i].chars().count())
            .fold(least, usize::max)
    };
    let (gap_w, solver_w) = (width(2, 24), width(3, 14));
    let _ = writeln!(
        s,
        "{:>12}  {:>6}  {:>9}  {:<10}  {:<gap_w$}  {:<solver_w$}  best baseline that fits",
        "budget", "of it", "overhead", "status", "gap (bound)", "solver"
    );
    for [figures, status, gap, solver, best] in &rows {
        let _ = writeln!(
            s,
            "{figures}  {status:<10}  {gap:<gap_w$}  {solver:<solver_w$}  {best}"
        );
    }
    s
}

/// A planned run (`remat validate`): the plan in one line, then the cost model and the run
/// when the document has them.
pub fn run_summary(doc: &PlanDocument) -> String {
    let r = &doc.report;
    let mut s = format!(
        "plan       {} at budget {}: predicted peak {}, overhead {:+.2}%\n",
        r.solver,
        human_bytes(r.budget_bytes),
        human_bytes(r.predicted.peak_bytes),
        100.0 * r.predicted.overhead
    );
    costs_and_run(doc, &mut s);
    s
}

/// The cost model and the run, when the document has them.
fn costs_and_run(doc: &PlanDocument, s: &mut String) {
    if let Some(cm) = &doc.cost_model {
        let _ = writeln!(s, "{}", cost_summary(cm));
    }
    if let ValidationReport::Ran(v) = &doc.validation {
        s.push_str(&validation_summary(v));
    }
}

/// One line on what measured costs changed.
pub fn cost_summary(cm: &CostModel) -> String {
    if cm.kind == "roofline" {
        return format!(
            "cost model roofline seconds (store-all step {:.3}s by {})",
            cm.store_all_seconds,
            cm.rates.as_deref().unwrap_or("remat's rates")
        );
    }
    let pct = |v: Option<f64>| {
        v.map(|x| format!("{:+.2}%", 100.0 * x))
            .unwrap_or("-".into())
    };
    let c = cm.comparison.as_ref();
    format!(
        "cost model measured seconds on {} (store-all step {:.3}s): plan by FLOPs {} vs by time {} in measured time; {} node(s) computed differently",
        cm.device,
        cm.store_all_seconds,
        pct(c.and_then(|c| c.flops_plan_measured_overhead)),
        pct(c.and_then(|c| c.measured_plan_measured_overhead)),
        c.map(|c| c.nodes_computed_differently.to_string()).unwrap_or("-".into()),
    )
}

/// A run of a plan on the executor: checks, peaks, heap, gradients, time, ops, weights.
pub fn validation_summary(v: &Validation) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "validation {} on {}\n",
        if v.ok { "passed" } else { "FAILED" },
        v.device
    ));
    s.push_str(&format!(
        "  peak     predicted {}  measured {} ({:+.2}%)  at step {}\n",
        human_bytes(v.predicted_peak_bytes),
        human_bytes(v.measured_peak_bytes),
        100.0 * v.peak_rel_diff,
        v.measured_peak_step
    ));
    match v.heap_peak_bytes {
        Some(h) => s.push_str(&format!(
            "  heap     {} — {}\n",
            human_bytes(h),
            v.heap_note
        )),
        None => s.push_str(&format!("  heap     {}\n", v.heap_note)),
    }
    if let Some(d) = v.device_peak_bytes {
        s.push_str(&format!(
            "  device   {} in use at the peak (cuMemGetInfo, the CUDA allocator's cache included)\n",
            human_bytes(d)
        ));
    }
    if v.params_checked == 0 {
        // Nothing to compare: saying "0 error" would read as a check that passed.
        s.push_str(&format!(
            "  grads    no parameter takes a gradient: nothing to compare (store-all loss {:.6}, plan loss {:.6})\n",
            v.store_all_loss, v.loss
        ));
    } else {
        s.push_str(&format!(
            "  grads    max relative error {:.2e} over {} parameters (store-all loss {:.6}, plan loss {:.6})\n",
            v.grad_max_rel_err, v.params_checked, v.store_all_loss, v.loss
        ));
    }
    if let Some(note) = &v.grad_note {
        s.push_str(&format!("           {note}\n"));
    }
    s.push_str(&format!(
        "  time     step {:.3}s vs store-all {:.3}s: measured overhead {:+.2}% ({}; steps at their least {:+.2}%; predicted {:+.2}%), {} recomputation(s)\n",
        v.step_seconds,
        v.store_all_step_seconds,
        100.0 * v.measured_overhead,
        match v.timing_rounds {
            0 | 1 => "one run each".to_string(),
            n => format!(
                "median of {n} rounds, {:+.2}% to {:+.2}%",
                100.0 * v.measured_overhead_range[0],
                100.0 * v.measured_overhead_range[1]
            ),
        },
        100.0 * v.measured_step_overhead,
        100.0 * v.predicted_overhead,
        v.recomputations
    ));
    let ops: Vec<String> = v
        .op_seconds
        .iter()
        .take(6)
        .map(|o| format!("{} {:.3}s", o.op, o.seconds))
        .collect();
    s.push_str(&format!("  ops      {}\n", ops.join(", ")));
    if !v.host_ops.is_empty() {
        s.push_str(&format!(
            "  host     {} ran on the host: the GPU's kernel library lacks one of their kernels\n",
            v.host_ops.join(", ")
        ));
    }
    s.push_str(&format!(
        "  weights  {} parameter(s) from the file, {} seeded\n",
        v.params_from_file, v.params_seeded
    ));
    for p in &v.problems {
        s.push_str(&format!("  problem  {p}\n"));
    }
    s
}

/// A user's overhead limit as a percent: two decimals, or in scientific notation from a
/// million percent up (`--max-overhead 1e30` is not a 33-digit figure).
fn limit_percent(o: f64) -> String {
    let pct = 100.0 * o;
    if pct.abs() >= 1e6 {
        format!("{pct:.3e}%")
    } else {
        format!("{pct:.2}%")
    }
}

#[cfg(test)]
mod tests {
    use super::{limit_percent, sweep_summary};
    use crate::engine::document::{GraphInfo, SweepDocument};
    use crate::engine::ModelFormat;
    use remat_solver::plan::{ParetoPoint, Status};

    /// A solver cell wider than its column (a reused schedule's budget) widens the column:
    /// every row's last column starts where the header's does.
    #[test]
    fn sweep_rows_stay_in_their_columns() {
        let point = |budget_bytes: u64, status, solver: &str, reused: Option<u64>| ParetoPoint {
            budget_bytes,
            fraction: budget_bytes as f64 / 1e6,
            status,
            overhead: (status != Status::Infeasible).then_some(0.1),
            solver: solver.to_string(),
            gap: None,
            bound_source: None,
            reused_from_budget_bytes: reused,
            baselines: vec![("chen-sqrt".to_string(), None)],
            min_feasible_budget_bytes: (status == Status::Infeasible).then_some(107_000),
        };
        let doc = SweepDocument {
            graph: GraphInfo {
                name: "m".to_string(),
                format: ModelFormat::GraphJson,
                nodes: 3,
            },
            store_all_peak_bytes: 1_000_000,
            points: vec![
                point(100_000, Status::Infeasible, "auto", None),
                point(500_000, Status::Feasible, "search", Some(109_363)),
                point(900_000, Status::Optimal, "dp", None),
            ],
        };
        let text = sweep_summary(&doc);
        let lines: Vec<&str> = text.lines().skip(1).collect();
        let column = |line: &str, cell: &str| line.find(cell).map(|i| line[..i].chars().count());
        let at = column(lines[0], "best baseline that fits").unwrap();
        for line in &lines[1..] {
            assert_eq!(column(line, "none fits"), Some(at), "{text}");
        }
        // The infeasible row says the least budget a plan meets.
        assert!(lines[1].contains("auto (least 104.5 KiB)"), "{text}");
    }

    #[test]
    fn overhead_limits_read_as_percents() {
        assert_eq!(limit_percent(0.1), "10.00%");
        assert_eq!(limit_percent(0.0), "0.00%");
        assert_eq!(limit_percent(9_999.0), "999900.00%");
        assert_eq!(limit_percent(1e30), "1.000e32%");
    }
}
