// GELU, tanh approximation (CPU reference: kernels/gelu.rs). Legend: N elements.

#define ZR_GELU_S 0.7978846f
#define ZR_GELU_K 0.044715f

// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
// Geometry: one thread per element, block 256, grid ceil(N / 256).
// Contract: the CPU's operations in its order with zr_tanh = math::tanh: bitwise.
extern "C" __global__ void gelu_forward(float* out, const float* inp, u64 n) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = inp[i];
    float u = ZR_GELU_S * (x + ZR_GELU_K * x * x * x);
    out[i] = 0.5f * x * (1.0f + zr_tanh(u));
}

// dinp += gelu'(inp) dout. Geometry as gelu_forward. Contract: bitwise (as forward).
extern "C" __global__ void gelu_backward(float* dinp, const float* inp, const float* dout,
                                         u64 n) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = inp[i];
    float u = ZR_GELU_S * (x + ZR_GELU_K * x * x * x);
    float th = zr_tanh(u);
    float sech2 = 1.0f - th * th;
    float local = 0.5f * (1.0f + th)
        + 0.5f * x * sech2 * ZR_GELU_S * (1.0f + 3.0f * ZR_GELU_K * x * x);
    dinp[i] += local * dout[i];
}
