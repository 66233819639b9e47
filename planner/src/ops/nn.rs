//! Neural-network ops: convolutions, normalizations, pooling, matrix products, softmax,
//! dropout, einsum.

use super::{first, nonneg, save_x, save_y, Ctx, GradRule, OpSpec, Registry, Saved, Window};
use crate::error::Result;
use crate::tensor::{broadcast, bytes_of, DType, Fact};

fn prod(v: &[u64]) -> f64 {
    v.iter().map(|&x| x as f64).product()
}

/// Input 0 as `[N, C, spatial...]`.
pub(super) fn nchw<'a>(cx: &Ctx<'a>) -> Result<&'a Fact> {
    let x = cx.input(0)?;
    if x.rank() < 3 {
        return Err(cx.err(format!(
            "input must be [N, C, spatial...], got shape {:?}",
            x.shape
        )));
    }
    Ok(x)
}

fn conv_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = nchw(cx)?;
    let w = cx.input(1)?;
    if w.rank() != x.rank() {
        return Err(cx.err(format!(
            "weight shape {:?} does not match input rank {}",
            w.shape,
            x.rank()
        )));
    }
    let group = cx.attrs.int_or("group", 1)?;
    if group < 1 {
        return Err(cx
            .attrs
            .err("group", format!("must be positive, got {group}")));
    }
    let group = group as u64;
    let kernel = match cx.attrs.ints("kernel_shape")? {
        Some(k) => nonneg(cx, "kernel_shape", k)?,
        None => w.shape[2..].to_vec(),
    };
    if x.shape[1] != w.shape[1].saturating_mul(group) {
        return Err(cx.err(format!(
            "input has {} channels but weight {:?} with group {group} expects {}",
            x.shape[1],
            w.shape,
            w.shape[1].saturating_mul(group)
        )));
    }
    let win = Window::read(cx, kernel)?;
    let mut shape = vec![x.shape[0], w.shape[0]];
    shape.extend(win.out_spatial(cx, &x.shape[2..])?);
    Ok(vec![cx.fact(x.dtype, shape)?])
}

fn conv_flops(cx: &Ctx, out: &[Fact]) -> f64 {
    let (Some(w), Some(y)) = (cx.opt(1), out.first()) else {
        return 0.0;
    };
    // Each output element: C/g * prod(kernel) multiply-adds.
    2.0 * y.numel() as f64 * prod(&w.shape[1..])
}

fn conv_transpose_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = nchw(cx)?;
    let w = cx.input(1)?;
    if w.rank() != x.rank() {
        return Err(cx.err(format!(
            "weight shape {:?} does not match input rank {}",
            w.shape,
            x.rank()
        )));
    }
    let group = cx.attrs.int_or("group", 1)?;
    if group < 1 {
        return Err(cx
            .attrs
            .err("group", format!("must be positive, got {group}")));
    }
    let group = group as u64;
    if x.shape[1] != w.shape[0] {
        return Err(cx.err(format!(
            "input has {} channels but weight {:?} expects {}",
            x.shape[1], w.shape, w.shape[0]
        )));
    }
    let kernel = match cx.attrs.ints("kernel_shape")? {
        Some(k) => nonneg(cx, "kernel_shape", k)?,
        None => w.shape[2..].to_vec(),
    };
    let n = kernel.len();
    if n != x.rank() - 2 {
        return Err(cx.attrs.err(
            "kernel_shape",
            format!("{n} dims for an input with {} spatial dims", x.rank() - 2),
        ));
    }
    let win = Window::read(cx, kernel)?;
    let out_pad = match cx.attrs.ints("output_padding")? {
        Some(p) => nonneg(cx, "output_padding", p)?,
        None => vec![0; n],
    };
    let mut shape = vec![x.shape[0], w.shape[1].saturating_mul(group)];
    if let Some(os) = cx.attrs.ints("output_shape")? {
        let os = nonneg(cx, "output_shape", os)?;
        let spatial = if os.len() == n {
            os
        } else {
            os.iter().rev().take(n).rev().copied().collect()
        };
        shape.extend(spatial);
    } else {
        for i in 0..n {
            let input = x.shape[2 + i];
            let s = win.strides[i];
            let out = if win.auto_pad.starts_with("SAME") {
                input.saturating_mul(s)
            } else {
                let eff = (win.kernel[i].saturating_sub(1)).saturating_mul(win.dilations[i]) + 1;
                let full = s
                    .saturating_mul(input.saturating_sub(1))
                    .saturating_add(*out_pad.get(i).unwrap_or(&0))
                    .saturating_add(eff);
                let pads = win.pads[i] + win.pads[i + n];
                full.checked_sub(pads)
                    .filter(|&o| o > 0)
                    .ok_or_else(|| cx.err("pads exceed the output size"))?
            };
            shape.push(out);
        }
    }
    Ok(vec![cx.fact(x.dtype, shape)?])
}

