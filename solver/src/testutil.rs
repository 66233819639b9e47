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

/// A chain of `blocks` residual blocks, the shape of a transformer's: block `j` computes
/// `a = f(x)`, `b = g(a)` and `x' = x + b` from its input `x`; its backward reads `a` (for
/// `g`'s gradient), `x` (for `f`'s) and the incoming gradient. Sizes and costs per kind:
/// `a` 40 bytes / cost 5, `b` 40 / 1, `x'` 10 / 1; backward nodes 10 bytes, cost 2.
pub(crate) fn residual_blocks(blocks: usize) -> Problem {
    let mut nodes = Vec::new();
    let mut push = |id: String, cost: f64, bytes: u64, deps: Vec<usize>, kind: NodeKind| {
        nodes.push(Node {
            name: id.clone(),
            id,
            cost,
            bytes,
            deps,
            kind,
            required: kind == NodeKind::Backward,
        });
        nodes.len() - 1
    };
    let mut x = push("x0".into(), 0.0, 10, vec![], NodeKind::Forward);
    let mut fwd = Vec::new();
    for j in 0..blocks {
        let a = push(format!("a{j}"), 5.0, 40, vec![x], NodeKind::Forward);
        let b = push(format!("b{j}"), 1.0, 40, vec![a], NodeKind::Forward);
        let next = push(
            format!("x{}", j + 1),
            1.0,
            10,
            vec![x, b],
            NodeKind::Forward,
        );
        fwd.push((x, a));
        x = next;
    }
    let loss = push("loss".into(), 1.0, 4, vec![x], NodeKind::Loss);
    let mut grad = loss;
    for (j, &(input, a)) in fwd.iter().enumerate().rev() {
        let gb = push(format!("gb{j}"), 2.0, 10, vec![a, grad], NodeKind::Backward);
        let ga = push(
            format!("ga{j}"),
            2.0,
            10,
            vec![input, gb],
            NodeKind::Backward,
        );
        grad = push(
            format!("gx{j}"),
            2.0,
            10,
            vec![grad, ga],
            NodeKind::Backward,
        );
    }
    Problem::new("residual", nodes, 0).expect("residual blocks are a valid problem")
}
