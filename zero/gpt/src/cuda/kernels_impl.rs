//! `impl Backend for CudaBackend`: each method checks lengths as its CPU twin does, then
//! launches the kernels its `.cu` comment describes.
//!
//! Legend: B batch, T sequence, C channels, OC output channels, NH heads, N = B*T rows,
//! V vocabulary, Vp padded vocabulary.

// The llm.c signature (outputs, inputs, then every dimension) is the point of the trait.
#![allow(clippy::too_many_arguments)]

use super::backend::{addr, ids, with_dims, Arg, CudaBackend};
use super::device::{DeviceIds, DeviceSlice};
use super::gemm;
use super::geometry as geo;
use super::memory::DeviceBuffer;
use crate::Backend;
use crate::{Buffer, GptConfig, Result};

impl Backend for CudaBackend {
    type Slice = DeviceSlice;
    type Ids = DeviceIds;

    fn alloc(&self, len: usize) -> Result<Buffer<DeviceSlice>> {
        Ok(Box::new(DeviceBuffer::zeros(self.stream(), len)?))
    }
    fn ids(view: &DeviceSlice) -> &DeviceIds {
        // SAFETY: the same live device elements, 4 bytes each as ids are, borrowed for as
        // long as `view`.
        unsafe { DeviceIds::from_raw(view.addr(), view.len()) }
    }
    fn ids_mut(view: &mut DeviceSlice) -> &mut DeviceIds {
        // SAFETY: as in `ids`, and the result borrows `view` mutably, so it is unique.
        unsafe { DeviceIds::from_raw(view.addr(), view.len()) }
    }
    fn upload_ids(&self, dst: &mut DeviceIds, src: &[u32]) {
        self.upload(dst, src);
        self.remember_groups(dst, src);
    }
    fn fill(&self, out: &mut DeviceSlice, value: f32) {
        self.memset(out, value);
    }
    fn copy(&self, dst: &mut DeviceSlice, src: &DeviceSlice) {
        self.copy_on_device(dst, src);
    }
    fn mean(&self, x: &DeviceSlice) -> Result<f32> {
        self.mean_on_host(x)
    }
    fn scratch_len(&self, config: &GptConfig, b: usize, t: usize) -> Result<usize> {
        Self::scratch_elements(b, t, config.channels, config.num_heads)
    }
    fn provide_scratch(&self, scratch: Buffer<DeviceSlice>) {
        self.take_scratch(scratch);
    }
    fn scratch_outside_bytes(&self) -> u64 {
        self.own_scratch_bytes()
    }

    fn encoder_forward(
        &self,
        out: &mut DeviceSlice,
        tokens: &DeviceIds,
        wte: &DeviceSlice,
        wpe: &DeviceSlice,
        b: usize,
        t: usize,
        c: usize,
    ) {
        assert_eq!(out.len(), b * t * c);
        assert_eq!(tokens.len(), b * t);
        assert!(wpe.len() >= t * c);
        let k = "encoder_forward";
        let args = with_dims(
            k,
            vec![addr(out), ids(tokens), addr(wte), addr(wpe)],
            &[("n", b * t), ("t", t), ("c", c)],
        );
        self.launch(k, geo::per_element_of(k, &[b, t, c]), args);
    }

    fn encoder_backward(
        &self,
        dwte: &mut DeviceSlice,
        dwpe: &mut DeviceSlice,
        dout: &DeviceSlice,
        tokens: &DeviceIds,
        b: usize,
        t: usize,
        c: usize,
    ) {
        assert_eq!(dout.len(), b * t * c);
        assert_eq!(tokens.len(), b * t);
        assert!(dwpe.len() >= t * c);
        let k = "encoder_backward_wpe";
        let args = with_dims(
            k,
            vec![addr(dwpe), addr(dout)],
            &[("b", b), ("t", t), ("c", c)],
        );
        self.launch(k, geo::per_element_of(k, &[t, c]), args);
        self.encoder_backward_wte(dwte, dout, tokens, b * t, c);
    }

    fn layernorm_forward(
        &self,
        out: &mut DeviceSlice,
        mean: &mut DeviceSlice,
        rstd: &mut DeviceSlice,
        inp: &DeviceSlice,
        weight: &DeviceSlice,
        bias: &DeviceSlice,
        n: usize,
        c: usize,
    ) {
        assert_eq!((out.len(), inp.len()), (n * c, n * c));
        assert_eq!((mean.len(), rstd.len()), (n, n));
        assert_eq!((weight.len(), bias.len()), (c, c));
        let k = "layernorm_forward";
        let bufs = vec![
            addr(out),
            addr(mean),
            addr(rstd),
            addr(inp),
            addr(weight),
            addr(bias),
        ];
        self.launch(
            k,
            geo::layernorm_rows(k, n),
            with_dims(k, bufs, &[("n", n), ("c", c)]),
        );
    }