fn conv_transpose_flops(cx: &Ctx, _: &[Fact]) -> f64 {
    let (Some(x), Some(w)) = (cx.opt(0), cx.opt(1)) else {
        return 0.0;
    };
    2.0 * x.numel() as f64 * prod(&w.shape[1..])
}

/// Backward of a product-like op (conv, matmul): the weight-like operand is saved when the
/// data operand needs a gradient and vice versa.
fn product_grad(_: &Ctx, _: &[Fact], needs: &[bool]) -> GradRule {
    let mut s = vec![];
    if needs.get(1) == Some(&true) {
        s.push(Saved::Input(0));
    }
    if needs.first() == Some(&true) {
        s.push(Saved::Input(1));
    }
    GradRule::saves(s, 2.0)
}

fn matmul_shape(cx: &Ctx, a: &[u64], b: &[u64]) -> Result<(Vec<u64>, f64)> {
    if a.is_empty() || b.is_empty() {
        return Err(cx.err("MatMul operands must have rank >= 1"));
    }
    let (a2, squeeze_m) = if a.len() == 1 {
        (vec![1, a[0]], true)
    } else {
        (a.to_vec(), false)
    };
    let (b2, squeeze_n) = if b.len() == 1 {
        (vec![b[0], 1], true)
    } else {
        (b.to_vec(), false)
    };
    let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let (k2, n) = (b2[b2.len() - 2], b2[b2.len() - 1]);
    if k != k2 {
        return Err(cx.err(format!("inner dimensions differ: {a:?} x {b:?}")));
    }
    let batch = broadcast(&a2[..a2.len() - 2], &b2[..b2.len() - 2])
        .ok_or_else(|| cx.err(format!("batch dims of {a:?} and {b:?} do not broadcast")))?;
    let flops = 2.0 * prod(&batch) * m as f64 * n as f64 * k as f64;
    let mut shape = batch;
    if !squeeze_m {
        shape.push(m);
    }
    if !squeeze_n {
        shape.push(n);
    }
    Ok((shape, flops))
}

fn matmul_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let a = cx.input(0)?;
    let b = cx.input(1)?;
    let (shape, _) = matmul_shape(cx, &a.shape, &b.shape)?;
    Ok(vec![cx.fact(a.dtype, shape)?])
}

fn matmul_flops(cx: &Ctx, _: &[Fact]) -> f64 {
    match (cx.opt(0), cx.opt(1)) {
        (Some(a), Some(b)) => matmul_shape(cx, &a.shape, &b.shape)
            .map(|r| r.1)
            .unwrap_or(0.0),
        _ => 0.0,
    }
}

