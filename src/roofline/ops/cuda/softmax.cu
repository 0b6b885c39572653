// softmax forward over the last dimension in CUDA C++: the hand-written entry of the classic comparison.
//
// One thread block per row. Pass 1: every thread walks the row in 16-byte packs (strided by the block, so
// each load is coalesced across a warp) keeping a running max m and a sum s of exp(x - m), rescaled when m
// grows (the online softmax); the (m, s) pairs are merged across the warp with shuffles, then across warps
// through shared memory. Pass 2 reads the row again (mostly from L2: the row was just read) and writes
// exp(x - m) / s. Math in fp32. Rows whose start is not 16-byte aligned take one element per access.
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <cmath>

#include "common.cuh"

namespace {
using namespace roofline;

struct MaxSum {
  float m, s;
};

// The pair for the union of two sets of elements. A side that has seen only -inf contributes nothing
// (and exp(-inf - -inf) must not turn into nan).
__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};
  return {m, a.s * __expf(a.m - m) + b.s * __expf(b.m - m)};
}

__device__ __forceinline__ void add(MaxSum& acc, float v) {
  if (v > acc.m) {
    acc.s = acc.s * __expf(acc.m - v) + 1.0f;
    acc.m = v;
  } else if (v != -INFINITY) {   // -inf adds nothing (and exp(-inf - -inf) would be nan); nan gets through
    acc.s += __expf(v - acc.m);
  }
}

__device__ MaxSum block_merge(MaxSum v) {
  __shared__ MaxSum per_warp[32];
  for (int offset = 16; offset > 0; offset >>= 1) {
    MaxSum other{__shfl_xor_sync(0xffffffff, v.m, offset), __shfl_xor_sync(0xffffffff, v.s, offset)};
    v = merge(v, other);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0) per_warp[warp] = v;
  __syncthreads();
  v = lane < warps ? per_warp[lane] : MaxSum{-INFINITY, 0.0f};
  for (int offset = 16; offset > 0; offset >>= 1) {
    MaxSum other{__shfl_xor_sync(0xffffffff, v.m, offset), __shfl_xor_sync(0xffffffff, v.s, offset)};
    v = merge(v, other);
  }
  return v;   // every thread holds the row's pair
}

template <typename T, int VEC>
__global__ void softmax_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  using P = Pack<T, VEC>;
  const T* row = x + static_cast<int64_t>(blockIdx.x) * n;
  T* out = y + static_cast<int64_t>(blockIdx.x) * n;
  const int64_t packs = n / VEC;
  MaxSum acc{-INFINITY, 0.0f};
  for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
    const P p = reinterpret_cast<const P*>(row)[i];
#pragma unroll
    for (int k = 0; k < VEC; ++k) add(acc, to_float(p.v[k]));
  }
  for (int64_t i = packs * VEC + threadIdx.x; i < n; i += blockDim.x) add(acc, to_float(row[i]));
  const MaxSum total = block_merge(acc);
  const float inv = 1.0f / total.s;
  for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
    P p = reinterpret_cast<const P*>(row)[i];
#pragma unroll
    for (int k = 0; k < VEC; ++k) p.v[k] = from_float<T>(__expf(to_float(p.v[k]) - total.m) * inv);
    reinterpret_cast<P*>(out)[i] = p;
  }
  for (int64_t i = packs * VEC + threadIdx.x; i < n; i += blockDim.x) {
    out[i] = from_float<T>(__expf(to_float(row[i]) - total.m) * inv);
  }
}

template <typename T>
void dispatch(const torch::Tensor& x, torch::Tensor& y) {
  const int64_t n = x.size(-1), rows = x.numel() / n;
  const T* xp = reinterpret_cast<const T*>(x.data_ptr());
  T* yp = reinterpret_cast<T*>(y.data_ptr());
  constexpr int vec = 16 / sizeof(T);
  // Every row starts 16-byte aligned when the base pointers are and a row is a whole number of packs.
  const bool aligned = n % vec == 0 && (reinterpret_cast<uintptr_t>(xp) | reinterpret_cast<uintptr_t>(yp)) % 16 == 0;
  // Enough threads for about four packs each, between one warp and 1024.
  const int64_t want = (n / (aligned ? vec : 1) + 3) / 4;
  const int threads = static_cast<int>(std::min<int64_t>(1024, std::max<int64_t>(32, (want + 31) / 32 * 32)));
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (aligned) {
    softmax_kernel<T, vec><<<rows, threads, 0, stream>>>(xp, yp, n);
  } else {
    softmax_kernel<T, 1><<<rows, threads, 0, stream>>>(xp, yp, n);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

// Arguments are validated in Python (roofline.ops.softmax) before this is called;
// these checks only guard against calls that bypass it.
torch::Tensor softmax_forward(torch::Tensor x) {
  TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.dim() >= 1, "softmax_forward: x must be a contiguous CUDA tensor");
  auto y = torch::empty_like(x);
  if (x.numel() == 0) return y;
  TORCH_CHECK(x.numel() / x.size(-1) <= 2147483647LL, "softmax_forward: more than 2^31 - 1 rows");
  const c10::cuda::CUDAGuard guard(x.device());
  switch (x.scalar_type()) {
    case at::kFloat: dispatch<float>(x, y); break;
    case at::kHalf: dispatch<__half>(x, y); break;
    case at::kBFloat16: dispatch<__nv_bfloat16>(x, y); break;
    default: TORCH_CHECK(false, "softmax_forward: x must be float32, float16 or bfloat16");
  }
  return y;
}
