//! The `torch-sac` execution model: what PyTorch eager runs with non-reentrant
//! `torch.utils.checkpoint` around regions and a selective-checkpoint policy inside each.
//!
//! The input is a [`TorchGraph`]: one training step as PyTorch ran it (`remat.torch.capture`
//! records it; docs/torch.md documents the format). Every storage has the op that allocated it,
//! when it died in the unplanned step (`free_after`), when it would die if autograd saved nothing
//! (`natural_free_after`, set by the Python code's own references), and which region saved it.
//!
//! A [`SacPlan`] wraps some regions and keeps, in each, the outputs of some ops (`MUST_SAVE`);
//! every other op of a wrapped region is `PREFER_RECOMPUTE`. [`simulate`] replays the step the
//! way PyTorch runs it under that plan:
//! - forward: a value saved only by its own wrapped region and not kept dies at its natural
//!   death; everything else lives as in the unplanned step (kept values are held by the SAC
//!   cache); a wrapped region's inputs are held by its checkpoint until autograd has released
//!   the last value the region saved, whether or not one of its ops saves them;
//! - backward: at the region's trigger (the first unpack of a value it saved) the region's
//!   forward re-runs from its first op through its stop op (the op after which its last value
//!   was saved: early stop), skipping kept ops (their cached outputs are returned); a re-run
//!   op's saved outputs live until their unplanned backward death, the others die at their
//!   natural death within the re-run, or when it stops.
//!
//! [`plan`] chooses wrapped regions and keep sets under a byte budget: the cheapest plan that
//! fits among candidates that do not depend on the budget (a [`path`] of moves from full
//! checkpointing, the budgeted [`greedy`] at budgets taken from the path, and the
//! [`block_plans`] of each class of identical regions), so a larger budget never costs more.
//! The moves are "keep op j" (in every copy of a block, or in one region) and "do not wrap
//! region r". The block plans give every copy of a block one of its options (each keep set of
//! its keepable ops, or unwrapped) computed once for the block, or the first copies one
//! option and the rest another. It is a heuristic, not an exact solver: the block plans are
//! exhaustive only within that class.

mod chain;
mod document;
mod model;
mod planner;

