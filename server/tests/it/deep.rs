//! Deep transformers (issue 19): every model of `fixtures/deep/manifest.json` (GPT-2 at 12,
//! 48 and 96 layers, a Llama-style decoder at 32 and 80 layers, the 80-layer one through both
//! exporters) planned at the manifest's budgets with `auto`: each plan fits, costs within the
//! manifest's gap of the time-point bound (which holds for every schedule), never more than a
//! plan at a smaller budget, and at most `baseline_ratio` times the best baseline's overhead
//! unless the bound proves that no schedule can be (the least overhead any schedule can have
//! is then above that share). The figures and timings: docs/bench/transformers.md.

use crate::deep_eval::{evaluate, manifest, problem};
use remat_solver::plan::{BoundSource, Status};
use std::time::Duration;

#[test]
fn deep_transformers_are_planned_within_the_gap_of_a_proven_bound() {
    let m = manifest();
    let limit = Duration::from_secs_f64(m.time_limit_seconds);
    let mut failures = Vec::new();
    for model in &m.models {
        let (p, onnx_nodes) = problem(model);
        assert_eq!(onnx_nodes, model.onnx_nodes, "{}: ONNX nodes", model.name);
        assert_eq!(
            p.len(),
            model.training_nodes,
            "{}: training nodes",
            model.name
        );
        let rows = evaluate(&model.name, &p, &m.budgets, limit);
        let mut below: Option<f64> = None;
        for r in &rows {
            let what = format!("{} at {}", r.model, r.fraction);
            assert_ne!(r.report.status, Status::Infeasible, "{what}");
            assert!(r.report.predicted.peak_bytes <= r.budget, "{what}");
            let cost = r.report.predicted.compute_cost;
            let bound = r
                .bound
                .unwrap_or_else(|| panic!("{what}: the bound did not solve"));
            assert!(
                bound <= cost * (1.0 + 1e-9),
                "{what}: bound {bound} above the plan {cost}"
            );
            // The plan's own report carries a bound too (it had less time for it).
            let own = r.report.lower_bound.expect("every plan reports a bound");
            assert!(
                matches!(
                    own.source,
                    BoundSource::TimePoints | BoundSource::StoreAll | BoundSource::Exact
                ),
                "{what}: {:?}",
                own.source
            );
            let gap = r.gap().expect("a bound");
            if gap > m.gap_tolerance {
                failures.push(format!(
                    "{what}: gap {:.3}% over {:.1}%",
                    gap * 100.0,
                    m.gap_tolerance * 100.0
                ));
            }
            let overhead = r.report.predicted.overhead;
            if let Some(b) = below {
                assert!(
                    overhead <= b + 1e-12,
                    "{what}: {overhead} above the smaller budget's {b}"
                );
            }
            below = Some(overhead);
            if let (Some(ratio), Some(floor)) = (r.ratio(), r.ratio_floor()) {
                if ratio > m.baseline_ratio && floor <= m.baseline_ratio {
                    failures.push(format!(
                        "{what}: {:.3} of the best baseline's overhead, {:.3} possible",
                        ratio, floor
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
