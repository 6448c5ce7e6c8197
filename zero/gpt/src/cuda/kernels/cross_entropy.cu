// Fused softmax + cross-entropy over the padded vocabulary, in place (CPU reference:
// kernels/cross_entropy.rs). Legend: N rows, V vocabulary, Vp padded vocabulary (V <= Vp).
// One (N,Vp) buffer holds logits, then probabilities, then d(logits); columns V..Vp are
// masked: probability 0, gradient 0, whatever they held.

// losses (N,) = -log softmax(logits[row, ..V])[target]; logits become probabilities.
// Geometry: one warp per row, block 128 (4 rows), grid ceil(N / 4).
// Contract: the maximum is exact in any order; the exponential sum repeats
// math::exp_shifted_sum (lanes 0..15 of the warp each keep one of its 16 running sums, lane
// 0 adds them in order and then the tail), so the probabilities are bitwise the CPU's. The
// loss uses CUDA's logf (1 ulp) where the CPU uses the platform's: tolerance 2 ulp of
// max + log(sum). A target >= V gives a NaN loss (the CPU panics); the row's probabilities
// are still written.
extern "C" __global__ void crossentropy_forward(float* losses, float* logits,
                                                const u32* targets, u32 n, u32 v, u32 vp) {
    u32 lane = threadIdx.x % 32;
    u64 row = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= n) return;
    float* x = logits + row * vp;
    float m = ZR_NEG_INF;
    for (u32 j = lane; j < v; j += 32) m = fmaxf(m, x[j]);
    m = zr_warp_max(m);
    u32 target = targets[row];
    // Read before the exponentials overwrite the row; the barrier also orders every lane's
    // reads of the row above before any lane's writes below.
    float target_logit = target < v ? x[target] : 0.0f;
    __syncwarp();
    u32 whole = v - v % 16;
    float acc = 0.0f;
    if (lane < 16) {
        for (u32 j = lane; j < whole; j += 16) {
            float e = zr_exp(x[j] - m);
            x[j] = e;
            acc += e;
        }
    }
    float sum = 0.0f;
    // Lanes 0..15 hand their running sums to lane 0, which adds them in lane order.
    float lanes[16];
#pragma unroll
    for (int i = 0; i < 16; i++) lanes[i] = __shfl_sync(0xffffffffu, acc, i);
    if (lane == 0) {
        float tail = 0.0f;
        for (u32 j = whole; j < v; j++) {
            float e = zr_exp(x[j] - m);
            x[j] = e;
            tail += e;
        }
        float s = -0.0f;
#pragma unroll
        for (int i = 0; i < 16; i++) s += lanes[i];
        sum = s + tail;
        losses[row] = target < v ? m + logf(sum) - target_logit : __int_as_float(0x7fc00000);
    }
    sum = __shfl_sync(0xffffffffu, sum, 0);
    __syncwarp();
    float inv = 1.0f / sum;
    for (u32 j = lane; j < v; j += 32) x[j] *= inv;
    for (u32 j = v + lane; j < vp; j += 32) x[j] = 0.0f;
}

// probs (N,Vp) become d(logits) = (probs - [j == target]) * dloss, padding 0.
// Geometry: one thread per element, block 256, grid ceil(N*Vp / 256).
// Contract: p * dl, then - dl at the target, as the CPU: bitwise. A target >= V leaves the
// row without the - dl term (the CPU panics).
extern "C" __global__ void crossentropy_backward(float* probs, const float* dlosses,
                                                 const u32* targets, u32 n, u32 v, u32 vp) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (u64)n * vp) return;
    u64 row = i / vp;
    u32 j = i % vp;
    if (j >= v) {
        probs[i] = 0.0f;
        return;
    }
    float dl = dlosses[row];
    float g = probs[i] * dl;
    if (j == targets[row]) g -= dl;
    probs[i] = g;
}
