//! Options of the tower passes: how the batch is split, where variables
//! live, and whose batch-norm statistics update the moving averages.

use serde::{Deserialize, Serialize};

/// How `split` divides the global batch across the replicas.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum SplitPolicy {
    /// Equal shares; the global batch must divide by towers × micro-batches.
    #[default]
    Even,
    /// Shares proportional to one weight per tower (`[3, 1]` on 256 gives
    /// 192 and 64). Every share must be an exact integer: no example is
    /// ever dropped or duplicated.
    Weighted(Vec<u32>),
}

/// Where `place` puts variables (TF's "variables on the CPU or on GPU 0", or sharded).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum VarPlacement {
    /// All on `cpu:0` (cifar10_multi_gpu_train.py's choice).
    #[default]
    Cpu,
    /// All on the first tower device.
    Gpu0,
    /// Round-robin over the tower devices in variable creation order
    /// (TF's `replica_device_setter` default).
    RoundRobin,
    /// By byte size (variable plus its optimizer slots), largest first, ties
    /// by name, each onto the least-loaded tower device (ties by device
    /// order). Sorting first makes it independent of creation order, unlike
    /// TF's `GreedyLoadBalancingStrategy`.
    Greedy,
}

impl VarPlacement {
    /// The short name used in placement reasons (`variables=cpu`).
    pub fn name(self) -> &'static str {
        match self {
            VarPlacement::Cpu => "cpu",
            VarPlacement::Gpu0 => "gpu0",
            VarPlacement::RoundRobin => "round_robin",
            VarPlacement::Greedy => "greedy",
        }
    }
}

/// Whose batch statistics feed the batch-norm moving averages (`update_ops`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum BnUpdates {
    /// Tower 0's statistics only: what TF1 recipes did (cifar10_estimator,
    /// tf_cnn_benchmarks take the first tower; Inception the last), on the
    /// grounds that the statistics "accumulate extremely fast". The other
    /// towers' statistics are computed and thrown away.
    Tower0,
    /// The replicas' statistics combined by one `TowerMean` weighted by the
    /// replicas' shares of the batch (the default: every example counts, as
    /// on one device, up to the mean of per-replica variances).
    #[default]
    Mean,
}
