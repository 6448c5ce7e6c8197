// The parts of the fully connected layer around cuBLAS's cublasGemmEx (CPU reference:
// kernels/matmul.rs). Legend: N rows, OC output channels.

// out (N,OC)[i, j] = bias[j]; the gemm then adds inp · weightᵀ with beta = 1, as the CPU
// copies the bias before its gemm.
// Geometry: one thread per element, block 256, grid ceil(N*OC / 256). Contract: a copy.
extern "C" __global__ void bias_broadcast(float* out, const float* bias, u32 n, u32 oc) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (u64)n * oc) out[i] = bias[i % oc];
}

// dbias (OC,) += Σ_rows dout (N,OC), rows in order.
// Geometry: one thread per column, block 256, grid ceil(OC / 256); each walks all N rows.
// Contract: the CPU adds row by row into dbias: the same order per element, bitwise.
extern "C" __global__ void bias_backward(float* dbias, const float* dout, u32 n, u32 oc) {
    u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= oc) return;
    float acc = dbias[j];
    for (u64 row = 0; row < n; row++) acc += dout[row * oc + j];
    dbias[j] = acc;
}
