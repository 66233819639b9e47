//! Gathers, scatters and ordered scans: Gather, GatherElements, GatherND, ScatterND,
//! ScatterElements, Scatter, TopK, CumSum.

use crate::kernel::kbail;
use crate::kernel::{
    BwdArgs, Extras, Inputs, KResult, Kernel, KernelCtx, KernelError, KernelRegistry, Outs,
};
use crate::kernels::common::{
    grad0, host_f64, host_i64, ids, ints_in, norm_indices, select, strides, unselect, want,
};
use candle_core::{DType as CD, Device, Tensor};

fn gather_axis(cx: &KernelCtx) -> KResult<usize> {
    Ok(cx.axis(cx.attrs.int_or("axis", 0)?, cx.input(0)?.rank())?)
}

fn gather_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let x = xs.req(0)?;
    let axis = gather_axis(cx)?;
    let mut idx = host_i64(xs.req(1)?)?;
    norm_indices(&mut idx, x.dims().get(axis).copied().unwrap_or(0), "index")?;
    Ok(vec![Some(
        select(x, &idx, axis)?.reshape(cx.out_shape(0)?)?,
    )])
}

fn gather_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        let shape = cx.in_shape(0)?;
        let axis = gather_axis(cx)?;
        let d = shape.get(axis).copied().unwrap_or(0);
        let mut idx = host_i64(a.input(1)?)?;
        norm_indices(&mut idx, d, "index")?;
        let mut gs = shape[..axis].to_vec();
        gs.push(idx.len());
        gs.extend(&shape[axis + 1..]);
        let g = a.grad(cx, 0)?.reshape(gs)?;
        unselect(&g, &idx, axis, d)
    })
}

/// Flat positions in the data of every index of an elements-wise gather or scatter.
fn element_positions(
    data: &[usize],
    ind_shape: &[usize],
    axis: usize,
    idx: &[i64],
) -> KResult<Vec<i64>> {
    if ind_shape.len() != data.len() {
        kbail!("indices of shape {ind_shape:?} do not match data of shape {data:?}");
    }
    for (k, (&i, &d)) in ind_shape.iter().zip(data).enumerate() {
        if k != axis && i > d {
            kbail!("indices of shape {ind_shape:?} exceed data of shape {data:?}");
        }
    }
    let d = data.get(axis).copied().unwrap_or(0) as i64;
    let ds = strides(data);
    let is = strides(ind_shape);
    let mut out = Vec::with_capacity(idx.len());
    for (flat, &v) in idx.iter().enumerate() {
        let v = if v < 0 { v + d } else { v };
        if v < 0 || v >= d {
            kbail!("index {v} is out of range for axis {axis} of size {d}");
        }
        let mut rem = flat;
        let mut pos = 0i64;
        for k in 0..ind_shape.len() {
            let c = rem / is[k];
            rem -= c * is[k];
            let c = if k == axis { v as usize } else { c };
            pos += (c * ds[k]) as i64;
        }
        out.push(pos);
    }
    Ok(out)
}

fn gather_elements_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let x = xs.req(0)?;
    let ind = xs.req(1)?;
    let axis = gather_axis(cx)?;
    let pos = element_positions(x.dims(), ind.dims(), axis, &host_i64(ind)?)?;
    let y = select(&x.flatten_all()?, &pos, 0)?.reshape(ind.dims())?;
    Ok(vec![Some(y)])
}

fn gather_elements_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        let shape = cx.in_shape(0)?;
        let ind = a.input(1)?;
        let axis = gather_axis(cx)?;
        let pos = element_positions(&shape, ind.dims(), axis, &host_i64(ind)?)?;
        let n = shape.iter().product();
        let g = a.grad(cx, 0)?.flatten_all()?;
        Ok(unselect(&g, &pos, 0, n)?.reshape(shape)?)
    })
}

