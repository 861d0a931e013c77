//! `split`: slice the global batch across the replicas.
//!
//! Invariants after this pass:
//! - each placeholder of `st.batch_inputs` that a replica reads feeds exactly
//!   one `Split { axis: 0, sizes }` node named `split/<placeholder>`, whose
//!   output `r` is replica `r`'s slice; replicas read only their slice,
//!   nodes outside the towers still read the whole placeholder;
//! - the slices are contiguous and in replica order (tower 0's micro-batches
//!   first): replica `r` holds rows `b_0 + .. + b_{r-1} ..` of the global
//!   batch, and every Dropout of replica `r` has `first_row` set to that
//!   first row, so N towers draw the masks one device draws;
//! - the sizes sum to the global batch: an even split must divide exactly
//!   and a weighted split must give integer shares, otherwise
//!   [`PassError::BadSplit`]; no example is ever dropped;
//! - `st.tower_batches[r] = b_r`, `st.tower_weights[r] = b_r / B` (sums to
//!   1), and every `TowerMean` already in the graph over all replicas (the
//!   batch-norm statistic means made by `replicate`) gets these weights;
//! - output types are re-inferred.

use towers_graph::{Graph, NewNode, Op, Tensor, F32};

use std::ops::Range;

use crate::manager::Pass;
use crate::options::{ProcessGroup, SplitPolicy};
use crate::state::{CompileState, PassError, Replica};

/// Split the batch (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct SplitBatch {
    pub policy: SplitPolicy,
    /// Set when several processes share the global batch: this process
    /// splits only its rows, and weights its replicas by their share of the
    /// global batch.
    pub share: Option<ProcessShare>,
}

/// How the global batch divides over the processes of a group: every
/// process has `towers` towers of `accumulate` micro-batches, and `policy`
/// splits the global batch over all `world * towers` towers, rank by rank
/// (rank 0's towers first). Rank `r` feeds the contiguous rows of its
/// replicas, so the group's replicas, rank after rank, cover the global
/// batch exactly once, in the order one device would see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessShare {
    pub group: ProcessGroup,
    pub towers: usize,
    pub accumulate: usize,
    pub policy: SplitPolicy,
}

impl ProcessShare {
    /// Every replica's size over the whole group, rank after rank.
    pub fn global_sizes(&self, batch: usize) -> Result<Vec<usize>, PassError> {
        split_sizes(&self.policy, batch, self.group.workers() * self.towers, self.accumulate)
    }

    /// This process's replicas: (their sizes, the global row each starts at).
    /// Only the workers split the batch (`--ps-ranks`): a parameter-server
    /// rank gets the last worker's replicas, for their shapes alone (its
    /// program keeps none of the towers and feeds nothing).
    pub fn replicas(&self, batch: usize) -> Result<(Vec<usize>, Vec<usize>), PassError> {
        let all = self.global_sizes(batch)?;
        let per = self.towers * self.accumulate;
        let at = self.group.rank.min(self.group.workers() - 1) * per;
        let first: usize = all[..at].iter().sum();
        let sizes = all[at..at + per].to_vec();
        let firsts = sizes.iter().scan(first, |acc, &b| Some(std::mem::replace(acc, *acc + b))).collect();
        Ok((sizes, firsts))
    }

    /// The rows of every global batch this process feeds.
    pub fn rows(&self, batch: usize) -> Result<Range<usize>, PassError> {
        let (sizes, firsts) = self.replicas(batch)?;
        let first = firsts.first().copied().unwrap_or(0);
        Ok(first..first + sizes.iter().sum::<usize>())
    }
}

/// The replica a node belongs to, by its name prefix.
pub(crate) fn replica_of(replicas: &[Replica], name: &str) -> Option<usize> {
    replicas.iter().position(|r| name.starts_with(&r.prefix))
}

