// Optimizer-side kernels over a flat shard: AdamW, squared-norm partial sums, the inf/NaN
// check of fp16 loss scaling, and the rank-order sum of the device-local backend.
// References: zero::optim::adamw (engine crate), zero::optim::clip::sum_of_squares.

// AdamW over one shard (fp32 master p, moments m, v, gradient g; all (n,)), the engine's
// update with its per-step constants computed on the host:
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g g;
//   p = p decay - step_size (m / (sqrt(v) inv_sqrt_bc2 + eps)).
// Geometry: one thread per element, block 256, grid ceil(n / 256).
// Contract: the engine's operations in its order: bitwise.
__device__ __forceinline__ float zr_adamw_element(float* p, float* m, float* v,
                                                  const float* g, u64 i, float b1, float b2,
                                                  float eps, float step_size,
                                                  float inv_sqrt_bc2, float decay) {
    float gi = g[i];
    float mi = b1 * m[i] + (1.0f - b1) * gi;
    float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float denom = sqrtf(vi) * inv_sqrt_bc2 + eps;
    float pi = p[i] * decay - step_size * (mi / denom);
    p[i] = pi;
    return pi;
}

extern "C" __global__ void adamw_update(float* p, float* m, float* v, const float* g, u64 n,
                                        float b1, float b2, float eps, float step_size,
                                        float inv_sqrt_bc2, float decay) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) zr_adamw_element(p, m, v, g, i, b1, b2, eps, step_size, inv_sqrt_bc2, decay);
}

// As adamw_update, and writes the new parameter rounded to bf16 (round to nearest even,
// NaN kept quiet) into half_copy (n,) as raw bits. Contract: the bits half::bf16::from_f32
// gives.
extern "C" __global__ void adamw_update_bf16(float* p, float* m, float* v, const float* g,
                                             u16* half_copy, u64 n, float b1, float b2,
                                             float eps, float step_size, float inv_sqrt_bc2,
                                             float decay) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float pi = zr_adamw_element(p, m, v, g, i, b1, b2, eps, step_size, inv_sqrt_bc2, decay);
    u32 bits = __float_as_uint(pi);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        half_copy[i] = (u16)((bits >> 16) | 0x0040u);
    } else {
        u32 rounding = 0x7fffu + ((bits >> 16) & 1u);
        half_copy[i] = (u16)((bits + rounding) >> 16);
    }
}

// As adamw_update, and writes the new parameter rounded to fp16 (the PTX conversion
// cvt.rn.f16.f32: round to nearest even, overflow to infinity) into half_copy (n,).
// Contract: the bits half::f16::from_f32 gives, NaN payloads aside.
extern "C" __global__ void adamw_update_f16(float* p, float* m, float* v, const float* g,
                                            u16* half_copy, u64 n, float b1, float b2,
                                            float eps, float step_size, float inv_sqrt_bc2,
                                            float decay) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float pi = zr_adamw_element(p, m, v, g, i, b1, b2, eps, step_size, inv_sqrt_bc2, decay);
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(pi));
    half_copy[i] = h;
}

// partials (gridDim.x,) = per-block Σ x[i]^2 in f64 over a grid-stride loop.
// Geometry: block 256 (a power of two: the tree below halves it), grid
// min(ceil(n / 256), 1024), shared memory 256 * 8 bytes. The host adds the partials in
// block order.
// Contract: f64 accumulation like sum_of_squares, in another order: relative 1e-12 of the
// CPU sum for inputs of one sign of magnitude; not bitwise.
extern "C" __global__ void sum_squares_partial(double* partials, const float* x, u64 n) {
    extern __shared__ double zr_partial[];
    double acc = 0.0;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        double xi = (double)x[i];
        acc += xi * xi;
    }
    zr_partial[threadIdx.x] = acc;
    __syncthreads();
    for (u32 stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) zr_partial[threadIdx.x] += zr_partial[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) partials[blockIdx.x] = zr_partial[0];
}

// *flag = 1 when some x[i] is infinite or NaN (the flag is zeroed by the caller; only 1 is
// ever written, so concurrent writers agree). Geometry: one thread per element, block 256,
// grid ceil(n / 256). Contract: exact.
extern "C" __global__ void nonfinite_check(u32* flag, const float* x, u64 n) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && (__float_as_uint(x[i]) & 0x7f800000u) == 0x7f800000u) *flag = 1u;
}

#define ZR_MAX_SUM_INPUTS 16

// Up to 16 input addresses, passed by value (kernel parameters may be 4 KiB).
struct zr_inputs {
    u64 ptr[ZR_MAX_SUM_INPUTS];
};

// out (n,) = ((in[0] + in[1]) + in[2]) + ... + in[k-1], inputs in rank order; out may be
// in[0] (the host chains more than 16 inputs that way, keeping the left fold).
// Geometry: one thread per element, block 256, grid ceil(n / 256).
// Contract: the left fold in rank order: bitwise with a CPU loop that adds in rank order.
extern "C" __global__ void sum_in_rank_order(float* out, zr_inputs inputs, u32 k, u64 n) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || k == 0) return;
    float acc = ((const float*)inputs.ptr[0])[i];
    for (u32 r = 1; r < k; r++) acc += ((const float*)inputs.ptr[r])[i];
    out[i] = acc;
}
