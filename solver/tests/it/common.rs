//! Random problems for property tests, shared by the solver's integration tests.
//!
//! - [`chain`] / [`arb_chain`]: training chains in the exact shape of
//!   `remat_solver::dp::as_training_chain` (forward path, then stage backward nodes reading the
//!   stage's input, output and the incoming gradient).
//! - [`training_dag`] / [`arb_training_dag`]: a random forward DAG, a loss, and a mirrored
//!   backward graph reading forward values, like Checkmate's training graphs.
//! - [`brute_force`]: exhaustive search over every schedule of a tiny problem.
#![allow(dead_code)]

use proptest::prelude::*;
use remat_solver::{Node, NodeKind, Problem};
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

fn node(id: String, cost: f64, bytes: u64, deps: Vec<usize>, kind: NodeKind) -> Node {
    Node {
        name: id.clone(),
        id,
        cost,
        bytes,
        deps,
        kind,
        required: true,
    }
}

/// A training chain: forward `x_0 … x_{N-1}` with `(cost, bytes)` from `fwd`, then one backward
/// node per entry of `bwd` (`b_i` is the backward of stage `N-2-i`, reading `x_j`, `x_{j+1}` and
/// `b_{i-1}`). Needs `1 ≤ bwd.len() ≤ fwd.len() - 1`.
pub fn chain(fwd: &[(f64, u64)], bwd: &[(f64, u64)], fixed_bytes: u64) -> Problem {
    let n = fwd.len();
    let mut nodes = Vec::new();
    for (j, &(c, b)) in fwd.iter().enumerate() {
        let deps = if j == 0 { vec![] } else { vec![j - 1] };
        nodes.push(node(format!("x{j}"), c, b, deps, NodeKind::Forward));
    }
    for (i, &(c, b)) in bwd.iter().enumerate() {
        let j = n - 2 - i;
        let mut deps = vec![j, j + 1];
        if i > 0 {
            deps.push(n + i - 1);
        }
        nodes.push(node(format!("b{j}"), c, b, deps, NodeKind::Backward));
    }
    Problem::new("chain", nodes, fixed_bytes).expect("generated chain is valid")
}

/// Random training chains with `2..=max_fwd` forward nodes, small integer costs and sizes.
pub fn arb_chain(max_fwd: usize) -> impl Strategy<Value = Problem> {
    (2..=max_fwd.max(2))
        .prop_flat_map(|n| (Just(n), 1..n))
        .prop_flat_map(|(n, k)| {
            (
                prop::collection::vec((1u32..=10, 1u64..=20), n),
                prop::collection::vec((1u32..=10, 1u64..=20), k),
                0u64..=5,
            )
        })
        .prop_map(|(f, b, fixed)| {
            let f: Vec<(f64, u64)> = f.into_iter().map(|(c, s)| (c as f64, s)).collect();
            let b: Vec<(f64, u64)> = b.into_iter().map(|(c, s)| (c as f64, s)).collect();
            chain(&f, &b, fixed)
        })
}

/// A training DAG from a forward DAG: `fwd_deps[j]` lists the earlier forward nodes forward
/// node `j` reads. A loss reads the last forward node; backward node `g_j` (for each forward `j`,
/// in reverse order) reads `x_j`, the forward inputs of `x_j`, and the gradients of `x_j`'s
/// forward users (the loss gradient for nodes without users).
pub fn training_dag(fwd: &[(f64, u64)], fwd_deps: &[Vec<usize>], bwd: &[(f64, u64)]) -> Problem {
    let n = fwd.len();
    let mut nodes = Vec::new();
    for (j, &(c, b)) in fwd.iter().enumerate() {
        let mut deps: Vec<usize> = fwd_deps
            .get(j)
            .map(|d| d.iter().copied().filter(|&x| x < j).collect())
            .unwrap_or_default();
        deps.sort_unstable();
        deps.dedup();
        nodes.push(node(format!("x{j}"), c, b, deps, NodeKind::Forward));
    }
    let loss = n;
    nodes.push(node("loss".into(), 1.0, 1, vec![n - 1], NodeKind::Loss));
    let mut users = vec![Vec::new(); n];
    for (j, nd) in nodes.iter().enumerate().take(n) {
        for &d in &nd.deps {
            users[d].push(j);
        }
    }
    // Gradient node of forward j sits at index grad_index(j): reverse order after the loss.
    let grad_index = |j: usize| loss + (n - j);
    for j in (0..n).rev() {
        let (c, b) = bwd.get(n - 1 - j).copied().unwrap_or((1.0, 1));
        let mut deps = vec![j];
        deps.extend(nodes[j].deps.iter().copied());
        if users[j].is_empty() {
            deps.push(loss);
        } else {
            deps.extend(users[j].iter().map(|&u| grad_index(u)));
        }
        nodes.push(node(format!("g{j}"), c, b, deps, NodeKind::Backward));
    }
    Problem::new("training-dag", nodes, 0).expect("generated training DAG is valid")
}

