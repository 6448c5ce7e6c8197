//! Optimizer-side device operations beyond the [`crate::Backend`] trait: AdamW over a
//! shard, squared-norm partial sums, the inf/NaN check of fp16 loss scaling, and the
//! rank-order sum of the device-local collective backend. Kernels: `kernels/optimizer.cu`.

use super::backend::{addr, Arg, CudaBackend};
use super::device::DeviceSlice;
use super::geometry as geo;
use super::sources::MAX_SUM_INPUTS;
use crate::Result;

/// One AdamW step's scalars, computed on the host as the engine's `zero::optim::AdamW`
/// computes them (bias corrections in f64, rounded once to f32).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWStep {
    /// β1.
    pub beta1: f32,
    /// β2.
    pub beta2: f32,
    /// ε.
    pub eps: f32,
    /// lr / (1 - β1^t).
    pub step_size: f32,
    /// 1 / sqrt(1 - β2^t).
    pub inv_sqrt_bc2: f32,
    /// 1 - lr · weight_decay for decayed tensors, 1 for the others.
    pub decay: f32,
}

impl AdamWStep {
    /// The scalars of step `step` (from 1) at learning rate `lr`; `decayed` says whether
    /// the shard's tensors take weight decay.
    #[must_use]
    pub fn new(
        beta1: f32,
        beta2: f32,
        eps: f32,
        weight_decay: f32,
        lr: f32,
        step: u64,
        decayed: bool,
    ) -> Self {
        let t = i32::try_from(step).unwrap_or(i32::MAX);
        let bc1 = 1.0 - f64::from(beta1).powi(t);
        let bc2 = 1.0 - f64::from(beta2).powi(t);
        Self {
            beta1,
            beta2,
            eps,
            step_size: (f64::from(lr) / bc1) as f32,
            inv_sqrt_bc2: (1.0 / bc2.sqrt()) as f32,
            decay: if decayed {
                1.0 - lr * weight_decay
            } else {
                1.0
            },
        }
    }
}

/// The 2-byte parameter copy an AdamW update also writes, as raw bits (n,).
#[derive(Debug)]
pub enum HalfCopy<'a> {
    /// fp32 only.
    None,
    /// bf16 bits (round to nearest even).
    Bf16(&'a mut DeviceSlice),
    /// fp16 bits (round to nearest even).
    F16(&'a mut DeviceSlice),
}

impl CudaBackend {
    /// AdamW over one shard: params, m, v (fp32) updated in place from grads, all (n,).
    /// A half copy, when given, is a view of n/2 f32 slots holding n 2-byte values (its
    /// length must be ceil(n/2)).
    ///
    /// # Panics
    /// On lengths that differ.
    pub fn adamw_update(
        &self,
        params: &mut DeviceSlice,
        m: &mut DeviceSlice,
        v: &mut DeviceSlice,
        grads: &DeviceSlice,
        half: HalfCopy<'_>,
        s: AdamWStep,
    ) {
        let n = params.len();
        assert_eq!((m.len(), v.len(), grads.len()), (n, n, n));
        let mut args = vec![addr(params), addr(m), addr(v), addr(grads)];
        let name = match &half {
            HalfCopy::None => "adamw_update",
            HalfCopy::Bf16(h) | HalfCopy::F16(h) => {
                assert_eq!(h.len(), n.div_ceil(2), "half copy: ceil(n/2) f32 slots");
                args.push(addr(h));
                if matches!(half, HalfCopy::Bf16(_)) {
                    "adamw_update_bf16"
                } else {
                    "adamw_update_f16"
                }
            }
        };
        args.push(Arg::U64(n as u64));
        for x in [
            s.beta1,
            s.beta2,
            s.eps,
            s.step_size,
            s.inv_sqrt_bc2,
            s.decay,
        ] {
            args.push(Arg::F32(x));
        }
        self.launch(name, geo::per_element(name, n), Ok(args));
    }

    /// Σ x² accumulated in f64: per-block partial sums on the device, added on the host in
    /// block order. Synchronises the stream.
    ///
    /// # Errors
    /// A failed launch or copy (including one recorded earlier on this backend).
    pub fn sum_of_squares(&self, x: &DeviceSlice) -> Result<f64> {
        let g = geo::sum_squares(x.len())?;
        if g.is_empty() {
            return Ok(0.0);
        }
        let mut partials = self
            .stream()
            .alloc_zeros::<f64>(g.grid as usize)
            .map_err(super::backend::driver_err("cuMemAlloc"))?;
        let out = {
            use cudarc::driver::DevicePtrMut;
            partials.device_ptr_mut(self.stream()).0
        };
        self.launch(
            "sum_squares_partial",
            Ok(g),
            Ok(vec![Arg::U64(out), addr(x), Arg::U64(x.len() as u64)]),
        );
        self.synchronize()?;
        let host = self
            .stream()
            .clone_dtoh(&partials)
            .map_err(super::backend::driver_err("cuMemcpyDtoH"))?;
        Ok(host.iter().fold(0.0, |acc, &p| acc + p))
    }

    /// True when some element of `x` is infinite or NaN. Synchronises the stream.
    ///
    /// # Errors
    /// A failed launch or copy.
    pub fn has_nonfinite(&self, x: &DeviceSlice) -> Result<bool> {
        let mut flag = self
            .stream()
            .alloc_zeros::<u32>(1)
            .map_err(super::backend::driver_err("cuMemAlloc"))?;
        let flag_addr = {
            use cudarc::driver::DevicePtrMut;
            flag.device_ptr_mut(self.stream()).0
        };
        let k = "nonfinite_check";
        self.launch(
            k,
            geo::per_element(k, x.len()),
            Ok(vec![Arg::U64(flag_addr), addr(x), Arg::U64(x.len() as u64)]),
        );
        self.synchronize()?;
        let host = self
            .stream()
            .clone_dtoh(&flag)
            .map_err(super::backend::driver_err("cuMemcpyDtoH"))?;
        Ok(host.first().is_some_and(|&f| f != 0))
    }

    /// `out = inputs[0] + inputs[1] + ...` in that order (a left fold), elementwise; more than
    /// [`MAX_SUM_INPUTS`] inputs are chained through `out`, keeping the fold's order.
    /// `out` must not be one of the inputs.
    ///
    /// # Panics
    /// On an empty input list or lengths that differ.
    pub fn sum_in_rank_order(&self, out: &mut DeviceSlice, inputs: &[&DeviceSlice]) {
        assert!(!inputs.is_empty(), "sum of no inputs");
        let n = out.len();
        assert!(
            inputs.iter().all(|x| x.len() == n),
            "inputs of different lengths"
        );
        let k = "sum_in_rank_order";
        let mut rest = inputs;
        let mut first = true;
        while !rest.is_empty() {
            // After the first launch, out carries the fold so far as input 0.
            let room = if first {
                MAX_SUM_INPUTS
            } else {
                MAX_SUM_INPUTS - 1
            };
            let (now, later) = rest.split_at(rest.len().min(room));
            let mut ptrs = [0u64; MAX_SUM_INPUTS];
            let mut count = 0;
            if !first {
                ptrs[0] = out.addr();
                count = 1;
            }
            for x in now {
                ptrs[count] = x.addr();
                count += 1;
            }
            let args = vec![
                addr(out),
                Arg::Inputs(ptrs),
                Arg::U32(count as u32),
                Arg::U64(n as u64),
            ];
            self.launch(k, geo::per_element(k, n), Ok(args));
            rest = later;
            first = false;
        }
    }
}
