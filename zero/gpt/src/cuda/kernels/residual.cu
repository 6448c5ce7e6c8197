// Residual addition (CPU reference: kernels/residual.rs). Legend: N elements.

// out = inp1 + inp2. Geometry: one thread per element, block 256, grid ceil(N / 256).
// Contract: one f32 addition per element: bitwise.
extern "C" __global__ void residual_forward(float* out, const float* inp1, const float* inp2,
                                            u64 n) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = inp1[i] + inp2[i];
}

// dinp1 += dout; dinp2 += dout. Geometry as residual_forward. Contract: bitwise.
extern "C" __global__ void residual_backward(float* dinp1, float* dinp2, const float* dout,
                                             u64 n) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float d = dout[i];
        dinp1[i] += d;
        dinp2[i] += d;
    }
}
