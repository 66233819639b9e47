//! What the run counts: the bytes of distinct storages (each counted once, as the memory
//! model does), and values copied into storages of their own where they would share one.

use crate::kernel::{KResult, KernelError};
use candle_core::Tensor;
use std::collections::HashSet;

/// A node's value: its outputs (or the gradients of its inputs, for a backward node).
pub(super) type Value = Vec<Option<Tensor>>;

/// Bytes of the distinct storages behind `tensors`.
pub fn storage_bytes<'a>(
    tensors: impl Iterator<Item = &'a Tensor>,
    seen: &mut HashSet<usize>,
) -> u64 {
    let mut total = 0u64;
    for t in tensors {
        let (storage, layout) = t.storage_and_layout();
        let key = std::ptr::from_ref(&*storage).addr();
        if !seen.insert(key) {
            continue;
        }
        let bytes = match &*storage {
            candle_core::Storage::Cpu(c) => cpu_storage_bytes(c),
            _ => None,
        };
        total += bytes.unwrap_or((layout.shape().elem_count() * t.dtype().size_in_bytes()) as u64);
    }
    total
}

fn cpu_storage_bytes(c: &candle_core::CpuStorage) -> Option<u64> {
    use candle_core::CpuStorage as C;
    let n = match c {
        C::U8(v) => v.len(),
        C::U32(v) => v.len() * 4,
        C::I16(v) => v.len() * 2,
        C::I32(v) => v.len() * 4,
        C::I64(v) => v.len() * 8,
        C::BF16(v) => v.len() * 2,
        C::F16(v) => v.len() * 2,
        C::F32(v) => v.len() * 4,
        C::F64(v) => v.len() * 8,
        _ => return None,
    };
    Some(n as u64)
}

fn storage_key(t: &Tensor) -> usize {
    let (storage, _) = t.storage_and_layout();
    std::ptr::from_ref(&*storage).addr()
}

/// A node's value in storages of its own, as the memory model has it: an output that shares
/// storage with another output or with a resident value (an Add's backward passing its
/// incoming gradient through, an op returning its input), or that is a view into a larger
/// storage (a Concat's backward slicing its incoming gradient), is copied into a compact storage.
pub(super) fn distinct_storages(v: Value, resident: &[Option<Value>]) -> KResult<Value> {
    let mut taken: HashSet<usize> = resident
        .iter()
        .flatten()
        .flatten()
        .flatten()
        .map(storage_key)
        .collect();
    let mut out = Vec::with_capacity(v.len());
    for t in v {
        out.push(match t {
            Some(t) => {
                let own = (t.elem_count() * t.dtype().size_in_bytes()) as u64;
                let held = storage_bytes(std::iter::once(&t), &mut HashSet::new());
                if !taken.insert(storage_key(&t)) || held > own {
                    let c = t.force_contiguous()?;
                    taken.insert(storage_key(&c));
                    Some(c)
                } else {
                    Some(t)
                }
            }
            None => None,
        });
    }
    Ok(out)
}

/// A parameter's gradient `g` as the parameter's `shape` and `dtype` in a storage of its own
/// size (a view into a larger storage is copied out).
pub(super) fn own_grad(g: Tensor, shape: &[usize], dt: candle_core::DType) -> KResult<Tensor> {
    if g.dims() != shape {
        return Err(KernelError::new(format!(
            "the parameter's gradient has shape {:?}, the parameter {shape:?}",
            g.dims()
        )));
    }
    let g = g.to_dtype(dt)?;
    let own = (g.elem_count() * dt.size_in_bytes()) as u64;
    if storage_bytes(std::iter::once(&g), &mut HashSet::new()) > own {
        return Ok(g.force_contiguous()?);
    }
    Ok(g)
}