/// Cumulative sum along `axis` (float tensors with candle ops, integers on the host).
fn cumsum(x: &Tensor, axis: usize, exclusive: bool, reverse: bool) -> KResult<Tensor> {
    let d = x.dims().get(axis).copied().unwrap_or(0);
    if d == 0 {
        return Ok(x.clone());
    }
    if x.dtype().is_float() {
        let mut t = x.contiguous()?;
        if reverse {
            t = t.flip(&[axis])?;
        }
        let mut y = t.cumsum(axis)?.contiguous()?;
        if exclusive {
            y = y
                .narrow(axis, 0, d - 1)?
                .pad_with_zeros(axis, 1, 0)?
                .contiguous()?;
        }
        if reverse {
            y = y.flip(&[axis])?;
        }
        Ok(y.contiguous()?)
    } else {
        let v = host_i64(x)?;
        let outer: usize = x.dims()[..axis].iter().product();
        let inner: usize = x.dims()[axis + 1..].iter().product();
        let mut out = vec![0i64; v.len()];
        for o in 0..outer {
            for i in 0..inner {
                let mut acc = 0i64;
                for s in 0..d {
                    let j = if reverse { d - 1 - s } else { s };
                    let p = (o * d + j) * inner + i;
                    let val = v.get(p).copied().unwrap_or(0);
                    if exclusive {
                        out[p] = acc;
                        acc = acc.wrapping_add(val);
                    } else {
                        acc = acc.wrapping_add(val);
                        out[p] = acc;
                    }
                }
            }
        }
        Ok(Tensor::from_vec(out, x.dims(), x.device())?.to_dtype(x.dtype())?)
    }
}

fn cumsum_axis(cx: &KernelCtx, xs: &[Option<Tensor>]) -> KResult<usize> {
    let a = ints_in(cx, xs, 1)?
        .and_then(|v| v.first().copied())
        .ok_or_else(|| KernelError::new("input 1 (axis) is required"))?;
    Ok(cx.axis(a, cx.input(0)?.rank())?)
}

fn cumsum_flags(cx: &KernelCtx) -> KResult<(bool, bool)> {
    Ok((
        cx.attrs.int_or("exclusive", 0)? != 0,
        cx.attrs.int_or("reverse", 0)? != 0,
    ))
}

fn cumsum_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let axis = cumsum_axis(cx, xs)?;
    let (ex, rev) = cumsum_flags(cx)?;
    Ok(vec![Some(cumsum(xs.req(0)?, axis, ex, rev)?)])
}

fn cumsum_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        let axis = cumsum_axis(cx, a.inputs)?;
        let (ex, rev) = cumsum_flags(cx)?;
        cumsum(&a.grad(cx, 0)?, axis, ex, !rev)
    })
}

/// GatherND / ScatterND rows: the data viewed as `[rows, slice]` and, per index tuple, the row it
/// addresses.
struct NdPlan {
    rows: usize,
    slice: usize,
    picks: Vec<i64>,
}

fn nd_plan(data: &[usize], ind_shape: &[usize], idx: &[i64], batch: usize) -> KResult<NdPlan> {
    let k = ind_shape.last().copied().unwrap_or(0);
    if ind_shape.is_empty() || batch + k > data.len() || batch >= ind_shape.len() {
        kbail!("indices {ind_shape:?} with batch_dims {batch} do not index data {data:?}");
    }
    if data[..batch] != ind_shape[..batch] {
        kbail!("batch dims of indices {ind_shape:?} and data {data:?} differ");
    }
    let bsize: usize = data[..batch].iter().product();
    let indexed = &data[batch..batch + k];
    let per_batch: usize = indexed.iter().product();
    let slice: usize = data[batch + k..].iter().product();
    let tuples: usize = ind_shape[..ind_shape.len() - 1].iter().product();
    let per_b = tuples.checked_div(bsize).unwrap_or(0);
    let st = strides(indexed);
    let mut picks = Vec::with_capacity(tuples);
    for t in 0..tuples {
        let b = t.checked_div(per_b).unwrap_or(0);
        let mut row = b * per_batch;
        for j in 0..k {
            let v = idx.get(t * k + j).copied().unwrap_or(0);
            let d = indexed[j] as i64;
            let v = if v < 0 { v + d } else { v };
            if v < 0 || v >= d {
                kbail!("index {v} is out of range for a dim of size {d}");
            }
            row += v as usize * st[j];
        }
        picks.push(row as i64);
    }
    Ok(NdPlan {
        rows: bsize * per_batch,
        slice,
        picks,
    })
}

