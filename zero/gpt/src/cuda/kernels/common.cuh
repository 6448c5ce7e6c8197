// Shared by every kernel source: the registry prepends this text to each .cu file before NVRTC
// compiles it (NVRTC sees no file system, so there is no #include).
//
// Numerical contract: every source is compiled with --fmad=false, IEEE division and square
// root, so a kernel that performs the CPU kernel's f32 operations in the CPU kernel's order
// produces the CPU kernel's bits. zr_exp, zr_tanh and zr_dot16 below repeat zero/gpt's
// kernels/math.rs operation for operation for that reason.

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

#define ZR_LOG2E 1.44269504088896340736f
#define ZR_LN2_HI 0.693359375f
#define ZR_LN2_LO (-2.12194440e-4f)
#define ZR_ROUND_MAGIC 12582912.0f
// -inf (NVRTC has no math.h, so no INFINITY macro).
#define ZR_NEG_INF __int_as_float(0xff800000)

// e^x as math::exp: clamp to [-87, 88], Cody-Waite reduction, Taylor series to r^7.
// Bitwise equal to the CPU for finite x (for NaN, fmaxf returns -87 where Rust's clamp keeps
// NaN; no kernel of the model feeds it NaN on purpose).
__device__ __forceinline__ float zr_exp(float x) {
    x = fminf(fmaxf(x, -87.0f), 88.0f);
    float shifted = x * ZR_LOG2E + ZR_ROUND_MAGIC;
    float n = shifted - ZR_ROUND_MAGIC;
    int n_int = __float_as_int(shifted) - __float_as_int(ZR_ROUND_MAGIC);
    float r = x - n * ZR_LN2_HI - n * ZR_LN2_LO;
    float p = 1.0f
        + r * (1.0f
            + r * (0.5f
                + r * (1.0f / 6.0f
                    + r * (1.0f / 24.0f
                        + r * (1.0f / 120.0f + r * (1.0f / 720.0f + r * (1.0f / 5040.0f)))))));
    float scale = __int_as_float((n_int + 127) << 23);
    return p * scale;
}

// tanh(x) = 1 - 2 / (e^{2x} + 1), as math::tanh.
__device__ __forceinline__ float zr_tanh(float x) {
    return 1.0f - 2.0f / (zr_exp(2.0f * x) + 1.0f);
}

// Σ a[i*sa] b[i*sb] for i < len in math::dot's order: 16 running lanes over whole chunks of
// 16, the remainder summed in order, then lanes 0..15 in order, then the remainder.
__device__ __forceinline__ float zr_dot16(const float* a, int sa, const float* b, int sb, int len) {
    float acc[16];
#pragma unroll
    for (int i = 0; i < 16; i++) acc[i] = 0.0f;
    int whole = len - len % 16;
    for (int base = 0; base < whole; base += 16) {
#pragma unroll
        for (int i = 0; i < 16; i++) acc[i] += a[(base + i) * sa] * b[(base + i) * sb];
    }
    float tail = -0.0f; // Rust's f32 Sum starts from -0.0
    for (int i = whole; i < len; i++) tail += a[i * sa] * b[i * sb];
    float s = -0.0f;
#pragma unroll
    for (int i = 0; i < 16; i++) s += acc[i];
    return s + tail;
}

__device__ __forceinline__ float zr_warp_sum(float x) {
    for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
    return x;
}

__device__ __forceinline__ float zr_warp_max(float x) {
    for (int off = 16; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
    return x;
}

// Column reductions (bias_backward, layernorm_backward_params): the first stage's block
// `k * col_blocks + cb` covers columns cb * 256 + threadIdx.x of row chunk k; each thread
// sums its column over rows [row0, row_end) in row order. Returns false for threads past the
// last column. geometry.rs's column_reduce computes the grid from the same rule.
__device__ __forceinline__ bool zr_column_chunk(u32 n, u32 cols, u32 chunk_rows, u64* col,
                                                u64* row0, u64* row_end, u64* chunk) {
    u64 col_blocks = ((u64)cols + blockDim.x - 1) / blockDim.x;
    *chunk = blockIdx.x / col_blocks;
    *col = (blockIdx.x % col_blocks) * blockDim.x + threadIdx.x;
    *row0 = *chunk * chunk_rows;
    u64 end = *row0 + chunk_rows;
    *row_end = end < n ? end : n;
    return *col < cols;
}

// The second stage: Σ_k partials[k * cols + col] for k = 0..chunks in chunk order, from 0.
__device__ __forceinline__ float zr_sum_chunks(const float* partials, u32 chunks, u32 cols,
                                               u64 col) {
    float s = 0.0f;
    for (u64 k = 0; k < chunks; k++) s += partials[k * cols + col];
    return s;
}
