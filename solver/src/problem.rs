//! A checkpointing problem: a DAG of values in a topological order, each with the cost to
//! compute it and the bytes its output occupies.

use crate::error::{Result, SolverError};
use serde::{Deserialize, Serialize};

/// Index of a node in [`Problem::nodes`] (its position in the natural topological order).
pub type NodeId = usize;

/// What a node is in the training step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum NodeKind {
    Forward,
    Loss,
    Backward,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// The node's id in the input (node-link `id`, or the training node id `planner` assigns).
    pub id: String,
    /// A human readable name (layer name, op type).
    pub name: String,
    /// Cost of computing the node once (FLOPs, measured seconds or the graph's own unit).
    pub cost: f64,
    /// Bytes of the node's output.
    pub bytes: u64,
    /// Indices of the nodes whose outputs this node reads; all smaller than its own index.
    pub deps: Vec<NodeId>,
    pub kind: NodeKind,
    /// Whether every schedule must compute this node at least once (backward results,
    /// parameter gradients). Nodes that are not required exist as intermediates only.
    pub required: bool,
}

/// Most bytes a problem's values and fixed bytes may add up to (1 EiB): every peak, budget
/// and sum of bytes the solver forms then fits a `u64` with room to spare, so no figure wraps
/// around. A graph past it is refused, naming the node where the sum passes it (real models
/// are many orders of magnitude below; a dimension bound too large, or a size in the wrong
/// unit, is not).
pub const MAX_TOTAL_BYTES: u64 = 1 << 60;

/// Most the costs of a problem's nodes may add up to: a schedule recomputes a node far fewer
/// than 10^30 times, so its cost, the overhead and the bounds stay finite.
pub const MAX_TOTAL_COST: f64 = 1e270;

/// A DAG in a valid topological order plus the bytes every step carries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Problem {
    pub name: String,
    pub nodes: Vec<Node>,
    /// Bytes resident at every step whatever the schedule (parameters, gradients, optimizer state).
    pub fixed_bytes: u64,
    #[serde(skip)]
    users: Vec<Vec<NodeId>>,
}