/// Per-replica batch sizes for `batch` examples, `towers` towers of `k` micro-batches.
pub fn split_sizes(policy: &SplitPolicy, batch: usize, towers: usize, k: usize) -> Result<Vec<usize>, PassError> {
    let r = towers * k;
    let bad = |detail: String| PassError::BadSplit { batch, towers, detail };
    let micro = if k > 1 { format!(" x {k} micro-batches") } else { String::new() };
    match policy {
        SplitPolicy::Even => {
            if r > 0 && batch < r {
                let fewer =
                    if k == 1 { format!("{batch} tower(s)") } else { "fewer towers or micro-batches".to_string() };
                return Err(bad(format!(
                    "{micro}: each replica needs at least one example, and {batch} < {r}; use a global batch of at least {r}, or, for a short last batch of an epoch, compile that batch with {fewer} (or none) and load it into the same Session beside the training program (it shares the variables, optimizer slots and global_step)"
                )));
            }
            if r == 0 || !batch.is_multiple_of(r) {
                let lo = batch / r.max(1) * r;
                let hint = if lo > 0 { format!("{lo} or {}", lo + r) } else { format!("{r}") };
                // The nearest even split, as weights that are the rows
                // themselves (exact at any batch: shares b_t / B).
                let weighted = if k == 1 && batch >= towers && towers > 0 {
                    let w: Vec<String> =
                        (0..towers).map(|t| (batch / towers + usize::from(t < batch % towers)).to_string()).collect();
                    format!(
                        "SplitPolicy::Weighted(vec![{}]) (CLI: --split-weights {}), as even as {batch} rows allow",
                        w.join(", "),
                        w.join(",")
                    )
                } else {
                    "SplitPolicy::Weighted with one weight per tower (CLI: --split-weights)".to_string()
                };
                return Err(bad(format!(
                    "{micro} evenly: {batch} is not a multiple of {r}; use a global batch size of {hint}, or {weighted}"
                )));
            }
            Ok(vec![batch / r; r])
        }
        SplitPolicy::Weighted(w) => {
            if w.len() != towers {
                return Err(PassError::Options(format!(
                    "SplitPolicy::Weighted has {} weights {w:?} for {towers} towers; give one weight per tower",
                    w.len()
                )));
            }
            if w.contains(&0) {
                return Err(bad(format!(" with weights {w:?}: a weight of 0 leaves a tower without examples")));
            }
            let sum: u64 = w.iter().map(|&x| x as u64).sum();
            let mut sizes = Vec::with_capacity(r);
            for (i, &wi) in w.iter().enumerate() {
                let num = batch as u64 * wi as u64;
                if !num.is_multiple_of(sum) || !(num / sum).is_multiple_of(k as u64) {
                    return Err(bad(format!(
                        "{micro} with weights {w:?}: tower {i} would get {batch}*{wi}/{sum} = {:.2} examples{}; use a global batch size that is a multiple of {}",
                        num as f64 / sum as f64,
                        if k > 1 { format!(", which must divide into {k} equal micro-batches") } else { String::new() },
                        sum * k as u64
                    )));
                }
                sizes.extend(std::iter::repeat_n((num / sum) as usize / k, k));
            }
            Ok(sizes)
        }
    }
}

impl crate::CompileOptions {
    /// How the global batch divides over the processes, when there are
    /// several (each has at least one tower).
    pub fn process_share(&self) -> Option<ProcessShare> {
        (!self.process.is_single()).then(|| ProcessShare {
            group: self.process,
            towers: self.towers.len().max(1),
            accumulate: self.accumulate,
            policy: self.split.clone(),
        })
    }

    /// The rows of every global batch this process feeds (all of them for one process).
    pub fn process_rows(&self) -> Result<Range<usize>, PassError> {
        match self.process_share() {
            Some(share) => share.rows(self.batch),
            None => Ok(0..self.batch),
        }
    }
}

impl SplitBatch {
    /// Split one process's batch by `policy`.
    pub fn new(policy: SplitPolicy) -> SplitBatch {
        SplitBatch { policy, share: None }
    }
}

