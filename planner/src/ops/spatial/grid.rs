//! AffineGrid and GridSample.

use super::common::{as_dims, const_vec};
use crate::error::Result;
use crate::ops::rule::{first, nothing_saved, Ctx, GradRule, OpSpec, Registry, Saved};
use crate::tensor::Fact;

fn affine_grid_infer(cx: &Ctx) -> Result<Vec<Fact>> {
    let theta = cx.input(0)?;
    let size = as_dims(cx, &const_vec(cx, 1, "size")?, "size")?;
    let spatial = size.len().saturating_sub(2);
    if !(spatial == 2 || spatial == 3)
        || theta.shape != [size[0], spatial as u64, spatial as u64 + 1]
    {
        return Err(cx.err(format!(
            "theta {:?} does not match size {size:?} (expects [N, 2, 3] with [N, C, H, W] or [N, 3, 4] with [N, C, D, H, W])",
            theta.shape
        )));
    }
    let mut shape = vec![size[0]];
    shape.extend(&size[2..]);
    shape.push(spatial as u64);
    Ok(vec![cx.fact(theta.dtype, shape)?])
}

pub(super) fn register(r: &mut Registry) {
    r.insert(
        "AffineGrid",
        OpSpec {
            infer: affine_grid_infer,
            diff_in: first,
            grad: nothing_saved,
            ..OpSpec::DEFAULT
        },
    );
    r.insert(
        "GridSample",
        OpSpec {
            infer: |cx| {
                let x = cx.input(0)?;
                let g = cx.input(1)?;
                if x.rank() < 3 || g.rank() != x.rank() {
                    return Err(cx.err(format!(
                        "input {:?} and grid {:?} do not match",
                        x.shape, g.shape
                    )));
                }
                let mut shape = x.shape[..2].to_vec();
                shape.extend(&g.shape[1..g.rank() - 1]);
                Ok(vec![cx.fact(x.dtype, shape)?])
            },
            flops: |_, o| 8.0 * o.iter().map(|f| f.numel() as f64).sum::<f64>(),
            grad: |_, _, _| GradRule::saves(vec![Saved::Input(0), Saved::Input(1)], 2.0),
            ..OpSpec::DEFAULT
        },
    );
}