fn gemm_dims(cx: &Ctx) -> Result<(u64, u64, u64)> {
    let a = cx.input(0)?;
    let b = cx.input(1)?;
    if a.rank() != 2 || b.rank() != 2 {
        return Err(cx.err(format!(
            "Gemm operands must be 2-D, got {:?} and {:?}",
            a.shape, b.shape
        )));
    }
    let ta = cx.attrs.int_or("transA", 0)? != 0;
    let tb = cx.attrs.int_or("transB", 0)? != 0;
    let (m, k) = if ta {
        (a.shape[1], a.shape[0])
    } else {
        (a.shape[0], a.shape[1])
    };
    let (k2, n) = if tb {
        (b.shape[1], b.shape[0])
    } else {
        (b.shape[0], b.shape[1])
    };
    if k != k2 {
        return Err(cx.err(format!(
            "inner dimensions differ: A {:?} (transA {ta}) x B {:?} (transB {tb})",
            a.shape, b.shape
        )));
    }
    Ok((m, n, k))
}

fn gemm_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let (m, n, _) = gemm_dims(cx)?;
    if let Some(c) = cx.opt(2) {
        if broadcast(&c.shape, &[m, n]).as_deref() != Some(&[m, n][..]) {
            return Err(cx.err(format!(
                "C of shape {:?} does not broadcast to [{m}, {n}]",
                c.shape
            )));
        }
    }
    Ok(vec![cx.fact(cx.input(0)?.dtype, vec![m, n])?])
}

/// Batch-norm style ops: output 0 like the input, other outputs small per-channel vectors.
fn norm_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let c = x.shape.get(1).copied().unwrap_or(1);
    let mut out = vec![Fact::new(x.dtype, x.shape.clone())];
    for _ in 1..cx.n_outputs {
        out.push(Fact::new(x.dtype, vec![c]));
    }
    Ok(out)
}

fn bn_training(cx: &Ctx) -> bool {
    if cx.opset >= 14 {
        cx.attrs.int_or("training_mode", 0).unwrap_or(0) != 0
    } else {
        cx.n_outputs > 1
    }
}

fn stats_bytes(n: u64) -> u64 {
    // Mean and inverse standard deviation, kept in fp32.
    bytes_of(DType::F32, n.saturating_mul(2))
}

fn batch_norm_grad(cx: &Ctx, _: &[Fact], _: &[bool]) -> GradRule {
    let x = cx.opt(0);
    let c = x.and_then(|x| x.shape.get(1).copied()).unwrap_or(1);
    let mut s = vec![Saved::Input(0)];
    if bn_training(cx) {
        s.push(Saved::Extra {
            tag: "stats",
            bytes: stats_bytes(c),
            cost: 2.0 * x.map(|x| x.numel() as f64).unwrap_or(0.0),
        });
    }
    GradRule::saves(s, 2.0)
}

fn instance_norm_grad(cx: &Ctx, _: &[Fact], _: &[bool]) -> GradRule {
    let x = cx.opt(0);
    let nc = x
        .map(|x| crate::tensor::prod_sat(&x.shape[..x.rank().min(2)]))
        .unwrap_or(1);
    GradRule::saves(
        vec![
            Saved::Input(0),
            Saved::Extra {
                tag: "stats",
                bytes: stats_bytes(nc),
                cost: 2.0 * x.map(|x| x.numel() as f64).unwrap_or(0.0),
            },
        ],
        2.0,
    )
}

fn layer_norm_axis(cx: &Ctx) -> Result<usize> {
    let x = cx.input(0)?;
    cx.axis(cx.attrs.int_or("axis", -1)?, x.rank())
}

fn layer_norm_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let axis = layer_norm_axis(cx)?;
    let mut stat = x.shape[..axis].to_vec();
    stat.extend(std::iter::repeat_n(1, x.rank() - axis));
    let mut out = vec![Fact::new(x.dtype, x.shape.clone())];
    for _ in 1..cx.n_outputs {
        out.push(Fact::new(DType::F32, stat.clone()));
    }
    Ok(out)
}

