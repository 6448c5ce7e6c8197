// The parts of the fully connected layer around cuBLAS's cublasGemmEx (CPU reference:
// kernels/matmul.rs). Legend: N rows, OC output channels.

// out (N,OC)[i, j] = bias[j]; the gemm then adds inp · weightᵀ with beta = 1, as the CPU
// copies the bias before its gemm.
// Geometry: one thread per element, block 256, grid ceil(N*OC / 256). Contract: a copy.
extern "C" __global__ void bias_broadcast(float* out, const float* bias, u32 n, u32 oc) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (u64)n * oc) out[i] = bias[i % oc];
}

// dbias (OC,) += Σ_rows dout (N,OC), in two stages (no atomics, so the order is fixed):
// bias_backward_partials writes partials (chunks, OC): the column sums of each chunk of
// chunk_rows rows, each from 0 in row order; bias_backward_finish adds, per column, the
// partials in chunk order (from 0) and adds that total into dbias.
// Geometry: geometry.rs's column_reduce: stage 1 ceil(OC / 256) * chunks blocks of 256 (a
// warp reads 32 adjacent columns of a row: coalesced), stage 2 one thread per column.
// Contract: the CPU adds the N rows one by one into dbias; this is the chunked order, the
// same bits as its CPU emulation (cuda::column_sums), within 1e-5 * (|dbias| + Σ|dout|) of
// the CPU kernel; deterministic from run to run.
extern "C" __global__ void bias_backward_partials(float* partials, const float* dout, u32 n,
                                                  u32 oc, u32 chunk_rows) {
    u64 j, row0, row_end, chunk;
    if (!zr_column_chunk(n, oc, chunk_rows, &j, &row0, &row_end, &chunk)) return;
    float acc = 0.0f;
    for (u64 row = row0; row < row_end; row++) acc += dout[row * oc + j];
    partials[chunk * oc + j] = acc;
}

extern "C" __global__ void bias_backward_finish(float* dbias, const float* partials, u32 chunks,
                                                u32 oc) {
    u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= oc) return;
    dbias[j] += zr_sum_chunks(partials, chunks, oc, j);
}
