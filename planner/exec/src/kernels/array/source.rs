//! Ops that make tensors from attributes and shapes: Shape, Size, Constant, ConstantOfShape,
//! Range, OneHot, EyeLike, NonZero.

use crate::kernel::kbail;
use crate::kernel::{Extras, Inputs, Kernel, KernelCtx, KernelError, KernelRegistry, Outs};
use crate::kernels::common::{full, host_f64, host_i64, ids, out_dtype, strides};
use crate::value::from_planner;
use candle_core::Tensor;

/// Output 0 from the value the shape rule folded.
fn folded_fwd(cx: &KernelCtx, _: &[Option<Tensor>], _: &Extras) -> Outs {
    let f = cx
        .outputs
        .first()
        .and_then(|f| f.as_ref())
        .ok_or_else(|| KernelError::new("output 0 is not in the graph"))?;
    match &f.value {
        Some(v) => Ok(vec![Some(from_planner(v, cx.device)?)]),
        None => kbail!(
            "the value of this {} ({:?}, shape {:?}) is not kept at import",
            cx.op,
            f.dtype,
            f.shape
        ),
    }
}

/// Constant: the folded value, else the `value` tensor attribute decoded in full (constants
/// above the import's folding limit keep only their shape in the facts).
fn constant_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], e: &Extras) -> Outs {
    if cx
        .outputs
        .first()
        .is_some_and(|f| f.as_ref().is_some_and(|f| f.value.is_some()))
    {
        return folded_fwd(cx, xs, e);
    }
    let Some(t) = cx.attrs.tensor("value")? else {
        return folded_fwd(cx, xs, e);
    };
    let d = remat_planner::onnx::decode_tensor(t, cx.node)?;
    let n = d.shape.iter().product::<u64>() as usize;
    let data = remat_planner::onnx::decode_values(t, d.dtype, n).ok_or_else(|| {
        KernelError::new(format!(
            "the value of this Constant ({:?}, shape {:?}) is not stored inline",
            d.dtype, d.shape
        ))
    })?;
    if data.len() != n {
        kbail!(
            "the Constant holds {} values for shape {:?}",
            data.len(),
            d.shape
        );
    }
    let pt = remat_planner::tensor::Tensor {
        dtype: d.dtype,
        shape: d.shape,
        data,
    };
    Ok(vec![Some(from_planner(&pt, cx.device)?)])
}

fn shape_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], e: &Extras) -> Outs {
    if cx
        .outputs
        .first()
        .is_some_and(|f| f.as_ref().is_some_and(|f| f.value.is_some()))
    {
        return folded_fwd(cx, xs, e);
    }
    let shape = cx.in_shape(0)?;
    let r = shape.len() as i64;
    let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let start = clamp(cx.attrs.int_or("start", 0)?);
    let end = clamp(cx.attrs.int_or("end", r)?).max(start);
    let dims: Vec<i64> = shape[start..end].iter().map(|&d| d as i64).collect();
    Ok(vec![Some(ids(dims, cx.device)?)])
}

fn size_fwd(cx: &KernelCtx, _: &[Option<Tensor>], _: &Extras) -> Outs {
    let n: usize = cx.in_shape(0)?.iter().product();
    Ok(vec![Some(Tensor::new(n as i64, cx.device)?)])
}

fn constant_of_shape_fwd(cx: &KernelCtx, _: &[Option<Tensor>], _: &Extras) -> Outs {
    let fill = match cx.attrs.tensor("value")? {
        Some(t) => remat_planner::onnx::decode_tensor(t, cx.node)?
            .value
            .and_then(|v| v.data.get_f64(0))
            .unwrap_or(0.0),
        None => 0.0,
    };
    let shape = cx.out_shape(0)?;
    Ok(vec![Some(full(
        fill,
        &shape,
        out_dtype(cx, 0)?,
        cx.device,
    )?)])
}