fn layer_norm_grad(cx: &Ctx, _: &[Fact], _: &[bool]) -> GradRule {
    let outer = match (cx.opt(0), layer_norm_axis(cx)) {
        (Some(x), Ok(axis)) => crate::tensor::prod_sat(&x.shape[..axis]),
        _ => 1,
    };
    GradRule::saves(
        vec![
            Saved::Input(0),
            Saved::Extra {
                tag: "stats",
                bytes: stats_bytes(outer),
                cost: 2.0 * cx.in_numel(0),
            },
        ],
        2.0,
    )
}

fn group_norm_grad(cx: &Ctx, _: &[Fact], _: &[bool]) -> GradRule {
    let n = cx
        .opt(0)
        .and_then(|x| x.shape.first().copied())
        .unwrap_or(1);
    let g = cx.attrs.int_or("num_groups", 1).unwrap_or(1).max(1) as u64;
    GradRule::saves(
        vec![
            Saved::Input(0),
            Saved::Extra {
                tag: "stats",
                bytes: stats_bytes(n.saturating_mul(g)),
                cost: 2.0 * cx.in_numel(0),
            },
        ],
        2.0,
    )
}

fn pool_kernel(cx: &Ctx) -> Result<Vec<u64>> {
    match cx.attrs.ints("kernel_shape")? {
        Some(k) => nonneg(cx, "kernel_shape", k),
        None => Err(cx
            .attrs
            .err("kernel_shape", "required attribute is missing")),
    }
}

pub(super) fn pool_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = nchw(cx)?;
    let win = Window::read(cx, pool_kernel(cx)?)?;
    let mut shape = x.shape[..2].to_vec();
    shape.extend(win.out_spatial(cx, &x.shape[2..])?);
    let mut out = vec![cx.fact(x.dtype, shape.clone())?];
    if cx.n_outputs > 1 {
        out.push(Fact::new(DType::I64, shape));
    }
    Ok(out)
}

pub(super) fn pool_flops(cx: &Ctx, out: &[Fact]) -> f64 {
    let k = pool_kernel(cx).map(|k| prod(&k)).unwrap_or(1.0);
    out.first().map(|y| y.numel() as f64 * k).unwrap_or(0.0)
}

fn max_pool_grad(cx: &Ctx, out: &[Fact], _: &[bool]) -> GradRule {
    let y = out.first().map(|y| y.numel()).unwrap_or(0);
    GradRule::saves(
        vec![
            Saved::Input(0),
            Saved::Extra {
                tag: "indices",
                bytes: bytes_of(DType::I64, y),
                cost: pool_flops(cx, out),
            },
        ],
        1.0,
    )
}

pub(super) fn global_pool_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = nchw(cx)?;
    let mut shape = x.shape[..2].to_vec();
    shape.extend(std::iter::repeat_n(1, x.rank() - 2));
    Ok(vec![Fact::new(x.dtype, shape)])
}

fn in_elems(cx: &Ctx, _: &[Fact]) -> f64 {
    cx.in_numel(0)
}

fn softmax_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let default = if cx.opset >= 13 { -1 } else { 1 };
    cx.axis(cx.attrs.int_or("axis", default)?, x.rank())?;
    Ok(vec![Fact::new(x.dtype, x.shape.clone())])
}

/// Dropout is active in the training graph when its ratio is positive (the training graph
/// models training, whatever mode the model was exported in). A ratio input that is not a
/// constant counts as active.
fn dropout_active(cx: &Ctx) -> bool {
    if cx.opset < 12 {
        return cx.attrs.float_or("ratio", 0.5).unwrap_or(0.5) > 0.0;
    }
    match cx.opt(1) {
        None => true,
        Some(f) => match &f.value {
            Some(v) => v.as_f64().first().copied().unwrap_or(0.5) > 0.0,
            None => true,
        },
    }
}

fn dropout_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = cx.input(0)?;
    let mut out = vec![Fact::new(x.dtype, x.shape.clone())];
    if cx.n_outputs > 1 {
        out.push(Fact::new(DType::Bool, x.shape.clone()));
    }
    Ok(out)
}

