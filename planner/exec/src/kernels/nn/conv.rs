//! Conv and ConvTranspose.

use super::conv_host::{c2_dw_host, c2_dx_host, c2_fwd_host, data_grad_weights, CMAJOR_BELOW, G2};
use crate::kernel::kbail;
use crate::kernel::{
    BwdArgs, Extras, Inputs, KResult, Kernel, KernelCtx, KernelError, KernelRegistry,
};
use crate::kernels::common::{chan_shape, fsum, host_unfold, ints_attr, usizes};
use crate::kernels::window::{
    pad_dims, put_strided, read_win, take_strided, window, zero_insert, Win,
};
use candle_core::Tensor;
use remat_planner::ops::Window;

/// With different dilations per dim, the kernel is dilated explicitly (zeros inserted) so
/// that candle sees dilation 1.
fn uniform_dilation(w: &Tensor, p: &G2) -> KResult<(Tensor, G2)> {
    if p.d[0] == p.d[1] {
        return Ok((w.clone(), p.clone()));
    }
    let mut w2 = w.clone();
    for j in 0..2 {
        w2 = zero_insert(&w2, 2 + j, p.d[j])?;
    }
    let mut q = p.clone();
    q.k = [p.eff(0), p.eff(1)];
    q.d = [1, 1];
    Ok((w2, q))
}

/// `x` `[N, C, H, W]`, `w` `[OC, C/g, kh, kw]` → `[N, OC, out...]`.
fn c2_fwd(x: &Tensor, w: &Tensor, p: &G2) -> KResult<Tensor> {
    if host_unfold(x.device()) {
        return c2_fwd_host(x, w, p, p.out[0] * p.out[1] < CMAJOR_BELOW);
    }
    c2_fwd_candle(x, w, p)
}

fn c2_fwd_candle(x: &Tensor, w: &Tensor, p: &G2) -> KResult<Tensor> {
    let (w, q) = uniform_dilation(w, p)?;
    let uniform_pad = q.pb[0] == q.pb[1] && q.pe[0] == q.pe[1] && q.pb[0] == q.pe[0];
    let (xin, pad) = if uniform_pad {
        (x.clone(), q.pb[0])
    } else {
        (pad_dims(x, 2, &q.pb, &q.pe, 0.0)?, 0)
    };
    let same_stride = q.s[0] == q.s[1];
    let st = if same_stride { q.s[0] } else { 1 };
    let mut y = xin.conv2d(&w, pad, st, q.d[0], q.g)?;
    if !same_stride {
        y = window(&y, 2, &[0, 0], &q.s, &q.out)?;
    }
    for j in 0..2 {
        let have = y.dim(2 + j)?;
        if have < q.out[j] {
            kbail!(
                "convolution produced {have} positions along spatial dim {j}, expected {}",
                q.out[j]
            );
        }
        if have > q.out[j] {
            y = y.narrow(2 + j, 0, q.out[j])?;
        }
    }
    Ok(y)
}

/// Gradient of [`c2_fwd`] with respect to `x` (spatial size `input`), from `dy`.
fn c2_dx(dy: &Tensor, w: &Tensor, p: &G2, input: [usize; 2]) -> KResult<Tensor> {
    if host_unfold(dy.device()) {
        let oo = dy.dim(2)? * dy.dim(3)?;
        return c2_dx_host(dy, w, p, input, oo < CMAJOR_BELOW);
    }
    c2_dx_candle(dy, w, p, input)
}

