// TVM PagedKVCache's token-tree mask (speculative decoding) in attngen's mma.sync prefill template, for the
// two tree slots (tvm_slots.h: prefill_ragged_tree, prefill_paged_tree).
//
// TVM's arrays (read at run time): tree_mn_indptr [B+1] says where request b's tree lies in tree_order
// [nodes, 2], whose row per node is (DFS order, one past the largest order in its subtree). Request b's tree
// is its last tree_len = tree_mn_indptr[b+1] - tree_mn_indptr[b] keys (from tree_start = keys - tree_len on);
// its query rows are the tree's last qo_len nodes. A query sees every key before tree_start and, inside the
// tree, the nodes whose (order, end) pair holds its own node's order: itself and its ancestors (the CPU tree
// slots' rule, codegen/cpu/attention_tir.py). A node's ancestors precede it, so a query at row i never sees a
// key past keys - qo_len + i: the kernel runs with its in-call causal bound (tile and step skipping past the
// diagonal) and tests each score against the tree only where the key lies in the tree (score_rules.cuh);
// tiles before tree_start keep the interior path. TVM's paged tree slot also carries requests whose tree
// lies in a deeper block of their sequence (tree_len 0 here): those see every key, without the causal bound.
// The template compiles this in only for the traits TvmTree<V> (tvm_traits.cuh; `if constexpr (tvm_tree<V>())`),
// which the tree slots alone instantiate: every other instance is the plain kernel, unchanged.
// TvmTree<TvmWindowed<V>> serves the paged tree slot on "mha_sliding" layers (length_info [3, B], tvm_window.cuh).
#pragma once
#include <stdint.h>

#include "tvm_traits.cuh"

namespace attngen {

// TVM's tree arrays of a tree call (null elsewhere; read by the tree instances only).
struct TreeMask {
  const int32_t* indptr;  // tree_mn_indptr [B+1]
  const int32_t* order;   // tree_order [nodes, 2]: (DFS order, end of the subtree's orders)

  __device__ __forceinline__ int tree_len(int b) const { return indptr[b + 1] - indptr[b]; }

  // The causal bound of request b's rows (1: no key past a row's own): a node's ancestors precede it, for a
  // request with a tree in this call; one without (a shared block before its sequence's tree) sees every key.
  __device__ __forceinline__ int causal(int b) const { return int(tree_len(b) > 0); }
};

// Per query row of a tree instance's score rules: the first key of the request's tree, the (order, end) pairs
// of its keys indexed by key (key j's at keys[2j], j >= tree_start), and the DFS order of rows prow and prow + 8.
template <bool Tree>
struct RowTree {};
template <>
struct RowTree<true> {
  int tree_start;
  const int32_t* keys;  // (int32 pairs: TVM's views need not be 8-byte aligned)
  int node[2];

  // Whether key j (< the request's keys) is visible to row h under the tree mask.
  __device__ __forceinline__ bool sees(int h, int j) const {
    if (j < tree_start) return true;
    return __ldg(keys + 2 * j) <= node[h] && node[h] < __ldg(keys + 2 * j + 1);
  }
};

// The tree fields of rows prow and prow + 8 (packed rows token * group + head) of request b, which has qo_len
// query rows and kv_len keys (rows past the request's are never visible: theirs is unused).
template <class Rows>
__device__ __forceinline__ void set_row_tree(Rows& rt, const TreeMask& tree, int b, int qo_len, int kv_len,
                                             int prow, int group, int rows_total) {
  const int base = tree.indptr[b], len = tree.tree_len(b);
  rt.tree_start = kv_len - len;
  rt.keys = tree.order + 2 * (base - rt.tree_start);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    // (a request without a tree in this call, a block before its sequence's tree, has no node: keys are all
    // before its tree_start, and no node is read)
    const int pr = prow + 8 * h, node = len - qo_len + pr / group;
    rt.node[h] = pr < rows_total && node >= 0 ? tree.order[2 * (base + node)] : 0;
  }
}

}  // namespace attngen
