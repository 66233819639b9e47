//! Views and layout ops: Identity, Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Expand,
//! Slice, Split, Concat, Cast, CastLike, Tile, Trilu, DepthToSpace, SpaceToDepth,
//! ReverseSequence.

use crate::kernel::kbail;
use crate::kernel::{
    to_candle, BwdArgs, Extras, Inputs, KResult, Kernel, KernelCtx, KernelError, KernelRegistry,
    Outs,
};
use crate::kernels::common::{
    grad0, host_i64, in_dtype, ints_in, select, strides, sum_to, unselect, want,
};
use candle_core::Tensor;
use remat_planner::tensor::DType;

fn identity_fwd(_: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    Ok(vec![Some(xs.req(0)?.clone())])
}

fn identity_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || a.grad(cx, 0))
}

/// Reshape, Flatten, Squeeze, Unsqueeze: the shape rule already knows the output shape.
fn reshape_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    Ok(vec![Some(xs.req(0)?.reshape(cx.out_shape(0)?)?)])
}

fn reshape_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || Ok(a.grad(cx, 0)?.reshape(cx.in_shape(0)?)?))
}

fn perm_of(cx: &KernelCtx) -> KResult<Vec<usize>> {
    let rank = cx.input(0)?.rank();
    match cx.attrs.ints("perm")? {
        Some(p) => {
            let p = cx.rule.axes(p, rank)?;
            if p.len() != rank {
                kbail!("attribute \"perm\" has {} entries for rank {rank}", p.len());
            }
            Ok(p)
        }
        None => Ok((0..rank).rev().collect()),
    }
}

/// Transpose and Expand return contiguous tensors: candle's matmul and several other ops
/// reject arbitrary strided (or stride-0 broadcast) layouts.
fn transpose_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let p = perm_of(cx)?;
    Ok(vec![Some(xs.req(0)?.permute(p)?.contiguous()?)])
}

fn transpose_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    let p = perm_of(cx)?;
    let mut inv = vec![0; p.len()];
    for (k, &q) in p.iter().enumerate() {
        if let Some(s) = inv.get_mut(q) {
            *s = k;
        }
    }
    grad0(cx, a, || Ok(a.grad(cx, 0)?.permute(inv)?.contiguous()?))
}

fn expand_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let x = xs.req(0)?;
    let out = cx.out_shape(0)?;
    if out.len() < x.rank() {
        kbail!("cannot expand {:?} to {out:?}", x.dims());
    }
    let mut padded = vec![1; out.len() - x.rank()];
    padded.extend(x.dims());
    Ok(vec![Some(
        x.reshape(padded)?.broadcast_as(out)?.contiguous()?,
    )])
}

fn expand_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || sum_to(&a.grad(cx, 0)?, &cx.in_shape(0)?))
}

/// Per axis: first index, step, count (the shape rule's own reading of the inputs).
fn slice_plan(cx: &KernelCtx) -> KResult<Vec<(i64, i64, u64)>> {
    let shape = cx.input(0)?.shape.clone();
    Ok(remat_planner::ops::array::view::slice_ranges(
        &cx.rule, &shape,
    )?)
}

fn slice_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let mut x = xs.req(0)?.clone();
    let shape = cx.in_shape(0)?;
    for (a, &(s, step, n)) in slice_plan(cx)?.iter().enumerate() {
        let d = shape.get(a).copied().unwrap_or(0);
        let n = n as usize;
        if step == 1 {
            if s != 0 || n != d {
                x = x.narrow(a, s as usize, n)?;
            }
        } else {
            let idx: Vec<i64> = (0..n as i64).map(|j| s + j * step).collect();
            x = select(&x, &idx, a)?;
        }
    }
    Ok(vec![Some(x.contiguous()?)])
}

