//! Copy paths: which way each transfer of a plan goes, and what each way
//! costs per byte on this machine.
//!
//! A copy between two devices is host->device, device->host,
//! device->device or host->host by the kinds of its ends (`cpu:*` is the
//! host, `gpu:*` a device); a launch that combines the towers' gradients in
//! process is an in-process reduction ([`is_reduction`]); an all-reduce,
//! reduce or broadcast crosses processes. The calibration keeps one entry
//! per path ([`PathCost`]: items, bytes and nanoseconds summed over the
//! traced steps), so the cost model names the path of every link and can
//! price a copy it never timed at its size by the path's cost per byte.
//!
//! Invariants: a step's path depends only on the plan (the kinds of its
//! ends, its kernel); [`PathCost`] only adds, so the entries of a
//! calibration are the sums of its samples, deterministic for given
//! samples; records and waits belong to no path.

use serde::{Deserialize, Serialize};
use towers_codegen::{BufRef, Plan, Step};
use towers_graph::{Device, DeviceKind};

/// Which way a transfer goes; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CopyPath {
    HostToHost,
    HostToDevice,
    DeviceToHost,
    DeviceToDevice,
    /// The towers' gradients combined by a kernel in this process.
    Reduction,
    /// A collective across processes (all-reduce, reduce to an owner, broadcast).
    AcrossProcesses,
}

impl CopyPath {
    /// Every path, in the order the text lists them.
    pub const ALL: [CopyPath; 6] = [
        CopyPath::HostToDevice,
        CopyPath::DeviceToHost,
        CopyPath::DeviceToDevice,
        CopyPath::HostToHost,
        CopyPath::Reduction,
        CopyPath::AcrossProcesses,
    ];

    /// Its name in the cost model's text and the calibration's JSON.
    pub fn name(self) -> &'static str {
        match self {
            CopyPath::HostToHost => "host->host",
            CopyPath::HostToDevice => "host->device",
            CopyPath::DeviceToHost => "device->host",
            CopyPath::DeviceToDevice => "device->device",
            CopyPath::Reduction => "in-process reduction",
            CopyPath::AcrossProcesses => "across processes",
        }
    }

    /// The path of a copy from `from` to `to`.
    pub fn of_copy(from: Device, to: Device) -> CopyPath {
        match (from.kind, to.kind) {
            (DeviceKind::Cpu, DeviceKind::Cpu) => CopyPath::HostToHost,
            (DeviceKind::Cpu, DeviceKind::Gpu) => CopyPath::HostToDevice,
            (DeviceKind::Gpu, DeviceKind::Cpu) => CopyPath::DeviceToHost,
            (DeviceKind::Gpu, DeviceKind::Gpu) => CopyPath::DeviceToDevice,
        }
    }

    /// The path of a plan step, with the bytes it moves; None for compute
    /// launches, records and waits (and a copy whose ends the plan does not name).
    pub fn of_step(plan: &Plan, step: &Step) -> Option<(CopyPath, usize)> {
        let collective = |buffers: &[BufRef]| buffers.iter().filter_map(|b| plan.buffer(b)).map(|b| b.bytes).sum();
        match step {
            Step::Copy { from, to, bytes, .. } => {
                Some((CopyPath::of_copy(device_of(plan, from)?, device_of(plan, to)?), *bytes))
            }
            Step::Launch { kernel, outputs, .. } if is_reduction(kernel.name()) => {
                let bytes = outputs
                    .iter()
                    .filter_map(|o| plan.type_of(o))
                    .map(|(d, sh)| d.size_bytes() * sh.iter().product::<usize>())
                    .sum();
                Some((CopyPath::Reduction, bytes))
            }
            Step::AllReduce { buffers, .. } | Step::Reduce { buffers, .. } | Step::Broadcast { buffers, .. } => {
                Some((CopyPath::AcrossProcesses, collective(buffers)))
            }
            Step::Launch { .. } | Step::Record(_) | Step::Wait(_) => None,
        }
    }
}

/// The device a buffer or variable of `plan` lives on.
pub fn device_of(plan: &Plan, r: &BufRef) -> Option<Device> {
    match r {
        BufRef::Arena { device, .. } => plan.devices.get(*device).map(|d| d.device),
        BufRef::Variable(n) => plan.variable(n).map(|v| v.device),
    }
}

/// Whether a kernel reduces the towers' gradients in process.
pub fn is_reduction(kernel: &str) -> bool {
    matches!(kernel, "weighted_sum" | "mean_apply" | "multi_apply" | "gemm_tower_mean" | "gemm_tower_apply")
}