pub use chain::{ChainChoice, ChainModel};
pub use document::*;
pub use model::*;
pub use planner::*;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Two identical blocks `a_k = f(x_k)`, `x_{k+1} = g(a_k)` each saving `a_k` and its input,
    /// then a loss and the backward in reverse.
    fn two_blocks() -> TorchGraph {
        // ops: 0 f0, 1 g0, 2 f1, 3 g1, 4 loss | 5 bg1, 6 bf1, 7 bg0, 8 bf0
        let op = |name: &str,
                  region: Option<usize>,
                  occ: Option<usize>,
                  cost: f64,
                  outputs: Vec<usize>| TorchOp {
            op: name.into(),
            phase: String::new(),
            module: String::new(),
            region,
            occurrence: occ,
            cost,
            outputs,
            random: false,
            transient: 0,
        };
        let st = |producer, free_after, natural, saves: Vec<(usize, Option<usize>)>| TorchStorage {
            bytes: 100,
            producer,
            free_after,
            natural_free_after: natural,
            saves: saves
                .into_iter()
                .map(|(after_op, region)| TorchSave {
                    after_op,
                    region,
                    released_after: free_after,
                })
                .collect(),
            mutated: false,
        };
        TorchGraph {
            format: FORMAT.into(),
            version: VERSION,
            name: "two".into(),
            device: "cpu".into(),
            cost_unit: "flop".into(),
            fingerprint: String::new(),
            signature: serde_json::Value::Null,
            fixed_bytes: 10,
            forward_ops: 5,
            regions: vec![
                TorchRegion {
                    fqn: "b.0".into(),
                    call: 0,
                    class_name: "B".into(),
                    first_op: 0,
                    last_op: 1,
                    stop_op: Some(0),
                    trigger_op: Some(7),
                    inputs: vec![],
                    rerun_extra_bytes: 0,
                    writes_input: None,
                },
                TorchRegion {
                    fqn: "b.1".into(),
                    call: 0,
                    class_name: "B".into(),
                    first_op: 2,
                    last_op: 3,
                    stop_op: Some(2),
                    trigger_op: Some(5),
                    inputs: vec![1],
                    rerun_extra_bytes: 0,
                    writes_input: None,
                },
            ],
            ops: vec![
                op("f", Some(0), Some(0), 5.0, vec![0]),
                op("g", Some(0), Some(0), 1.0, vec![1]),
                op("f", Some(1), Some(0), 5.0, vec![2]),
                op("g", Some(1), Some(0), 1.0, vec![3]),
                op("loss", None, None, 1.0, vec![4]),
                op("bg", None, None, 1.0, vec![5]),
                op("bf", None, None, 1.0, vec![6]),
                op("bg", None, None, 1.0, vec![7]),
                op("bf", None, None, 1.0, vec![8]),
            ],
            storages: vec![
                st(0, Some(7), Some(1), vec![(0, Some(0))]), // a0: saved by g0
                st(1, Some(6), Some(2), vec![(1, Some(1))]), // x1: saved by f1 (region 1's input)
                st(2, Some(5), Some(3), vec![(2, Some(1))]), // a1: saved by g1
                st(3, Some(4), Some(4), vec![]),             // x2: the loss reads it
                st(4, Some(5), Some(4), vec![]),             // loss
                st(5, Some(6), None, vec![]),                // grad of a1
                st(6, Some(7), None, vec![]),                // grad of x1
                st(7, Some(8), None, vec![]),                // grad of a0
                st(8, Some(8), None, vec![]),                // grad of x0
            ],
            wrap_cost: None,
        }
    }

    #[test]
    fn a_kernels_transient_bytes_count_at_its_op_wherever_it_runs() {
        let mut g = two_blocks();
        let before = simulate(&g, &SacPlan::full(&g)).unwrap();
        // f1's kernel takes 1000 bytes while it runs: in the forward and in region 1's re-run.
        g.ops[2].transient = 1000;
        let s = simulate(&g, &SacPlan::full(&g)).unwrap();
        assert!(s.peak_bytes >= 1000 + 110, "{}", s.peak_bytes);
        assert_ne!(s.peak_bytes, before.peak_bytes);
        let points = timeline(&g, &SacPlan::full(&g)).unwrap();
        let at_f1: Vec<u64> = points
            .iter()
            .filter(|p| p.op == 2)
            .map(|p| p.bytes)
            .collect();
        assert_eq!(at_f1.len(), 2, "the forward's and the re-run's");
        assert!(at_f1.iter().all(|&b| b >= 1000));
        assert_eq!(s.peak_bytes, points.iter().map(|p| p.bytes).max().unwrap());
    }

    #[test]
    fn a_random_op_is_never_kept() {
        let mut g = two_blocks();
        assert!(keepable(&g, 0, 0));
        g.ops[0].random = true;
        assert!(!keepable(&g, 0, 0));
        // That no plan keeps one at any budget: `sac_props::a_random_op_is_never_kept` (here
        // keeping f0 is never worth it, random or not).
    }

    #[test]
    fn unplanned_replays_the_captured_lifetimes() {
        let g = two_blocks();
        g.check().unwrap();
        let s = simulate(&g, &SacPlan::default()).unwrap();
        // After op 3: fixed 10 + a0, x1, a1, x2 = 410; op 4 adds the loss (510) and frees x2.
        assert_eq!(s.peak_bytes, 510);
        assert_eq!(s.compute_cost, g.base_cost());
        assert!(s.rerun_cost.is_empty());
    }

    #[test]
    fn full_checkpointing_frees_the_saved_values_and_reruns_up_to_the_last_save() {
        let g = two_blocks();
        let s = simulate(&g, &SacPlan::full(&g)).unwrap();
        // a0 and a1 die at their natural deaths; x1 is held (region 1's input).
        // Forward end: 10 + x1 + loss = 210 after op 4 frees x2.
        assert_eq!(s.forward_end_bytes, 210);
        // Each region re-runs f only (early stop after its last save): +5 each.
        assert_eq!(s.rerun_cost.values().sum::<f64>(), 10.0);
        assert_eq!(s.compute_cost, g.base_cost() + 10.0);
        assert!(s.peak_bytes < simulate(&g, &SacPlan::default()).unwrap().peak_bytes);
    }

    #[test]
    fn a_wrapped_region_holds_its_inputs_until_its_last_save_is_released() {
        // x1 is region 1's input but none of its ops saves it (as a slice feeding a copy):
        // unwrapped, it dies after f1 reads it; wrapped, the checkpoint holds it until autograd
        // releases the last value region 1 saved (a1, after op 5).
        let mut g = two_blocks();
        g.storages[1].saves.clear();
        g.storages[1].free_after = Some(2);
        g.check().unwrap();
        let only_1 = SacPlan {
            wrapped: [(1, BTreeSet::new())].into(),
        };
        let s = simulate(&g, &only_1).unwrap();
        // After op 4: fixed 10 + a0 (saved by the unwrapped region 0) + x1 + loss.
        assert_eq!(s.forward_end_bytes, 310);
        let t = timeline(&g, &only_1).unwrap();
        let at = |op: usize| {
            t.iter()
                .find(|p| p.op == op && p.rerun_of.is_none())
                .unwrap()
        };
        // Op 5 (bg1) allocates the gradient of a1 with x1 still held; op 6 (bf1) runs after it
        // was let go with a1.
        assert_eq!(at(5).bytes, 10 + 100 + 100 + 100 + 100 + 100);
        assert_eq!(at(6).bytes, 10 + 100 + 100 + 100);
    }

    #[test]
    fn a_region_that_writes_its_input_in_place_is_never_wrapped() {
        let mut g = two_blocks();
        g.regions[1].writes_input = Some("aten.relu_.default".into());
        g.check().unwrap();
        assert_eq!(SacPlan::full(&g).wrapped.keys().collect::<Vec<_>>(), [&0]);
        let e = simulate(&g, &SacPlan::full(&two_blocks()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("region 1 (b.1), whose forward writes its input in place (aten.relu_"),
            "{e}"
        );
        let unplanned = simulate(&g, &SacPlan::default()).unwrap().peak_bytes;
        let cands = Candidates::new(&g).unwrap();
        for budget in [cands.least_peak(), unplanned] {
            let (p, _) = cands.select(budget).unwrap();
            assert!(!p.wrapped.contains_key(&1), "{p:?}");
        }
    }

    #[test]
    fn calls_of_one_module_are_regions_named_by_fqn_and_call() {
        // One module run twice per step (a shared layer): two regions, one per call.
        let mut g = two_blocks();
        g.regions[1].fqn = "b.0".into();
        g.regions[1].call = 1;
        g.check().unwrap();
        assert_eq!(g.region_label(1), "b.0 (call 2 of 2)");
        assert_eq!(two_blocks().region_label(1), "b.1");
        // Each call is planned, written and read back on its own.
        let mut p = SacPlan::default();
        p.wrapped.insert(1, BTreeSet::new());
        let predicted = simulate(&g, &p).unwrap();
        let report = SacReport {
            budget_bytes: predicted.peak_bytes,
            status: "fits",
            min_peak_bytes: 0,
            unplanned_peak_bytes: 0,
            predicted,
            moves: 0,
            lower_bound: None,
        };
        let doc = document(&g, &p, &report);
        let calls: Vec<_> = doc
            .regions
            .iter()
            .map(|r| (r.fqn.as_str(), r.call, r.wrapped))
            .collect();
        assert_eq!(calls, [("b.0", 0, false), ("b.0", 1, true)]);
        assert_eq!(plan_from_document(&g, &doc).unwrap(), p);
        let mut other = doc.clone();
        other.regions[1].call = 2;
        let e = plan_from_document(&g, &other).unwrap_err().to_string();
        assert!(
            e.contains("\"b.0\" (its call 3), which the graph lacks"),
            "{e}"
        );
        // The same module and call twice is refused, naming both.
        g.regions[1].call = 0;
        let e = g.check().unwrap_err().to_string();
        assert!(
            e.contains("regions[1] (b.0 (call 1 of 2)): the same module and call as regions[0]"),
            "{e}"
        );
    }

    #[test]
    fn wrapping_costs_its_dispatched_ops_where_the_graph_prices_it() {
        let mut g = two_blocks();
        g.wrap_cost = Some(WrapCost {
            per_op: 0.5,
            step: 20.0,
            source: String::new(),
            pairs: vec![],
        });
        g.check().unwrap();
        let none = simulate(&g, &SacPlan::default()).unwrap();
        assert_eq!(
            (none.compute_cost, none.base_cost, none.wrap_cost),
            (20.0, 20.0, 0.0)
        );
        // Each region: 2 forward ops and a re-run of 1 (early stop after f), 3 dispatched.
        assert_eq!((g.wrapped_ops(0), g.wrapped_ops(1)), (3, 3));
        let full = simulate(&g, &SacPlan::full(&g)).unwrap();
        assert_eq!(full.wrap_cost, 3.0);
        assert_eq!(full.rerun_cost[&0], 5.0 + 1.5);
        assert_eq!(full.compute_cost, 20.0 + 10.0 + 3.0);
        assert!((full.overhead() - 13.0 / 20.0).abs() < 1e-12);
        // Keeping f spares its kernel, not its dispatch: the cache serves it through the mode.
        let mut p = SacPlan::full(&g);
        p.wrapped.get_mut(&0).unwrap().insert(0);
        assert_eq!(simulate(&g, &p).unwrap().rerun_cost[&0], 1.5);
        g.wrap_cost.as_mut().unwrap().per_op = f64::NAN;
        let e = g.check().unwrap_err().to_string();
        assert!(e.contains("wrap_cost.per_op NaN"), "{e}");
    }

    #[test]
    fn keeping_an_op_skips_its_rerun_and_holds_its_output() {
        let g = two_blocks();
        let mut p = SacPlan::full(&g);
        p.wrapped.get_mut(&0).unwrap().insert(0);
        let s = simulate(&g, &p).unwrap();
        assert_eq!(s.rerun_cost[&0], 0.0);
        assert_eq!(s.rerun_cost[&1], 5.0);
        let kept_bytes = simulate(&g, &SacPlan::full(&g)).unwrap().forward_end_bytes + 100;
        assert_eq!(s.forward_end_bytes, kept_bytes);
    }

    #[test]
    fn plan_fits_the_budget_and_costs_less_with_more_memory() {
        let g = two_blocks();
        let unplanned = simulate(&g, &SacPlan::default()).unwrap().peak_bytes;
        let min = Candidates::new(&g).unwrap().least_peak();
        assert!(min <= simulate(&g, &SacPlan::full(&g)).unwrap().peak_bytes);
        let mut last = f64::INFINITY;
        for budget in [min, (min + unplanned) / 2, unplanned] {
            let (p, rep) = plan(&g, budget).unwrap();
            assert_eq!(rep.status, "fits");
            let s = simulate(&g, &p).unwrap();
            assert!(s.peak_bytes <= budget);
            assert_eq!(s, rep.predicted);
            assert!(s.compute_cost <= last);
            last = s.compute_cost;
        }
        let (p, rep) = plan(&g, min - 1).unwrap();
        assert_eq!(rep.status, "infeasible");
        assert_eq!(simulate(&g, &p).unwrap().peak_bytes, rep.min_peak_bytes);
    }

    /// The latest-holder form of a death (used where more than 6 regions touch a storage)
    /// against trying every state of the touching regions, on every storage of the fixture
    /// captures and of variants of `two_blocks` where both apply.
    #[test]
    fn the_latest_holder_form_agrees_with_trying_every_state() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/torch");
        let mut graphs: Vec<TorchGraph> = ["gpt2", "albert", "resnet18", "stack"]
            .iter()
            .map(|n| {
                let text = std::fs::read_to_string(dir.join(format!("{n}.torch.json"))).unwrap();
                TorchGraph::from_json(&text).unwrap()
            })
            .collect();
        // x1 (storage 1): made outside the regions, taken by both, saved by one or both or
        // by an op outside them, released at several points.
        // (after_op, region, released_after) per save, and the storage's death.
        type Saves = Vec<(usize, Option<usize>, usize)>;
        let variants: Vec<(Saves, usize)> = vec![
            (vec![(1, Some(1), 6)], 6),
            (vec![(1, Some(1), 5)], 6),
            (vec![(1, Some(1), 7), (0, Some(0), 7)], 7),
            (vec![(1, Some(1), 6), (0, Some(0), 8)], 8),
            (vec![(1, Some(1), 8), (0, Some(0), 6)], 8),
            (vec![(1, Some(1), 6), (4, None, 8)], 8),
            (vec![(1, Some(1), 8), (4, None, 5)], 8),
            (vec![(0, Some(0), 5), (4, None, 6)], 6),
            (vec![(4, None, 8)], 8),
            (vec![], 5),
            // Both regions decide (region 0's frame ends after region 1's save and frame).
            (vec![(1, Some(1), 3)], 3),
            (vec![(1, Some(1), 3), (4, None, 4)], 4),
            (vec![(1, Some(1), 3), (4, None, 6)], 6),
        ];
        for (saves, free_after) in variants {
            let mut g = two_blocks();
            g.ops[1].region = None;
            g.ops[1].occurrence = None;
            g.regions[0].last_op = 0;
            g.regions[0].inputs = vec![1];
            g.storages[1].saves = saves
                .into_iter()
                .map(|(after_op, region, released)| TorchSave {
                    after_op,
                    region,
                    released_after: Some(released),
                })
                .collect();
            g.storages[1].free_after = Some(free_after);
            g.check().unwrap();
            graphs.push(g);
        }
        let (mut compared, mut both) = (0, 0);
        for g in &graphs {
            let mut res = Resolved::all_wrapped(g);
            for s in 0..g.storages.len() {
                let touching = g.touching(s, &res.input_of);
                if !(2..=6).contains(&touching.len()) {
                    continue;
                }
                let Some(latest) = g.regions_deciding_latest(s, &res.input_of, &res.frame_ends)
                else {
                    continue;
                };
                let every = g.regions_deciding(s, &touching, &mut res);
                assert_eq!(latest, every, "{}: storage {s}", g.name);
                compared += 1;
                both += usize::from(every == 2);
            }
        }
        assert!(compared >= 12, "only {compared} storages compared");
        assert!(both >= 2, "only {both} storages two regions decide");
    }

    /// Sums past a `u64` or past a finite cost would make a wrong peak or a NaN overhead.
    #[test]
    fn bytes_and_costs_too_large_to_add_up_are_refused() {
        let mut g = two_blocks();
        g.storages[0].bytes = u64::MAX;
        let e = g.check().unwrap_err().to_string();
        assert!(
            e.contains("storages' bytes add up to") && e.contains("1 EiB"),
            "{e}"
        );
        let mut g = two_blocks();
        g.fixed_bytes = u64::MAX;
        let e = g.check().unwrap_err().to_string();
        assert!(e.contains("fixed_bytes"), "{e}");
        let mut g = two_blocks();
        for op in &mut g.ops {
            op.cost = 1e308;
        }
        let e = g.check().unwrap_err().to_string();
        assert!(e.contains("costs add up to"), "{e}");
    }

    #[test]
    fn bad_documents_name_the_field() {
        let mut g = two_blocks();
        g.ops[3].outputs = vec![9];
        let e = g.check().unwrap_err().to_string();
        assert!(e.contains("ops[3] (g): output storage 9"), "{e}");
        let mut g = two_blocks();
        g.regions[1].first_op = 1;
        let e = g.check().unwrap_err().to_string();
        assert!(e.contains("regions[1] (b.1): op 1 (g)"), "{e}");
        let mut g = two_blocks();
        g.format = "x".into();
        assert!(g
            .check()
            .unwrap_err()
            .to_string()
            .contains("format is \"x\""));
        let g = two_blocks();
        let mut p = SacPlan::full(&g);
        p.wrapped.get_mut(&1).unwrap().insert(0);
        let e = simulate(&g, &p).unwrap_err().to_string();
        assert!(e.contains("keeps op 0 in region 1 (b.1)"), "{e}");
    }
}