fn c2_dx_candle(dy: &Tensor, w: &Tensor, p: &G2, input: [usize; 2]) -> KResult<Tensor> {
    let (w, q) = uniform_dilation(w, p)?;
    let (oc, cg, _, _) = w.dims4()?;
    let g = q.g;
    if g == 0 || !oc.is_multiple_of(g) {
        kbail!("{oc} output channels do not split into {g} groups");
    }
    let wt = data_grad_weights(&w, g)?;
    let mut z = dy.clone();
    let mut lr = [(0isize, 0isize); 2];
    for j in 0..2 {
        z = zero_insert(&z, 2 + j, q.s[j])?;
        let o = dy.dim(2 + j)? as isize;
        let l = ((q.k[j] - 1) * q.d[j]) as isize - q.pb[j] as isize;
        let r = input[j] as isize + q.pb[j] as isize - (o - 1) * q.s[j] as isize - 1;
        lr[j] = (l, r);
    }
    let uniform = lr[0].0 == lr[0].1 && lr[1] == lr[0] && lr[0].0 >= 0;
    let pad = if uniform {
        lr[0].0 as usize
    } else {
        for (j, &(l, r)) in lr.iter().enumerate() {
            let dim = 2 + j;
            if l < 0 {
                let len = z.dim(dim)?;
                let cut = (-l) as usize;
                if cut >= len {
                    kbail!("padding {} exceeds the gradient length {len}", q.pb[j]);
                }
                z = z.narrow(dim, cut, len - cut)?;
            }
            if r < 0 {
                let len = z.dim(dim)?;
                let cut = (-r) as usize;
                if cut >= len {
                    kbail!("the gradient of length {len} does not reach the input");
                }
                z = z.narrow(dim, 0, len - cut)?;
            }
            z = z.pad_with_zeros(dim, l.max(0) as usize, r.max(0) as usize)?;
        }
        0
    };
    let dx = z.conv2d(&wt, pad, 1, q.d[0], g)?;
    let want = [dy.dim(0)?, g * cg, input[0], input[1]];
    if dx.dims() != want {
        kbail!("data gradient has shape {:?}, expected {want:?}", dx.dims());
    }
    Ok(dx)
}

/// Gradient of [`c2_fwd`] with respect to `w` (`[OC, C/g, kh, kw]`): one matrix product of
/// the gradient with the unfolded input per group.
fn c2_dw(x: &Tensor, dy: &Tensor, p: &G2) -> KResult<Tensor> {
    if host_unfold(x.device()) {
        let oo = dy.dim(2)? * dy.dim(3)?;
        return c2_dw_host(x, dy, p, oo < CMAJOR_BELOW);
    }
    c2_dw_candle(x, dy, p)
}

fn c2_dw_candle(x: &Tensor, dy: &Tensor, p: &G2) -> KResult<Tensor> {
    let (n, c, h, wd) = x.dims4()?;
    let (_, oc, o0, o1) = dy.dims4()?;
    let g = p.g;
    if g == 0 || !c.is_multiple_of(g) || !oc.is_multiple_of(g) {
        kbail!("{c} input and {oc} output channels do not split into {g} groups");
    }
    let input = [h, wd];
    let mut pe = [0usize; 2];
    for j in 0..2 {
        let o = [o0, o1][j];
        let need = (o - 1) * p.s[j] + p.eff(j);
        pe[j] = need.saturating_sub(input[j] + p.pb[j]);
    }
    let xt = pad_dims(&x.transpose(0, 1)?, 2, &p.pb, &pe, 0.0)?;
    let mut cols = Vec::with_capacity(p.k[0] * p.k[1]);
    for i in 0..p.k[0] {
        for j in 0..p.k[1] {
            cols.push(window(&xt, 2, &[i * p.d[0], j * p.d[1]], &p.s, &[o0, o1])?);
        }
    }
    let kk = n * o0 * o1;
    let cols = Tensor::stack(&cols, 1)?.reshape((g, c / g * p.k[0] * p.k[1], kk))?;
    let dym = dy.transpose(0, 1)?.contiguous()?.reshape((g, oc / g, kk))?;
    let dw = dym.matmul(&cols.t()?)?;
    Ok(dw.reshape((oc, c / g, p.k[0], p.k[1]))?)
}

// ---------------------------------------------------------------------------------------------
// Conv

