// Stand-alone attention-state merging on the GPU (base-2 lse, the empty-state rule), for any
// head_dim and K states per row: merge_state_inplace, merge_states, merge_states_sum,
// exported through TVM-FFI for fp32, fp16 and bf16 states.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "ffi_glue.h"

namespace attngen {
namespace {

constexpr float kNegInfM = -INFINITY;

template <class T> __device__ __forceinline__ float ld(const T* p) { return float(*p); }
template <> __device__ __forceinline__ float ld(const half* p) { return __half2float(*p); }
template <> __device__ __forceinline__ float ld(const __nv_bfloat16* p) { return __bfloat162float(*p); }
template <class T> __device__ __forceinline__ T cvt(float x) { return T(x); }
template <> __device__ __forceinline__ half cvt(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 cvt(float x) { return __float2bfloat16_rn(x); }

// grid (n * H), block threads over D; v [n, K, H, D], s [n, K, H] -> vm [n, H, D], sm [n, H]
template <class T, bool Sum>
__global__ void merge_states_kernel(const T* v, const float* s, T* vm, float* sm, int K, int H, int D) {
  const int row = blockIdx.x, n = row / H, h = row % H;
  // exponent base: the largest lse, 0 when every state is empty (so that 2^(-inf - base) = 0, not NaN);
  // a NaN lse keeps its weight 2^NaN = NaN whatever fmaxf made of it: the merged row is NaN, O and lse
  float m = kNegInfM;
  if constexpr (!Sum)
    for (int k = 0; k < K; ++k) m = fmaxf(m, s[(int64_t(n) * K + k) * H + h]);
  const float base = m == kNegInfM ? 0.f : m;
  float tot = 0.f;
  if constexpr (!Sum)
    for (int k = 0; k < K; ++k) tot += exp2f(s[(int64_t(n) * K + k) * H + h] - base);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.f;
    for (int k = 0; k < K; ++k) {
      const float x = ld(v + ((int64_t(n) * K + k) * H + h) * D + d);
      if constexpr (Sum) {
        acc += x;
      } else {
        acc += exp2f(s[(int64_t(n) * K + k) * H + h] - base) * x;
      }
    }
    vm[(int64_t(n) * H + h) * D + d] = cvt<T>(Sum ? acc : (tot == 0.f ? 0.f : acc / tot));
  }
  if constexpr (!Sum)
    if (threadIdx.x == 0) sm[int64_t(n) * H + h] = tot == 0.f ? kNegInfM : m + log2f(tot);
}

// in place: (v, s) <- merge((v, s), (vo, so)); v [n, H, D]
template <class T>
__global__ void merge_state_inplace_kernel(T* v, float* s, const T* vo, const float* so, int H, int D) {
  const int row = blockIdx.x;
  const float sa = s[row], sb = so[row];
  const float m = fmaxf(sa, sb);
  const float base = m == kNegInfM ? 0.f : m;  // as in merge_states_kernel: empty weighs 0, NaN stays NaN
  const float wa = exp2f(sa - base), wb = exp2f(sb - base), tot = wa + wb;
  const bool empty = tot == 0.f;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    const int64_t i = int64_t(row) * D + d;
    v[i] = cvt<T>(empty ? 0.f : (ld(v + i) * wa + ld(vo + i) * wb) / tot);
  }
  __syncthreads();  // every thread has read s[row] before it changes
  if (threadIdx.x == 0) s[row] = empty ? kNegInfM : m + log2f(tot);
}

int threads_for(int D) { return D >= 256 ? 256 : (D >= 128 ? 128 : 64); }

template <class T>
void merge_states_ffi(tvm::ffi::TensorView v, tvm::ffi::TensorView s, tvm::ffi::TensorView vm,
                      tvm::ffi::TensorView sm) {
  const int n = int(v.size(0)), K = int(v.size(1)), H = int(v.size(2)), D = int(v.size(3));
  if (n * H == 0) return;
  merge_states_kernel<T, false><<<n * H, threads_for(D), 0, stream_of(v)>>>(
      static_cast<const T*>(data_of(v)), static_cast<const float*>(data_of(s)), static_cast<T*>(data_of(vm)),
      static_cast<float*>(data_of(sm)), K, H, D);
  check_launch("merge_states");
}

template <class T>
void merge_states_sum_ffi(tvm::ffi::TensorView v, tvm::ffi::TensorView vm) {
  const int n = int(v.size(0)), K = int(v.size(1)), H = int(v.size(2)), D = int(v.size(3));
  if (n * H == 0) return;
  merge_states_kernel<T, true><<<n * H, threads_for(D), 0, stream_of(v)>>>(
      static_cast<const T*>(data_of(v)), nullptr, static_cast<T*>(data_of(vm)), nullptr, K, H, D);
  check_launch("merge_states_sum");
}

template <class T>
void merge_state_inplace_ffi(tvm::ffi::TensorView v, tvm::ffi::TensorView s, tvm::ffi::TensorView vo,
                             tvm::ffi::TensorView so) {
  const int n = int(v.size(0)), H = int(v.size(1)), D = int(v.size(2));
  if (n * H == 0) return;
  merge_state_inplace_kernel<T><<<n * H, threads_for(D), 0, stream_of(v)>>>(
      static_cast<T*>(data_of(v)), static_cast<float*>(data_of(s)), static_cast<const T*>(data_of(vo)),
      static_cast<const float*>(data_of(so)), H, D);
  check_launch("merge_state_inplace");
}

}  // namespace
}  // namespace attngen

ATTNGEN_EXPORT_TYPED_FUNC(merge_states_f32, attngen::merge_states_ffi<float>);
ATTNGEN_EXPORT_TYPED_FUNC(merge_states_f16, attngen::merge_states_ffi<half>);
ATTNGEN_EXPORT_TYPED_FUNC(merge_states_bf16, attngen::merge_states_ffi<__nv_bfloat16>);
ATTNGEN_EXPORT_TYPED_FUNC(merge_states_sum_f32, attngen::merge_states_sum_ffi<float>);
ATTNGEN_EXPORT_TYPED_FUNC(merge_states_sum_f16, attngen::merge_states_sum_ffi<half>);
ATTNGEN_EXPORT_TYPED_FUNC(merge_states_sum_bf16, attngen::merge_states_sum_ffi<__nv_bfloat16>);
ATTNGEN_EXPORT_TYPED_FUNC(merge_state_inplace_f32, attngen::merge_state_inplace_ffi<float>);
ATTNGEN_EXPORT_TYPED_FUNC(merge_state_inplace_f16, attngen::merge_state_inplace_ffi<half>);
ATTNGEN_EXPORT_TYPED_FUNC(merge_state_inplace_bf16, attngen::merge_state_inplace_ffi<__nv_bfloat16>);