/// A chain of `blocks` blocks of `width` forward nodes each (a [`training_dag`]): each node
/// reads its predecessor, and a block's last node reads every node of its block, so the only
/// split points are the blocks' boundaries and each block's backward reads the whole block.
/// `fwd(j)` is forward node `j`'s cost and bytes; every backward node costs 2 and holds 10.
pub fn chain_of_blocks(blocks: usize, width: usize, fwd: impl Fn(usize) -> (f64, u64)) -> Problem {
    let n = blocks * width;
    let deps: Vec<Vec<usize>> = (0..n)
        .map(|j| {
            let start = j - j % width;
            if j % width == width - 1 {
                (start..j).collect()
            } else {
                j.checked_sub(1).into_iter().collect()
            }
        })
        .collect();
    let fwd: Vec<(f64, u64)> = (0..n).map(fwd).collect();
    training_dag(&fwd, &deps, &vec![(2.0, 10); n])
}

/// Random training DAGs with `2..=max_fwd` forward nodes; each forward node reads its
/// predecessor and, sometimes, one or two earlier nodes (skip connections).
pub fn arb_training_dag(max_fwd: usize) -> impl Strategy<Value = Problem> {
    (2..=max_fwd.max(2))
        .prop_flat_map(|n| {
            (
                prop::collection::vec((1u32..=10, 1u64..=20), n),
                prop::collection::vec(
                    prop::collection::vec(any::<prop::sample::Index>(), 0..=2),
                    n,
                ),
                prop::collection::vec((1u32..=10, 1u64..=20), n),
            )
        })
        .prop_map(|(f, skips, b)| {
            let n = f.len();
            let deps: Vec<Vec<usize>> = (0..n)
                .map(|j| {
                    if j == 0 {
                        return vec![];
                    }
                    let mut d = vec![j - 1];
                    d.extend(skips[j].iter().map(|ix| ix.index(j)));
                    d
                })
                .collect();
            let f: Vec<(f64, u64)> = f.into_iter().map(|(c, s)| (c as f64, s)).collect();
            let b: Vec<(f64, u64)> = b.into_iter().map(|(c, s)| (c as f64, s)).collect();
            training_dag(&f, &deps, &b)
        })
}

/// Random plain DAGs (every node forward, all required): node `j` reads 0–3 earlier nodes.
pub fn arb_plain_dag(max_nodes: usize) -> impl Strategy<Value = Problem> {
    (1..=max_nodes.max(1))
        .prop_flat_map(|n| {
            (
                prop::collection::vec((1u32..=10, 1u64..=20), n),
                prop::collection::vec(
                    prop::collection::vec(any::<prop::sample::Index>(), 0..=3),
                    n,
                ),
            )
        })
        .prop_map(|(f, deps)| {
            let nodes = f
                .iter()
                .enumerate()
                .map(|(j, &(c, b))| {
                    let d = if j == 0 {
                        vec![]
                    } else {
                        deps[j].iter().map(|ix| ix.index(j)).collect()
                    };
                    node(format!("v{j}"), c as f64, b, d, NodeKind::Forward)
                })
                .collect();
            Problem::new("plain-dag", nodes, 0).expect("generated DAG is valid")
        })
}