/// Convolution geometry of a node: its window and groups.
struct ConvGeo {
    win: Win,
    g: usize,
}

fn conv_geo(cx: &KernelCtx, transpose: bool) -> KResult<ConvGeo> {
    let x = cx.in_shape(0)?;
    let w = cx.in_shape(1)?;
    if x.len() < 3 || w.len() != x.len() {
        kbail!("input {x:?} and weight {w:?} must be [N, C, spatial...] of the same rank");
    }
    let n = x.len() - 2;
    let g = cx.attrs.int_or("group", 1)?;
    if g < 1 {
        kbail!("attribute \"group\" = {g} must be positive");
    }
    let g = g as usize;
    let k = match cx.attrs.ints("kernel_shape")? {
        Some(v) => {
            let v = usizes(cx, "attribute \"kernel_shape\"", v)?;
            if v != w[2..] {
                kbail!("attribute \"kernel_shape\" = {v:?} does not match the weight {w:?}");
            }
            v
        }
        None => w[2..].to_vec(),
    };
    let y = cx.out_shape(0)?;
    if y.len() != x.len() {
        kbail!("output {y:?} does not match the input rank");
    }
    if x[2..].contains(&0) || y[2..].contains(&0) || x[1] == 0 || y[1] == 0 {
        kbail!("empty input {x:?} or output {y:?}");
    }
    let win = if transpose {
        convt_win(cx, k, &x[2..], &y[2..])?
    } else {
        read_win(cx, k, &x[2..], &y[2..])?
    };
    if win.k.len() != n {
        kbail!("kernel does not match {n} spatial dims");
    }
    Ok(ConvGeo { win, g })
}

/// Window of a ConvTranspose: `out` is its output (the larger side); pads from `pads`,
/// `auto_pad` or `output_shape` as the ONNX spec computes them.
fn convt_win(cx: &KernelCtx, k: Vec<usize>, input: &[usize], out: &[usize]) -> KResult<Win> {
    let n = k.len();
    let w = Window::read(&cx.rule, k.iter().map(|&x| x as u64).collect())?;
    let size = |v: &[u64]| v.iter().map(|&x| x as usize).collect::<Vec<usize>>();
    let (s, d) = (size(&w.strides), size(&w.dilations));
    let op = ints_attr(cx, "output_padding", n, 0)?;
    if k.contains(&0) || s.contains(&0) || d.contains(&0) {
        kbail!("kernel, strides and dilations must be positive");
    }
    let auto_pad = w.auto_pad.as_str();
    let explicit_shape = cx.attrs.ints("output_shape")?.is_some();
    let mut pb = vec![0; n];
    let mut pe = vec![0; n];
    match auto_pad {
        "" | "NOTSET" if !explicit_shape => {
            pb = size(&w.pads[..n]);
            pe = size(&w.pads[n..]);
        }
        "" | "NOTSET" | "SAME_UPPER" | "SAME_LOWER" | "VALID" => {
            for j in 0..n {
                let eff = (k[j] - 1) * d[j] + 1;
                let full = s[j] * input[j].saturating_sub(1) + op[j] + eff;
                if auto_pad == "VALID" {
                    continue;
                }
                let total = full.checked_sub(out[j]).ok_or_else(|| {
                    KernelError::new(format!(
                        "output size {} exceeds the full transposed size {full}",
                        out[j]
                    ))
                })?;
                if auto_pad == "SAME_LOWER" {
                    pb[j] = total - total / 2;
                    pe[j] = total / 2;
                } else {
                    pb[j] = total / 2;
                    pe[j] = total - total / 2;
                }
            }
        }
        other => kbail!("attribute \"auto_pad\" = {other:?} is not supported"),
    }
    Ok(Win {
        k,
        s,
        d,
        pb,
        pe,
        out: input.to_vec(),
    })
}