fn dropout_grad(cx: &Ctx, _: &[Fact], _: &[bool]) -> GradRule {
    if !dropout_active(cx) {
        return GradRule::saves(vec![], 0.0);
    }
    let n = cx.opt(0).map(|x| x.numel()).unwrap_or(0);
    GradRule {
        saved: vec![Saved::Extra {
            tag: "mask",
            bytes: bytes_of(DType::Bool, n),
            cost: n as f64,
        }],
        bwd_factor: 1.0,
        replay_rng: true,
    }
}

/// Parsed einsum equation: letters per operand and of the output (`...` not supported).
fn einsum_parse(cx: &Ctx) -> Result<(Vec<Vec<char>>, Vec<char>)> {
    let eq = cx
        .attrs
        .string("equation")?
        .ok_or_else(|| cx.attrs.err("equation", "required attribute is missing"))?;
    let eq: String = eq.chars().filter(|c| !c.is_whitespace()).collect();
    if eq.contains("...") {
        return Err(cx
            .attrs
            .err("equation", format!("ellipsis is not supported: {eq:?}")));
    }
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l.to_string(), Some(r.to_string())),
        None => (eq.clone(), None),
    };
    let ins: Vec<Vec<char>> = lhs.split(',').map(|s| s.chars().collect()).collect();
    for term in ins.iter().flatten() {
        if !term.is_ascii_alphabetic() {
            return Err(cx
                .attrs
                .err("equation", format!("invalid character {term:?} in {eq:?}")));
        }
    }
    let out: Vec<char> = match rhs {
        Some(r) => r.chars().collect(),
        None => {
            let mut letters: Vec<char> = ins.iter().flatten().copied().collect();
            letters.sort_unstable();
            let mut once: Vec<char> = letters
                .iter()
                .copied()
                .filter(|c| letters.iter().filter(|d| *d == c).count() == 1)
                .collect();
            once.dedup();
            once
        }
    };
    Ok((ins, out))
}

fn einsum_dims(cx: &Ctx) -> Result<(std::collections::BTreeMap<char, u64>, Vec<char>)> {
    let (ins, out) = einsum_parse(cx)?;
    if ins.len() != cx.inputs.len() {
        return Err(cx.err(format!(
            "equation has {} operands but the node has {} inputs",
            ins.len(),
            cx.inputs.len()
        )));
    }
    let mut dims = std::collections::BTreeMap::new();
    for (i, letters) in ins.iter().enumerate() {
        let f = cx.input(i)?;
        if letters.len() != f.rank() {
            return Err(cx.err(format!(
                "operand {i} has rank {} but the equation gives it {} letters",
                f.rank(),
                letters.len()
            )));
        }
        for (&l, &d) in letters.iter().zip(&f.shape) {
            match dims.get(&l) {
                Some(&e) if e != d && e != 1 && d != 1 => {
                    return Err(cx.err(format!("letter {l:?} has sizes {e} and {d}")))
                }
                Some(&e) if e >= d => {}
                _ => {
                    dims.insert(l, d);
                }
            }
        }
    }
    Ok((dims, out))
}

fn einsum_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let (dims, out) = einsum_dims(cx)?;
    let shape = out
        .iter()
        .map(|l| {
            dims.get(l)
                .copied()
                .ok_or_else(|| cx.err(format!("output letter {l:?} appears in no operand")))
        })
        .collect::<Result<Vec<u64>>>()?;
    Ok(vec![cx.fact(cx.input(0)?.dtype, shape)?])
}

fn einsum_flops(cx: &Ctx, _: &[Fact]) -> f64 {
    einsum_dims(cx)
        .map(|(d, _)| 2.0 * d.values().map(|&x| x as f64).product::<f64>())
        .unwrap_or(0.0)
}

fn lrn_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let x = nchw(cx)?;
    Ok(vec![Fact::new(x.dtype, x.shape.clone())])
}