fn gather_nd_plan(cx: &KernelCtx, ind: &Tensor) -> KResult<NdPlan> {
    let b = cx.attrs.int_or("batch_dims", 0)?;
    let b = usize::try_from(b)
        .map_err(|_| KernelError::new("attribute \"batch_dims\" must be non-negative"))?;
    nd_plan(&cx.in_shape(0)?, ind.dims(), &host_i64(ind)?, b)
}

fn gather_nd_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let x = xs.req(0)?;
    let p = gather_nd_plan(cx, xs.req(1)?)?;
    let y = select(&x.reshape((p.rows, p.slice))?, &p.picks, 0)?.reshape(cx.out_shape(0)?)?;
    Ok(vec![Some(y)])
}

fn gather_nd_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        let p = gather_nd_plan(cx, a.input(1)?)?;
        let g = a.grad(cx, 0)?.reshape((p.picks.len(), p.slice))?;
        Ok(unselect(&g, &p.picks, 0, p.rows)?.reshape(cx.in_shape(0)?)?)
    })
}

#[derive(Clone, Copy, PartialEq)]
enum Reduction {
    None,
    Add,
    Mul,
    Max,
    Min,
}

fn reduction(cx: &KernelCtx) -> KResult<Reduction> {
    match cx.attrs.string("reduction")?.as_deref().unwrap_or("none") {
        "none" => Ok(Reduction::None),
        "add" => Ok(Reduction::Add),
        "mul" => Ok(Reduction::Mul),
        "max" => Ok(Reduction::Max),
        "min" => Ok(Reduction::Min),
        m => kbail!("attribute \"reduction\" = {m:?} is not supported"),
    }
}

/// Per hit row, the update rows that land on it (in order).
fn row_hits(rows: usize, picks: &[i64]) -> Vec<Vec<usize>> {
    let mut hits = vec![vec![]; rows];
    for (t, &p) in picks.iter().enumerate() {
        if let Some(h) = hits.get_mut(p as usize) {
            h.push(t);
        }
    }
    hits
}

/// Mul / max / min scatters on the host (`[rows, slice]` data, `[picks, slice]` updates).
fn scatter_reduce_host(
    data: &Tensor,
    picks: &[i64],
    upd: &Tensor,
    red: Reduction,
) -> KResult<Tensor> {
    let (rows, slice) = data.dims2()?;
    let mut out = host_f64(data)?;
    let u = host_f64(upd)?;
    for (t, &p) in picks.iter().enumerate() {
        for j in 0..slice {
            let (Some(o), Some(&v)) = (out.get_mut(p as usize * slice + j), u.get(t * slice + j))
            else {
                kbail!("update {t} does not fit the data");
            };
            *o = match red {
                Reduction::Mul => *o * v,
                Reduction::Max => o.max(v),
                Reduction::Min => o.min(v),
                Reduction::None | Reduction::Add => v,
            };
        }
    }
    Ok(Tensor::from_vec(out, (rows, slice), data.device())?.to_dtype(data.dtype())?)
}

