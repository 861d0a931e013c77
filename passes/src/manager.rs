//! The pass manager: runs passes in order, times them, verifies the graph
//! after each in debug builds, and dumps the graph after named passes.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use towers_graph::{dot::to_dot, text::to_text, verify::verify, Graph};

use crate::state::{CompileState, PassError};

/// One transformation of a graph. `name()` appears in dumps and timings.
pub trait Pass {
    fn name(&self) -> &'static str;
    fn run(&mut self, g: &mut Graph, st: &mut CompileState) -> Result<(), PassError>;
    /// Whether the graph is placed after this pass (the verifier then checks devices and copies).
    fn places(&self) -> bool {
        false
    }
}

/// How long one pass took.
#[derive(Debug, Clone)]
pub struct PassTiming {
    pub pass: &'static str,
    pub elapsed: Duration,
}

/// Runs passes in order.
#[derive(Default)]
pub struct PassManager {
    passes: Vec<Box<dyn Pass>>,
    dump_dir: Option<PathBuf>,
    dump_after: Vec<String>,
    verify: bool,
    pub timings: Vec<PassTiming>,
}

impl PassManager {
    pub fn new() -> PassManager {
        PassManager { verify: cfg!(debug_assertions), ..Default::default() }
    }
    #[allow(clippy::should_implement_trait)] // a builder's `add`, not arithmetic
    pub fn add(mut self, p: impl Pass + 'static) -> Self {
        self.passes.push(Box::new(p));
        self
    }
    pub fn push(&mut self, p: Box<dyn Pass>) {
        self.passes.push(p);
    }
    /// Dump after every pass named in `after` ("all" dumps after each) into `dir`.
    pub fn dump(mut self, dir: impl AsRef<Path>, after: &[String]) -> Self {
        self.dump_dir = Some(dir.as_ref().to_path_buf());
        self.dump_after = after.to_vec();
        self
    }
    /// Force the verifier on (it is on by default in debug builds).
    pub fn verify(mut self, on: bool) -> Self {
        self.verify = on;
        self
    }
    pub fn names(&self) -> Vec<&'static str> {
        self.passes.iter().map(|p| p.name()).collect()
    }

    pub fn run(&mut self, g: &mut Graph, st: &mut CompileState) -> Result<(), PassError> {
        let mut placed = false;
        for (i, p) in self.passes.iter_mut().enumerate() {
            let t = Instant::now();
            p.run(g, st)?;
            self.timings.push(PassTiming { pass: p.name(), elapsed: t.elapsed() });
            placed |= p.places();
            if self.verify {
                verify(g, p.name(), placed)?;
            }
            if let Some(dir) = &self.dump_dir {
                if self.dump_after.iter().any(|n| n == p.name() || n == "all") {
                    let base = dir.join(format!("{:02}-{}", i, p.name()));
                    let write = |ext: &str, s: String| {
                        let path = base.with_extension(ext);
                        std::fs::create_dir_all(dir).and_then(|_| std::fs::write(&path, s)).map_err(|source| {
                            PassError::Dump { pass: p.name().into(), path: path.display().to_string(), source }
                        })
                    };
                    write("txt", to_text(g)?)?;
                    write("dot", to_dot(g)?)?;
                }
            }
        }
        Ok(())
    }
}
