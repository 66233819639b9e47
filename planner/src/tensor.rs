//! Element types, facts (dtype + concrete shape + optional constant value) and the small
//! constant tensors the shape-arithmetic folding evaluates.

use serde::Serialize;
use std::sync::Arc;

/// Constant tensors with more elements than this are never materialized: their shapes are
/// known, their values are not. Keeps hostile models (`ConstantOfShape` of 10^12 elements)
/// from allocating.
pub const FOLD_LIMIT: u64 = 1 << 20;

/// Floating-point constants are kept only up to this many elements: shapes never depend on
/// large float tensors (only on scalars such as Resize scales or Range bounds), and weights
/// must not be copied into the IR.
pub const FLOAT_FOLD_LIMIT: u64 = 4096;

/// Whether a constant of `n` elements of `dtype` is small enough to keep its values.
pub fn keep_value(dtype: DType, n: u64) -> bool {
    if dtype.is_float() {
        n <= FLOAT_FOLD_LIMIT
    } else {
        n <= FOLD_LIMIT
    }
}

/// ONNX element types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    U8,
    I8,
    U16,
    I16,
    I32,
    I64,
    String,
    Bool,
    F16,
    F64,
    U32,
    U64,
    C64,
    C128,
    Bf16,
    F8E4M3Fn,
    F8E4M3Fnuz,
    F8E5M2,
    F8E5M2Fnuz,
    U4,
    I4,
    F4E2M1,
}

impl DType {
    /// The type of an ONNX `TensorProto.DataType` code; `None` for UNDEFINED or unknown codes.
    pub fn from_onnx(code: i64) -> Option<DType> {
        use DType::*;
        Some(match code {
            1 => F32,
            2 => U8,
            3 => I8,
            4 => U16,
            5 => I16,
            6 => I32,
            7 => I64,
            8 => String,
            9 => Bool,
            10 => F16,
            11 => F64,
            12 => U32,
            13 => U64,
            14 => C64,
            15 => C128,
            16 => Bf16,
            17 => F8E4M3Fn,
            18 => F8E4M3Fnuz,
            19 => F8E5M2,
            20 => F8E5M2Fnuz,
            21 => U4,
            22 => I4,
            23 => F4E2M1,
            _ => return None,
        })
    }

    /// Bits per element (strings count as a pointer-sized 64).
    pub fn bits(self) -> u64 {
        use DType::*;
        match self {
            U4 | I4 | F4E2M1 => 4,
            U8 | I8 | Bool | F8E4M3Fn | F8E4M3Fnuz | F8E5M2 | F8E5M2Fnuz => 8,
            U16 | I16 | F16 | Bf16 => 16,
            F32 | I32 | U32 => 32,
            F64 | I64 | U64 | C64 | String => 64,
            C128 => 128,
        }
    }

    /// Whether gradients flow through values of this type.
    pub fn is_float(self) -> bool {
        use DType::*;
        matches!(
            self,
            F32 | F16
                | F64
                | Bf16
                | F8E4M3Fn
                | F8E4M3Fnuz
                | F8E5M2
                | F8E5M2Fnuz
                | F4E2M1
                | C64
                | C128
        )
    }

    /// Integer or boolean types, whose values the folding keeps as `i64`.
    pub fn is_int(self) -> bool {
        use DType::*;
        matches!(
            self,
            U8 | I8 | U16 | I16 | I32 | I64 | U32 | U64 | Bool | U4 | I4
        )
    }
}

/// Number of elements of a shape, `None` on overflow.
pub fn numel(shape: &[u64]) -> Option<u64> {
    shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))
}

/// Product of dims, saturating (a zero dim elsewhere can hide an overflowing partial product).
pub fn prod_sat(dims: &[u64]) -> u64 {
    dims.iter().fold(1u64, |a, &d| a.saturating_mul(d))
}

/// Bytes of `n` elements of `dtype`.
pub fn bytes_of(dtype: DType, n: u64) -> u64 {
    n.saturating_mul(dtype.bits()).div_ceil(8)
}

/// Constant data: integers and booleans as `i64`, floats as `f64`.
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    I(Vec<i64>),
    F(Vec<f64>),
}