/// Gradients of a mul / max / min scatter from the data, the updates and `g`. Max and min
/// share the gradient evenly between the values equal to the result (as PyTorch's amax).
fn scatter_reduce_bwd(
    data: &Tensor,
    picks: &[i64],
    upd: &Tensor,
    g: &Tensor,
    red: Reduction,
) -> KResult<(Tensor, Tensor)> {
    let (rows, slice) = data.dims2()?;
    let dv = host_f64(data)?;
    let u = host_f64(upd)?;
    let gv = host_f64(g)?;
    if dv.len() != rows * slice || gv.len() != rows * slice || u.len() != picks.len() * slice {
        kbail!("scatter gradient: data, updates and gradient do not match");
    }
    let mut dd = gv.clone();
    let mut du = vec![0.0; u.len()];
    for (r, ts) in row_hits(rows, picks).iter().enumerate() {
        if ts.is_empty() {
            continue;
        }
        for j in 0..slice {
            let k = r * slice + j;
            let ups: Vec<f64> = ts.iter().map(|&t| u[t * slice + j]).collect();
            match red {
                Reduction::Mul => {
                    dd[k] = gv[k] * ups.iter().product::<f64>();
                    for (q, &t) in ts.iter().enumerate() {
                        let others: f64 = ups
                            .iter()
                            .enumerate()
                            .filter(|&(w, _)| w != q)
                            .map(|(_, &v)| v)
                            .product();
                        du[t * slice + j] = gv[k] * dv[k] * others;
                    }
                }
                _ => {
                    let best = ups.iter().fold(dv[k], |m, &v| {
                        if red == Reduction::Max {
                            m.max(v)
                        } else {
                            m.min(v)
                        }
                    });
                    let n = ups.iter().filter(|&&v| v == best).count() + usize::from(dv[k] == best);
                    let share = gv[k] / n.max(1) as f64;
                    dd[k] = if dv[k] == best { share } else { 0.0 };
                    for (q, &t) in ts.iter().enumerate() {
                        du[t * slice + j] = if ups[q] == best { share } else { 0.0 };
                    }
                }
            }
        }
    }
    let dt = g.dtype();
    Ok((
        Tensor::from_vec(dd, (rows, slice), g.device())?.to_dtype(dt)?,
        Tensor::from_vec(du, (picks.len(), slice), g.device())?.to_dtype(dt)?,
    ))
}

/// Rows of a `[rows, slice]` view hit by `picks`, as a `[rows, 1]` mask.
fn hit_mask(rows: usize, picks: &[i64], dev: &Device) -> KResult<Tensor> {
    let mut m = vec![0u8; rows];
    for &p in picks {
        if let Some(v) = m.get_mut(p as usize) {
            *v = 1;
        }
    }
    Ok(Tensor::from_vec(m, (rows, 1), dev)?)
}

/// The positions of `picks` whose write lands under reduction 'none': the last one of each
/// row. ONNX leaves the order of duplicate writes undefined but the result one of the values;
/// its reference evaluator and PyTorch's CPU `scatter` / `index_put` keep the last.
fn last_writes(picks: &[i64]) -> Vec<usize> {
    let mut seen = std::collections::HashSet::new();
    let mut wins: Vec<usize> = (0..picks.len())
        .rev()
        .filter(|&t| seen.insert(picks[t]))
        .collect();
    wins.reverse();
    wins
}

/// Writes (or adds) `upd` (`[picks, slice]`) into the rows `picks` of `data` (`[rows, slice]`);
/// a row picked more than once takes its last write under reduction 'none'.
fn scatter_rows(data: &Tensor, picks: &[i64], upd: &Tensor, red: Reduction) -> KResult<Tensor> {
    let (rows, slice) = data.dims2()?;
    let upd = upd.contiguous()?;
    match red {
        Reduction::Mul | Reduction::Max | Reduction::Min => {
            scatter_reduce_host(data, picks, &upd, red)
        }
        Reduction::Add => {
            let id = ids(picks.to_vec(), data.device())?;
            Ok(data.contiguous()?.index_add(&id, &upd, 0)?)
        }
        Reduction::None => {
            let wins = last_writes(picks);
            let rows_won: Vec<i64> = wins.iter().map(|&t| picks[t]).collect();
            let won: Vec<i64> = wins.iter().map(|&t| t as i64).collect();
            let placed = Tensor::zeros((rows, slice), data.dtype(), data.device())?.index_add(
                &ids(rows_won, data.device())?,
                &select(&upd, &won, 0)?,
                0,
            )?;
            let hit = hit_mask(rows, picks, data.device())?.broadcast_as((rows, slice))?;
            Ok(hit.where_cond(&placed, &data.contiguous()?)?)
        }
    }
}

