// Host launcher for decode: picks the head tile G from the group size, then merges split chunks.
#pragma once
#include <cuda_runtime.h>

#include "decode.cuh"
#include "merge.cuh"

namespace attngen {

template <class V, class T, int D, int G>
void launch_decode_tile(const DecodeProblem& P, const typename V::Params& hp, cudaStream_t stream) {
  using Tile = DecodeTile<D, G>;
  const size_t smem = decode_smem_bytes<V, T, D, G>();
  auto kernel = decode_kernel<V, T, D, G>;
  if (smem > 48 * 1024) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  kernel<<<dim3(P.num_chunks, P.num_kv_heads, P.batch), dim3(Tile::kLanes, G, Tile::kZ), smem, stream>>>(P, hp);
  if (P.num_chunks > 1) {
    merge_decode_kernel<V, T, D><<<dim3(P.num_qo_heads, P.batch), D / 8, 0, stream>>>(P, hp);
  }
}

// MaxG: the build's max_group_size; groups above it were refused before the launch.
template <class V, class T, int D, int MaxG>
void launch_decode(const DecodeProblem& P, const typename V::Params& hp, cudaStream_t stream) {
  if (P.group <= 1) return launch_decode_tile<V, T, D, 1>(P, hp, stream);
  if constexpr (MaxG >= 2) if (P.group <= 2) return launch_decode_tile<V, T, D, 2>(P, hp, stream);
  if constexpr (MaxG >= 4) if (P.group <= 4) return launch_decode_tile<V, T, D, 4>(P, hp, stream);
  if constexpr (MaxG >= 8) return launch_decode_tile<V, T, D, 8>(P, hp, stream);
}

}  // namespace attngen
