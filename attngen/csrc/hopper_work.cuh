// The work items of the persistent Hopper prefill (hopper_prefill.cuh): which (query tile, request, KV head) a
// CTA's round deals, and the key range or tile list of each. Only the producer decodes items: it hands each one
// to the consumers in shared memory with the item's query rows (the consumers' own decoding, dependent loads of
// the work order and the indptr arrays, had cost ~1k cycles at every item).
#pragma once
#include "hopper_tile.cuh"
#include "tvm_window.cuh"

namespace attngen {

// Work item idx and its KV range from the mask's bounds, or (Mapped) its tile list; in the plan's order where it
// gives one (longest work first over the whole batch), else request-major (the CTAs at work share a request's K/V
// in L2), its last query tiles (under causal masks the longest) first. False: the tile holds none of the
// request's rows (the producer skips it). Tile: the kernel's HopperTile (rows and keys per tile).
// piece: idx names a tail split's item as pair * KV heads + KV head (hopper_tail.cuh), without an order entry to
// read; the order holds the pairs of those items past the pairs' range, pair + B * q_tiles, which the full rounds
// skip as out of range (no code of the tail's in their loop, whose producer has no register to spare).
template <class V, class Tile, bool Mapped, class Problem>
__device__ __forceinline__ bool hopper_item_at(const Problem& P, const typename V::Params& hp, int q_tiles, int idx,
                                               HopperItem& w, bool piece) {
  constexpr int RQ = Tile::kRows, TK = Tile::kKeys;
  const int group = P.group, per_request = q_tiles * P.num_kv_heads;
  w.hk = idx % P.num_kv_heads;
  if (P.work_order != nullptr) {  // the plan's order of (request, query tile) pairs (a piece names its pair)
    const int pair = piece ? idx / P.num_kv_heads : P.work_order[idx / P.num_kv_heads];
    if (pair < 0 || pair >= P.batch * q_tiles) return false;  // (an order not the plan's: never out of bounds)
    w.b = pair / q_tiles;
    w.tile = pair % q_tiles;
  } else {
    w.b = idx / per_request;
    w.tile = q_tiles - 1 - (idx % per_request) / P.num_kv_heads;
  }
  // the request's query and key counts in one round trip (load_index: the key entries not behind the test of
  // the tile's rows, last_page_len not behind the page count; the three trips these took came before the
  // item's first page lookup)
  w.q0 = load_index(P.qo_indptr + w.b);
  const int qo_len = load_index(P.qo_indptr + w.b + 1) - w.q0;
  const int kv_len = view_length<V>(P.kv, w.b);
  w.rows_total = qo_len * group;
  w.row0 = w.tile * RQ;
  if (w.row0 >= w.rows_total) return false;
  w.pos_base = kv_len - qo_len;
  const int first_pos = w.pos_base + w.row0 / group;
  const int last_pos = w.pos_base + (min(w.row0 + RQ, w.rows_total) - 1) / group;
  long long lo64 = 0, hi64 = kv_len;
  if constexpr (V::kHasUpper) lo64 = max(lo64, (long long)first_pos - V::mask_upper(hp));
  if constexpr (V::kHasLower) hi64 = min(hi64, (long long)last_pos - V::mask_lower(hp) + 1);
  if (P.causal) hi64 = min(hi64, (long long)last_pos + 1);
  w.lo = int(min(lo64, (long long)kv_len));
  w.hi = int(max(hi64, 0LL));
  w.num_kt = w.hi > w.lo ? (w.hi - w.lo + TK - 1) / TK : 0;
  w.tile_list = nullptr;
  if constexpr (Mapped) {
    const int l = P.tiles.list(w.b, w.hk, w.tile);
    w.tile_list = P.tiles.entries + P.tiles.indptr[l];
    w.num_kt = P.tiles.indptr[l + 1] - P.tiles.indptr[l];
  }
  return true;
}

// Launches of at most kHopperPrefetchBatch requests (verify steps, a chunk of a long prompt): their items'
// decoding (hopper_item_at: the requests' indptr entries and last_page_len) and first page lookups
// (KVRows::page_slot) read a few lines the whole CTA's start waits on. Producer thread 32 + t, t in [0, 96), brings
// them into L1 while thread 0 reads the tail's pieces: t < 6 a line of the query indptr, the key indptr or
// last_page_len (at most B + 1 entries: two lines), t >= 8 a line of the page ids [indptr[0], indptr[B]) (88 lines,
// 2816 pages: every page of a verify step's 8k keys over pages of 16, the first ones of longer requests).
// Prefetches are hints: the loads that follow read the same memory whether they hit or not. Only launches with a
// tail split (P.work_tail_len > 0) take them, where thread 0's read of the pieces hides the producers' two index
// loads (H100: verify B1 19.5 -> 18.9-19.1 us, ab_trees_2026-12-07_start_prefetch_h100.md); the same verify step
// forced unsplit ran 108 -> 114 us with them.
constexpr int kHopperPrefetchBatch = 32;

// Every thread of the CTA calls it (tid: its index); only the launches and threads above act.
template <class Problem>
__device__ __forceinline__ void hopper_prefetch_indices(const Problem& P, int tid) {
  const int t = tid - 32;
  if (P.work_tail_len <= 0 || P.batch > kHopperPrefetchBatch || t < 0 || t >= 96) return;
  const auto prefetch_l1 = [](const int32_t* a) { asm volatile("prefetch.global.L1 [%0];" ::"l"(a)); };
  const int B = P.batch;
  if (t < 6) {
    const int which = t % 3, line = (t / 3) * 32;
    const int32_t* a = which == 0 ? P.qo_indptr : which == 1 ? P.kv.indptr : P.kv.last_page_len;
    // (the indptr arrays hold B + 1 entries, last_page_len B: no prefetch past an array's end)
    if (a != nullptr && line < B + (which != 2) && (which != 2 || P.kv.page_size > 0)) prefetch_l1(a + line);
  } else if (t >= 8 && P.kv.page_size > 0) {
    const int first = load_index(P.kv.indptr), end = load_index(P.kv.indptr + B);
    const int at = max((first & ~31) + (t - 8) * 32, first);  // (a line of 32 ids; the first from indptr[0]'s)
    if (at < end) prefetch_l1(P.kv.indices + at);
  }
}

}  // namespace attngen
