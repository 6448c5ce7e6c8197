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

// dwte (Vp,C)[tokens[row], j] += dout[row, j] for row = 0..N in order, from the positions
// grouped by token on the host (cuda::token_groups: words = flag | positions (N) |
// slot_tokens (N) | offsets (U+1) | tokens (U)), in three launches:
// 1. encoder_backward_wte_check, one thread per slot, block 256, grid ceil(N / 256): sets
//    the flag when ids[positions[i]] != slot_tokens[i] (the ids changed since grouping).
// 2. encoder_backward_wte_grouped, one block of 256 per distinct token, threads over
//    channels: dwte[token, j] += that token's rows in increasing position order. Skipped
//    (every block returns) when the flag is set.
// 3. encoder_backward_wte, one thread per channel walking all N rows: runs only when the flag
//    is set, or unconditionally when flag is null (ids the backend never grouped).
// Contract: either path adds, per (token, j), the CPU's terms in the CPU's row order, with
// no atomics: bitwise. A token >= Vp writes out of bounds, as on the CPU (where it panics).
extern "C" __global__ void encoder_backward_wte_check(u32* words, const u32* tokens, u32 n) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const u32* positions = words + 1;
    const u32* slot_tokens = positions + n;
    if (tokens[positions[i]] != slot_tokens[i]) words[0] = 1; // the same value from all
}

extern "C" __global__ void encoder_backward_wte_grouped(float* dwte, const float* dout,
                                                        const u32* words, u32 n, u32 groups,
                                                        u32 c) {
    if (words[0] != 0 || blockIdx.x >= groups) return;
    const u32* positions = words + 1;
    const u32* offsets = words + 1 + 2 * (u64)n;
    const u32* tokens = offsets + groups + 1;
    u64 tok = tokens[blockIdx.x];
    u32 begin = offsets[blockIdx.x], end = offsets[blockIdx.x + 1];
    for (u64 j = threadIdx.x; j < c; j += blockDim.x) {
        float acc = dwte[tok * c + j];
        for (u32 i = begin; i < end; i++) acc += dout[(u64)positions[i] * c + j];
        dwte[tok * c + j] = acc;
    }
}

extern "C" __global__ void encoder_backward_wte(float* dwte, const float* dout,
                                                const u32* tokens, const u32* flag, u32 n,
                                                u32 c) {
    u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= c || (flag != 0 && *flag == 0)) return;
    for (u64 row = 0; row < n; row++) {
        u64 tok = tokens[row];
        dwte[tok * c + j] += dout[row * c + j];
    }
}