fn slice_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        let mut g = a.grad(cx, 0)?;
        let shape = cx.in_shape(0)?;
        for (ax, &(s, step, n)) in slice_plan(cx)?.iter().enumerate().rev() {
            let d = shape.get(ax).copied().unwrap_or(0);
            let n = n as usize;
            if step == 1 {
                if s != 0 || n != d {
                    let s = s as usize;
                    g = g.pad_with_zeros(ax, s, d.saturating_sub(s + n))?;
                }
            } else {
                let idx: Vec<i64> = (0..n as i64).map(|j| s + j * step).collect();
                g = unselect(&g, &idx, ax, d)?;
            }
        }
        Ok(g)
    })
}

/// Split: the axis and the size of every output along it.
fn split_plan(cx: &KernelCtx, xs: Option<&[Option<Tensor>]>) -> KResult<(usize, Vec<usize>)> {
    let shape = cx.in_shape(0)?;
    let axis = cx.axis(cx.attrs.int_or("axis", 0)?, shape.len())?;
    let d = shape.get(axis).copied().unwrap_or(0);
    let n = cx.outputs.len().max(1);
    let given = if cx.opset < 13 {
        cx.attrs.ints("split")?.map(|s| s.to_vec())
    } else {
        match xs {
            Some(xs) => ints_in(cx, xs, 1)?,
            None => cx.const_ints(1)?,
        }
    };
    let sizes: Vec<usize> = match given {
        Some(s) => {
            if s.iter().any(|&v| v < 0) {
                kbail!("split {s:?} has a negative size");
            }
            s.iter().map(|&v| v as usize).collect()
        }
        None => {
            let chunk = d.div_ceil(n);
            (0..n)
                .map(|i| chunk.min(d.saturating_sub(i * chunk)))
                .collect()
        }
    };
    if sizes.len() != n || sizes.iter().sum::<usize>() != d {
        kbail!("split {sizes:?} does not divide axis {axis} of size {d} into {n} outputs");
    }
    Ok((axis, sizes))
}

fn split_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let x = xs.req(0)?;
    let (axis, sizes) = split_plan(cx, Some(xs))?;
    let mut off = 0;
    let mut out = vec![];
    for (k, &n) in sizes.iter().enumerate() {
        out.push(if want(cx, k) {
            Some(x.narrow(axis, off, n)?.contiguous()?)
        } else {
            None
        });
        off += n;
    }
    Ok(out)
}

fn split_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        let (axis, sizes) = split_plan(cx, None)?;
        let shape = cx.in_shape(0)?;
        let dt = in_dtype(cx, 0)?;
        let mut parts = vec![];
        for (k, &n) in sizes.iter().enumerate() {
            let g = match a.grads.get(k).and_then(|g| g.as_ref()) {
                Some(g) => g.clone(),
                None => {
                    let mut s = shape.clone();
                    if let Some(d) = s.get_mut(axis) {
                        *d = n;
                    }
                    Tensor::zeros(s, dt, cx.device)?
                }
            };
            parts.push(g);
        }
        Ok(Tensor::cat(&parts, axis)?)
    })
}

fn concat_axis(cx: &KernelCtx) -> KResult<usize> {
    let axis = cx
        .attrs
        .int("axis")?
        .ok_or_else(|| KernelError::new("attribute \"axis\" is required"))?;
    Ok(cx.axis(axis, cx.input(0)?.rank())?)
}

fn concat_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let axis = concat_axis(cx)?;
    let parts: Vec<&Tensor> = (0..xs.len()).map(|i| xs.req(i)).collect::<KResult<_>>()?;
    Ok(vec![Some(Tensor::cat(&parts, axis)?)])
}

fn concat_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    let axis = concat_axis(cx)?;
    let g = a.grad(cx, 0)?;
    let mut off = 0;
    let mut v = vec![];
    for i in 0..cx.inputs.len() {
        let n = cx.in_shape(i)?.get(axis).copied().unwrap_or(0);
        v.push(if a.need(i) {
            Some(g.narrow(axis, off, n)?.contiguous()?)
        } else {
            None
        });
        off += n;
    }
    Ok(v)
}

