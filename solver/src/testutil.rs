//! Problems shared by the crate's unit tests.

use crate::problem::{Node, NodeKind, Problem};

/// A training chain of `k` forward nodes and `k` backward nodes (backward `j` reads forward
/// `k-1-j`, the previous backward node or, first, the forward before the last); forward node `i`
/// costs `cost(i)` and holds `bytes(i)`; backward nodes cost 2 and hold 100 bytes.
pub(crate) fn training_chain(
    k: usize,
    cost: impl Fn(usize) -> f64,
    bytes: impl Fn(usize) -> u64,
) -> Problem {
    let mut nodes = Vec::new();
    for i in 0..k {
        nodes.push(Node {
            id: format!("f{i}"),
            name: String::new(),
            cost: cost(i),
            bytes: bytes(i),
            deps: if i == 0 { vec![] } else { vec![i - 1] },
            kind: NodeKind::Forward,
            required: false,
        });
    }
    for j in 0..k {
        let f = k - 1 - j;
        let mut deps = vec![f];
        if j > 0 {
            deps.push(k + j - 1);
        } else if k > 1 {
            deps.push(k - 2);
        }
        nodes.push(Node {
            id: format!("b{j}"),
            name: String::new(),
            cost: 2.0,
            bytes: 100,
            deps,
            kind: NodeKind::Backward,
            required: true,
        });
    }
    Problem::new("train", nodes, 0).expect("a training chain is a valid problem")
}
