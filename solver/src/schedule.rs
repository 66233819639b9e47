//! Schedules and the one simulator that validates and scores them.

use crate::error::{Result, SolverError};
use crate::problem::{NodeId, Problem};
use serde::{Deserialize, Serialize};

/// One step of a schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// Compute the node's output; every dependency must be resident. A second `Compute` of the
    /// same node (after a `Free`) is a recomputation.
    Compute(NodeId),
    /// Release the node's output.
    Free(NodeId),
}

/// A sequence of steps. Values never freed stay resident to the end.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Schedule {
    pub steps: Vec<Step>,
}

/// A schedule step in the interchange format: `{"op": "compute" | "free", "node": ID}` where ID
/// is the node's id in the input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepJson {
    pub op: StepOp,
    pub node: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum StepOp {
    Compute,
    Free,
}

impl Schedule {
    pub fn new(steps: Vec<Step>) -> Self {
        Schedule { steps }
    }

    /// The schedule in the interchange format, nodes named by their external ids.
    pub fn to_json_steps(&self, problem: &Problem) -> Vec<StepJson> {
        self.steps
            .iter()
            .map(|s| match *s {
                Step::Compute(v) => StepJson {
                    op: StepOp::Compute,
                    node: problem.nodes[v].id.clone(),
                },
                Step::Free(v) => StepJson {
                    op: StepOp::Free,
                    node: problem.nodes[v].id.clone(),
                },
            })
            .collect()
    }

    /// Reads the interchange format back, resolving external ids; an unknown id is an error
    /// naming the step.
    pub fn from_json_steps(problem: &Problem, steps: &[StepJson]) -> Result<Self> {
        let index: std::collections::HashMap<&str, NodeId> = problem
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.id.as_str(), i))
            .collect();
        steps
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let v = *index
                    .get(s.node.as_str())
                    .ok_or_else(|| SolverError::GraphFormat {
                        what: format!("schedule step {i}: unknown node id {:?}", s.node),
                    })?;
                Ok(match s.op {
                    StepOp::Compute => Step::Compute(v),
                    StepOp::Free => Step::Free(v),
                })
            })
            .collect::<Result<Vec<_>>>()
            .map(Schedule::new)
    }

    /// Number of `Compute` steps.
    pub fn computes(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| matches!(s, Step::Compute(_)))
            .count()
    }
}

/// What `simulate` measures of a valid schedule.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Stats {
    /// Largest resident bytes (including `fixed_bytes`) over all steps. While a node is computed
    /// its output and all its dependencies are resident, so a compute step's memory is the
    /// resident bytes right after it.
    pub peak_bytes: u64,
    /// Index of the step at which the peak is first reached.
    pub peak_step: usize,
    /// Sum of the costs of all `Compute` steps (recomputations included).
    pub compute_cost: f64,
    /// Resident bytes (including `fixed_bytes`) after every step.
    pub memory: Vec<u64>,
    /// Number of `Compute` steps that recompute a node computed before.
    pub recomputations: usize,
    /// Bytes resident after the last step (values never freed), fixed bytes included.
    pub final_bytes: u64,
}

impl Stats {
    /// `compute_cost / base_cost − 1`: the extra compute relative to computing everything once.
    pub fn overhead(&self, problem: &Problem) -> f64 {
        let base = problem.base_cost();
        if base > 0.0 {
            self.compute_cost / base - 1.0
        } else {
            0.0
        }
    }
}

