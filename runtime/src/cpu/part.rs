//! The CPU backend as a [`Part`] of a mixed session: it serves some of a
//! plan's devices (the host's, `cpu:*`, beside a CUDA part; or the plan's
//! GPUs as host threads, beside another CPU part, which is how CI tests the
//! mixed session without a GPU).
//!
//! A part's load runs on a copy of the plan whose unserved streams are
//! empty, so the threads, the deadlock-free order and the elided copies
//! are the plan's own restricted to this part. What changes at the part's
//! edge: a copy naming another part's memory is a real copy
//! ([`super::prepare::Transfer`]); records and waits of bridged events go
//! through the bridge's flags; the arenas of unserved devices are empty
//! and the constants of those devices are the other part's to fill. Memory
//! comes from the store's allocator (`CpuBackend::with_host_memory`), so a
//! host part beside a CUDA part lends pinned memory.

use std::collections::BTreeMap;
use std::sync::Arc;

use towers_codegen::{BufRef, Plan};

use super::mem::{Region, Slot};
use super::prepare::{part_arenas, prepare_in, resolve};
use super::CpuBackend;
use crate::backend::{BackendError, ProgramId};
use crate::comm::Comm;
use crate::mixed::{Lent, Memory, Part, PartPlan, Reservation};

/// A plan reserved by [`Part::reserve`]: its arenas, made before any part
/// resolves another's memory.
pub(super) struct Reserved {
    name: String,
    plan: Plan,
    served: Vec<bool>,
    arenas: Vec<Arc<Region>>,
}

impl CpuBackend {
    fn reservation(&self, r: Reservation) -> Result<&Reserved, BackendError> {
        self.reserved
            .get(r.0)
            .and_then(|x| x.as_ref())
            .ok_or_else(|| BackendError::Access(format!("no reservation {} (or it was loaded already)", r.0)))
    }
}

impl Part for CpuBackend {
    fn memory(&self) -> Memory {
        Memory::Host { pinned: self.store.memory.pinned() }
    }

    fn reserve(&mut self, name: &str, plan: &Plan, served: &[bool]) -> Result<Reservation, BackendError> {
        crate::mixed::check_served(name, plan, served)?;
        let arenas = part_arenas(plan, &self.store, served).map_err(BackendError::Device)?;
        self.reserved.push(Some(Reserved { name: name.into(), plan: plan.clone(), served: served.to_vec(), arenas }));
        Ok(Reservation(self.reserved.len() - 1))
    }

    fn lend(&self, reservation: Reservation, r: &BufRef) -> Result<Lent, BackendError> {
        let res = self.reservation(reservation)?;
        if let BufRef::Arena { device, .. } = r {
            if !res.served.get(*device).copied().unwrap_or(false) {
                return Err(BackendError::Access(format!(
                    "{} is on a device this part does not serve",
                    res.plan.ref_name(r)
                )));
            }
        }
        let b = resolve(&res.plan, &res.arenas, &self.store, &BTreeMap::new(), r).map_err(BackendError::Access)?;
        Ok(Lent { addr: b.slot.addr(), bytes: b.slot.len() * 4, memory: self.memory() })
    }

    fn load_part(
        &mut self,
        reservation: Reservation,
        part: &PartPlan<'_>,
        comm: Arc<dyn Comm>,
    ) -> Result<ProgramId, BackendError> {
        let Reserved { name, plan, served, arenas } = self
            .reserved
            .get_mut(reservation.0)
            .and_then(Option::take)
            .ok_or_else(|| BackendError::Access(format!("no reservation {}", reservation.0)))?;
        if plan != *part.plan || served != part.served {
            return Err(BackendError::BadPlan(format!(
                "program '{name}' was reserved for another plan or other devices"
            )));
        }
        let mut foreign = BTreeMap::new();
        for (r, lent) in part.foreign {
            if lent.memory == Memory::Device || lent.addr % 4 != 0 || lent.bytes % 4 != 0 {
                return Err(BackendError::BadPlan(format!(
                    "program '{name}': a step of the host part names {}, which lives in GPU memory the host cannot address (copies between host and GPU belong on the GPU's streams)",
                    plan.ref_name(r)
                )));
            }
            // SAFETY: the lending part keeps the memory for as long as the
            // program (the mixed backend drops parts' programs together).
            foreign.insert(r.clone(), unsafe { Slot::foreign(lent.addr, lent.bytes / 4) });
        }
        let mut own = plan.clone();
        for s in &mut own.streams {
            let i = own.devices.iter().position(|d| d.device == s.device);
            if !i.is_some_and(|i| served[i]) {
                s.steps.clear();
            }
        }
        let prepared =
            prepare_in(&own, arenas, &self.store, &comm, foreign, Some(&served)).map_err(BackendError::BadPlan)?;
        self.finish_load(&name, &own, prepared, Some((&served, part.bridge)))
    }
}