fn cast_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let x = xs.req(0)?;
    let to = cx
        .outputs
        .first()
        .and_then(|f| f.as_ref())
        .ok_or_else(|| KernelError::new("output 0 is not in the graph"))?
        .dtype;
    let y = if to == DType::Bool {
        x.ne(&x.zeros_like()?)?
    } else {
        x.to_dtype(to_candle(to)?)?
    };
    Ok(vec![Some(y)])
}

fn cast_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || Ok(a.grad(cx, 0)?.to_dtype(in_dtype(cx, 0)?)?))
}

fn tile_reps(cx: &KernelCtx, xs: &[Option<Tensor>]) -> KResult<Vec<usize>> {
    let reps =
        ints_in(cx, xs, 1)?.ok_or_else(|| KernelError::new("input 1 (repeats) is required"))?;
    if reps.len() != cx.input(0)?.rank() || reps.iter().any(|&r| r < 0) {
        kbail!("repeats {reps:?} do not match rank {}", cx.input(0)?.rank());
    }
    Ok(reps.iter().map(|&r| r as usize).collect())
}

fn tile_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let reps = tile_reps(cx, xs)?;
    Ok(vec![Some(xs.req(0)?.repeat(reps)?.contiguous()?)])
}

fn tile_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        let reps = tile_reps(cx, a.inputs)?;
        let shape = cx.in_shape(0)?;
        // Output index rep * d + j: view as (r0, d0, r1, d1, ...) and sum the repetitions.
        let mut split = vec![];
        for (&r, &d) in reps.iter().zip(&shape) {
            split.push(r);
            split.push(d);
        }
        let g = a.grad(cx, 0)?.reshape(split)?;
        let rep_axes: Vec<usize> = (0..reps.len()).map(|k| 2 * k).collect();
        Ok(g.sum(rep_axes)?.reshape(shape)?)
    })
}

/// Trilu's keep mask over the last two dims, broadcast to the input's shape.
fn trilu_mask(cx: &KernelCtx, xs: &[Option<Tensor>]) -> KResult<Tensor> {
    let shape = cx.in_shape(0)?;
    let r = shape.len();
    if r < 2 {
        kbail!("Trilu needs a rank >= 2 input, got {shape:?}");
    }
    let k = ints_in(cx, xs, 1)?
        .and_then(|v| v.first().copied())
        .unwrap_or(0);
    let upper = cx.attrs.int_or("upper", 1)? != 0;
    let (rows, cols) = (shape[r - 2], shape[r - 1]);
    let mut m = Vec::with_capacity(rows * cols);
    for i in 0..rows as i64 {
        for j in 0..cols as i64 {
            let keep = if upper { j - i >= k } else { j - i <= k };
            m.push(u8::from(keep));
        }
    }
    Ok(Tensor::from_vec(m, (rows, cols), cx.device)?
        .broadcast_as(shape)?
        .contiguous()?)
}

fn trilu_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let x = xs.req(0)?;
    let m = trilu_mask(cx, xs)?;
    Ok(vec![Some(
        m.where_cond(&x.contiguous()?, &x.zeros_like()?)?,
    )])
}

fn trilu_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        let g = a.grad(cx, 0)?.contiguous()?;
        let m = trilu_mask(cx, a.inputs)?;
        Ok(m.where_cond(&g, &g.zeros_like()?)?)
    })
}

