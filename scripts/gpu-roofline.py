#!/usr/bin/env python3
"""GPT-2 124M's training step on an H200, on paper: FLOPs and memory traffic per step for
today's CUDA design and for the changes that would reach 45% MFU (docs/gpu.md, "The route to
speed"). Nothing here is measured: every input is a constant below, stated with its source.

    python3 scripts/gpu-roofline.py            # B=16, T=1024
    python3 scripts/gpu-roofline.py --batch 32

The step time is modelled as the matrix products at an assumed fraction of the tensor-core
peak plus every other kernel at an assumed fraction of HBM bandwidth, one after the other (a
single stream, as the backend runs). Traffic is counted in elements read and written per
kernel, from the kernel list of docs/gpu.md.
"""
import argparse

# GPT-2 124M (llm.c's padded vocabulary).
L, C, NH, V, VP = 12, 768, 12, 50257, 50304
# H200 SXM: dense bf16 tensor-core peak and HBM3e bandwidth (NVIDIA's data sheet figures).
PEAK_BF16 = 989.4e12
HBM = 4.8e12
# Assumed efficiencies (not measured): the share of peak a kernel reaches.
HBM_SHARE = 0.8  # elementwise and reduction kernels
GEMM_SHARE_TODAY = 0.5  # fp32 operands on bf16 tensor cores (FAST_16BF), B attention calls
GEMM_SHARE_PLANNED = 0.7  # bf16 operands, cuBLASLt epilogues, flash attention


def params():
    """N as llm.c counts it (the script gpu-check.sh uses for MFU)."""
    return VP * C + 1024 * C + L * (12 * C * C + 13 * C) + 2 * C


def matmul_flops(b, t, causal_flash):
    """FLOPs of one step's matrix products, forward and backward (backward = 2x forward)."""
    n = b * t
    layers = 2 * n * 12 * C * C  # qkv, attention projection, MLP up and down
    attention = 4 * b * t * t * C  # q k^T and att v, the whole (T, T) square
    if causal_flash:
        # Only the causal half is computed; the backward recomputes q k^T (2.5x forward).
        attention_step = attention / 2 * (1 + 2.5)
    else:
        attention_step = attention * 3
    head = 2 * n * C * VP
    return L * (3 * layers + attention_step) + 3 * head


def traffic_today(b, t):
    """Bytes of one step's non-gemm and gemm-operand traffic, fp32, attention materialised.

    Per layer, in (N, C)-sized passes: forward 64 (layernorms 4, bias broadcast then the
    gemms' beta = 1 read and write 27, gemm inputs 7, head split, products and merge 12,
    GELU 8, residuals 6), backward 98 (the gemms' dY read for dX, dW and dbias, X read, dX
    written: 41; attention 25; GELU 12; layernorm input and parameter passes 10; residuals
    10); and over the (B, NH, T, T) scores, 4 passes forward and 7 backward. The head: 7
    passes over the (N, Vp) logits.
    """
    n = b * t
    per_layer = (64 + 98) * n * C + 11 * b * NH * t * t
    return 4 * (L * per_layer + 7 * n * VP)


def traffic_planned(b, t):
    """Bytes with bf16 activations, flash attention, fused bias/GELU/dbias epilogues and a
    fused classifier: forward 34 passes (layernorms 4, gemm inputs 7 and outputs 9, the
    GELU's saved pre-activation 4, flash attention 4, residuals 6), backward 64 (gemms 32, the
    dGELU epilogue's read 4, flash backward 8, layernorms 10, residuals 10); the head: 3
    passes over bf16 logits (written, read by the fused loss and gradient, read by dW)."""
    n = b * t
    per_layer = (34 + 64) * n * C
    return 2 * (L * per_layer + 3 * n * VP)


def design(name, flops, bytes_moved, gemm_share, b, t):
    gemm_s = flops / (PEAK_BF16 * gemm_share)
    mem_s = bytes_moved / (HBM * HBM_SHARE)
    step_s = gemm_s + mem_s
    tokens = b * t
    useful = tokens * (6 * params() + 6 * L * C * t)
    mfu = useful / step_s / PEAK_BF16
    print(f"| {name} | {flops / 1e12:.2f} | {gemm_s * 1e3:.1f} | {bytes_moved / 1e9:.0f} | "
          f"{mem_s * 1e3:.1f} | {step_s * 1e3:.1f} | {tokens / step_s / 1e3:.0f}k | "
          f"{100 * mfu:.0f}% |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    a = ap.parse_args()
    b, t = a.batch, a.seq
    useful = b * t * (6 * params() + 6 * L * C * t)
    print(f"GPT-2 124M (N = {params():,}), B = {b}, T = {t}: {useful / 1e12:.2f} TFLOP a step "
          f"by llm.c's count (6N + 6LCT a token); at 45% of {PEAK_BF16 / 1e12:.1f} TFLOP/s: "
          f"{useful / (0.45 * PEAK_BF16) * 1e3:.1f} ms")
    print("| design | gemm TFLOP | gemm ms | GB moved | memory ms | step ms | tokens/s | MFU |")
    print("|---|---|---|---|---|---|---|---|")
    design("today: fp32 activations, (T,T) scores", matmul_flops(b, t, False),
           traffic_today(b, t), GEMM_SHARE_TODAY, b, t)
    design("bf16, flash attention, fused epilogues", matmul_flops(b, t, True),
           traffic_planned(b, t), GEMM_SHARE_PLANNED, b, t)


if __name__ == "__main__":
    main()
