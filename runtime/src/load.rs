//! Where a model's weights come from: a checkpoint (with loading progress), or seeded random
//! values of the right shapes.

use tch::{Device, Kind, Tensor};

use crate::checkpoint::Checkpoint;
use crate::error::Result;

/// A source of weights: a checkpoint, or seeded random values.
pub(crate) trait WeightSource {
    /// Rows `rows` (all for `None`) of a stored tensor, as `kind` on `device`.
    fn rows(
        &mut self,
        name: &str,
        shape: &[i64],
        rows: Option<(usize, usize)>,
        kind: Kind,
        device: Device,
    ) -> Result<Tensor>;
}

impl WeightSource for (&Checkpoint, Progress) {
    fn rows(
        &mut self,
        name: &str,
        shape: &[i64],
        rows: Option<(usize, usize)>,
        kind: Kind,
        device: Device,
    ) -> Result<Tensor> {
        self.0.check(name, shape)?;
        let t = self.0.load_rows(name, rows, kind, device)?;
        self.1.tick(name, t.numel() * t.kind().elt_size_in_bytes());
        Ok(t)
    }
}

/// Random weights of the right shapes: normal(0, 0.02) for matrices, ones for norms. Each
/// tensor is drawn whole from a generator seeded by its name, then sliced, so a sharded
/// random model holds exactly the slices of the unsharded one. Tensors for a GPU are drawn
/// there (CPU draws of GLM-4-9B's 9.4B values take about a minute; the GPU's generator
/// gives other values than the CPU's for the same seed).
pub(crate) struct RandomSource {
    pub seed: i64,
}

impl WeightSource for RandomSource {
    fn rows(
        &mut self,
        name: &str,
        shape: &[i64],
        rows: Option<(usize, usize)>,
        kind: Kind,
        device: Device,
    ) -> Result<Tensor> {
        if name.ends_with("norm.weight") {
            let mut s = shape.to_vec();
            if let (Some((_, n)), Some(first)) = (rows, s.first_mut()) {
                *first = n as i64;
            }
            return Ok(Tensor::f_ones(&s, (kind, device))?);
        }
        // FNV-1a of the name, mixed with the seed.
        let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
        // Bit reinterpretations of a hash, masked to a non-negative seed: no value matters.
        tch::manual_seed((h ^ self.seed as u64) as i64 & i64::MAX);
        let draw_on = if matches!(device, Device::Cuda(_)) { device } else { Device::Cpu };
        let full = Tensor::f_randn(shape, (Kind::Float, draw_on))?.f_mul_scalar(0.02)?;
        let part = match rows {
            Some((start, n)) => full.f_narrow(0, start as i64, n as i64)?,
            None => full,
        };
        Ok(part.f_to_kind(kind)?.f_to_device(device)?)
    }
}

/// Loading progress on stderr for large checkpoints.
pub(crate) struct Progress {
    pub total: usize,
    pub done: usize,
    pub shown: usize,
    pub enabled: bool,
}

impl Progress {
    pub(crate) fn tick(&mut self, _name: &str, bytes: usize) {
        if !self.enabled {
            return;
        }
        self.done += bytes;
        let pct = (self.done * 100 / self.total.max(1)).min(100);
        if pct >= self.shown + 5 || pct == 100 && self.shown != 100 {
            self.shown = pct;
            let bar = "#".repeat(pct / 5) + &".".repeat(20 - pct / 5);
            eprint!("\rloading weights [{bar}] {pct:>3}% of {:.1} GB", self.total as f64 / 1e9);
            if pct == 100 {
                eprintln!();
            }
        }
    }
}