/// DepthToSpace / SpaceToDepth as reshape → permute → reshape: the intermediate shape, the
/// permutation and whether the op runs forward (`to_space`).
fn depth_plan(cx: &KernelCtx) -> KResult<(Vec<usize>, Vec<usize>)> {
    let s = cx.in_shape(0)?;
    let b = cx.attrs.int("blocksize")?.unwrap_or(0);
    if s.len() != 4 || b < 1 {
        kbail!("needs a 4-D input and a positive \"blocksize\", got {s:?} and {b}");
    }
    let b = b as usize;
    let (n, c, h, w) = (s[0], s[1], s[2], s[3]);
    if cx.op == "DepthToSpace" {
        let c2 = c / (b * b);
        match cx.attrs.string("mode")?.as_deref().unwrap_or("DCR") {
            "DCR" => Ok((vec![n, b, b, c2, h, w], vec![0, 3, 4, 1, 5, 2])),
            "CRD" => Ok((vec![n, c2, b, b, h, w], vec![0, 1, 4, 2, 5, 3])),
            m => kbail!("attribute \"mode\" = {m:?} is not supported"),
        }
    } else {
        // SpaceToDepth's `mode` is opset 28's; earlier opsets are DCR.
        let mid = vec![n, c, h / b, b, w / b, b];
        match cx.attrs.string("mode")?.as_deref().unwrap_or("DCR") {
            "DCR" => Ok((mid, vec![0, 3, 5, 1, 2, 4])),
            "CRD" => Ok((mid, vec![0, 1, 3, 5, 2, 4])),
            m => kbail!("attribute \"mode\" = {m:?} is not supported"),
        }
    }
}

fn depth_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let (mid, perm) = depth_plan(cx)?;
    let y = xs
        .req(0)?
        .reshape(mid)?
        .permute(perm)?
        .contiguous()?
        .reshape(cx.out_shape(0)?)?;
    Ok(vec![Some(y)])
}

fn depth_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        let (mid, perm) = depth_plan(cx)?;
        let permuted: Vec<usize> = perm
            .iter()
            .map(|&p| mid.get(p).copied().unwrap_or(1))
            .collect();
        let mut inv = vec![0; perm.len()];
        for (k, &p) in perm.iter().enumerate() {
            if let Some(s) = inv.get_mut(p) {
                *s = k;
            }
        }
        Ok(a.grad(cx, 0)?
            .reshape(permuted)?
            .permute(inv)?
            .contiguous()?
            .reshape(cx.in_shape(0)?)?)
    })
}

/// ReverseSequence: the flat source of every output element.
fn reverse_positions(cx: &KernelCtx, lens: &[i64]) -> KResult<Vec<i64>> {
    let shape = cx.in_shape(0)?;
    let r = shape.len();
    let ba = cx.axis(cx.attrs.int_or("batch_axis", 1)?, r)?;
    let ta = cx.axis(cx.attrs.int_or("time_axis", 0)?, r)?;
    if ba == ta {
        kbail!("attributes \"batch_axis\" and \"time_axis\" are both {ba}");
    }
    let (nb, nt) = (shape[ba], shape[ta]);
    if lens.len() != nb {
        kbail!(
            "sequence_lens has {} entries for a batch of {nb}",
            lens.len()
        );
    }
    if let Some(bad) = lens.iter().find(|&&l| l < 0 || l as usize > nt) {
        kbail!("sequence length {bad} is out of range for a time axis of {nt}");
    }
    let st = strides(&shape);
    let n: usize = shape.iter().product();
    let mut out = Vec::with_capacity(n);
    for flat in 0..n {
        let b = flat / st[ba] % nb;
        let t = flat / st[ta] % nt;
        let l = lens[b] as usize;
        let src = if t < l { l - 1 - t } else { t };
        out.push((flat + src * st[ta] - t * st[ta]) as i64);
    }
    Ok(out)
}

fn reverse_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let x = xs.req(0)?;
    let pos = reverse_positions(cx, &host_i64(xs.req(1)?)?)?;
    Ok(vec![Some(
        select(&x.flatten_all()?, &pos, 0)?.reshape(x.dims())?,
    )])
}

fn reverse_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        let lens = ints_in(cx, a.inputs, 1)?
            .ok_or_else(|| KernelError::new("the backward needs input 1 (sequence_lens)"))?;
        let pos = reverse_positions(cx, &lens)?;
        let shape = cx.in_shape(0)?;
        let n = shape.iter().product();
        Ok(unselect(&a.grad(cx, 0)?.flatten_all()?, &pos, 0, n)?.reshape(shape)?)
    })
}

