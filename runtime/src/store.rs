//! The variable store: host memory by variable name, shared by every
//! program of a session. A variable is created and initialized the first
//! time a loaded plan declares it, from its initializer seeded by (session
//! seed, variable name), so the same seed and name always give the same
//! values whatever the load order. Regions never move or resize.

use std::collections::BTreeMap;
use std::sync::Arc;

use towers_codegen::VariableDecl;
use towers_graph::{DType, Initializer};
use towers_kernels::init;

use crate::mem::Region;

/// One variable's storage.
pub struct Var {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub region: Arc<Region>,
}

impl Var {
    pub fn describe(&self) -> String {
        format!("{}{:?}", self.dtype, self.shape)
    }
}

/// Variables by name (sorted: checkpoints and listings are deterministic).
#[derive(Default)]
pub struct Store {
    pub vars: BTreeMap<String, Var>,
}

/// Initial values of a variable as f32.
pub fn initial_values(d: &VariableDecl, seed: u64) -> Vec<f32> {
    let n: usize = d.shape.iter().product();
    let mut v = vec![0.0f32; n];
    match &d.init {
        Initializer::Zeros => {}
        Initializer::Ones => init::fill(&mut v, 1.0),
        Initializer::Constant(c) => init::fill(&mut v, c.0),
        Initializer::TruncatedNormal { mean, stddev } => {
            init::truncated_normal(&mut v, mean.0, stddev.0, seed, &d.name)
        }
        Initializer::GlorotUniform => init::glorot_uniform(&mut v, &d.shape, seed, &d.name),
        Initializer::RandomUniform { min, max } => init::uniform(&mut v, min.0, max.0, seed, &d.name),
    }
    v
}

impl Store {
    /// Create and initialize `d` if new; otherwise check dtype and shape.
    /// Err carries the existing variable's description.
    pub fn ensure(&mut self, d: &VariableDecl, seed: u64) -> Result<&Var, String> {
        if let Some(v) = self.vars.get(&d.name) {
            if v.dtype != d.dtype || v.shape != d.shape {
                return Err(v.describe());
            }
        } else {
            let values = initial_values(d, seed);
            let region = Region::new(values.len());
            let slot = region.all();
            // SAFETY: the region is new and not shared yet.
            unsafe {
                match d.dtype {
                    DType::F32 => slot.f32_mut().copy_from_slice(&values),
                    DType::I32 | DType::Bool => {
                        for (o, v) in slot.i32_mut().iter_mut().zip(&values) {
                            *o = *v as i32;
                        }
                    }
                }
            }
            let var = Var { dtype: d.dtype, shape: d.shape.clone(), region: Arc::new(region) };
            self.vars.insert(d.name.clone(), var);
        }
        self.vars.get(&d.name).ok_or_else(String::new)
    }
}