/// The 2-D geometry of spatial dims `dims` of a window (a unit dim when `None`).
fn g2_of(w: &Win, dims: [Option<usize>; 2], out: [usize; 2], g: usize) -> G2 {
    let pick = |v: &[usize], j: usize, def: usize| dims[j].map(|i| v[i]).unwrap_or(def);
    G2 {
        k: [pick(&w.k, 0, 1), pick(&w.k, 1, 1)],
        s: [pick(&w.s, 0, 1), pick(&w.s, 1, 1)],
        d: [pick(&w.d, 0, 1), pick(&w.d, 1, 1)],
        pb: [pick(&w.pb, 0, 0), pick(&w.pb, 1, 0)],
        pe: [pick(&w.pe, 0, 0), pick(&w.pe, 1, 0)],
        out,
        g,
    }
}

/// A convolution in the layout candle's 2-D kernels take: 1-D data gets a unit height, 3-D
/// data is handled by the caller as a sum over kernel depth.
fn to4(t: &Tensor) -> KResult<Tensor> {
    match t.rank() {
        3 => Ok(t.unsqueeze(2)?),
        4 => Ok(t.clone()),
        r => kbail!("rank {r} is not a 1-D or 2-D convolution layout"),
    }
}

fn from4(t: &Tensor, rank: usize) -> KResult<Tensor> {
    if rank == 3 {
        Ok(t.squeeze(2)?)
    } else {
        Ok(t.clone())
    }
}

/// 2-D geometry for rank-3 or rank-4 data.
fn g2_for(geo: &ConvGeo, rank: usize, out: &[usize]) -> KResult<G2> {
    match rank {
        3 => Ok(g2_of(&geo.win, [None, Some(0)], [1, out[0]], geo.g)),
        4 => Ok(g2_of(&geo.win, [Some(0), Some(1)], [out[0], out[1]], geo.g)),
        r => kbail!("convolution over {} spatial dims is not supported", r - 2),
    }
}

/// Depth slice `t` of a padded 5-D input, as a batch of 2-D images `[N * OD, C, H, W]`.
fn depth_slice(xpd: &Tensor, w: &Win, t: usize) -> KResult<Tensor> {
    let xs = take_strided(xpd, 2, t * w.d[0], w.s[0], w.out[0])?;
    let (n, c, od, h, wd) = xs.dims5()?;
    Ok(xs
        .permute((0, 2, 1, 3, 4))?
        .contiguous()?
        .reshape((n * od, c, h, wd))?)
}

/// Depth padding of a 5-D input: left pad and the right pad the windows need.
fn depth_pads(w: &Win, depth: usize) -> (usize, usize) {
    let need = (w.out[0] - 1) * w.s[0] + w.eff(0);
    (w.pb[0], need.saturating_sub(depth + w.pb[0]))
}

/// Forward convolution of `x` with `w` under `geo` (any of 1, 2, 3 spatial dims).
fn conv_apply(x: &Tensor, w: &Tensor, geo: &ConvGeo) -> KResult<Tensor> {
    let rank = x.rank();
    if rank == 5 {
        let win = &geo.win;
        let (n, _, d, _, _) = x.dims5()?;
        let (pb, pe) = depth_pads(win, d);
        let xpd = x.pad_with_zeros(2, pb, pe)?;
        let p = g2_of(win, [Some(1), Some(2)], [win.out[1], win.out[2]], geo.g);
        let mut acc: Option<Tensor> = None;
        for t in 0..win.k[0] {
            let xs = depth_slice(&xpd, win, t)?;
            let wt = w.narrow(2, t, 1)?.squeeze(2)?.contiguous()?;
            let y = c2_fwd(&xs, &wt, &p)?;
            acc = Some(match acc {
                None => y,
                Some(a) => (a + y)?,
            });
        }
        let y = acc.ok_or_else(|| KernelError::new("empty kernel depth"))?;
        let (_, oc, oh, ow) = y.dims4()?;
        return Ok(y
            .reshape((n, win.out[0], oc, oh, ow))?
            .permute((0, 2, 1, 3, 4))?
            .contiguous()?);
    }
    let p = g2_for(geo, rank, &geo.win.out)?;
    from4(&c2_fwd(&to4(x)?, &to4(w)?, &p)?, rank)
}