pub(super) fn register(r: &mut KernelRegistry) {
    r.insert("Identity", Kernel::new(identity_fwd, Some(identity_bwd)));
    for op in ["Reshape", "Flatten", "Squeeze", "Unsqueeze"] {
        r.insert(op, Kernel::new(reshape_fwd, Some(reshape_bwd)));
    }
    r.insert("Transpose", Kernel::new(transpose_fwd, Some(transpose_bwd)));
    r.insert("Expand", Kernel::new(expand_fwd, Some(expand_bwd)));
    r.insert("Slice", Kernel::new(slice_fwd, Some(slice_bwd)));
    r.insert("Split", Kernel::new(split_fwd, Some(split_bwd)));
    r.insert("Concat", Kernel::new(concat_fwd, Some(concat_bwd)));
    r.insert("Cast", Kernel::new(cast_fwd, Some(cast_bwd)));
    r.insert("CastLike", Kernel::new(cast_fwd, Some(cast_bwd)));
    r.insert("Tile", Kernel::new(tile_fwd, Some(tile_bwd)));
    r.insert("Trilu", Kernel::new(trilu_fwd, Some(trilu_bwd)));
    r.insert("DepthToSpace", Kernel::new(depth_fwd, Some(depth_bwd)));
    r.insert("SpaceToDepth", Kernel::new(depth_fwd, Some(depth_bwd)));
    r.insert(
        "ReverseSequence",
        Kernel::new(reverse_fwd, Some(reverse_bwd)),
    );
}

#[cfg(test)]
mod tests {
    use crate::testing::fixed::{c64, close, fl, iota, run, scalar};
    use crate::testing::{check, int, ints, string, Case, In};
    use remat_planner::tensor::DType;

    #[test]
    fn views() {
        check(&Case::new("Identity", 17, vec![In::Rand(vec![2, 3])]));
        let x = || In::Rand(vec![2, 3, 4]);
        check(&Case::new("Reshape", 17, vec![x(), c64(&[0, -1, 2])]));
        check(&Case::new("Reshape", 17, vec![x(), c64(&[4, 6])]).attr(int("allowzero", 1)));
        check(
            &Case::new("Reshape", 17, vec![In::Rand(vec![0, 3]), c64(&[3, 0])])
                .attr(int("allowzero", 1)),
        );
        for axis in [0, 2, -1] {
            check(&Case::new("Flatten", 13, vec![x()]).attr(int("axis", axis)));
        }
        let y = || In::Rand(vec![2, 1, 3, 1]);
        check(&Case::new("Squeeze", 13, vec![y(), c64(&[1, -1])]));
        check(&Case::new("Squeeze", 13, vec![y()]));
        check(&Case::new("Squeeze", 11, vec![y()]).attr(ints("axes", &[3])));
        check(&Case::new("Unsqueeze", 13, vec![x(), c64(&[0, -1])]));
        check(&Case::new("Unsqueeze", 11, vec![x()]).attr(ints("axes", &[1])));
        check(&Case::new("Transpose", 13, vec![x()]).attr(ints("perm", &[2, 0, 1])));
        check(&Case::new("Transpose", 13, vec![x()]));
        check(&Case::new(
            "Expand",
            13,
            vec![In::Rand(vec![3, 1]), c64(&[2, 3, 4])],
        ));
        check(&Case::new(
            "Expand",
            13,
            vec![In::Rand(vec![1]), c64(&[2, 2])],
        ));
        check(&Case::new(
            "Expand",
            13,
            vec![In::Rand(vec![2, 1, 4]), c64(&[1, 3, 1])],
        ));
    }

