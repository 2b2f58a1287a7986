// The problem a prefill / append kernel takes (the mma.sync template, prefill.cuh, and the Hopper one,
// hopper_prefill.cuh): the query, output and lse rows, the K/V view, the plan's tile lists and work order, and
// TVM's run-time arrays and scalars, read only by the TVM instances (tvm_traits.cuh). A kernel over an fp8 cache
// takes it with the cache's scales (PrefillProblemOf).
#pragma once
#include <stdint.h>

#include <type_traits>

#include "common.cuh"
#include "fp8_kv.cuh"
#include "kv_rows.cuh"
#include "tile_map.cuh"
#include "tvm_rope.cuh"
#include "tvm_tree.cuh"
#include "tvm_window.cuh"

namespace attngen {

// PrefillProblem::hooks_applied: the row hooks the call's keys / queries already carry (hook_pass.cuh)
enum HookApplied : int { kKeysApplied = 1, kQueriesApplied = 2 };

struct PrefillProblem {
  const void* q;             // [total_q, Hq, D], token rows q_stride elements apart
  int64_t q_stride;          // elements from one token's query heads to the next's (Hq * D when packed)
  void* o;                   // [total_q, Hq, D]
  float* lse;                // [total_q, Hq]
  const int32_t* qo_indptr;  // [B+1]
  int64_t q_rows;            // total_q (host side: the extent of the Hopper kernel's query tensor map)
  int batch, num_qo_heads, num_kv_heads, group;
  int tile_rows;   // 0: the library's choice (128 rows for long requests); 128: the wide tile where it
                   // serves (D <= 128, long requests); 64: the 64-row tiles
  int kernel;      // PrefillTemplate (attngen_enums.h): 0 the library's choice, 1 mma.sync, 2 Hopper
  int causal;      // 1: also hide keys after the query's position (TVM's run-time causal flag)
  int hooks_applied;  // HookApplied bits (hook_pass.cuh): the keys / queries already carry the row hooks
  int tvm_conventions;  // 1: rows with no key store lse = -5e4 (TVM PagedKVCache); 0: -inf
  __host__ __device__ float empty_lse() const { return tvm_conventions ? kTvmEmptyLse : kNegInf; }
  float sm_scale;
  KVRows kv;
  TileList tiles;  // the plan's mask-derived tile lists (tile_map.cuh); absent: each CTA walks its key range
  // [B * q_tiles] or null: the plan's order of the (request, query tile) pairs, longest work first, which
  // the persistent Hopper kernel deals out (each pair's KV heads in a row); null: request by request
  const int32_t* work_order;
  // ints past the order's pairs: the Hopper tail split's section (hopper_tail.cuh) or the mma.sync split's
  // (prefill_split.cuh; its launcher points work_order at the section), 0: none
  int work_tail_len;
  PositionWindow win;  // TVM's positions and layer window: read by the windowed instances only (tvm_window.cuh)
  TreeMask tree;       // TVM's token trees: read by the tree instances only (tvm_tree.cuh)
  RopeFreq rope;       // TVM's inline RoPE at P.win's positions: read by the RoPE instances only (tvm_rope.cuh)
};

// The problem of a prefill over an fp8 cache: its per-KV-head scales (fp8_kv.cuh)
struct ScaledPrefillProblem : PrefillProblem {
  KVScales scales;
};

// The problem a prefill kernel reading K/V of type KV takes.
template <class KV>
using PrefillProblemOf = std::conditional_t<kIsFp8<KV>, ScaledPrefillProblem, PrefillProblem>;

}  // namespace attngen