/// Gradients of a row scatter: (d data, d updates) from `g` (`[rows, slice]`). Under 'none' an
/// update overwritten by a later one of the same row gets zero: it does not reach the output
/// (PyTorch's `scatter` backward hands it the row's gradient all the same, `grad.gather`).
fn scatter_rows_bwd(g: &Tensor, picks: &[i64], add: bool) -> KResult<(Tensor, Tensor)> {
    let (rows, slice) = g.dims2()?;
    let g = g.contiguous()?;
    let du = select(&g, picks, 0)?;
    if add {
        return Ok((g, du));
    }
    let hit = hit_mask(rows, picks, g.device())?.broadcast_as((rows, slice))?;
    let dd = hit.where_cond(&g.zeros_like()?, &g)?;
    let mut keep = vec![0u8; picks.len()];
    for t in last_writes(picks) {
        keep[t] = 1;
    }
    let keep =
        Tensor::from_vec(keep, (picks.len(), 1), g.device())?.broadcast_as((picks.len(), slice))?;
    Ok((dd, keep.where_cond(&du, &du.zeros_like()?)?))
}

/// Scatter plan: `[rows, slice]`, the picked rows, and the updates' shape.
fn scatter_plan(cx: &KernelCtx, ind: &Tensor) -> KResult<NdPlan> {
    let data = cx.in_shape(0)?;
    let idx = host_i64(ind)?;
    if cx.op == "ScatterND" {
        nd_plan(&data, ind.dims(), &idx, 0)
    } else {
        let axis = cx.axis(cx.attrs.int_or("axis", 0)?, data.len())?;
        let picks = element_positions(&data, ind.dims(), axis, &idx)?;
        Ok(NdPlan {
            rows: data.iter().product(),
            slice: 1,
            picks,
        })
    }
}

fn scatter_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let x = xs.req(0)?;
    let upd = xs.req(2)?;
    let p = scatter_plan(cx, xs.req(1)?)?;
    let y = scatter_rows(
        &x.reshape((p.rows, p.slice))?,
        &p.picks,
        &upd.reshape((p.picks.len(), p.slice))?,
        reduction(cx)?,
    )?;
    Ok(vec![Some(y.reshape(x.dims())?)])
}

fn scatter_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    let p = scatter_plan(cx, a.input(1)?)?;
    let g = a.grad(cx, 0)?.reshape((p.rows, p.slice))?;
    let red = reduction(cx)?;
    let (dd, du) = match red {
        Reduction::None | Reduction::Add => scatter_rows_bwd(&g, &p.picks, red == Reduction::Add)?,
        _ => scatter_reduce_bwd(
            &a.input(0)?.reshape((p.rows, p.slice))?,
            &p.picks,
            &a.input(2)?.reshape((p.picks.len(), p.slice))?,
            &g,
            red,
        )?,
    };
    let mut v = vec![None; cx.inputs.len()];
    if a.need(0) {
        if let Some(slot) = v.get_mut(0) {
            *slot = Some(dd.reshape(cx.in_shape(0)?)?);
        }
    }
    if a.need(2) {
        if let Some(slot) = v.get_mut(2) {
            *slot = Some(du.reshape(cx.in_shape(2)?)?);
        }
    }
    Ok(v)
}

fn topk_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let x = xs.req(0)?;
    let shape = x.dims().to_vec();
    let axis = cx.axis(cx.attrs.int_or("axis", -1)?, shape.len())?;
    let k = cx.out_shape(0)?.get(axis).copied().unwrap_or(0);
    let largest = cx.attrs.int_or("largest", 1)? != 0;
    let d = shape[axis];
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let v = host_f64(x)?;
    let mut idx = vec![0i64; outer * k * inner];
    let mut order: Vec<usize> = Vec::with_capacity(d);
    for o in 0..outer {
        for i in 0..inner {
            order.clear();
            order.extend(0..d);
            let at = |j: usize| v[(o * d + j) * inner + i];
            // Stable: equal values keep the lower index first.
            if largest {
                order.sort_by(|&p, &q| at(q).total_cmp(&at(p)));
            } else {
                order.sort_by(|&p, &q| at(p).total_cmp(&at(q)));
            }
            for (r, &j) in order.iter().take(k).enumerate() {
                idx[(o * k + r) * inner + i] = j as i64;
            }
        }
    }
    let mut out_shape = shape.clone();
    out_shape[axis] = k;
    let it = Tensor::from_vec(idx, out_shape, x.device())?;
    let values = x.contiguous()?.gather(&it, axis)?;
    Ok(vec![
        want(cx, 0).then_some(values),
        want(cx, 1).then_some(it),
    ])
}