pub fn register(r: &mut Registry) {
    r.insert(
        "Conv",
        OpSpec {
            infer: conv_infer,
            flops: conv_flops,
            grad: product_grad,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "ConvTranspose",
        OpSpec {
            infer: conv_transpose_infer,
            flops: conv_transpose_flops,
            grad: product_grad,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "MatMul",
        OpSpec {
            infer: matmul_infer,
            flops: matmul_flops,
            grad: product_grad,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "Gemm",
        OpSpec {
            infer: gemm_infer,
            flops: |cx, _| {
                gemm_dims(cx)
                    .map(|(m, n, k)| 2.0 * m as f64 * n as f64 * k as f64 + (m * n) as f64)
                    .unwrap_or(0.0)
            },
            grad: product_grad,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "BatchNormalization",
        OpSpec {
            infer: norm_infer,
            flops: |cx, _| 5.0 * cx.in_numel(0),
            diff_in: |_, i| i < 3,
            diff_out: first,
            grad: batch_norm_grad,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "InstanceNormalization",
        OpSpec {
            infer: norm_infer,
            flops: |cx, _| 5.0 * cx.in_numel(0),
            grad: instance_norm_grad,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "LayerNormalization",
        OpSpec {
            infer: layer_norm_infer,
            flops: |cx, _| 5.0 * cx.in_numel(0),
            diff_out: first,
            grad: layer_norm_grad,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "GroupNormalization",
        OpSpec {
            infer: |cx| {
                norm_infer(cx).map(|mut v| {
                    v.truncate(1);
                    v
                })
            },
            flops: |cx, _| 5.0 * cx.in_numel(0),
            grad: group_norm_grad,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "LRN",
        OpSpec {
            infer: lrn_infer,
            flops: |cx, _| {
                cx.in_numel(0) * (cx.attrs.int_or("size", 1).unwrap_or(1).max(1) as f64 + 3.0)
            },
            grad: |_, _, _| GradRule::saves(vec![Saved::Input(0), Saved::Output(0)], 2.0),
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "MaxPool",
        OpSpec {
            infer: pool_infer,
            flops: pool_flops,
            diff_out: first,
            grad: max_pool_grad,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "AveragePool",
        OpSpec {
            infer: pool_infer,
            flops: pool_flops,
            grad: save_x,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "GlobalAveragePool",
        OpSpec {
            infer: global_pool_infer,
            flops: in_elems,
            grad: save_x,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "GlobalMaxPool",
        OpSpec {
            infer: global_pool_infer,
            flops: in_elems,
            grad: |_, out, _| {
                let y = out.first().map(|y| y.numel()).unwrap_or(0);
                GradRule::saves(
                    vec![
                        Saved::Input(0),
                        Saved::Extra {
                            tag: "indices",
                            bytes: bytes_of(DType::I64, y),
                            cost: y as f64,
                        },
                    ],
                    1.0,
                )
            },
            ..OpSpec::DEFAULT
        },
    );
    for op in ["Softmax", "LogSoftmax"] {
        r.insert(
            op,
            OpSpec {
                infer: softmax_infer,
                flops: |cx, _| 5.0 * cx.in_numel(0),
                grad: save_y,
                ..OpSpec::DEFAULT
            },
        );
    }
    r.insert(
        "Hardmax",
        OpSpec {
            infer: softmax_infer,
            diff_in: super::none,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "Dropout",
        OpSpec {
            infer: dropout_infer,
            flops: |cx, _| {
                if dropout_active(cx) {
                    cx.in_numel(0)
                } else {
                    0.0
                }
            },
            diff_in: first,
            diff_out: first,
            grad: dropout_grad,
            view: |cx| if dropout_active(cx) { None } else { Some(0) },
            random: true,
        },
    );
    r.insert(
        "Einsum",
        OpSpec {
            infer: einsum_infer,
            flops: einsum_flops,
            grad: |cx, _, _| GradRule::saves((0..cx.inputs.len()).map(Saved::Input).collect(), 2.0),
            ..OpSpec::DEFAULT
        },
    );
}
