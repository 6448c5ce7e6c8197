// LayerNorm over channels (CPU reference: kernels/layernorm.rs). Legend: N rows, C channels.

#define ZR_LN_EPS 1e-5f

// out (N,C), mean (N,), rstd (N,) from inp (N,C), weight (C,), bias (C,).
// Geometry: one warp per row, block 256 (8 rows), grid ceil(N / 8).
// Contract: mean and variance are warp-shuffle sums (32 strided partial sums combined in a
// butterfly) where the CPU sums left to right: tolerance 1e-5 relative on mean and rstd,
// 1e-4 absolute on out for inputs of order 1; not bitwise.
extern "C" __global__ void layernorm_forward(float* out, float* mean, float* rstd,
                                             const float* inp, const float* weight,
                                             const float* bias, u32 n, u32 c) {
    u32 lane = threadIdx.x % 32;
    u64 row = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= n) return;
    const float* x = inp + row * c;
    float sum = 0.0f;
    for (u32 j = lane; j < c; j += 32) sum += x[j];
    float mu = zr_warp_sum(sum) / (float)c;
    float sq = 0.0f;
    for (u32 j = lane; j < c; j += 32) {
        float d = x[j] - mu;
        sq += d * d;
    }
    float var = zr_warp_sum(sq) / (float)c;
    float s = 1.0f / sqrtf(var + ZR_LN_EPS);
    float* o = out + row * c;
    for (u32 j = lane; j < c; j += 32) o[j] = (x[j] - mu) * s * weight[j] + bias[j];
    if (lane == 0) {
        mean[row] = mu;
        rstd[row] = s;
    }
}

// dinp (N,C) += LayerNorm backward, given the saved mean and rstd.
// Geometry: one warp per row, block 256 (8 rows), grid ceil(N / 8).
// Contract: the two row means are warp-shuffle sums: tolerance 1e-4 absolute for inputs of
// order 1; not bitwise. dweight and dbias come from layernorm_backward_params.
extern "C" __global__ void layernorm_backward_input(float* dinp, const float* dout,
                                                    const float* inp, const float* weight,
                                                    const float* mean, const float* rstd,
                                                    u32 n, u32 c) {
    u32 lane = threadIdx.x % 32;
    u64 row = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= n) return;
    const float* d = dout + row * c;
    const float* x = inp + row * c;
    float mu = mean[row], s = rstd[row];
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (u32 j = lane; j < c; j += 32) {
        float norm = (x[j] - mu) * s;
        float gw = d[j] * weight[j];
        dnorm_mean += gw;
        dnorm_norm_mean += gw * norm;
    }
    dnorm_mean = zr_warp_sum(dnorm_mean) / (float)c;
    dnorm_norm_mean = zr_warp_sum(dnorm_norm_mean) / (float)c;
    float* di = dinp + row * c;
    for (u32 j = lane; j < c; j += 32) {
        float norm = (x[j] - mu) * s;
        di[j] += (d[j] * weight[j] - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
}

// dweight (C,) += Σ_rows norm * dout; dbias (C,) += Σ_rows dout, in two stages as
// bias_backward (matmul.cu): layernorm_backward_params_partials writes partials (2, chunks, C)
// (dweight's, then dbias's), each chunk's column sums from 0 in row order, with the CPU's
// term (inp - mean) * rstd * dout; layernorm_backward_params_finish adds per channel the
// partials in chunk order and that total into dweight and dbias.
// Geometry: geometry.rs's column_reduce (stage 1 ceil(C / 256) * chunks blocks of 256, stage
// 2 one thread per channel).
// Contract: with the same saved mean and rstd, the same bits as the CPU emulation of the
// chunked order (cuda::column_sums), within 1e-5 * (|initial| + Σ|term|) of the CPU kernel;
// deterministic from run to run.
extern "C" __global__ void layernorm_backward_params_partials(float* partials,
                                                              const float* dout,
                                                              const float* inp,
                                                              const float* mean,
                                                              const float* rstd, u32 n, u32 c,
                                                              u32 chunk_rows) {
    u64 j, row0, row_end, chunk;
    if (!zr_column_chunk(n, c, chunk_rows, &j, &row0, &row_end, &chunk)) return;
    float dw = 0.0f, db = 0.0f;
    for (u64 row = row0; row < row_end; row++) {
        float g = dout[row * c + j];
        dw += (inp[row * c + j] - mean[row]) * rstd[row] * g;
        db += g;
    }
    u64 chunks = ((u64)n + chunk_rows - 1) / chunk_rows;
    partials[chunk * c + j] = dw;
    partials[(chunks + chunk) * c + j] = db;
}

extern "C" __global__ void layernorm_backward_params_finish(float* dweight, float* dbias,
                                                            const float* partials, u32 chunks,
                                                            u32 c) {
    u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= c) return;
    dweight[j] += zr_sum_chunks(partials, chunks, c, j);
    dbias[j] += zr_sum_chunks(partials + (u64)chunks * c, chunks, c, j);
}
