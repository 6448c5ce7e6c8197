// The engine's passes over model-state bytes (zero::kernels::CudaKernels), one NVRTC program.
// Reference: zero::kernels::HostKernels (zero/engine/src/kernels/host.rs).
//
// Compiled with --fmad=false, IEEE division and square root and denormals kept, so a kernel
// that performs the host's f32 operations in the host's order gives the host's bits.
//
// Geometry of every kernel: a grid-stride loop, block ZE_BLOCK threads, grid
// min(ceil(n / ZE_BLOCK), cap) blocks (cap: 8192, or 1024 for add_squares_partial_*), so
// any n is covered whatever the grid. Storage types: f32, bf16 and f16 kept as raw 16-bit
// words; one kernel per type, named with the suffix _f32, _bf16 or _f16.

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

#define ZE_BLOCK 256

#define ZE_FOR_EACH(i, n) \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (u64)gridDim.x * blockDim.x)

// Widening is exact for every type.
__device__ __forceinline__ float ze_load_f32(float x) { return x; }
__device__ __forceinline__ float ze_load_bf16(u16 x) { return __uint_as_float((u32)x << 16); }
__device__ __forceinline__ float ze_load_f16(u16 x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
}

__device__ __forceinline__ float ze_store_f32(float x) { return x; }
// half::bf16::from_f32: round to nearest even; a NaN stays NaN with its quiet bit set.
__device__ __forceinline__ u16 ze_store_bf16(float x) {
    u32 bits = __float_as_uint(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (u16)((bits >> 16) | 0x0040u);
    return (u16)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}
// half::f16::from_f32: round to nearest even, overflow to infinity (NaN payloads aside).
__device__ __forceinline__ u16 ze_store_f16(float x) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}

// Per storage type T (suffix S):
//   widen_S:      dst[i] = f32(src[i]), times factor when factor != 1.
//   narrow_S:     dst[i] = round(src[i] * factor), the product skipped when factor == 1.
//   accumulate_S: acc[i] = round(f32(acc[i]) + f32(x[i])); *flag = 1 when some stored acc[i]
//                 is inf or NaN (the caller zeroes the flag; only 1 is written, so writers
//                 agree).
//   add_squares_partial_S: partials[block] = sum of f64(f32(x[i]) * factor)^2 over the
//                 block's elements (grid-stride, then a tree over ZE_BLOCK threads in shared
//                 memory); the host adds the partials in block order.
//   adamw_scale_S: scratch[i] = f32(grads[i]) * grad_factor * clip_coef, in that order.
#define ZE_STORAGE_KERNELS(T, S)                                                              \
    extern "C" __global__ void widen_##S(float* dst, const T* src, u64 n, float factor) {     \
        ZE_FOR_EACH(i, n) {                                                                   \
            float x = ze_load_##S(src[i]);                                                    \
            dst[i] = factor != 1.0f ? x * factor : x;                                         \
        }                                                                                     \
    }                                                                                         \
    extern "C" __global__ void narrow_##S(T* dst, const float* src, u64 n, float factor) {    \
        ZE_FOR_EACH(i, n) {                                                                   \
            float x = src[i];                                                                 \
            dst[i] = ze_store_##S(factor != 1.0f ? x * factor : x);                           \
        }                                                                                     \
    }                                                                                         \
    extern "C" __global__ void accumulate_##S(T* acc, const T* x, u32* flag, u64 n) {         \
        ZE_FOR_EACH(i, n) {                                                                   \
            T sum = ze_store_##S(ze_load_##S(acc[i]) + ze_load_##S(x[i]));                    \
            if ((__float_as_uint(ze_load_##S(sum)) & 0x7f800000u) == 0x7f800000u) *flag = 1u; \
            acc[i] = sum;                                                                     \
        }                                                                                     \
    }                                                                                         \
    extern "C" __global__ void add_squares_partial_##S(double* partials, const T* x, u64 n,   \
                                                       float factor) {                        \
        __shared__ double part[ZE_BLOCK];                                                     \
        double acc = 0.0;                                                                     \
        ZE_FOR_EACH(i, n) {                                                                   \
            double xi = (double)(ze_load_##S(x[i]) * factor);                                 \
            acc += xi * xi;                                                                   \
        }                                                                                     \
        part[threadIdx.x] = acc;                                                              \
        __syncthreads();                                                                      \
        for (u32 stride = ZE_BLOCK / 2; stride > 0; stride >>= 1) {                           \
            if (threadIdx.x < stride) part[threadIdx.x] += part[threadIdx.x + stride];        \
            __syncthreads();                                                                  \
        }                                                                                     \
        if (threadIdx.x == 0) partials[blockIdx.x] = part[0];                                 \
    }                                                                                         \
    extern "C" __global__ void adamw_scale_##S(float* scratch, const T* grads, u64 n,         \
                                               float grad_factor, float clip_coef) {          \
        ZE_FOR_EACH(i, n) { scratch[i] = ze_load_##S(grads[i]) * grad_factor * clip_coef; }   \
    }

ZE_STORAGE_KERNELS(float, f32)
ZE_STORAGE_KERNELS(u16, bf16)
ZE_STORAGE_KERNELS(u16, f16)

// AdamW over one decay segment's part of a shard (f32 weights p, moments m, v, gradients g;
// all (n,)), zero::optim::AdamW's per-element arithmetic in its order, with the step's
// constants computed on the host by AdamW::step_constants:
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g g;
//   p = p decay - step_size (m / (sqrt(v) inv_sqrt_bc2 + eps)).
// Contract: bitwise.
extern "C" __global__ void adamw_update(float* p, float* m, float* v, const float* g, u64 n,
                                        float b1, float b2, float eps, float step_size,
                                        float inv_sqrt_bc2, float decay) {
    ZE_FOR_EACH(i, n) {
        float gi = g[i];
        float mi = b1 * m[i] + (1.0f - b1) * gi;
        float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi) * inv_sqrt_bc2 + eps;
        p[i] = p[i] * decay - step_size * (mi / denom);
    }
}
