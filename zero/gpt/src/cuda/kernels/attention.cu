// Causal multi-head self-attention around cuBLAS batched products (CPU reference:
// kernels/attention.rs; the products and the scratch layout: cuda/attention_gemm.rs).
// Legend: B batch, T sequence, C channels, NH heads, hs = C/NH.
// qkv (B,T,3,NH,hs) = (B,T,3C); att (B,T,NH,T): softmax weights, zero above the diagonal.
// The scratch holds (B,NH,T,hs) regions (q, k, v, y, dq, dk, dv) and the backward's
// (B,NH,T,T) d(att) / d(score) region.
//
// Forward: split qkv into q, k, v; att = q kᵀ (cuBLAS, into att in place);
// attention_softmax_forward (in place); y = att v (cuBLAS); merge y into out.
// Backward: split qkv, and dout into y; dv = attᵀ dy (cuBLAS, att read in place);
// scores = dy vᵀ; attention_softmax_backward; dq = scores k; dk = scoresᵀ q (cuBLAS); merge
// dq, dk, dv into dqkv, adding.

// dst (W,B,NH,T,hs) from src (B,T,W,NH,hs): W = 3 splits qkv into q, k, v; W = 1 splits
// dout into per-(b, h) matrices.
// Geometry: one thread per element of src, block 256, grid ceil(B*T*W*NH*hs / 256).
// Contract: a copy (bitwise).
extern "C" __global__ void attention_split_heads(float* dst, const float* src, u32 b, u32 t,
                                                 u32 w, u32 nh, u32 hs) {
    u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (u64)b * t * w * nh * hs) return;
    u32 j = idx % hs;
    u64 r = idx / hs;
    u32 h = r % nh;
    r /= nh;
    u32 wi = r % w;
    r /= w;
    u32 ti = r % t;
    u64 bi = r / t;
    dst[((((u64)wi * b + bi) * nh + h) * t + ti) * hs + j] = src[idx];
}

// dst (B,T,W,NH,hs) = src (W,B,NH,T,hs), or += when `accumulate` is non-zero: the inverse
// of attention_split_heads (y into out with W = 1; dq, dk, dv into dqkv with W = 3).
// Geometry: one thread per element of dst, block 256, grid ceil(B*T*W*NH*hs / 256).
// Contract: a copy, or one f32 addition per element (bitwise given src).
extern "C" __global__ void attention_merge_heads(float* dst, const float* src, u32 b, u32 t,
                                                 u32 w, u32 nh, u32 hs, u32 accumulate) {
    u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (u64)b * t * w * nh * hs) return;
    u32 j = idx % hs;
    u64 r = idx / hs;
    u32 h = r % nh;
    r /= nh;
    u32 wi = r % w;
    r /= w;
    u32 ti = r % t;
    u64 bi = r / t;
    float v = src[((((u64)wi * b + bi) * nh + h) * t + ti) * hs + j];
    dst[idx] = accumulate ? dst[idx] + v : v;
}

// att (B,T,NH,T) holds q·k for every (b, ti, h, t2); each row (b, ti, h) becomes, in place,
// its softmax over t2 <= ti of q·k * scale (scale = 1/sqrt(hs), as the CPU), zero for
// t2 > ti. Each element is stored once: the exponentials are recomputed in the last pass
// (zr_exp is deterministic) rather than stored between passes.
// Geometry: one warp per (b, ti, h) row, 8 rows per 256-thread block, grid
// ceil(B*T*NH / 8); lane l handles t2 = l, l + 32, ... and reads only what it writes.
// Contract: zr_exp as the CPU's math::exp, max and sum by warp shuffles (another order than
// the CPU's left-to-right sum): att within 1e-6 absolute of the CPU for the q·k given.
extern "C" __global__ void attention_softmax_forward(float* att, u32 b, u32 t, u32 nh,
                                                     u32 hs) {
    u32 lane = threadIdx.x % 32;
    u64 row = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= (u64)b * t * nh) return; // whole warps leave together
    u32 ti = (row / nh) % t;
    float scale = 1.0f / sqrtf((float)hs);
    float* a = att + row * t;
    float max = ZR_NEG_INF;
    for (u32 t2 = lane; t2 <= ti; t2 += 32) max = fmaxf(max, a[t2] * scale);
    max = zr_warp_max(max);
    float sum = 0.0f;
    for (u32 t2 = lane; t2 <= ti; t2 += 32) sum += zr_exp(a[t2] * scale - max);
    float inv = 1.0f / zr_warp_sum(sum);
    for (u32 t2 = lane; t2 < t; t2 += 32) {
        a[t2] = t2 <= ti ? zr_exp(a[t2] * scale - max) * inv : 0.0f;
    }
}

// scores (B,NH,T,T) holds d(att) = dy·v for every (b, h, ti, t2); each row becomes the
// gradient of q·k: att (d(att) - Σ_{t2<=ti} att d(att)) * scale for t2 <= ti, zero above,
// with att read in its (B,T,NH,T) layout.
// Geometry: as attention_softmax_forward.
// Contract: the CPU's formula, its sum by warp shuffles: 1e-6 absolute for the d(att) given.
extern "C" __global__ void attention_softmax_backward(float* scores, const float* att, u32 b,
                                                      u32 t, u32 nh, u32 hs) {
    u32 lane = threadIdx.x % 32;
    u64 row = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= (u64)b * nh * t) return;
    u32 ti = row % t;
    u64 pair = row / t;
    u32 h = pair % nh;
    u64 bi = pair / nh;
    float scale = 1.0f / sqrtf((float)hs);
    float* d = scores + row * t;
    const float* a = att + ((bi * t + ti) * nh + h) * t;
    float dot = 0.0f;
    for (u32 t2 = lane; t2 <= ti; t2 += 32) dot += a[t2] * d[t2];
    dot = zr_warp_sum(dot);
    for (u32 t2 = lane; t2 < t; t2 += 32) d[t2] = t2 <= ti ? a[t2] * (d[t2] - dot) * scale : 0.0f;
}