    fn layernorm_backward(
        &self,
        dinp: &mut DeviceSlice,
        dweight: &mut DeviceSlice,
        dbias: &mut DeviceSlice,
        dout: &DeviceSlice,
        inp: &DeviceSlice,
        weight: &DeviceSlice,
        mean: &DeviceSlice,
        rstd: &DeviceSlice,
        n: usize,
        c: usize,
    ) {
        assert_eq!(dinp.len(), n * c);
        assert_eq!((dout.len(), inp.len()), (n * c, n * c));
        assert_eq!((mean.len(), rstd.len()), (n, n));
        assert_eq!((weight.len(), dweight.len(), dbias.len()), (c, c, c));
        let k = "layernorm_backward_input";
        let bufs = vec![
            addr(dinp),
            addr(dout),
            addr(inp),
            addr(weight),
            addr(mean),
            addr(rstd),
        ];
        self.launch(
            k,
            geo::layernorm_rows(k, n),
            with_dims(k, bufs, &[("n", n), ("c", c)]),
        );
        self.layernorm_backward_params(dweight, dbias, [dout, inp, mean, rstd], n, c);
    }

    fn matmul_forward(
        &self,
        out: &mut DeviceSlice,
        inp: &DeviceSlice,
        weight: &DeviceSlice,
        bias: Option<&DeviceSlice>,
        n: usize,
        c: usize,
        oc: usize,
    ) {
        assert_eq!(out.len(), n * oc);
        assert_eq!(inp.len(), n * c);
        assert_eq!(weight.len(), oc * c);
        if let Some(bias) = bias {
            assert_eq!(bias.len(), oc);
            let k = "bias_broadcast";
            let args = with_dims(k, vec![addr(out), addr(bias)], &[("n", n), ("oc", oc)]);
            self.launch(k, geo::per_element_of(k, &[n, oc]), args);
        }
        if n == 0 || c == 0 || oc == 0 {
            return; // cuBLAS rejects empty products; the CPU leaves out as the bias made it
        }
        let call = gemm::forward(n, c, oc, bias.is_some());
        self.gemm(call, inp.addr(), weight.addr(), 0, out.addr());
    }

    fn matmul_backward(
        &self,
        dinp: &mut DeviceSlice,
        dweight: &mut DeviceSlice,
        dbias: Option<&mut DeviceSlice>,
        dout: &DeviceSlice,
        inp: &DeviceSlice,
        weight: &DeviceSlice,
        n: usize,
        c: usize,
        oc: usize,
    ) {
        self.matmul_backward_input(dinp, dout, weight, n, c, oc);
        self.matmul_backward_weight(dweight, dbias, dout, inp, n, c, oc);
    }

    fn matmul_backward_input(
        &self,
        dinp: &mut DeviceSlice,
        dout: &DeviceSlice,
        weight: &DeviceSlice,
        n: usize,
        c: usize,
        oc: usize,
    ) {
        assert_eq!(dinp.len(), n * c);
        assert_eq!(dout.len(), n * oc);
        assert_eq!(weight.len(), oc * c);
        if n != 0 && c != 0 && oc != 0 {
            let call = gemm::backward_input(n, c, oc);
            self.gemm(call, 0, weight.addr(), dout.addr(), dinp.addr());
        }
    }

    fn matmul_backward_weight(
        &self,
        dweight: &mut DeviceSlice,
        dbias: Option<&mut DeviceSlice>,
        dout: &DeviceSlice,
        inp: &DeviceSlice,
        n: usize,
        c: usize,
        oc: usize,
    ) {
        assert_eq!(dweight.len(), oc * c);
        assert_eq!(dout.len(), n * oc);
        assert_eq!(inp.len(), n * c);
        if n != 0 && c != 0 && oc != 0 {
            let call = gemm::backward_weight(n, c, oc);
            self.gemm(call, inp.addr(), 0, dout.addr(), dweight.addr());
        }
        if let Some(dbias) = dbias {
            assert_eq!(dbias.len(), oc);
            self.bias_backward(dbias, dout, n, oc);
        }
    }