/// Validates `schedule` against `problem` under the memory model and scores it.
///
/// Rejected, with the step named: a node index out of range, computing a node whose
/// dependency is not resident, computing a node already resident, freeing a node not
/// resident; and a required node that is never computed.
pub fn simulate(problem: &Problem, schedule: &Schedule) -> Result<Stats> {
    let n = problem.len();
    let mut resident = vec![false; n];
    let mut computed = vec![false; n];
    let mut mem = problem.fixed_bytes;
    let mut peak = mem;
    let mut peak_step = 0;
    let mut cost = 0.0;
    let mut recomputations = 0;
    let mut memory = Vec::with_capacity(schedule.steps.len());
    for (step, s) in schedule.steps.iter().enumerate() {
        match *s {
            Step::Compute(v) => {
                if v >= n {
                    return Err(SolverError::UnknownNode {
                        step,
                        op: "compute",
                        index: v,
                        len: n,
                    });
                }
                if resident[v] {
                    return Err(SolverError::AlreadyResident {
                        step,
                        node: problem.nodes[v].id.clone(),
                    });
                }
                if let Some(&d) = problem.deps(v).iter().find(|&&d| !resident[d]) {
                    return Err(SolverError::DependencyNotResident {
                        step,
                        node: problem.nodes[v].id.clone(),
                        dep: problem.nodes[d].id.clone(),
                    });
                }
                resident[v] = true;
                if computed[v] {
                    recomputations += 1;
                }
                computed[v] = true;
                mem += problem.bytes(v);
                cost += problem.cost(v);
                if mem > peak {
                    peak = mem;
                    peak_step = step;
                }
            }
            Step::Free(v) => {
                if v >= n {
                    return Err(SolverError::UnknownNode {
                        step,
                        op: "free",
                        index: v,
                        len: n,
                    });
                }
                if !resident[v] {
                    return Err(SolverError::FreeNotResident {
                        step,
                        node: problem.nodes[v].id.clone(),
                    });
                }
                resident[v] = false;
                mem -= problem.bytes(v);
            }
        }
        memory.push(mem);
    }
    let needed_required = problem.nodes.iter().any(|n| n.required);
    for (v, node) in problem.nodes.iter().enumerate() {
        let must = if needed_required { node.required } else { true };
        if must && !computed[v] {
            return Err(SolverError::RequiredNotComputed {
                node: node.id.clone(),
            });
        }
    }
    Ok(Stats {
        peak_bytes: peak,
        peak_step,
        compute_cost: cost,
        memory,
        recomputations,
        final_bytes: mem,
    })
}

/// Adds `Free` steps right after each value's last use (and right after computing a value no
/// later step reads), for a schedule that only lists `Compute` steps. Values never used again
/// are freed, so the result holds only what is still needed. This is how every algorithm
/// turns "what to compute when" into an explicit schedule with the least memory.
pub fn with_frees(problem: &Problem, computes: &[NodeId]) -> Schedule {
    // last[v] = index in `computes` of the last compute step that reads v's current instance.
    // Each recomputation starts a new instance, so process instances in order.
    let n = problem.len();
    let mut last_use: Vec<Option<usize>> = vec![None; computes.len()];
    // instance_start[i] = the compute index that produced the instance of each value in use.
    let mut current: Vec<Option<usize>> = vec![None; n];
    // For each compute step i of node v, the last compute index reading that instance.
    for (i, &v) in computes.iter().enumerate() {
        for &d in problem.deps(v) {
            if let Some(p) = current[d] {
                last_use[p] = Some(i);
            }
        }
        current[v] = Some(i);
    }
    // frees_after[i]: the instances whose last reader is step i.
    let mut frees_after: Vec<Vec<NodeId>> = vec![Vec::new(); computes.len()];
    for (p, &v) in computes.iter().enumerate() {
        let at = last_use[p].unwrap_or(p);
        frees_after[at].push(v);
    }
    let mut steps = Vec::with_capacity(computes.len() * 2);
    for (i, &v) in computes.iter().enumerate() {
        steps.push(Step::Compute(v));
        for &f in &frees_after[i] {
            steps.push(Step::Free(f));
        }
    }
    Schedule::new(steps)
}

/// Store-all: compute every needed node once in the natural order and free each value right
/// after its last use. Its peak is the `store_all_peak` budgets are fractions of.
pub fn store_all(problem: &Problem) -> Schedule {
    let needed = problem.needed();
    let computes: Vec<NodeId> = (0..problem.len()).filter(|&v| needed[v]).collect();
    with_frees(problem, &computes)
}

/// Peak bytes of [`store_all`], as scored by [`simulate`].
pub fn store_all_peak(problem: &Problem) -> u64 {
    simulate(problem, &store_all(problem))
        .expect("store-all of a valid problem is a valid schedule")
        .peak_bytes
}