fn range_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let n = cx.out_shape(0)?.first().copied().unwrap_or(0);
    let dt = out_dtype(cx, 0)?;
    let y = if dt.is_float() {
        let s = host_f64(xs.req(0)?)?.first().copied().unwrap_or(0.0);
        let d = host_f64(xs.req(2)?)?.first().copied().unwrap_or(0.0);
        let v: Vec<f64> = (0..n).map(|k| s + k as f64 * d).collect();
        Tensor::from_vec(v, n, cx.device)?.to_dtype(dt)?
    } else {
        let s = host_i64(xs.req(0)?)?.first().copied().unwrap_or(0);
        let d = host_i64(xs.req(2)?)?.first().copied().unwrap_or(0);
        let v: Vec<i64> = (0..n as i64)
            .map(|k| s.wrapping_add(k.wrapping_mul(d)))
            .collect();
        Tensor::from_vec(v, n, cx.device)?.to_dtype(dt)?
    };
    Ok(vec![Some(y)])
}

fn onehot_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let ind = xs.req(0)?;
    let out = cx.out_shape(0)?;
    let axis = cx.axis(cx.attrs.int_or("axis", -1)?, out.len())?;
    let depth = out[axis] as i64;
    // Indices in [-depth, depth) count from the end when negative; others select nothing.
    let idx: Vec<i64> = host_i64(ind)?
        .into_iter()
        .map(|v| {
            let v = if v < 0 { v + depth } else { v };
            if (0..depth).contains(&v) {
                v
            } else {
                -1
            }
        })
        .collect();
    let it = Tensor::from_vec(idx, ind.dims(), cx.device)?.unsqueeze(axis)?;
    let mut ar_shape = vec![1; out.len()];
    ar_shape[axis] = depth as usize;
    let ar = Tensor::arange(0i64, depth, cx.device)?.reshape(ar_shape)?;
    let mask = it.broadcast_eq(&ar)?.contiguous()?;
    let values = xs.req(2)?.flatten_all()?;
    if values.elem_count() != 2 {
        kbail!(
            "values must hold [off, on], got {} elements",
            values.elem_count()
        );
    }
    let off = values
        .narrow(0, 0, 1)?
        .reshape(())?
        .broadcast_as(out.as_slice())?;
    let on = values
        .narrow(0, 1, 1)?
        .reshape(())?
        .broadcast_as(out.as_slice())?;
    Ok(vec![Some(
        mask.where_cond(&on.contiguous()?, &off.contiguous()?)?,
    )])
}

fn eyelike_fwd(cx: &KernelCtx, _: &[Option<Tensor>], _: &Extras) -> Outs {
    let shape = cx.out_shape(0)?;
    if shape.len() != 2 {
        kbail!("EyeLike needs a 2-D input, got {shape:?}");
    }
    let k = cx.attrs.int_or("k", 0)?;
    let (r, c) = (shape[0], shape[1]);
    let v: Vec<f64> = (0..r as i64)
        .flat_map(|i| (0..c as i64).map(move |j| if j - i == k { 1.0 } else { 0.0 }))
        .collect();
    Ok(vec![Some(
        Tensor::from_vec(v, (r, c), cx.device)?.to_dtype(out_dtype(cx, 0)?)?,
    )])
}

fn nonzero_fwd(cx: &KernelCtx, xs: &[Option<Tensor>], _: &Extras) -> Outs {
    let x = xs.req(0)?;
    let shape = x.dims().to_vec();
    let st = strides(&shape);
    let nz: Vec<usize> = host_f64(x)?
        .iter()
        .enumerate()
        .filter(|(_, &v)| v != 0.0)
        .map(|(i, _)| i)
        .collect();
    let r = shape.len();
    let mut data = Vec::with_capacity(r * nz.len());
    for k in 0..r {
        data.extend(nz.iter().map(|&f| (f / st[k] % shape[k]) as i64));
    }
    let want = cx.out_shape(0)?;
    if want != [r, nz.len()] {
        kbail!(
            "the input has {} non-zero elements, the shape rule expected {want:?}",
            nz.len()
        );
    }
    Ok(vec![Some(Tensor::from_vec(
        data,
        (r, nz.len()),
        cx.device,
    )?)])
}

pub(super) fn register(r: &mut KernelRegistry) {
    r.insert("Shape", Kernel::new(shape_fwd, None));
    r.insert("Size", Kernel::new(size_fwd, None));
    r.insert("Constant", Kernel::new(constant_fwd, None));
    r.insert("ConstantOfShape", Kernel::new(constant_of_shape_fwd, None));
    r.insert("Range", Kernel::new(range_fwd, None));
    r.insert("OneHot", Kernel::new(onehot_fwd, None));
    r.insert("EyeLike", Kernel::new(eyelike_fwd, None));
    r.insert("NonZero", Kernel::new(nonzero_fwd, None));
}