#[derive(PartialEq)]
struct Entry(f64, u32, u32);
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Entry {
    fn cmp(&self, o: &Self) -> Ordering {
        o.0.total_cmp(&self.0)
            .then((o.1, o.2).cmp(&(self.1, self.2)))
    }
}

/// What exhaustive search finds for a tiny problem (≤ 16 nodes).
#[derive(Debug, Clone, PartialEq)]
pub struct BruteForce {
    /// The least peak of any valid schedule (fixed bytes included).
    pub min_peak: u64,
    /// The least cost of any valid schedule whose peak is within the budget asked for.
    pub min_cost: Option<f64>,
}

/// Exhaustive search over all schedules (any computes, recomputes and frees, in any order):
/// a shortest path over (resident set, computed-so-far set) states. `min_cost` is for schedules
/// whose every step stays within `budget`.
pub fn brute_force(p: &Problem, budget: u64) -> BruteForce {
    let n = p.len();
    assert!(n <= 16, "brute force is for tiny problems");
    let any_required = p.nodes.iter().any(|x| x.required);
    let goal: u32 = (0..n)
        .filter(|&v| !any_required || p.nodes[v].required)
        .fold(0, |m, v| m | (1 << v));
    let deps: Vec<u32> = (0..n)
        .map(|v| p.deps(v).iter().fold(0, |m, &d| m | (1 << d)))
        .collect();
    let mem = |res: u32| -> u64 {
        p.fixed_bytes
            + (0..n)
                .filter(|&v| res & (1 << v) != 0)
                .map(|v| p.bytes(v))
                .sum::<u64>()
    };
    // Minimax peak: Dijkstra on the bottleneck.
    let mut best_peak: HashMap<(u32, u32), u64> = HashMap::new();
    let mut heap = BinaryHeap::new();
    heap.push(std::cmp::Reverse((p.fixed_bytes, 0u32, 0u32)));
    best_peak.insert((0, 0), p.fixed_bytes);
    let mut min_peak = u64::MAX;
    while let Some(std::cmp::Reverse((pk, res, done))) = heap.pop() {
        if best_peak.get(&(res, done)).is_some_and(|&b| b < pk) {
            continue;
        }
        if done & goal == goal {
            min_peak = pk;
            break;
        }
        for (v, &dv) in deps.iter().enumerate() {
            let bit = 1u32 << v;
            let (nres, ndone, npk) = if res & bit != 0 {
                (res & !bit, done, pk)
            } else if dv & !res == 0 {
                (res | bit, done | bit, pk.max(mem(res | bit)))
            } else {
                continue;
            };
            let e = best_peak.entry((nres, ndone)).or_insert(u64::MAX);
            if npk < *e {
                *e = npk;
                heap.push(std::cmp::Reverse((npk, nres, ndone)));
            }
        }
    }
    // Least cost within the budget: Dijkstra on cost, states over budget excluded.
    let mut dist: HashMap<(u32, u32), f64> = HashMap::new();
    let mut heap = BinaryHeap::new();
    let mut min_cost = None;
    if p.fixed_bytes <= budget {
        dist.insert((0, 0), 0.0);
        heap.push(Entry(0.0, 0, 0));
    }
    while let Some(Entry(c, res, done)) = heap.pop() {
        if dist.get(&(res, done)).is_some_and(|&b| b < c) {
            continue;
        }
        if done & goal == goal {
            min_cost = Some(c);
            break;
        }
        for (v, &dv) in deps.iter().enumerate() {
            let bit = 1u32 << v;
            let (nres, ndone, nc) = if res & bit != 0 {
                (res & !bit, done, c)
            } else if dv & !res == 0 && mem(res | bit) <= budget {
                (res | bit, done | bit, c + p.cost(v))
            } else {
                continue;
            };
            let e = dist.entry((nres, ndone)).or_insert(f64::INFINITY);
            if nc < *e {
                *e = nc;
                heap.push(Entry(nc, nres, ndone));
            }
        }
    }
    BruteForce { min_peak, min_cost }
}

/// The package's directory: cargo's at run time, else the build's. A test binary built in
/// another clone that shares the cargo target folder (as CI's does) is reused here unchanged,
/// with that clone's path in `env!`.
pub fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), Into::into)
}
