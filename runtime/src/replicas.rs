//! Are the ranks' variables identical? A checksum compared over the
//! session's communicator.
//!
//! Data-parallel training is exact only if every rank starts from, and keeps,
//! the same variables: the same seed gives the same initial values, and the
//! all-reduced gradients give the same updates. [`Session::check_replicas`]
//! verifies it instead of trusting it: each rank hashes its variables
//! (FNV-1a 64 over every variable's bytes, names in sorted order), rank 0's
//! hash is broadcast (as 8 bytes, each an exact f32), and an all-reduce of a
//! one-hot "differs" vector tells every rank which ranks disagree. Every rank
//! thus returns the same result: `Ok`, or the same
//! [`RuntimeError::ReplicasDiffer`] naming the ranks, so no rank goes on
//! alone (a silent divergence becomes an error).

use crate::error::RuntimeError;
use crate::variables::HostVec;
use crate::Session;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv(mut h: u64, bytes: impl IntoIterator<Item = u8>) -> u64 {
    for b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

impl Session {
    /// A 64-bit checksum of every variable (names sorted, values bit for bit).
    pub fn variables_checksum(&self) -> Result<u64, RuntimeError> {
        self.variables_checksum_of(|_| true)
    }

    /// As [`Session::variables_checksum`], over the variables `keep` accepts.
    pub fn variables_checksum_of(&self, keep: impl Fn(&str) -> bool) -> Result<u64, RuntimeError> {
        let mut h = FNV_OFFSET;
        for name in self.variable_names().into_iter().filter(|n| keep(n)) {
            h = fnv(h, name.bytes());
            h = match self.read_host(&name)? {
                HostVec::F32(v) => fnv(h, v.iter().flat_map(|x| x.to_le_bytes())),
                HostVec::I32(v) => fnv(h, v.iter().flat_map(|x| x.to_le_bytes())),
            };
        }
        Ok(h)
    }

    /// Check that every rank of the session's communicator holds the same
    /// variables (see the module docs); `when` names the moment in the error
    /// ("before the first step"). A collective: every rank must call it.
    pub fn check_replicas(&self, when: &str) -> Result<(), RuntimeError> {
        self.check_replicas_of(when, |_| true)
    }

    /// As [`Session::check_replicas`], over the variables `keep` accepts
    /// (every rank must accept the same names): with `--variables ps`
    /// across processes, the optimizer slots live on their owner only and
    /// are left out.
    pub fn check_replicas_of(&self, when: &str, keep: impl Fn(&str) -> bool) -> Result<(), RuntimeError> {
        let comm = self.comm();
        let world = comm.world_size();
        if world == 1 {
            return Ok(());
        }
        let collective = |e| RuntimeError::Collective {
            program: "(replica check)".into(),
            node: "variables checksum".into(),
            source: Box::new(e),
        };
        let mine = self.variables_checksum_of(keep)?;
        let mut root: Vec<f32> = mine.to_le_bytes().iter().map(|&b| b as f32).collect();
        comm.broadcast(0, &mut [&mut root[..]]).map_err(collective)?;
        let rank0 = u64::from_le_bytes(std::array::from_fn(|i| root[i] as u8));
        let mut differs = vec![0f32; world];
        differs[comm.rank()] = if mine == rank0 { 0.0 } else { 1.0 };
        comm.all_reduce_sum(&mut [&mut differs[..]]).map_err(collective)?;
        let ranks: Vec<usize> = (0..world).filter(|&r| differs[r] != 0.0).collect();
        if ranks.is_empty() {
            Ok(())
        } else {
            Err(RuntimeError::ReplicasDiffer { when: when.into(), ranks, world })
        }
    }
}
