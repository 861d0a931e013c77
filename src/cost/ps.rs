//! The parameter-server layouts predicted: what crosses processes per step
//! on each rank, and the exchange time that implies on a link.
//!
//! The calibrated model ([`super::predict`]) times one process's plan; a
//! collective across processes costs what the link between them costs, and
//! that depends on the bytes each rank moves. This module compiles every
//! rank's program of a layout (all-reduce, `--variables ps` co-located with
//! round-robin or greedy owners), counts each rank's payload from the
//! compiled buckets and owners ([`RankBytes`], the figures `bench/mpi.sh`
//! prints), and predicts the exchange on a [`Link`]: the busiest rank's
//! bytes (sent plus received: one link per rank, its two directions
//! sharing it) over the link's bandwidth, plus one latency per collective.
//! The step's prediction is the calibrated compute plus this exchange
//! (an upper bound: the gradients' collectives overlap the backward pass).
//!
//! Invariants: the counts depend only on the compiled programs (never on
//! timing), so two runs give the same figures; a layout that moves more
//! bytes on its busiest rank, with no more collectives, is never predicted
//! faster.

use towers_graph::Graph;
use towers_passes::{CompileOptions, CompileState, ProcessGroup, PsStrategy, VarPlacement};

use super::CostError;
use crate::compiler::compile_train;

/// One rank's payload per step across processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RankBytes {
    /// Gradient bytes it contributes (every bucket) plus the values it broadcasts.
    pub sent: usize,
    /// Sums it receives (every all-reduced bucket and the buckets reduced to
    /// it) plus the values the other owners broadcast.
    pub received: usize,
    /// Collectives per step (buckets and value broadcasts).
    pub collectives: usize,
}

impl RankBytes {
    /// A rank's payload from its compiled state (see the module docs).
    pub fn of(state: &CompileState, rank: usize) -> RankBytes {
        let grads: usize = state.buckets.iter().map(|b| b.bytes).sum();
        let sums: usize =
            state.buckets.iter().filter(|b| b.root.is_none() || b.root == Some(rank)).map(|b| b.bytes).sum();
        let own: usize = state.ps_groups.iter().filter(|g| g.rank == rank).map(|g| g.variable_bytes).sum();
        let others: usize = state.ps_groups.iter().filter(|g| g.rank != rank).map(|g| g.variable_bytes).sum();
        RankBytes {
            sent: grads + own,
            received: sums + others,
            collectives: state.buckets.len() + state.ps_groups.len(),
        }
    }
}

/// A link between processes: its bandwidth and the fixed cost of one collective.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Link {
    pub bytes_per_ns: f64,
    pub latency_ns: f64,
}

/// One layout's prediction.
#[derive(Debug, Clone, PartialEq)]
pub struct LayoutPrediction {
    /// `all-reduce`, `ps`, `ps-greedy`.
    pub name: &'static str,
    pub placement: VarPlacement,
    /// Every rank's payload, by rank.
    pub ranks: Vec<RankBytes>,
    /// The predicted exchange per step, in nanoseconds.
    pub exchange_ns: f64,
}

/// The exchange time of `ranks` on `link`: the busiest rank's bytes over
/// the bandwidth plus its collectives' latency.
pub fn exchange_ns(ranks: &[RankBytes], link: Link) -> f64 {
    ranks
        .iter()
        .map(|r| (r.sent + r.received) as f64 / link.bytes_per_ns + r.collectives as f64 * link.latency_ns)
        .fold(0.0, f64::max)
}

/// The layouts compared, all-reduce first.
pub fn layouts(tasks: u32) -> [(&'static str, VarPlacement); 3] {
    [
        ("all-reduce", VarPlacement::Cpu),
        ("ps", VarPlacement::Ps { tasks, strategy: PsStrategy::RoundRobin }),
        ("ps-greedy", VarPlacement::Ps { tasks, strategy: PsStrategy::Greedy }),
    ]
}

/// Compile every rank of each layout of [`layouts`] over `world` processes
/// (one ps task per process), count the ranks' bytes and predict the
/// exchange on `link`. `base` gives every other option.
pub fn predict_layouts(
    model: &Graph,
    loss: &str,
    base: &CompileOptions,
    world: usize,
    link: Link,
) -> Result<Vec<LayoutPrediction>, CostError> {
    if world < 2 {
        return Err(CostError::Shape(format!(
            "the parameter-server layouts exchange across processes; got a world of {world} (use --world-size 2 or more)"
        )));
    }
    let mut out = Vec::new();
    for (name, placement) in layouts(world as u32) {
        let mut ranks = Vec::with_capacity(world);
        for rank in 0..world {
            let mut o = base.clone();
            o.variables = placement;
            o.process = ProcessGroup::new(rank, world).map_err(|e| CostError::Shape(e.to_string()))?;
            let c = compile_train(model, loss, &o)?;
            ranks.push(RankBytes::of(&c.state, rank));
        }
        let exchange_ns = exchange_ns(&ranks, link);
        out.push(LayoutPrediction { name, placement, ranks, exchange_ns });
    }
    Ok(out)
}