/// Gradient of [`conv_apply`] with respect to its input (spatial size `input`).
fn conv_apply_dx(dy: &Tensor, w: &Tensor, geo: &ConvGeo, input: &[usize]) -> KResult<Tensor> {
    let rank = dy.rank();
    if rank == 5 {
        let win = &geo.win;
        let (n, _, od, oh, ow) = dy.dims5()?;
        let oc = dy.dim(1)?;
        let dy2 = dy
            .permute((0, 2, 1, 3, 4))?
            .contiguous()?
            .reshape((n * od, oc, oh, ow))?;
        let p = g2_of(win, [Some(1), Some(2)], [oh, ow], geo.g);
        let (pb, pe) = depth_pads(win, input[0]);
        let dp = input[0] + pb + pe;
        let mut acc: Option<Tensor> = None;
        for t in 0..win.k[0] {
            let wt = w.narrow(2, t, 1)?.squeeze(2)?.contiguous()?;
            let dxs = c2_dx(&dy2, &wt, &p, [input[1], input[2]])?;
            let c = dxs.dim(1)?;
            let dxs = dxs
                .reshape((n, od, c, input[1], input[2]))?
                .permute((0, 2, 1, 3, 4))?;
            let placed = put_strided(&dxs, 2, t * win.d[0], win.s[0], dp)?;
            acc = Some(match acc {
                None => placed,
                Some(a) => (a + placed)?,
            });
        }
        let dx = acc.ok_or_else(|| KernelError::new("empty kernel depth"))?;
        return Ok(dx.narrow(2, pb, input[0])?.contiguous()?);
    }
    let out: Vec<usize> = dy.dims()[2..].to_vec();
    let p = g2_for(geo, rank, &out)?;
    let inp = if rank == 3 {
        [1, input[0]]
    } else {
        [input[0], input[1]]
    };
    from4(&c2_dx(&to4(dy)?, &to4(w)?, &p, inp)?, rank)
}

/// Gradient of [`conv_apply`] with respect to its weight.
fn conv_apply_dw(x: &Tensor, dy: &Tensor, geo: &ConvGeo) -> KResult<Tensor> {
    let rank = x.rank();
    if rank == 5 {
        let win = &geo.win;
        let (n, _, d, _, _) = x.dims5()?;
        let (_, oc, od, oh, ow) = dy.dims5()?;
        let dy2 = dy
            .permute((0, 2, 1, 3, 4))?
            .contiguous()?
            .reshape((n * od, oc, oh, ow))?;
        let (pb, pe) = depth_pads(win, d);
        let xpd = x.pad_with_zeros(2, pb, pe)?;
        let p = g2_of(win, [Some(1), Some(2)], [oh, ow], geo.g);
        let mut parts = vec![];
        for t in 0..win.k[0] {
            let xs = depth_slice(&xpd, win, t)?;
            parts.push(c2_dw(&xs, &dy2, &p)?);
        }
        return Ok(Tensor::stack(&parts, 2)?);
    }
    let out: Vec<usize> = dy.dims()[2..].to_vec();
    let p = g2_for(geo, rank, &out)?;
    from4(&c2_dw(&to4(x)?, &to4(dy)?, &p)?, rank)
}

fn bias_grad(g: &Tensor) -> KResult<Tensor> {
    let dims: Vec<usize> = (0..g.rank()).filter(|&d| d != 1).collect();
    fsum(g, &dims)
}