impl Pass for SplitBatch {
    fn name(&self) -> &'static str {
        "split"
    }

    fn run(&mut self, g: &mut Graph, st: &mut CompileState) -> Result<(), PassError> {
        let batch = st.batch_size.ok_or_else(|| PassError::MissingState {
            pass: "split".into(),
            what: "the global batch size".into(),
            after: "bind_batch".into(),
        })?;
        if st.replicas.is_empty() || st.towers.is_empty() {
            return Err(PassError::MissingState {
                pass: "split".into(),
                what: "the replicas".into(),
                after: "replicate".into(),
            });
        }
        let towers = st.towers.len();
        let k = st.replicas.len() / towers;
        // The batch the replicas' weights are shares of: the global one.
        let (sizes, firsts, global) = match &self.share {
            None => {
                let sizes = split_sizes(&self.policy, batch, towers, k)?;
                let firsts = sizes.iter().scan(0, |acc, &b| Some(std::mem::replace(acc, *acc + b))).collect();
                (sizes, firsts, batch)
            }
            Some(share) => {
                let global = st.global_batch.unwrap_or(batch);
                let (sizes, firsts) = share.replicas(global)?;
                if sizes.len() != st.replicas.len() || sizes.iter().sum::<usize>() != batch {
                    return Err(PassError::BadSplit {
                        batch,
                        towers,
                        detail: format!(
                            ": rank {} of {} has {} replicas and {} rows, but its share of the global batch of {global} is {sizes:?}; bind_batch and split must be given the same process share",
                            share.group.rank,
                            share.group.world,
                            st.replicas.len(),
                            batch
                        ),
                    });
                }
                (sizes, firsts, global)
            }
        };
        let firsts: Vec<usize> = firsts;

        for ph_name in st.batch_inputs.clone() {
            let Some(ph) = g.get(&ph_name) else { continue };
            let rows = g.tensor_type(Tensor::new(ph, 0))?.shape.dim(0);
            if rows != Some(batch) {
                return Err(PassError::BadSplit {
                    batch,
                    towers,
                    detail: format!(
                        ": placeholder '{ph_name}' has {rows:?} rows, not the bound batch; run bind_batch first"
                    ),
                });
            }
            let uses: Vec<(usize, usize, usize)> = g
                .consumers(ph)
                .into_iter()
                .filter_map(|(c, dst, _)| replica_of(&st.replicas, &g.node(c).name).map(|r| (c.index(), dst, r)))
                .collect();
            if uses.is_empty() {
                continue;
            }
            let name = g.unique_name(&format!("split/{ph_name}"));
            let split =
                g.add(NewNode::new(name, Op::Split { axis: 0, sizes: sizes.clone() }, vec![Tensor::new(ph, 0)]))?;
            for (c, dst, r) in uses {
                g.set_input(towers_graph::NodeId::new(c), dst, Tensor::new(split, r))?;
            }
        }

        let weights: Vec<f64> = sizes.iter().map(|&b| b as f64 / global as f64).collect();
        for id in g.node_ids() {
            let name = g.node(id).name.clone();
            let n_in = g.inputs(id).len();
            // One example's elements in a dropout's input: its elements over
            // the batch rows, read before the re-inference below gives the
            // towers their rows (0 where the batch does not divide them).
            let row_of = match g.node(id).op {
                Op::Dropout { .. } => {
                    let x = g.inputs(id)[0];
                    let n = g.tensor_type(x)?.shape.num_elements().unwrap_or(0);
                    if n % batch == 0 {
                        n / batch
                    } else {
                        0
                    }
                }
                _ => 0,
            };
            match &mut g.node_mut(id).op {
                Op::Dropout { first_row, row_elems, .. } => {
                    if let Some(r) = replica_of(&st.replicas, &name) {
                        *first_row = firsts[r];
                        *row_elems = row_of;
                    }
                }
                Op::TowerMean { weights: w } if n_in == sizes.len() => {
                    *w = weights.iter().map(|&x| F32(x as f32)).collect();
                }
                _ => {}
            }
        }
        st.tower_batches = sizes;
        st.tower_weights = weights;
        g.reinfer()?;
        Ok(())
    }
}