    fn attention_forward(
        &self,
        out: &mut DeviceSlice,
        att: &mut DeviceSlice,
        qkv: &DeviceSlice,
        b: usize,
        t: usize,
        c: usize,
        nh: usize,
    ) {
        assert_eq!(c % nh, 0);
        assert_eq!(out.len(), b * t * c);
        assert_eq!(att.len(), b * t * nh * t);
        assert_eq!(qkv.len(), b * t * 3 * c);
        self.attention_forward_gemm(out, att, qkv, (b, t, c, nh));
    }

    fn attention_backward(
        &self,
        dqkv: &mut DeviceSlice,
        dout: &DeviceSlice,
        qkv: &DeviceSlice,
        att: &DeviceSlice,
        b: usize,
        t: usize,
        c: usize,
        nh: usize,
    ) {
        assert_eq!(c % nh, 0);
        assert_eq!(dqkv.len(), b * t * 3 * c);
        assert_eq!(dout.len(), b * t * c);
        assert_eq!(att.len(), b * t * nh * t);
        assert_eq!(qkv.len(), b * t * 3 * c);
        self.attention_backward_gemm(dqkv, dout, qkv, att, (b, t, c, nh));
    }

    fn gelu_forward(&self, out: &mut DeviceSlice, inp: &DeviceSlice) {
        assert_eq!(out.len(), inp.len());
        let k = "gelu_forward";
        let n = out.len();
        self.launch(
            k,
            geo::per_element(k, n),
            Ok(vec![addr(out), addr(inp), Arg::U64(n as u64)]),
        );
    }

    fn gelu_backward(&self, dinp: &mut DeviceSlice, inp: &DeviceSlice, dout: &DeviceSlice) {
        assert_eq!(dinp.len(), inp.len());
        assert_eq!(dinp.len(), dout.len());
        let k = "gelu_backward";
        let n = dinp.len();
        let args = vec![addr(dinp), addr(inp), addr(dout), Arg::U64(n as u64)];
        self.launch(k, geo::per_element(k, n), Ok(args));
    }

    fn residual_forward(&self, out: &mut DeviceSlice, inp1: &DeviceSlice, inp2: &DeviceSlice) {
        assert_eq!(out.len(), inp1.len());
        assert_eq!(out.len(), inp2.len());
        let k = "residual_forward";
        let n = out.len();
        let args = vec![addr(out), addr(inp1), addr(inp2), Arg::U64(n as u64)];
        self.launch(k, geo::per_element(k, n), Ok(args));
    }

    fn residual_backward(
        &self,
        dinp1: &mut DeviceSlice,
        dinp2: &mut DeviceSlice,
        dout: &DeviceSlice,
    ) {
        assert_eq!(dinp1.len(), dout.len());
        assert_eq!(dinp2.len(), dout.len());
        let k = "residual_backward";
        let n = dout.len();
        let args = vec![addr(dinp1), addr(dinp2), addr(dout), Arg::U64(n as u64)];
        self.launch(k, geo::per_element(k, n), Ok(args));
    }

    fn crossentropy_forward(
        &self,
        losses: &mut DeviceSlice,
        logits: &mut DeviceSlice,
        targets: &DeviceIds,
        n: usize,
        v: usize,
        vp: usize,
    ) {
        assert!(v <= vp);
        assert_eq!(losses.len(), n);
        assert_eq!(logits.len(), n * vp);
        assert_eq!(targets.len(), n);
        let k = "crossentropy_forward";
        let args = with_dims(
            k,
            vec![addr(losses), addr(logits), ids(targets)],
            &[("n", n), ("v", v), ("vp", vp)],
        );
        self.launch(k, geo::crossentropy_forward(n), args);
    }

    fn crossentropy_backward(
        &self,
        probs: &mut DeviceSlice,
        dlosses: &DeviceSlice,
        targets: &DeviceIds,
        n: usize,
        v: usize,
        vp: usize,
    ) {
        assert!(v <= vp);
        assert_eq!(probs.len(), n * vp);
        assert_eq!(dlosses.len(), n);
        assert_eq!(targets.len(), n);
        let k = "crossentropy_backward";
        let args = with_dims(
            k,
            vec![addr(probs), addr(dlosses), ids(targets)],
            &[("n", n), ("v", v), ("vp", vp)],
        );
        self.launch(k, geo::per_element_of(k, &[n, vp]), args);
    }
}