fn topk_bwd(cx: &KernelCtx, a: &BwdArgs) -> Outs {
    grad0(cx, a, || {
        let shape = cx.in_shape(0)?;
        let axis = cx.axis(cx.attrs.int_or("axis", -1)?, shape.len())?;
        let idx = a.output(1)?.to_dtype(CD::I64)?.contiguous()?;
        let g = a.grad(cx, 0)?.contiguous()?;
        let z = Tensor::zeros(shape, g.dtype(), g.device())?;
        Ok(z.scatter_add(&idx, &g, axis)?)
    })
}

pub(super) fn register(r: &mut KernelRegistry) {
    r.insert("Gather", Kernel::new(gather_fwd, Some(gather_bwd)));
    r.insert(
        "GatherElements",
        Kernel::new(gather_elements_fwd, Some(gather_elements_bwd)),
    );
    r.insert("CumSum", Kernel::new(cumsum_fwd, Some(cumsum_bwd)));
    r.insert("GatherND", Kernel::new(gather_nd_fwd, Some(gather_nd_bwd)));
    for op in ["ScatterND", "ScatterElements", "Scatter"] {
        r.insert(op, Kernel::new(scatter_fwd, Some(scatter_bwd)));
    }
    r.insert("TopK", Kernel::new(topk_fwd, Some(topk_bwd)));
}

#[cfg(test)]
mod tests {
    use crate::testing::fixed::{c64, close, fl, iota, run, run_with, scalar};
    use crate::testing::{check, int, string, Case, In};
    use remat_planner::tensor::DType;