impl Data {
    pub fn len(&self) -> usize {
        match self {
            Data::I(v) => v.len(),
            Data::F(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get_f64(&self, i: usize) -> Option<f64> {
        match self {
            Data::I(v) => v.get(i).map(|&x| x as f64),
            Data::F(v) => v.get(i).copied(),
        }
    }

    pub fn get_i64(&self, i: usize) -> Option<i64> {
        match self {
            Data::I(v) => v.get(i).copied(),
            Data::F(v) => v.get(i).map(|&x| x as i64),
        }
    }
}

/// A small constant tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub data: Data,
}

impl Tensor {
    /// A tensor of `dtype` from `i64` values (integers, booleans) or `f64` values (floats),
    /// converting to the representation `dtype` uses.
    pub fn new(dtype: DType, shape: Vec<u64>, data: Data) -> Tensor {
        let data = match (dtype.is_float(), data) {
            (true, Data::I(v)) => Data::F(v.into_iter().map(|x| x as f64).collect()),
            (false, Data::F(v)) => Data::I(
                v.into_iter()
                    .map(|x| {
                        if dtype == DType::Bool {
                            i64::from(x != 0.0)
                        } else {
                            x as i64
                        }
                    })
                    .collect(),
            ),
            (false, Data::I(v)) if dtype == DType::Bool => {
                Data::I(v.into_iter().map(|x| i64::from(x != 0)).collect())
            }
            (_, d) => d,
        };
        Tensor { dtype, shape, data }
    }

    pub fn ints(shape: Vec<u64>, v: Vec<i64>) -> Tensor {
        Tensor::new(DType::I64, shape, Data::I(v))
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// All values as `i64` (floats truncated).
    pub fn as_i64(&self) -> Vec<i64> {
        match &self.data {
            Data::I(v) => v.clone(),
            Data::F(v) => v.iter().map(|&x| x as i64).collect(),
        }
    }

    /// All values as `f64`.
    pub fn as_f64(&self) -> Vec<f64> {
        match &self.data {
            Data::I(v) => v.iter().map(|&x| x as f64).collect(),
            Data::F(v) => v.clone(),
        }
    }

    /// The tensor cast to `dtype`.
    pub fn cast(&self, dtype: DType) -> Tensor {
        Tensor::new(dtype, self.shape.clone(), self.data.clone())
    }

    /// The same data under another shape (same element count, checked by the caller).
    pub fn reshaped(&self, shape: Vec<u64>) -> Tensor {
        Tensor {
            dtype: self.dtype,
            shape,
            data: self.data.clone(),
        }
    }
}

/// What shape inference knows about a value: its type, its concrete shape at the bound dims,
/// and its value when it is a small constant.
#[derive(Debug, Clone, PartialEq)]
pub struct Fact {
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub value: Option<Arc<Tensor>>,
}

impl Fact {
    pub fn new(dtype: DType, shape: Vec<u64>) -> Fact {
        Fact {
            dtype,
            shape,
            value: None,
        }
    }

    /// A fact carrying `t`'s values when they are small enough to keep (see [`keep_value`]).
    pub fn with_value(t: Tensor) -> Fact {
        if !keep_value(t.dtype, t.len() as u64) {
            return Fact::new(t.dtype, t.shape);
        }
        Fact {
            dtype: t.dtype,
            shape: t.shape.clone(),
            value: Some(Arc::new(t)),
        }
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Element count (saturating: shapes are checked against overflow when they are made).
    pub fn numel(&self) -> u64 {
        numel(&self.shape).unwrap_or(u64::MAX)
    }

    pub fn bytes(&self) -> u64 {
        bytes_of(self.dtype, self.numel())
    }
}

/// Strides of a row-major shape.
pub fn strides(shape: &[u64]) -> Vec<u64> {
    let mut s = vec![1u64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1].saturating_mul(shape[i + 1]);
    }
    s
}

/// Numpy-style broadcast of two shapes; `None` when they are incompatible.
pub fn broadcast(a: &[u64], b: &[u64]) -> Option<Vec<u64>> {
    let n = a.len().max(b.len());
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let da = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        out.push(match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        });
    }
    Some(out)
}

/// For each element of a broadcast `out` shape, the flat index into a tensor of shape `src`.
pub fn broadcast_index(src: &[u64], out: &[u64]) -> Vec<usize> {
    let total = numel(out).unwrap_or(0) as usize;
    let ss = strides(src);
    let os = strides(out);
    let off = out.len() - src.len();
    (0..total)
        .map(|flat| {
            let mut idx = 0u64;
            let mut rem = flat as u64;
            for (k, &st) in os.iter().enumerate() {
                let coord = rem.checked_div(st).unwrap_or(0);
                rem -= coord * st;
                if k >= off {
                    let d = src[k - off];
                    if d != 1 {
                        idx += coord * ss[k - off];
                    }
                }
            }
            idx as usize
        })
        .collect()
}
