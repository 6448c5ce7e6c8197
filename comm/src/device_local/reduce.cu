// Rank-order reduction of the device-local backend: dst[i] = op(src[0][i], ..., src[n-1][i]).
// Launch: 1-D grid of 256-thread blocks covering `elems` (grid-stride loop, so any grid
// size is correct). Numerical contract, bitwise that of comm's host reduction: widen each
// input to f32 in rank order, combine with IEEE round-to-nearest adds (__fadd_rn, never
// contracted) or fmaxf/fminf, divide by n with __fdiv_rn for avg, round once to the element
// type (bf16: round to nearest even as comm's f32_bits_to_bf16_bits; f16: cvt.rn).
// op: 0 sum, 1 avg, 2 max, 3 min. dst may equal a source: each element is read before it
// is written, and no thread touches another thread's element.

#define DEVICE_LOCAL_MAX_RANKS 16

struct Sources {
    unsigned long long ptr[DEVICE_LOCAL_MAX_RANKS];
};

__device__ __forceinline__ float bf16_to_f32(unsigned short x) {
    return __uint_as_float(((unsigned int)x) << 16);
}

__device__ __forceinline__ unsigned short f32_to_bf16(float v) {
    unsigned int bits = __float_as_uint(v);
    unsigned int rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    unsigned int quiet_nan = (bits >> 16) | 0x0040u;
    bool is_nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
    return (unsigned short)(is_nan ? quiet_nan : rounded);
}

__device__ __forceinline__ float f16_to_f32(unsigned short x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
}

__device__ __forceinline__ unsigned short f32_to_f16(float v) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
}

__device__ __forceinline__ float combine(float acc, float x, int op) {
    if (op == 2) return fmaxf(acc, x);
    if (op == 3) return fminf(acc, x);
    return __fadd_rn(acc, x);
}

#define DEVICE_LOCAL_REDUCE(NAME, T, LOAD, STORE)                                          \
extern "C" __global__ void NAME(T* dst, Sources srcs, unsigned int n_src,                 \
                                unsigned long long elems, int op) {                       \
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;               \
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; \
         i < elems; i += stride) {                                                         \
        float acc = LOAD(((const T*)srcs.ptr[0])[i]);                                      \
        for (unsigned int k = 1; k < n_src; ++k) {                                         \
            acc = combine(acc, LOAD(((const T*)srcs.ptr[k])[i]), op);                      \
        }                                                                                  \
        if (op == 1) acc = __fdiv_rn(acc, (float)n_src);                                   \
        dst[i] = STORE(acc);                                                               \
    }                                                                                      \
}

__device__ __forceinline__ float f32_id(float x) { return x; }

DEVICE_LOCAL_REDUCE(device_local_reduce_f32, float, f32_id, f32_id)
DEVICE_LOCAL_REDUCE(device_local_reduce_bf16, unsigned short, bf16_to_f32, f32_to_bf16)
DEVICE_LOCAL_REDUCE(device_local_reduce_f16, unsigned short, f16_to_f32, f32_to_f16)