impl Problem {
    /// Builds a problem, checking that the order is topological, that ids are unique, that
    /// costs are finite and non-negative, and that the bytes and the costs add up to at most
    /// [`MAX_TOTAL_BYTES`] and [`MAX_TOTAL_COST`]. Duplicate dependencies are merged.
    pub fn new(name: impl Into<String>, mut nodes: Vec<Node>, fixed_bytes: u64) -> Result<Self> {
        if nodes.is_empty() {
            return Err(SolverError::EmptyProblem);
        }
        if fixed_bytes > MAX_TOTAL_BYTES {
            return Err(SolverError::TooLarge {
                what: format!(
                    "the fixed bytes ({fixed_bytes}) are more than remat plans for ({MAX_TOTAL_BYTES} bytes, 1 EiB)"
                ),
            });
        }
        let mut seen = std::collections::HashSet::with_capacity(nodes.len());
        let mut total_bytes = u128::from(fixed_bytes);
        let mut total_cost = 0.0;
        for (index, node) in nodes.iter_mut().enumerate() {
            if !seen.insert(node.id.clone()) {
                return Err(SolverError::DuplicateNodeId(node.id.clone()));
            }
            if !node.cost.is_finite() || node.cost < 0.0 {
                return Err(SolverError::InvalidNodeField {
                    node: node.id.clone(),
                    field: "cost",
                    value: node.cost.to_string(),
                });
            }
            total_bytes += u128::from(node.bytes);
            if total_bytes > u128::from(MAX_TOTAL_BYTES) {
                return Err(SolverError::TooLarge {
                    what: format!(
                        "node {:?} ({} bytes): the fixed bytes and the bytes of the values up to it add up to {total_bytes}, more than remat plans for ({MAX_TOTAL_BYTES} bytes, 1 EiB); is a dimension bound too large, or a size in the wrong unit?",
                        node.id, node.bytes
                    ),
                });
            }
            total_cost += node.cost;
            if total_cost > MAX_TOTAL_COST {
                return Err(SolverError::TooLarge {
                    what: format!(
                        "node {:?} (cost {:e}): the costs of the nodes up to it add up to {total_cost:e}, more than remat plans with ({MAX_TOTAL_COST:e}); scale the costs down",
                        node.id, node.cost
                    ),
                });
            }
            node.deps.sort_unstable();
            node.deps.dedup();
            if let Some(&dep_index) = node.deps.iter().find(|&&d| d >= index) {
                return Err(SolverError::NotTopological {
                    node: node.id.clone(),
                    index,
                    dep_index,
                });
            }
        }
        let mut users = vec![Vec::new(); nodes.len()];
        for (v, node) in nodes.iter().enumerate() {
            for &d in &node.deps {
                users[d].push(v);
            }
        }
        Ok(Problem {
            name: name.into(),
            nodes,
            fixed_bytes,
            users,
        })
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Nodes that read `v`'s output, in increasing order.
    pub fn users(&self, v: NodeId) -> &[NodeId] {
        &self.users[v]
    }

    pub fn deps(&self, v: NodeId) -> &[NodeId] {
        &self.nodes[v].deps
    }

    pub fn bytes(&self, v: NodeId) -> u64 {
        self.nodes[v].bytes
    }

    pub fn cost(&self, v: NodeId) -> f64 {
        self.nodes[v].cost
    }

    /// Nodes a complete training step must evaluate: the required ones and their ancestors.
    /// When no node is marked required, every node is needed.
    pub fn needed(&self) -> Vec<bool> {
        let mut needed: Vec<bool> = self.nodes.iter().map(|n| n.required).collect();
        if !needed.iter().any(|&r| r) {
            return vec![true; self.len()];
        }
        for v in (0..self.len()).rev() {
            if needed[v] {
                for &d in &self.nodes[v].deps {
                    needed[d] = true;
                }
            }
        }
        needed
    }

    /// Cost of computing every needed node once: the compute cost of store-all, the
    /// reference for overhead figures.
    pub fn base_cost(&self) -> f64 {
        let needed = self.needed();
        self.nodes
            .iter()
            .zip(needed)
            .filter(|(_, n)| *n)
            .map(|(node, _)| node.cost)
            .sum()
    }

    /// Position of a node by its external id.
    pub fn index_of(&self, id: &str) -> Option<NodeId> {
        self.nodes.iter().position(|n| n.id == id)
    }

    /// Bytes needed to compute `v` alone: its output and all its dependencies, plus the fixed
    /// bytes. No schedule can have a peak below the largest of these.
    pub fn footprint(&self, v: NodeId) -> u64 {
        self.fixed_bytes
            + self.nodes[v].bytes
            + self.nodes[v]
                .deps
                .iter()
                .map(|&d| self.nodes[d].bytes)
                .sum::<u64>()
    }

    /// Whether the needed nodes have one topological order only: each reads the needed node
    /// before it in natural order (a chain, a training chain). Checkmate's stage model fixes
    /// the order in which nodes are first computed to the natural one, so its bounds and its
    /// optimum hold for every schedule only then; where independent branches may interleave
    /// otherwise, another order can need less memory and cost less.
    pub fn order_is_forced(&self) -> bool {
        let needed = self.needed();
        let mut prev: Option<NodeId> = None;
        for v in (0..self.len()).filter(|&v| needed[v]) {
            if let Some(u) = prev {
                if !self.nodes[v].deps.contains(&u) {
                    return false;
                }
            }
            prev = Some(v);
        }
        true
    }

    /// `max_v footprint(v)` over the needed nodes: a lower bound on any schedule's peak.
    pub fn footprint_lower_bound(&self) -> u64 {
        let needed = self.needed();
        (0..self.len())
            .filter(|&v| needed[v])
            .map(|v| self.footprint(v))
            .max()
            .unwrap_or(self.fixed_bytes)
    }

    /// Bytes of the forward values the backward reads when nothing is recomputed (each value
    /// counted once): what store-all keeps for the backward pass.
    pub fn saved_for_backward_bytes(&self) -> u64 {
        (0..self.len())
            .filter(|&v| self.nodes[v].kind != NodeKind::Backward)
            .filter(|&v| {
                self.users(v)
                    .iter()
                    .any(|&u| self.nodes[u].kind == NodeKind::Backward)
            })
            .map(|v| self.nodes[v].bytes)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, cost: f64, bytes: u64, deps: Vec<NodeId>) -> Node {
        Node {
            id: id.into(),
            name: id.into(),
            cost,
            bytes,
            deps,
            kind: NodeKind::Forward,
            required: true,
        }
    }

    /// Sums past a `u64` would wrap around in a release build (a peak smaller than one of its
    /// values): the problem is refused, naming the node where the sum passes the limit.
    #[test]
    fn bytes_and_costs_too_large_to_add_up_are_refused_naming_the_node() {
        let half = MAX_TOTAL_BYTES / 2 + 1;
        let e = Problem::new(
            "g",
            vec![node("a", 1.0, half, vec![]), node("b", 1.0, half, vec![0])],
            0,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("node \"b\"") && e.contains("1 EiB"), "{e}");
        let e = Problem::new("g", vec![node("a", 1.0, u64::MAX, vec![])], 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("node \"a\""), "{e}");
        let e = Problem::new("g", vec![node("a", 1.0, 8, vec![])], u64::MAX)
            .unwrap_err()
            .to_string();
        assert!(e.contains("fixed bytes"), "{e}");
        let e = Problem::new(
            "g",
            vec![node("a", 1e308, 8, vec![]), node("b", 1e308, 8, vec![0])],
            0,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("node \"a\"") && e.contains("scale the costs down"),
            "{e}"
        );
        // At the limits themselves the problem is accepted.
        let ok = Problem::new(
            "g",
            vec![node("a", MAX_TOTAL_COST, MAX_TOTAL_BYTES - 8, vec![])],
            8,
        );
        assert!(ok.is_ok(), "{ok:?}");
    }
}
