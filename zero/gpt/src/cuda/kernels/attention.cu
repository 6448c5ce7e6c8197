// Causal multi-head self-attention (CPU reference: kernels/attention.rs).
// Legend: B batch, T sequence, C channels, NH heads, hs = C/NH.
// qkv (B,T,3C): q, k, v thirds per position, head h at columns h*hs..(h+1)*hs of each third.
// att (B,T,NH,T): softmax weights, zero above the diagonal (the CPU layout).
//
// These are the simple kernels: one thread per softmax row, every sum in the CPU's order, so
// the results are the CPU's bits; they trade speed (no tiling, no tensor cores) for that.

// out (B,T,C), att (B,T,NH,T) from qkv (B,T,3C).
// Geometry: one thread per (b, t, h) row, block 128, grid ceil(B*T*NH / 128).
// Contract: zr_dot16 and zr_exp repeat math::dot and math::exp, sums run left to right as on
// the CPU: bitwise.
extern "C" __global__ void attention_forward(float* out, float* att, const float* qkv, u32 b,
                                             u32 t, u32 c, u32 nh) {
    u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (u64)b * t * nh) return;
    u32 h = idx % nh;
    u64 row = idx / nh; // b*T + t
    u32 ti = row % t;
    u64 bi = row / t;
    u32 hs = c / nh;
    float scale = 1.0f / sqrtf((float)hs);
    const float* seq = qkv + bi * t * 3 * c;
    const float* q = seq + (u64)ti * 3 * c + h * hs;
    float* a = att + (row * nh + h) * t;
    float max = ZR_NEG_INF;
    for (u32 t2 = 0; t2 <= ti; t2++) {
        const float* k = seq + (u64)t2 * 3 * c + c + h * hs;
        float s = zr_dot16(q, 1, k, 1, hs) * scale;
        max = fmaxf(max, s);
        a[t2] = s;
    }
    float sum = 0.0f;
    for (u32 t2 = 0; t2 <= ti; t2++) {
        a[t2] = zr_exp(a[t2] - max);
        sum += a[t2];
    }
    float inv = 1.0f / sum;
    for (u32 t2 = 0; t2 <= ti; t2++) a[t2] *= inv;
    for (u32 t2 = ti + 1; t2 < t; t2++) a[t2] = 0.0f;
    float* o = out + row * c + h * hs;
    for (u32 j = 0; j < hs; j++) {
        float acc = 0.0f;
        for (u32 t2 = 0; t2 <= ti; t2++) acc += a[t2] * seq[(u64)t2 * 3 * c + 2 * c + h * hs + j];
        o[j] = acc;
    }
}

// dscore (B,NH,T,T) = d(pre-softmax score) * scale for every (b, h, ti) row, zero above the
// diagonal; the first half of the backward pass.
// Geometry: one thread per (b, h, ti), block 128, grid ceil(B*NH*T / 128). The row's
// d(att) is built in dscore itself before the softmax backward overwrites it.
// Contract: d(att)[t2] = zr_dot16(dout, v[t2]), the dot with the row's weights and
// w * (d - dot) * scale as the CPU computes them: bitwise.
extern "C" __global__ void attention_backward_scores(float* dscore, const float* dout,
                                                     const float* qkv, const float* att,
                                                     u32 b, u32 t, u32 c, u32 nh) {
    u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (u64)b * nh * t) return;
    u32 ti = idx % t;
    u32 h = (idx / t) % nh;
    u64 bi = idx / ((u64)t * nh);
    u32 hs = c / nh;
    float scale = 1.0f / sqrtf((float)hs);
    const float* seq = qkv + bi * t * 3 * c;
    const float* d = dout + (bi * t + ti) * c + h * hs;
    const float* a = att + ((bi * t + ti) * nh + h) * t;
    float* ds = dscore + idx * t;
    for (u32 t2 = 0; t2 <= ti; t2++) {
        const float* v = seq + (u64)t2 * 3 * c + 2 * c + h * hs;
        ds[t2] = zr_dot16(d, 1, v, 1, hs);
    }
    float dot = zr_dot16(a, 1, ds, 1, ti + 1);
    for (u32 t2 = 0; t2 <= ti; t2++) ds[t2] = a[t2] * (ds[t2] - dot) * scale;
    for (u32 t2 = ti + 1; t2 < t; t2++) ds[t2] = 0.0f;
}

// dqkv (B,T,3C) += d(q), d(k), d(v) from dscore; the second half of the backward pass.
// Geometry: one thread per (b, t, h, j) with j < hs, i.e. per element of a (B,T,C) array,
// block 256, grid ceil(B*T*C / 256).
// Contract: d(q)[t] = Σ_{t2<=t} ds[t][t2] k[t2] with t2 increasing; d(k)[t] =
// Σ_{ti>=t} ds[ti][t] q[ti] and d(v)[t] = Σ_{ti>=t} att[ti][t] dout[ti] with ti increasing,
// each from 0 and then added to dqkv once: the CPU's per-element order, bitwise.
extern "C" __global__ void attention_backward_qkv(float* dqkv, const float* dscore,
                                                  const float* dout, const float* qkv,
                                                  const float* att, u32 b, u32 t, u32 c,
                                                  u32 nh) {
    u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (u64)b * t * c) return;
    u32 col = idx % c; // h*hs + j
    u64 row = idx / c; // b*T + t
    u32 ti = row % t;
    u64 bi = row / t;
    u32 hs = c / nh;
    u32 h = col / hs;
    const float* seq = qkv + bi * t * 3 * c;
    const float* ds = dscore + (bi * nh + h) * t * t; // (T,T) of this (b, h)
    float dq = 0.0f, dk = 0.0f, dv = 0.0f;
    for (u32 t2 = 0; t2 <= ti; t2++) dq += ds[(u64)ti * t + t2] * seq[(u64)t2 * 3 * c + c + col];
    for (u32 t1 = ti; t1 < t; t1++) {
        float g = ds[(u64)t1 * t + ti];
        dk += g * seq[(u64)t1 * 3 * c + col];
        float w = att[((bi * t + t1) * nh + h) * t + ti];
        dv += w * dout[(bi * t + t1) * c + col];
    }
    float* dst = dqkv + row * 3 * c;
    dst[col] += dq;
    dst[c + col] += dk;
    dst[2 * c + col] += dv;
}
