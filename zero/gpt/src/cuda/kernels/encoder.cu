// Token + position embedding (CPU reference: kernels/encoder.rs).
// Legend: B batch, T sequence, C channels, N = B*T rows, Vp padded vocabulary.

// out (N,C)[row, j] = wte[tokens[row], j] + wpe[row % T, j].
// Geometry: 1-D, one thread per output element, block 256, grid ceil(N*C / 256).
// Contract: one f32 addition per element, as the CPU: bitwise. A token >= Vp reads out of
// bounds, as on the CPU (where it panics); callers validate tokens on the host.
extern "C" __global__ void encoder_forward(float* out, const u32* tokens, const float* wte,
                                           const float* wpe, u32 n, u32 t, u32 c) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (u64)n * c) return;
    u64 row = i / c, j = i % c;
    u64 tok = tokens[row];
    u64 pos = row % t;
    out[i] = wte[tok * c + j] + wpe[pos * c + j];
}

// dwpe (maxT,C)[pos, j] += dout[b*T + pos, j] for b = 0..B in order.
// Geometry: one thread per (pos, j) of the first T rows, block 256, grid ceil(T*C / 256).
// Contract: the CPU adds rows in row order, which visits b in increasing order for a fixed
// pos: the same additions in the same order, bitwise.
extern "C" __global__ void encoder_backward_wpe(float* dwpe, const float* dout, u32 b, u32 t,
                                                u32 c) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (u64)t * c) return;
    float acc = dwpe[i];
    for (u64 bi = 0; bi < b; bi++) acc += dout[bi * t * c + i];
    dwpe[i] = acc;
}

// dwte (Vp,C)[tokens[row], j] += dout[row, j] for row = 0..N in order.
// Geometry: one thread per channel j, block 256, grid ceil(C / 256); each thread walks all N
// rows. Chosen over atomics (whose order is not fixed) and over sorting tokens (more code):
// O(N) per thread is small beside the matmuls at GPT-2 shapes.
// Contract: per element the CPU's additions in the CPU's row order: bitwise.
extern "C" __global__ void encoder_backward_wte(float* dwte, const float* dout,
                                                const u32* tokens, u32 n, u32 c) {
    u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= c) return;
    for (u64 row = 0; row < n; row++) {
        u64 tok = tokens[row];
        dwte[tok * c + j] += dout[row * c + j];
    }
}