    #[test]
    fn slice() {
        let x = || In::Rand(vec![4, 5, 6]);
        // Negative start, end past the end, default axes and steps.
        check(&Case::new(
            "Slice",
            13,
            vec![x(), c64(&[-3, 1]), c64(&[i64::MAX, 4])],
        ));
        // Axes, steps > 1, negative axis.
        check(&Case::new(
            "Slice",
            13,
            vec![x(), c64(&[1, 0]), c64(&[5, 6]), c64(&[-1, 1]), c64(&[2, 3])],
        ));
        // Negative steps: reversal and a strided reversal with clamped bounds.
        check(&Case::new(
            "Slice",
            13,
            vec![
                x(),
                c64(&[-1, 10]),
                c64(&[i64::MIN, 0]),
                c64(&[0, 2]),
                c64(&[-1, -2]),
            ],
        ));
        // Empty result.
        check(&Case::new(
            "Slice",
            13,
            vec![x(), c64(&[3]), c64(&[1]), c64(&[0])],
        ));
        // Opset < 10: attributes.
        check(
            &Case::new("Slice", 9, vec![x()])
                .attr(ints("starts", &[1, -2]))
                .attr(ints("ends", &[3, 100]))
                .attr(ints("axes", &[0, 2])),
        );
    }

    #[test]
    fn split_concat() {
        let x = || In::Rand(vec![2, 5, 3]);
        check(
            &Case::new("Split", 13, vec![x(), c64(&[1, 4])])
                .attr(int("axis", 1))
                .outputs(2),
        );
        check(
            &Case::new("Split", 11, vec![x()])
                .attr(ints("split", &[2, 3]))
                .attr(int("axis", -2))
                .outputs(2),
        );
        check(
            &Case::new("Split", 18, vec![x()])
                .attr(int("axis", 1))
                .attr(int("num_outputs", 3))
                .outputs(3),
        );
        check(&Case::new("Split", 13, vec![x()]).outputs(2));
        check(
            &Case::new(
                "Concat",
                13,
                vec![
                    In::Rand(vec![2, 1, 3]),
                    In::Rand(vec![2, 4, 3]),
                    In::Param(vec![2, 2, 3]),
                ],
            )
            .attr(int("axis", 1)),
        );
        check(
            &Case::new(
                "Concat",
                13,
                vec![In::Rand(vec![2, 3]), In::Rand(vec![2, 2])],
            )
            .attr(int("axis", -1)),
        );
        check(
            &Case::new(
                "Concat",
                13,
                vec![
                    In::Ints(DType::I64, vec![2], vec![1, 2]),
                    In::Ints(DType::I64, vec![1], vec![3]),
                ],
            )
            .attr(int("axis", 0)),
        );
    }
    #[test]
    fn cast() {
        let x = || In::Rand(vec![2, 3]);
        check(&Case::new("Cast", 13, vec![x()]).attr(int("to", 11)));
        check(&Case::new("Cast", 13, vec![x()]).attr(int("to", 9)));
        check(&Case::new("Cast", 13, vec![x()]).attr(int("to", 7)));
        check(
            &Case::new(
                "Cast",
                13,
                vec![In::Ints(DType::I64, vec![3], vec![0, 2, -1])],
            )
            .attr(int("to", 9)),
        );
        check(
            &Case::new("Cast", 13, vec![In::Ints(DType::Bool, vec![2], vec![0, 1])])
                .attr(int("to", 11)),
        );
        check(&Case::new(
            "CastLike",
            15,
            vec![x(), In::Ints(DType::I32, vec![1], vec![0])],
        ));
        check(&Case::new(
            "CastLike",
            15,
            vec![x(), In::Floats(vec![1], vec![0.0])],
        ));
    }
    #[test]
    fn tile_trilu_depth() {
        check(&Case::new(
            "Tile",
            13,
            vec![In::Rand(vec![2, 3]), c64(&[2, 3])],
        ));
        check(&Case::new(
            "Tile",
            13,
            vec![In::Rand(vec![2, 1, 3]), c64(&[1, 4, 1])],
        ));
        let x = || In::Rand(vec![2, 3, 4]);
        check(&Case::new("Trilu", 14, vec![x()]));
        check(&Case::new("Trilu", 14, vec![x(), scalar(-1)]).attr(int("upper", 0)));
        check(&Case::new("Trilu", 14, vec![x(), scalar(2)]));
        let y = || In::Rand(vec![1, 8, 2, 3]);
        check(&Case::new("DepthToSpace", 13, vec![y()]).attr(int("blocksize", 2)));
        check(
            &Case::new("DepthToSpace", 13, vec![y()])
                .attr(int("blocksize", 2))
                .attr(string("mode", "CRD")),
        );
        check(
            &Case::new("SpaceToDepth", 13, vec![In::Rand(vec![2, 2, 4, 6])])
                .attr(int("blocksize", 2)),
        );
    }
    #[test]
    fn values_rearrange() {
        let v = || fl(&[3], &[1.0, 2.0, 3.0]);
        let ax = || scalar(0);
        close(
            &run("CumSum", 14, vec![], vec![v(), ax()]),
            &[1.0, 3.0, 6.0],
        );
        close(
            &run("CumSum", 14, vec![int("exclusive", 1)], vec![v(), ax()]),
            &[0.0, 1.0, 3.0],
        );
        close(
            &run("CumSum", 14, vec![int("reverse", 1)], vec![v(), ax()]),
            &[6.0, 5.0, 3.0],
        );
        close(
            &run(
                "CumSum",
                14,
                vec![int("exclusive", 1), int("reverse", 1)],
                vec![v(), ax()],
            ),
            &[5.0, 3.0, 0.0],
        );
        close(
            &run(
                "CumSum",
                14,
                vec![int("reverse", 1)],
                vec![In::Ints(DType::I32, vec![3], vec![1, 2, 3]), ax()],
            ),
            &[6.0, 5.0, 3.0],
        );
        // DepthToSpace, from the ONNX operator documentation.
        let dcr = run(
            "DepthToSpace",
            13,
            vec![int("blocksize", 2)],
            vec![iota(&[1, 8, 2, 3])],
        );
        close(
            &dcr[..12],
            &[
                0.0, 12.0, 1.0, 13.0, 2.0, 14.0, 24.0, 36.0, 25.0, 37.0, 26.0, 38.0,
            ],
        );
        let crd = run(
            "DepthToSpace",
            13,
            vec![int("blocksize", 2), string("mode", "CRD")],
            vec![iota(&[1, 8, 2, 3])],
        );
        close(
            &crd[..12],
            &[
                0.0, 6.0, 1.0, 7.0, 2.0, 8.0, 12.0, 18.0, 13.0, 19.0, 14.0, 20.0,
            ],
        );
        // SpaceToDepth inverts DepthToSpace (DCR).
        let back = run(
            "SpaceToDepth",
            13,
            vec![int("blocksize", 2)],
            vec![fl(&[1, 2, 4, 6], &dcr)],
        );
        close(&back, &(0..48).map(|i| i as f64).collect::<Vec<_>>());
        // ReverseSequence, from the ONNX documentation.
        close(
            &run(
                "ReverseSequence",
                10,
                vec![],
                vec![
                    iota(&[4, 4]),
                    In::Ints(DType::I64, vec![4], vec![4, 3, 2, 1]),
                ],
            ),
            &[
                12.0, 9.0, 6.0, 3.0, 8.0, 5.0, 2.0, 7.0, 4.0, 1.0, 10.0, 11.0, 0.0, 13.0, 14.0,
                15.0,
            ],
        );
        close(
            &run("Trilu", 14, vec![], vec![iota(&[3, 3]), scalar(1)]),
            &[0.0, 1.0, 2.0, 0.0, 0.0, 5.0, 0.0, 0.0, 0.0],
        );
        close(
            &run("Trilu", 14, vec![int("upper", 0)], vec![iota(&[2, 3])]),
            &[0.0, 0.0, 0.0, 3.0, 4.0, 0.0],
        );
    }
}