fn add_bias(y: Tensor, b: Option<&Tensor>) -> KResult<Tensor> {
    match b {
        None => Ok(y),
        Some(b) => {
            let c = y.dim(1)?;
            if b.elem_count() != c {
                kbail!("bias has {} elements for {c} channels", b.elem_count());
            }
            Ok(y.broadcast_add(&b.reshape(chan_shape(c, y.rank()))?)?)
        }
    }
}

fn conv_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let geo = conv_geo(cx, false)?;
    let y = conv_apply(xs.req(0)?, xs.req(1)?, &geo)?;
    Ok(vec![Some(add_bias(y, xs.opt(2))?)])
}

fn conv_bwd(cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let geo = conv_geo(cx, false)?;
    let g = a.grad(cx, 0)?;
    let x_shape = cx.in_shape(0)?;
    let mut out = vec![None; a.inputs.len()];
    if a.need(0) {
        out[0] = Some(conv_apply_dx(&g, a.input(1)?, &geo, &x_shape[2..])?);
    }
    if a.need(1) {
        let dw = conv_apply_dw(a.input(0)?, &g, &geo)?;
        out[1] = Some(dw.reshape(cx.in_shape(1)?)?);
    }
    if a.need(2) {
        out[2] = Some(bias_grad(&g)?.reshape(cx.in_shape(2)?)?);
    }
    Ok(out)
}

// ConvTranspose: the data gradient of a convolution (whose input is this op's output).

fn convt_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> KResult<Vec<Option<Tensor>>> {
    let geo = conv_geo(cx, true)?;
    let x = xs.req(0)?;
    let y_shape = cx.out_shape(0)?;
    let y = conv_apply_dx(x, xs.req(1)?, &geo, &y_shape[2..])?;
    Ok(vec![Some(add_bias(y, xs.opt(2))?)])
}

fn convt_bwd(cx: &KernelCtx, a: &BwdArgs) -> KResult<Vec<Option<Tensor>>> {
    let mut geo = conv_geo(cx, true)?;
    let g = a.grad(cx, 0)?;
    let x_shape = cx.in_shape(0)?;
    let y_shape = cx.out_shape(0)?;
    // As a convolution of dY: its output is X's spatial size; the end pads only need to
    // cover the last window.
    for j in 0..geo.win.k.len() {
        let need = (x_shape[2 + j] - 1) * geo.win.s[j] + geo.win.eff(j);
        geo.win.pe[j] = need.saturating_sub(y_shape[2 + j] + geo.win.pb[j]);
    }
    let mut out = vec![None; a.inputs.len()];
    if a.need(0) {
        out[0] = Some(conv_apply(&g, a.input(1)?, &geo)?);
    }
    if a.need(1) {
        let dw = conv_apply_dw(&g, a.input(0)?, &geo)?;
        out[1] = Some(dw.reshape(cx.in_shape(1)?)?);
    }
    if a.need(2) {
        out[2] = Some(bias_grad(&g)?.reshape(cx.in_shape(2)?)?);
    }
    Ok(out)
}

pub(super) fn register(r: &mut KernelRegistry) {
    r.insert("Conv", Kernel::new(conv_fwd, Some(conv_bwd)));
    r.insert("ConvTranspose", Kernel::new(convt_fwd, Some(convt_bwd)));
}

#[cfg(test)]
mod tests {
    use crate::testing::{check, int, ints, string, Case};
    use crate::testing::{max_abs_diff, p, r};

    #[test]
    fn conv2d_pads_strides_bias() {
        check(
            &Case::new(
                "Conv",
                17,
                vec![r(&[2, 3, 5, 5]), p(&[4, 3, 3, 3]), p(&[4])],
            )
            .attr(ints("pads", &[1, 1, 1, 1]))
            .attr(ints("strides", &[2, 2])),
        );
        check(&Case::new(
            "Conv",
            17,
            vec![r(&[1, 2, 4, 4]), r(&[3, 2, 1, 1])],
        ));
        check(
            &Case::new("Conv", 17, vec![r(&[1, 2, 5, 5]), p(&[3, 2, 1, 1])])
                .attr(ints("strides", &[2, 2])),
        );
    }

