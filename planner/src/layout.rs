//! The memory layout of views, as PyTorch has it, where what autograd saves depends on it.
//!
//! A view shares its base's storage (see the crate docs), and its strides follow from the view
//! ops between them. PyTorch's batched `matmul` folds an operand's batch dims with `reshape`:
//! a view whose batch dims cannot be merged (a head split and permute of a projection, a
//! `qkv[1]` of a permuted `qkv`) is copied, and autograd saves the copy, not the view. Here the
//! strides are replayed from the base (contiguous) through the view ops, and
//! [`matmul_saves_copy`] says when the fold copies. Values that are not views are taken as
//! contiguous (PyTorch's elementwise ops can keep a permuted layout; that is not modelled).

use crate::model::{with_ctx, Model, ValueId};
use crate::ops::{GradRule, Saved, INPUT_COPY_TAGS};
use crate::tensor::broadcast;
use petgraph::graph::NodeIndex;

/// Row-major strides of `shape`, in elements.
pub(crate) fn contiguous(shape: &[u64]) -> Vec<i64> {
    let mut st = vec![0i64; shape.len()];
    let mut acc: i64 = 1;
    for (s, &d) in st.iter_mut().zip(shape).rev() {
        *s = acc;
        acc = acc.saturating_mul(d.max(1) as i64);
    }
    st
}