    #[test]
    fn gather() {
        let x = || In::Rand(vec![4, 3, 2]);
        check(&Case::new(
            "Gather",
            13,
            vec![x(), In::Ints(DType::I64, vec![2, 2], vec![0, -1, 2, 0])],
        ));
        check(
            &Case::new(
                "Gather",
                13,
                vec![x(), In::Ints(DType::I32, vec![], vec![-1])],
            )
            .attr(int("axis", 1)),
        );
        check(&Case::new("Gather", 13, vec![x(), c64(&[1, 1, 0])]).attr(int("axis", -1)));
        check(&Case::new(
            "Gather",
            13,
            vec![
                In::Ints(DType::I64, vec![3], vec![7, 8, 9]),
                In::Ints(DType::I64, vec![2], vec![2, 0]),
            ],
        ));
        check(
            &Case::new(
                "GatherElements",
                13,
                vec![
                    In::Rand(vec![2, 3]),
                    In::Ints(DType::I64, vec![2, 2], vec![0, 2, -1, 1]),
                ],
            )
            .attr(int("axis", 1)),
        );
        check(&Case::new(
            "GatherElements",
            13,
            vec![
                In::Rand(vec![3, 2]),
                In::Ints(DType::I64, vec![2, 2], vec![2, 0, 0, 0]),
            ],
        ));
    }
    #[test]
    fn cumsum() {
        let x = || In::Rand(vec![3, 4]);
        for (ex, rev) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
            check(
                &Case::new("CumSum", 14, vec![x(), scalar(1)])
                    .attr(int("exclusive", ex))
                    .attr(int("reverse", rev)),
            );
        }
        check(&Case::new("CumSum", 14, vec![x(), scalar(-2)]).attr(int("reverse", 1)));
        check(
            &Case::new(
                "CumSum",
                14,
                vec![
                    In::Ints(DType::I64, vec![2, 3], vec![1, 2, 3, 4, 5, 6]),
                    scalar(1),
                ],
            )
            .attr(int("exclusive", 1)),
        );
    }
    #[test]
    fn scatter_gather_nd() {
        let x = || In::Rand(vec![3, 4, 2]);
        check(&Case::new(
            "GatherND",
            13,
            vec![x(), In::Ints(DType::I64, vec![2, 2], vec![0, 1, -1, 3])],
        ));
        check(&Case::new(
            "GatherND",
            13,
            vec![x(), In::Ints(DType::I64, vec![2, 1, 1], vec![2, 0])],
        ));
        check(
            &Case::new(
                "GatherND",
                13,
                vec![x(), In::Ints(DType::I64, vec![3, 1], vec![1, 3, 0])],
            )
            .attr(int("batch_dims", 1)),
        );
        check(&Case::new(
            "ScatterND",
            13,
            vec![
                x(),
                In::Ints(DType::I64, vec![2, 1], vec![2, 0]),
                In::Rand(vec![2, 4, 2]),
            ],
        ));
        check(
            &Case::new(
                "ScatterND",
                16,
                vec![
                    x(),
                    In::Ints(DType::I64, vec![3, 2], vec![0, 1, 0, 1, 2, -1]),
                    In::Rand(vec![3, 2]),
                ],
            )
            .attr(string("reduction", "add")),
        );
        let d = || In::Rand(vec![3, 3]);
        check(&Case::new(
            "ScatterElements",
            13,
            vec![
                d(),
                In::Ints(DType::I64, vec![2, 3], vec![1, 0, 2, 0, 2, 1]),
                In::Rand(vec![2, 3]),
            ],
        ));
        check(
            &Case::new(
                "ScatterElements",
                16,
                vec![
                    d(),
                    In::Ints(DType::I64, vec![1, 2], vec![1, -1]),
                    In::Rand(vec![1, 2]),
                ],
            )
            .attr(int("axis", 1))
            .attr(string("reduction", "add")),
        );
        for red in ["mul", "max", "min"] {
            check(
                &Case::new(
                    "ScatterElements",
                    18,
                    vec![
                        d(),
                        In::Ints(DType::I64, vec![2, 2], vec![1, 1, 0, 2]),
                        In::Rand(vec![2, 2]),
                    ],
                )
                .attr(int("axis", 1))
                .attr(string("reduction", red)),
            );
            check(
                &Case::new(
                    "ScatterND",
                    18,
                    vec![
                        x(),
                        In::Ints(DType::I64, vec![3, 1], vec![2, 0, 2]),
                        In::Rand(vec![3, 4, 2]),
                    ],
                )
                .attr(string("reduction", red)),
            );
        }
        // Duplicate indices under 'none': the last write lands, the others get no gradient.
        check(&Case::new(
            "ScatterElements",
            13,
            vec![
                d(),
                In::Ints(DType::I64, vec![2, 3], vec![1, 0, 1, 1, 2, 0]),
                In::Rand(vec![2, 3]),
            ],
        ));
        check(&Case::new(
            "ScatterND",
            13,
            vec![
                x(),
                In::Ints(DType::I64, vec![3, 1], vec![2, 0, 2]),
                In::Rand(vec![3, 4, 2]),
            ],
        ));
        check(
            &Case::new(
                "Scatter",
                9,
                vec![
                    d(),
                    In::Ints(DType::I64, vec![1, 2], vec![2, 0]),
                    In::Param(vec![1, 2]),
                ],
            )
            .attr(int("axis", 1)),
        );
    }
    #[test]
    fn values_index_ops() {
        let y = run_with(
            "TopK",
            11,
            vec![],
            vec![fl(&[4], &[3.0, 1.0, 3.0, 2.0]), c64(&[2])],
            2,
            7,
        );
        close(&y[0], &[3.0, 3.0]);
        close(&y[1], &[0.0, 2.0]);
        let y = run_with(
            "TopK",
            11,
            vec![int("largest", 0)],
            vec![fl(&[4], &[3.0, 1.0, 3.0, 2.0]), c64(&[3])],
            2,
            7,
        );
        close(&y[1], &[1.0, 3.0, 0.0]);
        close(
            &run(
                "OneHot",
                11,
                vec![],
                vec![
                    In::Ints(DType::I64, vec![3], vec![0, -1, 7]),
                    scalar(3),
                    c64(&[0, 1]),
                ],
            ),
            &[1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0],
        );
        // GatherND with batch_dims = 1 (ONNX example 5).
        close(
            &run(
                "GatherND",
                13,
                vec![int("batch_dims", 1)],
                vec![
                    iota(&[2, 2, 2]),
                    In::Ints(DType::I64, vec![2, 1], vec![1, 0]),
                ],
            ),
            &[2.0, 3.0, 4.0, 5.0],
        );
        // ScatterND (ONNX example 1).
        close(
            &run(
                "ScatterND",
                13,
                vec![],
                vec![
                    fl(&[8], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]),
                    In::Ints(DType::I64, vec![4, 1], vec![4, 3, 1, 7]),
                    fl(&[4], &[9.0, 10.0, 11.0, 12.0]),
                ],
            ),
            &[1.0, 11.0, 3.0, 10.0, 9.0, 6.0, 7.0, 12.0],
        );
        // Duplicate indices under 'none' keep the last write (ONNX's reference evaluator,
        // PyTorch's CPU scatter), never their sum.
        close(
            &run(
                "ScatterElements",
                13,
                vec![int("axis", 1)],
                vec![
                    fl(&[1, 4], &[1.0, 2.0, 3.0, 4.0]),
                    In::Ints(DType::I64, vec![1, 3], vec![0, 0, 2]),
                    fl(&[1, 3], &[10.0, 20.0, 30.0]),
                ],
            ),
            &[20.0, 2.0, 30.0, 4.0],
        );
        close(
            &run(
                "ScatterND",
                13,
                vec![],
                vec![
                    fl(&[4], &[1.0, 2.0, 3.0, 4.0]),
                    In::Ints(DType::I64, vec![3, 1], vec![1, 3, 1]),
                    fl(&[3], &[10.0, 20.0, 30.0]),
                ],
            ),
            &[1.0, 30.0, 3.0, 20.0],
        );
        // ScatterElements (ONNX example 2), and its add reduction.
        let args = || {
            vec![
                fl(&[1, 5], &[1.0, 2.0, 3.0, 4.0, 5.0]),
                In::Ints(DType::I64, vec![1, 2], vec![1, 3]),
                fl(&[1, 2], &[1.1, 2.1]),
            ]
        };
        close(
            &run("ScatterElements", 13, vec![int("axis", 1)], args()),
            &[1.0, 1.1, 3.0, 2.1, 5.0],
        );
        close(
            &run(
                "ScatterElements",
                16,
                vec![int("axis", 1), string("reduction", "add")],
                args(),
            ),
            &[1.0, 3.1, 3.0, 6.1, 5.0],
        );
        // ScatterND reductions (ONNX examples: mul, and max / min on repeated indices).
        let nd = |red: &str, upd: &[f64]| {
            run(
                "ScatterND",
                18,
                vec![string("reduction", red)],
                vec![
                    fl(&[4], &[1.0, 2.0, 3.0, 4.0]),
                    In::Ints(DType::I64, vec![3, 1], vec![1, 1, 3]),
                    fl(&[3], upd),
                ],
            )
        };
        close(&nd("mul", &[3.0, 0.5, 2.0]), &[1.0, 3.0, 3.0, 8.0]);
        close(&nd("max", &[5.0, 1.0, 0.0]), &[1.0, 5.0, 3.0, 4.0]);
        close(&nd("min", &[5.0, 1.0, 0.0]), &[1.0, 1.0, 3.0, 0.0]);
        close(
            &run(
                "NonZero",
                13,
                vec![],
                vec![In::Const(DType::I64, vec![2, 2], vec![1.0, 0.0, 1.0, 1.0])],
            ),
            &[0.0, 1.0, 1.0, 0.0, 0.0, 1.0],
        );
        close(
            &run("EyeLike", 9, vec![int("k", -1)], vec![iota(&[3, 2])]),
            &[0.0, 0.0, 1.0, 0.0, 0.0, 1.0],
        );
    }
}