    #[test]
    fn conv2d_groups_dilations_asymmetric() {
        check(
            &Case::new(
                "Conv",
                17,
                vec![r(&[2, 4, 6, 7]), p(&[6, 2, 3, 2]), p(&[6])],
            )
            .attr(int("group", 2))
            .attr(ints("dilations", &[2, 2]))
            .attr(ints("pads", &[0, 1, 2, 0]))
            .attr(ints("strides", &[1, 2])),
        );
        check(
            &Case::new("Conv", 17, vec![r(&[1, 2, 7, 7]), p(&[2, 2, 3, 3])])
                .attr(ints("dilations", &[1, 2]))
                .attr(ints("pads", &[1, 2, 1, 2])),
        );
    }

    #[test]
    fn conv2d_depthwise_auto_pad() {
        check(
            &Case::new("Conv", 17, vec![r(&[1, 4, 6, 6]), p(&[4, 1, 3, 3])])
                .attr(int("group", 4))
                .attr(string("auto_pad", "SAME_UPPER"))
                .attr(ints("strides", &[2, 2])),
        );
        check(
            &Case::new("Conv", 17, vec![r(&[1, 2, 5, 6]), p(&[8, 1, 2, 2])])
                .attr(int("group", 2))
                .attr(string("auto_pad", "SAME_LOWER")),
        );
        check(
            &Case::new("Conv", 17, vec![r(&[1, 2, 5, 6]), p(&[2, 2, 3, 3])])
                .attr(string("auto_pad", "VALID"))
                .attr(ints("kernel_shape", &[3, 3])),
        );
    }

    #[test]
    fn conv1d_and_conv3d() {
        check(
            &Case::new("Conv", 17, vec![r(&[2, 2, 7]), p(&[3, 2, 3]), p(&[3])])
                .attr(ints("pads", &[1, 2]))
                .attr(ints("strides", &[2])),
        );
        check(
            &Case::new(
                "Conv",
                17,
                vec![r(&[1, 2, 4, 5, 5]), p(&[3, 2, 2, 3, 3]), p(&[3])],
            )
            .attr(ints("pads", &[1, 0, 1, 0, 1, 1]))
            .attr(ints("strides", &[2, 1, 2]))
            .attr(ints("dilations", &[1, 2, 1])),
        );
        check(
            &Case::new("Conv", 17, vec![r(&[2, 4, 3, 4, 4]), p(&[4, 2, 3, 1, 1])])
                .attr(int("group", 2))
                .attr(ints("pads", &[1, 0, 0, 1, 0, 0])),
        );
    }

