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

// dweight (C,) += Σ_rows norm * dout; dbias (C,) += Σ_rows dout, rows in order.
// Geometry: one thread per channel, block 256, grid ceil(C / 256); each walks all N rows.
// Contract: the CPU's per-element additions in its row order, with the same saved mean and
// rstd: bitwise.
extern "C" __global__ void layernorm_backward_params(float* dweight, float* dbias,
                                                     const float* dout, const float* inp,
                                                     const float* mean, const float* rstd,
                                                     u32 n, u32 c) {
    u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= c) return;
    float dw = dweight[j], db = dbias[j];
    for (u64 row = 0; row < n; row++) {
        float g = dout[row * c + j];
        dw += (inp[row * c + j] - mean[row]) * rstd[row] * g;
        db += g;
    }
    dweight[j] = dw;
    dbias[j] = db;
}
