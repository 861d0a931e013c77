//! The values' half of the synchronous parameter-server step
//! (`--variables ps` across processes): after every training step each
//! owning rank broadcasts the variables it updated, so every rank starts
//! the next step from the same values.
//!
//! Invariants:
//! - every rank holds the same [`ValueExchange`] (built from the compiler's
//!   owner groups, which do not depend on the rank) and so issues the same
//!   broadcasts, one per owning rank, in ascending rank order (the `Comm`
//!   contract);
//! - one flat host buffer per group, allocated at construction: a step
//!   allocates nothing (the owner copies its variables in, the others copy
//!   the received values out);
//! - the owner's own variables are never rewritten (it holds the values it
//!   sent), so a broadcast cannot perturb the owner's state.

use std::sync::Arc;

use super::Comm;
use crate::error::RuntimeError;
use crate::session::Session;

/// One owning rank's variables and their place in its flat buffer.
#[derive(Debug)]
struct Group {
    root: usize,
    /// (variable, offset, length) in `flat`.
    vars: Vec<(String, usize, usize)>,
    flat: Vec<f32>,
}

/// The broadcasts of the owners' new values (see the module docs).
#[derive(Debug)]
pub struct ValueExchange {
    groups: Vec<Group>,
    program: String,
}

impl ValueExchange {
    /// The exchange for `groups` (owning rank, the variables it updates;
    /// ranks ascending), sized from the session's variables. `program`
    /// names the program in errors.
    pub fn new(sess: &Session, program: &str, groups: &[(usize, Vec<String>)]) -> Result<ValueExchange, RuntimeError> {
        let world = sess.comm().world_size();
        let mut out = Vec::with_capacity(groups.len());
        for (root, names) in groups {
            if *root >= world {
                return Err(RuntimeError::Collective {
                    program: program.into(),
                    node: format!("ps_exchange/rank_{root}"),
                    source: Box::new(super::CommError::BadRoot {
                        op: "broadcast",
                        rank: sess.comm().rank(),
                        root: *root,
                        world,
                    }),
                });
            }
            let mut vars = Vec::with_capacity(names.len());
            let mut at = 0;
            for name in names {
                let (_, shape) = sess.variable_type(name)?;
                let len = shape.iter().product::<usize>();
                vars.push((name.clone(), at, len));
                at += len;
            }
            out.push(Group { root: *root, vars, flat: vec![0.0; at] });
        }
        Ok(ValueExchange { groups: out, program: program.into() })
    }

    /// Broadcast every owner's values to every rank (after a step).
    pub fn run(&mut self, sess: &mut Session) -> Result<(), RuntimeError> {
        let comm: Arc<dyn Comm> = Arc::clone(sess.comm());
        let rank = comm.rank();
        for g in &mut self.groups {
            if g.root == rank {
                for (name, at, len) in &g.vars {
                    sess.read_variable_into(name, &mut g.flat[*at..*at + *len])?;
                }
            }
            comm.broadcast(g.root, &mut [&mut g.flat[..]]).map_err(|e| RuntimeError::Collective {
                program: self.program.clone(),
                node: format!("ps_exchange/rank_{}", g.root),
                source: Box::new(e),
            })?;
            if g.root != rank {
                for (name, at, len) in &g.vars {
                    sess.write_variable(name, &g.flat[*at..*at + *len])?;
                }
            }
        }
        Ok(())
    }

    /// Bytes this rank sends per step as a root of the broadcasts (its
    /// owned values), and bytes it receives (everyone else's).
    pub fn bytes(&self, rank: usize) -> (usize, usize) {
        let size = |g: &Group| g.flat.len() * std::mem::size_of::<f32>();
        let sent = self.groups.iter().filter(|g| g.root == rank).map(size).sum();
        let received = self.groups.iter().filter(|g| g.root != rank).map(size).sum();
        (sent, received)
    }
}