    /// The candle-op convolution path (used off the CPU) agrees with the host im2col path.
    #[test]
    fn conv_paths_agree() {
        use super::{
            c2_dw_candle, c2_dw_host, c2_dx_candle, c2_dx_host, c2_fwd_candle, c2_fwd_host, G2,
        };
        use candle_core::{Device, Tensor};
        let dev = Device::Cpu;
        let geos = [
            // k, s, d, pb, pe, in, c, oc, g
            ([3, 3], [1, 1], [1, 1], [1, 1], [1, 1], [6, 6], 4, 6, 1),
            ([3, 2], [2, 1], [1, 2], [0, 1], [2, 0], [7, 6], 4, 6, 2),
            ([1, 1], [2, 2], [1, 1], [0, 0], [0, 0], [5, 5], 3, 4, 1),
            ([3, 3], [2, 2], [2, 2], [2, 1], [1, 2], [8, 7], 4, 4, 4),
            ([7, 7], [2, 2], [1, 1], [3, 3], [3, 3], [12, 12], 3, 4, 1),
            // 1×1, unit stride, no padding: the columns are the image itself.
            ([1, 1], [1, 1], [1, 1], [0, 0], [0, 0], [5, 6], 3, 4, 1),
            // Stride 3 with a window wider than the padding on one side.
            ([2, 4], [1, 3], [1, 1], [1, 2], [0, 3], [6, 9], 2, 3, 1),
            // Enough channels that an image goes in tiles of output rows (with padding rows
            // in the first and last tiles, and a shorter last tile).
            ([3, 3], [1, 1], [1, 1], [1, 1], [1, 1], [30, 20], 64, 8, 1),
            ([3, 3], [2, 2], [1, 1], [1, 0], [0, 1], [45, 40], 128, 4, 2),
            // Depthwise: every group's columns count toward the tile (four tiles here).
            (
                [3, 3],
                [1, 1],
                [1, 1],
                [1, 1],
                [1, 1],
                [40, 40],
                256,
                256,
                256,
            ),
        ];
        for (k, s, d, pb, pe, hw, c, oc, g) in geos {
            let out = [0, 1].map(|j| (hw[j] + pb[j] + pe[j] - ((k[j] - 1) * d[j] + 1)) / s[j] + 1);
            let p = G2 {
                k,
                s,
                d,
                pb,
                pe,
                out,
                g,
            };
            // One image (its products spread over the threads) and five (split between them).
            for n in [1, 5] {
                let x = Tensor::randn(0f64, 1.0, (n, c, hw[0], hw[1]), &dev).unwrap();
                let w = Tensor::randn(0f64, 1.0, (oc, c / g, k[0], k[1]), &dev).unwrap();
                let dy = Tensor::randn(0f64, 1.0, (n, oc, out[0], out[1]), &dev).unwrap();
                let diff = |a: Tensor, b: Tensor| max_abs_diff(&a, &b);
                for cm in [false, true] {
                    let e1 = diff(
                        c2_fwd_host(&x, &w, &p, cm).unwrap(),
                        c2_fwd_candle(&x, &w, &p).unwrap(),
                    );
                    let e2 = diff(
                        c2_dx_host(&dy, &w, &p, hw, cm).unwrap(),
                        c2_dx_candle(&dy, &w, &p, hw).unwrap(),
                    );
                    let e3 = diff(
                        c2_dw_host(&x, &dy, &p, cm).unwrap(),
                        c2_dw_candle(&x, &dy, &p).unwrap(),
                    );
                    assert!(
                        e1 < 1e-10 && e2 < 1e-10 && e3 < 1e-10,
                        "{p:?} batch {n} {cm}: {e1} {e2} {e3}"
                    );
                }
            }
        }
    }

    #[test]
    fn conv_transpose() {
        check(
            &Case::new(
                "ConvTranspose",
                17,
                vec![r(&[2, 3, 3, 4]), p(&[3, 2, 3, 3]), p(&[2])],
            )
            .attr(ints("strides", &[2, 2]))
            .attr(ints("pads", &[1, 1, 1, 1]))
            .attr(ints("output_padding", &[1, 0])),
        );
        check(
            &Case::new(
                "ConvTranspose",
                17,
                vec![r(&[1, 4, 3, 3]), p(&[4, 1, 2, 2])],
            )
            .attr(int("group", 2))
            .attr(ints("dilations", &[2, 1]))
            .attr(ints("pads", &[0, 1, 1, 0])),
        );
        check(
            &Case::new("ConvTranspose", 17, vec![r(&[1, 2, 5]), p(&[2, 3, 3])])
                .attr(ints("strides", &[2]))
                .attr(string("auto_pad", "SAME_UPPER")),
        );
        check(
            &Case::new(
                "ConvTranspose",
                17,
                vec![r(&[1, 2, 3, 3]), p(&[2, 2, 3, 3])],
            )
            .attr(ints("strides", &[2, 2]))
            .attr(ints("output_shape", &[6, 7])),
        );
    }
}