#[cfg(test)]
mod tests {
    use crate::testing::fixed::{c64, run, scalar, tensor_attr};
    use crate::testing::{check, int, ints, Case, In};
    use remat_planner::tensor::DType;

    #[test]
    fn sources() {
        check(&Case::new("Shape", 15, vec![In::Rand(vec![2, 3, 4])]).attr(int("start", 1)));
        check(&Case::new("Size", 13, vec![In::Rand(vec![2, 3, 4])]));
        check(&Case::new("Constant", 13, vec![]).attr(ints("value_ints", &[3, 4])));
        // Above the folding limit: decoded from the attribute (raw little-endian f64).
        let n = 5000;
        let mut t = onnx_protobuf::TensorProto::new();
        t.data_type = 11;
        t.dims = vec![n as i64];
        t.raw_data = (0..n).flat_map(|i| (i as f64).to_le_bytes()).collect();
        let mut a = onnx_protobuf::AttributeProto::new();
        a.name = "value".into();
        a.type_ = onnx_protobuf::attribute_proto::AttributeType::TENSOR.into();
        a.t = Some(t).into();
        check(&Case::new("Constant", 13, vec![]).attr(a.clone()));
        let y = run("Constant", 13, vec![a], vec![]);
        assert_eq!(y.len(), n);
        assert_eq!(y[4321], 4321.0);
        check(
            &Case::new("ConstantOfShape", 13, vec![c64(&[2, 3])]).attr(tensor_attr(
                "value",
                7,
                &[5],
            )),
        );
        check(
            &Case::new("ConstantOfShape", 13, vec![c64(&[3])]).attr(tensor_attr("value", 11, &[2])),
        );
        check(&Case::new(
            "Range",
            13,
            vec![scalar(2), scalar(11), scalar(3)],
        ));
        check(&Case::new(
            "Range",
            13,
            vec![
                In::Const(DType::F32, vec![], vec![1.0]),
                In::Const(DType::F32, vec![], vec![-2.0]),
                In::Const(DType::F32, vec![], vec![-0.75]),
            ],
        ));
    }
    #[test]
    fn topk_onehot_misc() {
        let x = || In::Rand(vec![3, 5]);
        check(&Case::new("TopK", 11, vec![x(), c64(&[2])]).outputs(2));
        check(
            &Case::new("TopK", 11, vec![In::Rand(vec![4, 3]), c64(&[3])])
                .attr(int("axis", 0))
                .attr(int("largest", 0))
                .outputs(2),
        );
        check(&Case::new("TopK", 1, vec![x()]).attr(int("k", 1)).outputs(2));
        let vals = In::Const(DType::F32, vec![2], vec![-1.0, 3.0]);
        check(&Case::new(
            "OneHot",
            11,
            vec![
                In::Ints(DType::I64, vec![2, 2], vec![0, -1, 2, 7]),
                scalar(4),
                vals.clone(),
            ],
        ));
        check(
            &Case::new(
                "OneHot",
                11,
                vec![
                    In::Ints(DType::I32, vec![3], vec![1, 0, 2]),
                    scalar(3),
                    c64(&[0, 1]),
                ],
            )
            .attr(int("axis", 0)),
        );
        check(&Case::new("EyeLike", 9, vec![In::Rand(vec![3, 4])]).attr(int("k", 1)));
        check(&Case::new("EyeLike", 9, vec![In::Rand(vec![3, 2])]).attr(int("dtype", 7)));
        check(&Case::new(
            "NonZero",
            13,
            vec![In::Const(
                DType::I64,
                vec![2, 3],
                vec![0.0, 1.0, 0.0, 2.0, 0.0, 3.0],
            )],
        ));
        let lens = || In::Ints(DType::I64, vec![3], vec![2, 4, 1]);
        check(&Case::new(
            "ReverseSequence",
            10,
            vec![In::Rand(vec![4, 3, 2]), lens()],
        ));
        check(
            &Case::new("ReverseSequence", 10, vec![In::Rand(vec![3, 4]), lens()])
                .attr(int("batch_axis", 0))
                .attr(int("time_axis", 1)),
        );
    }
}
