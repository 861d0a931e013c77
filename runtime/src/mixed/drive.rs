//! Running the parts of a mixed session side by side: the first part on
//! the caller's thread, each other part on a long-lived driver thread made
//! when the backend is built and parked between steps, so a step spawns
//! nothing and allocates nothing (the command and result slots are
//! reused; only an error allocates its message).

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use super::part::Part;
use crate::backend::{BackendError, ProgramId};

/// A part, shared between the backend and its driver thread (the lock is
/// only ever contended by nothing: the backend touches a part between
/// steps, the driver during one).
pub(super) type Shared = Arc<Mutex<Box<dyn Part>>>;

struct Cmd {
    /// Steps asked for so far; the driver runs one when it sees a new one.
    gen: u64,
    program: ProgramId,
    /// The last step finished, and its result.
    done: u64,
    result: Result<(), BackendError>,
    shutdown: bool,
}

/// The driver thread of one part.
pub(super) struct Driver {
    cell: Arc<(Mutex<Cmd>, Condvar)>,
    handle: Option<JoinHandle<()>>,
}

impl Driver {
    /// Start the driver of `part` (thread name `towers-part-<index>`).
    pub(super) fn start(part: Shared, index: usize) -> Result<Driver, BackendError> {
        let cell = Arc::new((
            Mutex::new(Cmd { gen: 0, program: ProgramId(0), done: 0, result: Ok(()), shutdown: false }),
            Condvar::new(),
        ));
        let c = Arc::clone(&cell);
        let handle = std::thread::Builder::new()
            .name(format!("towers-part-{index}"))
            .spawn(move || drive(&part, &c))
            .map_err(|e| BackendError::Device(format!("cannot start the thread of part {index}: {e}")))?;
        Ok(Driver { cell, handle: Some(handle) })
    }

    /// Ask for one step of `program`.
    pub(super) fn start_step(&self, program: ProgramId) {
        let (lock, cv) = &*self.cell;
        let mut c = lock.lock().unwrap_or_else(|p| p.into_inner());
        c.gen += 1;
        c.program = program;
        cv.notify_all();
    }

    /// Wait for the step asked last; its result.
    pub(super) fn finish_step(&self) -> Result<(), BackendError> {
        let (lock, cv) = &*self.cell;
        let mut c = lock.lock().unwrap_or_else(|p| p.into_inner());
        while c.done != c.gen {
            c = cv.wait(c).unwrap_or_else(|p| p.into_inner());
        }
        std::mem::replace(&mut c.result, Ok(()))
    }
}

fn drive(part: &Shared, cell: &(Mutex<Cmd>, Condvar)) {
    let (lock, cv) = cell;
    let mut seen = 0;
    loop {
        let program = {
            let mut c = lock.lock().unwrap_or_else(|p| p.into_inner());
            while c.gen == seen && !c.shutdown {
                c = cv.wait(c).unwrap_or_else(|p| p.into_inner());
            }
            if c.shutdown {
                return;
            }
            seen = c.gen;
            c.program
        };
        let result = part.lock().unwrap_or_else(|p| p.into_inner()).run(program);
        let mut c = lock.lock().unwrap_or_else(|p| p.into_inner());
        c.result = result;
        c.done = seen;
        cv.notify_all();
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        {
            let (lock, cv) = &*self.cell;
            let mut c = lock.lock().unwrap_or_else(|p| p.into_inner());
            c.shutdown = true;
            cv.notify_all();
        }
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