/// PyTorch's `computeStride` (ATen `TensorUtils.cpp`): the strides of `new` as a view of a
/// tensor of shape `old` and strides `old_st`, or `None` when no view has that shape (then
/// PyTorch's `reshape` copies).
pub(crate) fn view_strides(old: &[u64], old_st: &[i64], new: &[u64]) -> Option<Vec<i64>> {
    if old.len() != old_st.len() {
        return None;
    }
    let old_numel: u64 = old.iter().product();
    let new_numel: u64 = new.iter().product();
    if old_numel != new_numel {
        return None;
    }
    if old_numel == 0 || old.is_empty() {
        return Some(contiguous(new));
    }
    let mut new_st = vec![0i64; new.len()];
    let mut view_d = new.len() as i64 - 1;
    let mut chunk_base = *old_st.last()?;
    let mut tensor_numel: i64 = 1;
    let mut view_numel: i64 = 1;
    for td in (0..old.len()).rev() {
        tensor_numel = tensor_numel.saturating_mul(old[td] as i64);
        let chunk_ends = td == 0
            || (old[td - 1] != 1 && old_st[td - 1] != tensor_numel.saturating_mul(chunk_base));
        if chunk_ends {
            while view_d >= 0 && (view_numel < tensor_numel || new[view_d as usize] == 1) {
                new_st[view_d as usize] = view_numel.saturating_mul(chunk_base);
                view_numel = view_numel.saturating_mul(new[view_d as usize] as i64);
                view_d -= 1;
            }
            if view_numel != tensor_numel {
                return None;
            }
            if td > 0 {
                chunk_base = old_st[td - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    (view_d == -1).then_some(new_st)
}

fn shape_of(model: &Model, v: ValueId) -> Option<&[u64]> {
    model.values[v].fact.as_ref().map(|f| f.shape.as_slice())
}

/// The strides of `v` relative to its storage, replayed from the base through the view ops
/// (`view_of(node)`: the input a node's output views, if it is a view). `None` when a view op
/// on the way is not one this module follows.
pub(crate) fn strides(
    model: &Model,
    view_of: &dyn Fn(NodeIndex) -> Option<usize>,
    v: ValueId,
) -> Option<Vec<i64>> {
    // The chain of views from `v` up to its base.
    let mut chain: Vec<(NodeIndex, ValueId, ValueId)> = vec![];
    let mut cur = v;
    for _ in 0..model.values.len() {
        let Some((p, _)) = model.values[cur].producer else {
            break;
        };
        let Some(base) = view_of(p).and_then(|i| model.graph[p].inputs.get(i).copied().flatten())
        else {
            break;
        };
        chain.push((p, base, cur));
        cur = base;
    }
    let mut st = contiguous(shape_of(model, cur)?);
    for &(p, base, out) in chain.iter().rev() {
        let node = &model.graph[p];
        let (inp, outp) = (shape_of(model, base)?, shape_of(model, out)?);
        if st.len() != inp.len() {
            return None;
        }
        st = match node.op_type.as_str() {
            "Identity" | "Cast" | "Dropout" | "Split" => st,
            "Slice" => {
                // Opset 10+: steps (input 4) along axes (input 3) scale those strides.
                let (axes, steps) = with_ctx(model, p, |_, cx| {
                    (
                        cx.const_ints(3).ok().flatten(),
                        cx.const_ints(4).ok().flatten(),
                    )
                })?;
                let mut st = st;
                if let Some(steps) = steps {
                    let rank = st.len() as i64;
                    let axes = axes.unwrap_or_else(|| (0..steps.len() as i64).collect());
                    for (&a, &k) in axes.iter().zip(&steps) {
                        let a = usize::try_from(if a < 0 { a + rank } else { a }).ok()?;
                        *st.get_mut(a)? = st.get(a)?.saturating_mul(k);
                    }
                }
                st
            }
            "Transpose" => {
                let perm: Vec<usize> = match node.attrs().ints("perm").ok().flatten() {
                    Some(p) => p
                        .iter()
                        .map(|&j| usize::try_from(j).ok())
                        .collect::<Option<_>>()?,
                    None => (0..st.len()).rev().collect(),
                };
                perm.iter()
                    .map(|&j| st.get(j).copied())
                    .collect::<Option<_>>()?
            }
            "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" => {
                // Where no view has the shape, PyTorch's reshape copies: a fresh layout.
                view_strides(inp, &st, outp).unwrap_or_else(|| contiguous(outp))
            }
            "Gather" => {
                let rank = st.len() as i64;
                let axis = node.attrs().int_or("axis", 0).ok()?;
                let axis = usize::try_from(if axis < 0 { axis + rank } else { axis }).ok()?;
                if axis >= st.len() {
                    return None;
                }
                st.remove(axis);
                st
            }
            "Expand" => {
                let lead = outp.len().checked_sub(inp.len())?;
                (0..outp.len())
                    .map(|k| {
                        if k < lead {
                            0
                        } else {
                            let j = k - lead;
                            if inp[j] == 1 && outp[k] != 1 {
                                0
                            } else {
                                st[j]
                            }
                        }
                    })
                    .collect()
            }
            _ => return None,
        };
        if st.len() != outp.len() {
            return None;
        }
    }
    Some(st)
}

/// Whether PyTorch's `matmul` saves a copy of operand `slot` (0: A, 1: B) of MatMul node `ix`
/// rather than a view of its storage: the operand is a view of rank ≥ 3 whose folded dims (the
/// batch dims when both operands are batched, all but the last when A meets a 2-D B) cannot be
/// merged without copying. Only the cases PyTorch folds with `reshape` are answered `true`
/// (a broadcast batch, or a batched B against a 2-D A, answer `false`).
pub(crate) fn matmul_saves_copy(
    model: &Model,
    view_of: &dyn Fn(NodeIndex) -> Option<usize>,
    ix: NodeIndex,
    slot: usize,
) -> bool {
    let node = &model.graph[ix];
    let operand = |i: usize| node.inputs.get(i).copied().flatten();
    let (Some(a), Some(b)) = (operand(0), operand(1)) else {
        return false;
    };
    let (Some(sa), Some(sb)) = (shape_of(model, a), shape_of(model, b)) else {
        return false;
    };
    let (v, s, other) = if slot == 0 { (a, sa, sb) } else { (b, sb, sa) };
    let r = s.len();
    if r < 3 {
        return false;
    }
    let folded = if other.len() >= 3 {
        // Both batched: the batch dims fold, and only where no broadcast expands them.
        let batch = &s[..r - 2];
        if broadcast(batch, &other[..other.len() - 2]).as_deref() != Some(batch) {
            return false;
        }
        0..r - 2
    } else if slot == 0 {
        0..r - 1
    } else {
        return false;
    };
    let is_view = model.values[v]
        .producer
        .is_some_and(|(p, _)| view_of(p).is_some());
    if !is_view {
        return false;
    }
    let Some(st) = strides(model, view_of, v) else {
        return false;
    };
    let dims: Vec<usize> = folded.filter(|&d| s[d] != 1).collect();
    dims.windows(2)
        .any(|w| st[w[0]] != st[w[1]].saturating_mul(s[w[1]] as i64))
}

/// In the gradient rule of MatMul node `ix`, an operand that PyTorch saves as a copy
/// ([`matmul_saves_copy`]) becomes the extra value `INPUT_COPY_TAGS[i]` (its bytes, a copy's
/// cost) in place of `Saved::Input(i)`, so the view's base is no longer kept for it. Other ops
/// are left alone.
pub(crate) fn copy_strided_operands(
    model: &Model,
    view_of: &dyn Fn(NodeIndex) -> Option<usize>,
    ix: NodeIndex,
    rule: &mut GradRule,
) {
    if model.graph[ix].op_type != "MatMul" {
        return;
    }
    for s in rule.saved.iter_mut() {
        let Saved::Input(i) = *s else { continue };
        let Some(fact) = model.graph[ix]
            .inputs
            .get(i)
            .copied()
            .flatten()
            .and_then(|v| model.values[v].fact.as_ref())
        else {
            continue;
        };
        if i < INPUT_COPY_TAGS.len() && matmul_saves_copy(model, view_of, ix, i) {
            *s = Saved::Extra {
                tag: INPUT_COPY_TAGS[i],
                bytes: fact.bytes(),
                cost: fact.numel() as f64,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn view_strides_follow_pytorch() {
        // A contiguous [2, 3, 4] viewed as [6, 4] and [2, 12].
        let st = contiguous(&[2, 3, 4]);
        assert_eq!(st, vec![12, 4, 1]);
        assert_eq!(view_strides(&[2, 3, 4], &st, &[6, 4]), Some(vec![4, 1]));
        assert_eq!(view_strides(&[2, 3, 4], &st, &[2, 12]), Some(vec![12, 1]));
        // Its transpose(0, 1), [3, 2, 4] strides [4, 12, 1]: no two dims merge ...
        assert_eq!(view_strides(&[3, 2, 4], &[4, 12, 1], &[6, 4]), None);
        assert_eq!(view_strides(&[3, 2, 4], &[4, 12, 1], &[3, 8]), None);
        // ... but splitting a dim always views.
        assert_eq!(
            view_strides(&[3, 2, 4], &[4, 12, 1], &[3, 2, 2, 2]),
            Some(vec![4, 12, 2, 1])
        );
        // Unit dims go anywhere.
        assert_eq!(
            view_strides(&[2, 3], &[3, 1], &[2, 1, 3]),
            Some(vec![3, 3, 1])
        );
        // Expanded (stride 0) dims do not merge with their neighbours.
        assert_eq!(view_strides(&[2, 3], &[0, 1], &[6]), None);
        assert_eq!(view_strides(&[2, 3], &[3, 1], &[7]), None);
    }
}