/// What one path cost over a calibration's traced steps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathCost {
    /// Transfers timed.
    pub items: u64,
    /// Their bytes, summed.
    pub bytes: u64,
    /// Their nanoseconds, summed.
    pub ns: u64,
}

impl PathCost {
    /// Add one timed transfer.
    pub fn add(&mut self, bytes: usize, ns: u64) {
        self.items += 1;
        self.bytes += bytes as u64;
        self.ns += ns;
    }

    /// Mean nanoseconds per transfer (0 for none).
    pub fn mean_ns(&self) -> u64 {
        self.ns.checked_div(self.items).unwrap_or(0)
    }

    /// The predicted time of a transfer of `bytes` on this path: its cost
    /// per byte times `bytes` (the mean transfer's time when no byte was
    /// timed).
    pub fn predict(&self, bytes: usize) -> u64 {
        if self.bytes == 0 {
            return self.mean_ns();
        }
        (self.ns as u128 * bytes as u128 / self.bytes as u128) as u64
    }

    /// Bytes per second over the timed transfers, in GB/s (None when no
    /// time was measured).
    pub fn gb_per_s(&self) -> Option<f64> {
        (self.ns > 0).then(|| self.bytes as f64 / self.ns as f64)
    }

    /// `host->device: 12 transfers, 1.2 MB, 0.010 ms each, 9.6 GB/s`.
    pub fn text(&self, path: &str) -> String {
        let rate = self.gb_per_s().map(|r| format!(", {r:.1} GB/s")).unwrap_or_default();
        format!("{path}: {} transfers, {} B, {:.3} ms each{rate}", self.items, self.bytes, self.mean_ns() as f64 / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use towers_passes::VarPlacement;

    #[test]
    fn copies_take_the_path_of_their_ends() {
        let (h, d0, d1) = (Device::CPU0, Device::gpu(0), Device::gpu(1));
        assert_eq!(CopyPath::of_copy(h, d0), CopyPath::HostToDevice);
        assert_eq!(CopyPath::of_copy(d1, h), CopyPath::DeviceToHost);
        assert_eq!(CopyPath::of_copy(d0, d1), CopyPath::DeviceToDevice);
        assert_eq!(CopyPath::of_copy(h, h), CopyPath::HostToHost);
        let names: Vec<&str> = CopyPath::ALL.iter().map(|p| p.name()).collect();
        assert_eq!(
            names,
            [
                "host->device",
                "device->host",
                "device->device",
                "host->host",
                "in-process reduction",
                "across processes"
            ]
        );
    }

    /// Variables on the host: weights go host->device, gradients come back
    /// device->host; on gpu:0 the other tower reads them device->device.
    #[test]
    fn a_towers_plan_has_the_paths_of_its_placement() {
        let paths = |v: VarPlacement| {
            let plan = crate::cost::test_plan(2, v);
            let mut seen: Vec<CopyPath> = plan
                .streams
                .iter()
                .flat_map(|s| &s.steps)
                .filter_map(|st| CopyPath::of_step(&plan, st))
                .map(|p| p.0)
                .collect();
            seen.sort();
            seen.dedup();
            seen
        };
        let cpu = paths(VarPlacement::Cpu);
        assert!(cpu.contains(&CopyPath::HostToDevice) && cpu.contains(&CopyPath::DeviceToHost), "{cpu:?}");
        assert!(!cpu.contains(&CopyPath::DeviceToDevice), "{cpu:?}");
        let gpu0 = paths(VarPlacement::Gpu0);
        assert!(gpu0.contains(&CopyPath::DeviceToDevice), "{gpu0:?}");
        assert!(!gpu0.contains(&CopyPath::AcrossProcesses), "one process: {gpu0:?}");
    }

    #[test]
    fn a_path_prices_a_transfer_by_its_bytes() {
        let mut p = PathCost::default();
        assert_eq!((p.mean_ns(), p.predict(100), p.gb_per_s()), (0, 0, None));
        p.add(1_000, 100);
        p.add(3_000, 300);
        assert_eq!((p.items, p.bytes, p.ns, p.mean_ns()), (2, 4_000, 400, 200));
        assert_eq!(p.predict(2_000), 200);
        assert_eq!(p.gb_per_s(), Some(10.0));
        assert_eq!(p.text("host->device"), "host->device: 2 transfers, 4000 B, 0.000 ms each, 10.0 GB/s");
        // Nothing timed per byte (zero-byte transfers): the mean transfer.
        let mut z = PathCost::default();
        z.add(0, 50);
        assert_eq!(z.predict(1 << 20), 50);
    }
}
