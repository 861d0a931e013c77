//! The CPU backend's variable storage: host memory by variable name, shared
//! by every program of the backend. A variable is created once, with the
//! values the session gives (its initial or restored values); regions never
//! move or resize, so slots into them stay valid while programs run.

use std::collections::BTreeMap;
use std::sync::Arc;

use towers_vocab::DType;

use super::mem::Region;
use crate::backend::HostSlice;

/// One variable's storage.
pub struct Var {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub region: Arc<Region>,
}

/// Variables by name.
pub struct Store {
    pub vars: BTreeMap<String, Var>,
    /// Where new variables' memory comes from (pinned in a mixed session's host part).
    pub memory: Arc<dyn crate::host_memory::HostMemory>,
}

impl Default for Store {
    fn default() -> Store {
        Store { vars: BTreeMap::new(), memory: Arc::new(crate::host_memory::Pageable) }
    }
}

impl Store {
    /// Create variable `name` holding `init`; Err if it exists or `init` does not fit.
    pub fn create(&mut self, name: &str, dtype: DType, shape: &[usize], init: HostSlice<'_>) -> Result<(), String> {
        if self.vars.contains_key(name) {
            return Err(format!("variable '{name}' already exists"));
        }
        let n: usize = shape.iter().product();
        if init.len() != n || !init.fits(dtype) {
            return Err(format!("variable '{name}' is {dtype}{shape:?}; its initial values do not fit"));
        }
        let region = Region::new_in(&*self.memory, n)?;
        // SAFETY: the region is new and not shared yet.
        unsafe { region.all().write(init) };
        self.vars.insert(name.to_string(), Var { dtype, shape: shape.to_vec(), region: Arc::new(region) });
        Ok(())
    }
}
