// Batch decode over a paged KV cache on tensor cores (mma.sync), query tile 16.
//
// One CTA = (KV head, its work items: one chunk of the even split, or the plan's list), four
// warps (or, with KV-head pairs, decode_tc_pairs_kv_heads, two KV heads of two warps each, a stage then 32 keys of
// each head and the query tile both heads' groups); the K/V tiles of all its items form one cp.async stream, each
// item's query rows riding with its first tile (S query buffers), so the next item's query and first tiles load while
// this item finishes. The query heads of the KV head's
// group (GQA head-group fusion, at most 8) are the rows of one 16-row MMA tile, so a
// K/V element is read from memory once for the whole group. A stage holds 64 keys;
// warp w owns rows [16w, 16w + 16) of every stage (keys [16w, 16w + 16) of the tile, or with a pair keys
// [16 (w % 2), + 16) of its head), copies those rows itself (so the tiles
// need no CTA barrier; the warps meet once per item) and keeps its own online-softmax
// state (fp32, base 2); the four states are merged through shared memory at the end (a merge region of its own,
// or at D 256 over a 16-bit cache the stage the loader fills next, so that two one-stage CTAs share an SM:
// decode_tc_merge_in_stage).
// K/V rows are gathered from their pages with cp.async, S stages deep, rows padded by
// 8 elements so ldmatrix is conflict-free. Every hook runs: query / key transforms
// row by row on a per-warp fp32 scratch row, logits and mask per score, the output
// transform in the epilogue (or after the split-KV merge, merge.cuh). With the plan's merge counters
// (fused merge) the CTA that writes a split request's last partial state merges the request itself, so
// no merge kernel runs.
// fp8 K/V (KV = __nv_fp8_e4m3 / __nv_fp8_e5m2, fp8_kv.cuh): the S stages hold the fp8 rows as the loader
// copied them (half the bytes of a 16-bit stage, so S is deeper at the same bytes in flight), and each warp
// dequantises its own 16 rows into its rows of a 16-bit tile laid over its merge-region accumulator rows
// (exact: every fp8 value is a half and a bfloat16 value) for ldmatrix. Without a key hook the MMAs are half
// whatever the query's type (fp8 -> half is one instruction per pair, exact; the query rows are scaled into
// half's range by a power of two: decode_tc_half_mma) and run transposed: S^T = K Q^T with the staged key
// rows read straight into A fragments, then O^T = V^T P^T, whose value rows are widened into the 16-bit tile
// (at D 64 and 128 read straight into A fragments too: decode_tc_direct_values). With a key hook
// the key rows are widened too, for the hook and for Q K^T. k_scale scales the scores (or the key hook's
// input), v_scale the accumulated rows.
#pragma once
#include "common.cuh"
#include "cp_async.cuh"
#include "kv_tile_layout.cuh"
#include "decode.cuh"
#include "decode_tc_fp8.cuh"
#include "decode_tc_items.cuh"
#include "decode_tc_tile.cuh"
#include "epilogue.cuh"
#include "merge.cuh"
#include "mma.cuh"
#include "row_hook.cuh"

namespace attngen {

// Every work item of one CTA (grid row `cta_slot`: KV head cta_slot, or with KV-head pairs heads 2 cta_slot and
// 2 cta_slot + 1,
// decode_tc_pairs_kv_heads), as one stream of K/V tiles: the loader runs S - 1
// tiles ahead across item boundaries, so the next item's first tiles arrive while this one's
// last tiles and epilogue run. Called by all threads of the CTA.
template <class V, class T, int D, int S, class KV = T>
__device__ __forceinline__ void decode_tc_items(const DecodeProblem& P, const typename V::Params& hp,
                                                unsigned char* smem_raw, int cta_slot, const DecodeTCItems<V>& items,
                                                KVScales scales = {}) {
  using Tile = DecodeTCTile<D, S>;
  constexpr int TK = Tile::kKeys, ST = Tile::kStride, NT = Tile::kThreads, NW = Tile::kWarps;
  constexpr int NDT = D / 8;   // n-tiles of O per warp
  constexpr int CPR = D / 8;   // 16-byte chunks per row
  // the loader: each warp copies its own 16 key rows of every tile (the rows only it reads, so a tile
  // needs no CTA barrier); a lane copies 16-byte chunks c and c + TPR of a row and of its value row (one
  // row address, one page id, four copies): D / 16 lanes per 16-bit row, D / 32 per fp8 row of D >= 128 (fp8
  // at D 64: one chunk a lane, D / 16 lanes; fp8_decode_2026-12-05_loader_ab.md). Four fp8 chunks a lane at
  // D >= 128 read 6-8% slower (fp8_decode_2026-12-06_loader_chunks_ab_h100.md)
  constexpr int kFp8Chunks = kIsFp8<KV> && D >= 128 ? 2 : 1;  // (fp8 caches: chunks a lane copies of a row)
  constexpr int TPR = D / 16 / kFp8Chunks;  // loader lanes per row
  static_assert(32 % TPR == 0, "a lane's chunk column must stay fixed across passes");
  constexpr int RPW = 32 / TPR;  // rows per warp and pass
  static_assert(Tile::kKeysPerWarp % RPW == 0, "a warp's rows split evenly over its passes");
  constexpr int HALF = D / 2;
  constexpr int G8 = Tile::kMaxGroup;
  // the tiles' and MMAs' element type: T, or half for an fp8 cache whose keys no hook transforms (fp8 widens
  // to half in one instruction per pair, to bfloat16 in four; the query rows are scaled into half's range)
  using MT = std::conditional_t<decode_tc_half_mma<V, KV>(), half, T>;
  // keys straight from the fp8 stage into fragments (the transposed product S^T = K Q^T, every head dim)
  constexpr bool kDirectK = decode_tc_half_mma<V, KV>();
  // and values straight from it into fragments too (D 64 and 128: decode_tc_direct_values)
  constexpr bool kDirectV = kDirectK && decode_tc_direct_values<D>();
  // the output accumulator's tiles: O (16 rows, NDT n-tiles), or with direct keys O^T = V^T P^T (D / 16
  // m-tiles of dims by the 8 query rows: half the MMAs of O += P V, whose rows 8-15 were padding)
  constexpr int NOA = kDirectK ? D / 16 : NDT;
  // D 256 over a 16-bit cache: the warps merge in the stage the loader fills next and the query tiles hold 8 rows
  // (decode_tc_merge_in_stage), which leaves room for a second CTA per SM
  constexpr bool kMergeInStage = decode_tc_merge_in_stage<D, kIsFp8<KV>>();
  constexpr int QR = decode_tc_query_rows<D, kIsFp8<KV>>();  // rows of a query tile (8: the MMA's rows 8-15 read 0-7)
  T* sq_all = reinterpret_cast<T*>(smem_raw);                                          // [S][QR][ST]
  float* scratch_all = reinterpret_cast<float*>(smem_raw + size_t(S) * QR * ST * 2);  // [NW][2D]
  float* wstate = scratch_all + NW * 2 * D;  // [NW][G8][2]
  // the cross-warp merge: wacc [NW][G8][D] per-warp accumulator rows, rows [G8][D] final rows then [G8][D]
  // scratch, row_lse [G8]: a region of their own after wstate, or (kMergeInStage) row_lse after wstate and wacc
  // and rows in the stage the loader fills next, set after each item's last tile
  float* wacc = wstate + NW * G8 * 2;
  float* rows = wacc + NW * G8 * D;
  float* row_lse = kMergeInStage ? wstate + NW * G8 * 2 : rows + 2 * G8 * D;
  // [S][2][TK][D] (kv_tile_at); an fp8 cache: one [TK][D] tile of widened rows over wacc (warp w's rows are
  // its own accumulator rows, written after its last tile of an item)
  MT* tiles = kIsFp8<KV> ? reinterpret_cast<MT*>(wacc)
                         : reinterpret_cast<MT*>(smem_raw + decode_tc_tiles_offset<D, S, kIsFp8<KV>>());
  static_assert(!kIsFp8<KV> || size_t(TK) * D * sizeof(MT) == size_t(NW) * G8 * D * sizeof(float),
                "the widened tile is the merge region's accumulator rows");

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  float* scratch = scratch_all + warp * 2 * D;
  // KV-head pairs (kv_head_shift 1, decode_tc_pairs_kv_heads): warps 0-1 serve head 2 cta_slot, warps 2-3 head
  // 2 cta_slot + 1; a tile is 64 / 2 keys of each head in the stage's rows of its warps, and the query tile holds both
  // heads' groups (rows [q_lo, q_lo + group) are this warp's head's). Elsewhere one head, every warp on it.
  // Group parts (group_parts > 1, decode_tc_group_parts): CTA row cta_slot serves part cta_slot % parts of KV head
  // cta_slot / parts, query heads [8 part, + 8) of its group (the last part may hold fewer), every warp on it.
  const int shift = decode_tc_pairs_kv_heads<D, kIsFp8<KV>>() ? P.kv_head_shift : 0;
  const int parts = P.group_parts > 1 ? P.group_parts : 1;
  const int kv_slot = parts > 1 ? cta_slot / parts : cta_slot, part = cta_slot - kv_slot * parts;
  const int head_in_cta = shift ? warp >> 1 : 0;
  const int hk = (kv_slot << shift) + head_in_cta;           // this warp's KV head
  const int group = P.group;                                 // query heads per KV head
  // query rows of the CTA, its first query head, and this warp's first row
  const int cta_rows = parts > 1 ? min(G8, group - part * G8) : group << shift;
  const int qh0 = parts > 1 ? hk * group + part * G8 : cta_slot * cta_rows, q_lo = head_in_cta * group;
  const int tk = TK >> shift;                              // keys of one head per tile
  static_assert(TK == 64, "a pair's tiles are counted by a shift of 5");
  // tiles of n > 0 keys (a pair's 32-key tiles by a shift, not a division by a run-time count)
  auto tiles_of = [&](int n) { return shift ? (n + 31) >> 5 : (n + TK - 1) / TK; };
  // whether row r of the query tile is a query head of this warp's KV head
  auto own_row = [&](int r) { return shift ? unsigned(r - q_lo) < unsigned(group) : r < cta_rows; };
  const T* pages = static_cast<const T*>(P.kv.base);
  const int64_t head_off = int64_t(hk) * P.kv.stride_head + (lane % TPR) * 8;
  // fp8 caches: this head's rows at the lane's 16-byte chunk, once per CTA (the loader adds page and slot)
  [[maybe_unused]] const KV* head8 =
      static_cast<const KV*>(P.kv.base) + int64_t(hk) * P.kv.stride_head + (lane % TPR) * 16;
  const int wk = warp * Tile::kKeysPerWarp;  // this warp's first row of every stage
  const int wkey = (shift ? warp & 1 : warp) * Tile::kKeysPerWarp;  // and its first key of every tile
  const int ps = P.kv.page_size;
  const bool ps_pow2 = (ps & (ps - 1)) == 0;
  const int ps_shift = __ffs(ps) - 1;

  // ---- the loader: the stream's tiles in order. The page ids of the tile it issues next are read one
  // call ahead (into pid), so issuing a tile's cp.async never waits on a page-table load --------------
  constexpr int PASSES = Tile::kKeysPerWarp / RPW;
  int l_item = -1, l_tile = 0, l_tiles = 0, loaded = 0, q_loaded = 0;
  DecodeTCItem l_cur{0, 0, 0, -1};
  const int32_t* l_page_ids = nullptr;
  SinkShift l_sinks{};  // windowed instances: TVM's sliding-window view of the loader's request
  int pid[PASSES];
  bool l_have = false;  // pid holds the page ids of a tile still to issue
  auto advance = [&]() {  // to the stream's next tile (items without keys have none); read its page ids
    ++l_tile;
    while (l_tile >= l_tiles && l_item < items.count) {
      if (++l_item < items.count) {
        l_cur = items.get(l_item);
        l_tiles = l_cur.end > l_cur.start ? tiles_of(l_cur.end - l_cur.start) : 0;
        l_tile = 0;
        l_page_ids = P.kv.indices + P.kv.indptr[l_cur.b];
        if constexpr (tvm_windowed<V>()) l_sinks = P.kv.sinks(l_cur.b);
      }
    }
    l_have = l_item < items.count;
    if (!l_have) return;
    const int t0 = l_cur.start + l_tile * tk;
#pragma unroll
    for (int pass = 0; pass < PASSES; ++pass) {
      const int j = t0 + wkey + pass * RPW + lane / TPR, jr = view_row<V>(l_sinks, j);
      pid[pass] = j < l_cur.end ? __ldg(l_page_ids + (ps_pow2 ? (jr >> ps_shift) : jr / ps)) : 0;
    }
  };
  auto load_next = [&]() {  // issue the prefetched tile, then read the following tile's page ids
    if (!l_have) return;
    const int t0 = l_cur.start + l_tile * tk, stage = loaded % S;
    if (l_tile == 0) {  // the item's query rows (zero rows past the group) join its first tile's group
      T* sq = sq_all + (q_loaded % S) * QR * ST;
      const T* q = static_cast<const T*>(P.q) + int64_t(l_cur.b) * P.q_stride + int64_t(qh0) * D;
      for (int c = tid; c < QR * CPR; c += NT) {
        const int r = c / CPR, l = c % CPR;
        copy16_async(sq + r * ST + l * 8, r < cta_rows ? q + r * D + l * 8 : q, r < cta_rows);
      }
      ++q_loaded;
    }
#pragma unroll
    for (int pass = 0; pass < PASSES; ++pass) {
      const int r = wk + pass * RPW + lane / TPR, j = t0 + r + (wkey - wk), jr = view_row<V>(l_sinks, j);
      const bool ok = j < l_cur.end;
      const int slot = ps_pow2 ? (jr & (ps - 1)) : jr % ps;
      if constexpr (kIsFp8<KV>) {  // (a row past the item: page id 0, a slot inside the page, read as nothing;
        // page id and slot are non-negative, so unsigned 32 x 64-bit products serve)
        const KV* src = head8 + uint64_t(uint32_t(pid[pass])) * uint64_t(P.kv.stride_page) +
                        uint64_t(uint32_t(slot)) * uint64_t(P.kv.stride_slot);
        KV* dst = decode_tc_staged<D, S, KV>(smem_raw) + (stage * 2 * TK + r) * D;
#pragma unroll
        for (int k = 0; k < kFp8Chunks; ++k) {  // the key row's chunks c, c + TPR, ...; then the value row's
          const int c = lane % TPR + k * TPR;
          copy16_async(dst + (kDirectK ? staged_key_chunk<D>(r, c) : c) * 16, src + k * TPR * 16, ok);
        }
#pragma unroll
        for (int k = 0; k < kFp8Chunks; ++k) {
          const int c = lane % TPR + k * TPR;
          const KV* src_v = src + P.kv.stride_kv + k * TPR * 16;
          if constexpr (kDirectV)  // the value rows swizzled for the direct reads (staged_value_at)
            copy16_async(decode_tc_staged<D, S, KV>(smem_raw) + (stage * 2 + 1) * TK * D + staged_value_at<D>(r, c * 16),
                         src_v, ok);
          else
            copy16_async(dst + TK * D + c * 16, src_v, ok);
        }
        continue;
      }
      // a row past the item reads nothing; its address (page 0) only has to lie in the cache
      const T* src = ok ? pages + int64_t(pid[pass]) * P.kv.stride_page + int64_t(slot) * P.kv.stride_slot + head_off
                        : pages;
      MT* dst_k = tiles + (stage * 2) * TK * D;
      const int lo = kv_tile_at<D>(r, (lane % TPR) * 8), hi = kv_tile_at<D>(r, (lane % TPR) * 8 + HALF);
      copy16_async(dst_k + lo, src, ok);
      copy16_async(dst_k + hi, src + HALF, ok);
      copy16_async(dst_k + TK * D + lo, src + P.kv.stride_kv, ok);
      copy16_async(dst_k + TK * D + hi, src + P.kv.stride_kv + HALF, ok);
    }
    ++loaded;
    advance();
  };
  advance();
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    load_next();
    copy_commit();
  }

  int consumed = 0, q_consumed = 0;
  const int g = lane / 4, t4 = lane % 4;
  // the query row whose address this lane gives ldmatrix for the 16-row A tile (rows 8-15: padding)
  const int q_lane_row = (lane % 8) + (QR == 16 ? ((lane / 8) % 2) * 8 : 0);
  const bool row_valid = own_row(g);
  const int qh = qh0 + g;
  const float scale = P.sm_scale * ((V::kHasLogits || !V::kSoftmax) ? 1.f : kLog2e);
  for (int it = 0; it < items.count; ++it) {
    const DecodeTCItem cur = items.get(it);
    const int b = cur.b, start = cur.start, end = cur.end;
    const int qo_pos = view_length<V>(P.kv, b) - 1;
    const int num_tiles = end > start ? tiles_of(end - start) : 0;
    __syncthreads();  // the previous item's epilogue may still read the merge region

    // Q fragments in registers for the item where they fit (D <= 128); the query rows arrive with the
    // item's first tile, in the query buffer of its place among the items with keys
    constexpr bool kQInRegs = D <= 128;
    uint32_t qfrag[kQInRegs ? D / 16 : 1][4];
    T* sq = sq_all + (num_tiles > 0 ? q_consumed++ % S : 0) * QR * ST;
    float q_up = 1.f;  // half MMAs: the power of two row g's query was scaled down by

    // ---- per-thread state: rows g (a query head of this warp's KV head when own_row(g)) and g + 8 (padding);
    // direct keys: the transposed output O^T (m-tile i: dims 16 i + g and + 8 of query rows 2 t4 and 2 t4 + 1, no
    // padding)
    float o_acc[NOA][4];
#pragma unroll
    for (int n = 0; n < NOA; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o_acc[n][e] = 0.f;
    float m_row = kNegInf, d_row = 0.f;  // row g; row g + 8 never holds a head
    // direct keys (S^T = K Q^T, kDirectK): the softmax state of query rows 2 t4 and 2 t4 + 1, each thread's
    // sum over its own keys until the epilogue; their query scales
    float m2[2] = {kNegInf, kNegInf}, d2[2] = {0.f, 0.f};
    float qk2[2] = {1.f, 1.f};  // the rows' score factors: k_scale, their query scale and sm_scale

    for (int tile = 0; tile < num_tiles; ++tile) {
      load_next();  // S - 1 tiles ahead in the stream, possibly the next items'
      copy_commit();
      copy_wait<S - 1>();
      // a warp reads only the K / V rows it copied; the query rows (copied by every thread with the item's
      // first tile) need the whole CTA once per item
      if (tile == 0) __syncthreads(); else __syncwarp();
      const int stage = consumed % S;
      ++consumed;
      // fp8: one scratch tile, keys now and values after Q K^T
      MT* sk = tiles + (kIsFp8<KV> ? 0 : (stage * 2 + 0) * TK * D);
      MT* sv = tiles + (kIsFp8<KV> ? 0 : (stage * 2 + 1) * TK * D);
      if constexpr (kIsFp8<KV> && !kDirectK) decode_tc_widen_rows<MT, D, S, KV>(smem_raw, stage, 0, wk, sk, lane);
      if (tile == 0) {  // the query rows arrived with this tile: query transform, then the fragments
        if constexpr (tvm_rope<V>()) {  // TVM's inline RoPE, before the variant's query transform
          for (int r = warp; r < cta_rows; r += NW)
            rope_rotate_row<D>([&](int i) -> T& { return sq[r * ST + i]; }, scratch, P.win.q_pos[b], P.rope, lane);
          __syncthreads();
        }
        if constexpr (V::kHasQueryTransform) {
          for (int r = warp; r < cta_rows; r += NW) {
            for (int i = lane; i < D; i += 32) scratch[i] = to_float(sq[r * ST + i]);
            __syncwarp();
            warp_row_hook<D, V::kQueryElementwise>(
                scratch, scratch + D, [&](float* row, int i) { return V::query_elem(hp, row, i, qo_pos, qh0 + r); },
                [&](float* in, float* out) { V::query_row(hp, in, out, qo_pos, qh0 + r); }, lane);
            for (int i = lane; i < D; i += 32) sq[r * ST + i] = from_float<T>(scratch[D + i]);
            __syncwarp();
          }
          __syncthreads();
        }
        if constexpr (!std::is_same_v<MT, T>) {  // the query rows as half, in place; row_lse (free until the
          // epilogue) carries each row's scale to the threads of its MMA row
          for (int r = warp; r < cta_rows; r += NW) half_query_row<T, D>(sq + r * ST, row_lse + r, lane);
          __syncthreads();
          q_up = row_valid ? row_lse[g] : 1.f;
        }
        if constexpr (kDirectK) {  // (q . k) s = q . (k s), and a query of another type was scaled into half's range
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const bool scaled = !std::is_same_v<MT, T> && 2 * t4 + c < cta_rows;
            qk2[c] = scales.k_of(hk) * (scaled ? row_lse[2 * t4 + c] : 1.f) * scale;
          }
        }
        if constexpr (kQInRegs && kDirectK) {
#pragma unroll
          for (int k = 0; k < D / 16; ++k)
            decode_tc_direct_qfrag<D>(qfrag[k], reinterpret_cast<const half*>(sq), ST, k, g, t4);
        } else if constexpr (kQInRegs) {
#pragma unroll
          for (int k0 = 0; k0 < D; k0 += 16)
            ldmatrix_x4(qfrag[k0 / 16], sq + q_lane_row * ST + k0 + (lane / 16) * 8);
        }
      }
      const int j0 = start + tile * tk + wkey;  // this warp's first key
      if constexpr (tvm_rope<V>()) {  // this warp's rows at TVM's key positions, before the key transform
        for (int r = 0; r < Tile::kKeysPerWarp; ++r) {
          const int j = j0 + r;
          if (j >= end) break;
          rope_rotate_row<D>([&](int i) -> MT& { return sk[kv_tile_at<D>(wk + r, i)]; }, scratch, P.win.k_pos0[b] + j,
                             P.rope, lane);
        }
      }
      if constexpr (V::kHasKeyTransform) {  // this warp's 16 rows only: no CTA barrier needed
        for (int r = 0; r < Tile::kKeysPerWarp; ++r) {
          const int j = j0 + r;
          if (j >= end) break;
          for (int i = lane; i < D; i += 32) scratch[i] = to_float(sk[kv_tile_at<D>(wk + r, i)]);
          if constexpr (kIsFp8<KV>) {  // the key hook sees dequantised keys
            for (int i = lane; i < D; i += 32) scratch[i] *= scales.k_of(hk);
          }
          __syncwarp();
          warp_row_hook<D, V::kKeyElementwise>(
              scratch, scratch + D, [&](float* row, int i) { return V::key_elem(hp, row, i, j, hk); },
              [&](float* in, float* out) { V::key_row(hp, in, out, j, hk); }, lane);
          for (int i = lane; i < D; i += 32) sk[kv_tile_at<D>(wk + r, i)] = from_float<MT>(scratch[D + i]);
          __syncwarp();
        }
      }
      // P as the A fragment of O += P V (rows g and g + 8 of the 16-row tile: query heads, then padding), or
      // with direct keys P^T as the B fragment of O^T += V^T P^T (a[0], a[2])
      uint32_t a[4];
      if constexpr (kDirectK) {
        // S^T = K Q^T over this warp's 16 keys, the staged fp8 key rows straight into A fragments (keys g and
        // 8 + g) and the query rows as the B fragment (its 8 columns: at most 8 heads), so no MMA row is
        // padding; then the scores, hooks and online softmax in that layout (a thread holds keys g, 8 + g of
        // query rows 2 t4, 2 t4 + 1), and P transposed into the B layout of O^T += V^T P^T (movmatrix)
        float st[4];  // [key g | 8 + g][query row 2 t4 | 2 t4 + 1]
        decode_tc_direct_scores<D, S, KV>(st, smem_raw, stage, wk, g, t4, qfrag, reinterpret_cast<const half*>(sq),
                                          ST);
        float mt2[2] = {m2[0], m2[1]};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int c = i & 1, qrow = 2 * t4 + c, j = j0 + g + 8 * (i >> 1);
          float x = st[i] * qk2[c];
          bool visible = own_row(qrow) && j < end;
          if constexpr (V::kHasLogits) {
            if (visible) x = V::logits(hp, x, b, qo_pos, j, qh0 + qrow, hk) * (V::kLogitsLog2e ? kLog2e : 1.f);
          }
          if constexpr (V::kHasMask) {
            if (visible) visible = V::mask(hp, b, qo_pos, j, qh0 + qrow, hk);
          }
          st[i] = visible ? x : (V::kSoftmax ? kNegInf : 0.f);
          if constexpr (V::kSoftmax) mt2[c] = fmax_nan(mt2[c], st[i]);  // a NaN score must reach the state
        }
        if constexpr (V::kSoftmax) direct_online_softmax(st, mt2, m2, d2, o_acc);
        // P^T as the B fragment of O^T += V^T P^T (query row g, keys 2 t4, 2 t4 + 1 and 8 + 2 t4, + 1)
        a[0] = movmatrix_trans(pack2<MT>(st[0], st[1]));
        a[2] = movmatrix_trans(pack2<MT>(st[2], st[3]));
        a[1] = a[3] = 0u;
      } else {
        // S = Q K^T: 16 rows x this warp's 16 keys (two n-tiles)
        float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
        for (int k0 = 0; k0 < D; k0 += 16) {
          uint32_t a[4], bk[4];
          if constexpr (kQInRegs) {
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = qfrag[k0 / 16][i];
          } else {
            ldmatrix_x4(a, sq + q_lane_row * ST + k0 + (lane / 16) * 8);
          }
          ldmatrix_x4(bk, sk + kv_tile_at<D>(wk + (lane % 8) + (lane / 16) * 8, k0 + ((lane / 8) % 2) * 8));
          mma16816<MT>(s[0], a, bk[0], bk[1]);
          mma16816<MT>(s[1], a, bk[2], bk[3]);
        }
        // (q . k) s = q . (k s); with a key hook it scaled the keys
        if constexpr (kIsFp8<KV> && !V::kHasKeyTransform) {
          const float ks = scales.k_of(hk) * q_up;
#pragma unroll
          for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[n][e] *= ks;
        }
        float mt = m_row;
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int j = j0 + n * 8 + t4 * 2 + (e % 2);
            float x = s[n][e] * scale;
            bool visible = e < 2 && row_valid && j < end;
            if constexpr (V::kHasLogits) {
              if (visible) x = V::logits(hp, x, b, qo_pos, j, qh, hk) * (V::kLogitsLog2e ? kLog2e : 1.f);
            }
            if constexpr (V::kHasMask) {
              if (visible) visible = V::mask(hp, b, qo_pos, j, qh, hk);
            }
            s[n][e] = visible ? x : (V::kSoftmax ? kNegInf : 0.f);
            if constexpr (V::kSoftmax) {
              if (e < 2) mt = fmax_nan(mt, s[n][e]);  // a NaN score must reach m_row (merge_scales)
            }
          }
        }
        if constexpr (V::kSoftmax) {
          mt = fmax_nan(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
          mt = fmax_nan(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
          // then mt is finite, +inf or NaN (a poisoned row: every later rescale and p is NaN); m_row may be -inf
          const bool grew = mt != m_row;
          const float rescale = grew ? fast_exp2(m_row - mt) : 1.f;
          d_row *= rescale;
          m_row = mt;
#pragma unroll
          for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const float p = (e < 2 && m_row != kNegInf) ? fast_exp2(s[n][e] - m_row) : 0.f;
              s[n][e] = p;
              d_row += p;
            }
          if (__any_sync(0xffffffffu, grew)) {  // the output is rescaled only when a row's max grew
#pragma unroll
            for (int n = 0; n < NDT; ++n) {
              o_acc[n][0] *= rescale;
              o_acc[n][1] *= rescale;
            }
          }
        }
        a[0] = pack2<MT>(s[0][0], s[0][1]);
        a[1] = pack2<MT>(s[0][2], s[0][3]);
        a[2] = pack2<MT>(s[1][0], s[1][1]);
        a[3] = pack2<MT>(s[1][2], s[1][3]);
      }
      if constexpr (kIsFp8<KV> && !kDirectV) {  // the values over the keys this warp's ldmatrix has read
        __syncwarp();
        decode_tc_widen_rows<MT, D, S, KV>(smem_raw, stage, 1, wk, sv, lane);
      }
      if constexpr (kDirectV) {  // O^T += V^T P^T, the fp8 value rows straight into A fragments
        decode_tc_direct_pv<D, S, KV>(o_acc, smem_raw, stage, wk, g, t4, a[0], a[2]);
      } else if constexpr (kDirectK) {  // O^T += V^T P^T: m-tile i is V^T's dims 16 i .. + 15 (A by ldmatrix.trans)
#pragma unroll
        for (int i = 0; i < NOA; ++i) {
          uint32_t av[4];
          ldmatrix_x4_trans(av, sv + kv_tile_at<D>(wk + (lane % 8) + (lane / 16) * 8, 16 * i + ((lane / 8) % 2) * 8));
          mma16816<MT>(o_acc[i], av, a[0], a[2]);
        }
      } else {  // O += P V over this warp's 16 keys
#pragma unroll
        for (int n = 0; n < NDT; n += 2) {
          uint32_t bv[4];
          ldmatrix_x4_trans(bv, sv + kv_tile_at<D>(wk + (lane % 8) + ((lane / 8) % 2) * 8, n * 8 + (lane / 16) * 8));
          mma16816<MT>(o_acc[n], a, bv[0], bv[1]);
          mma16816<MT>(o_acc[n + 1], a, bv[2], bv[3]);
        }
      }
      __syncwarp();  // the warp's rows of the stage are refilled by its own later prefetch
    }

    if constexpr (kIsFp8<KV>) {  // sum_j p_j (v_j s) = s sum_j p_j v_j
      const float vs = scales.v_of(hk);
#pragma unroll
      for (int n = 0; n < NOA; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) o_acc[n][e] *= vs;
    }
    // ---- merge the four warps' states, normalise (the next tiles stay in flight) --------------------
    if constexpr (kMergeInStage) {  // the stage the loader fills next: free until the next item's first tile
      // (the loader is at most S - 1 tiles ahead of the consumer), and warp w's accumulator rows lie over key
      // rows [16 w, 16 w + 16) of it, which only warp w reads: no barrier before they are written
      static_assert(sizeof(float) * NW * G8 * D == sizeof(MT) * TK * D &&
                        2 * G8 * D * sizeof(float) <= sizeof(MT) * TK * D,
                    "the merge region fits a stage: accumulator rows over the keys, final rows over the values");
      MT* free_stage = tiles + (loaded % S) * 2 * TK * D;
      wacc = reinterpret_cast<float*>(free_stage);
      rows = reinterpret_cast<float*>(free_stage + TK * D);
    }
    if constexpr (kDirectK) {  // query rows 2 t4 + c: sums over the keys of the eight lanes g
#pragma unroll
      for (int c = 0; c < 2; ++c) {
#pragma unroll
        for (int o = 4; o < 32; o *= 2) d2[c] += __shfl_xor_sync(0xffffffffu, d2[c], o);
        const int q = 2 * t4 + c;
        if (own_row(q)) {  // (a pair's other head's rows: its own warps' states)
          if (g == 0) {
            wstate[(warp * G8 + q) * 2] = m2[c];
            wstate[(warp * G8 + q) * 2 + 1] = d2[c];
          }
#pragma unroll
          for (int i = 0; i < NOA; ++i) {  // m-tile i's rows g and g + 8: dims 16 i + g and + 8, or permuted
            const int d0 = kDirectV ? decode_tc_direct_value_dim<D>(i, g, 0) : 16 * i + g;
            const int d1 = kDirectV ? decode_tc_direct_value_dim<D>(i, g, 1) : 16 * i + 8 + g;
            wacc[(warp * G8 + q) * D + d0] = o_acc[i][c];
            wacc[(warp * G8 + q) * D + d1] = o_acc[i][2 + c];
          }
        }
      }
    } else {
      d_row += __shfl_xor_sync(0xffffffffu, d_row, 1);
      d_row += __shfl_xor_sync(0xffffffffu, d_row, 2);
      if (row_valid && t4 == 0) {
        wstate[(warp * G8 + g) * 2] = m_row;
        wstate[(warp * G8 + g) * 2 + 1] = d_row;
      }
      if (row_valid) {
#pragma unroll
        for (int n = 0; n < NDT; ++n) {
          wacc[(warp * G8 + g) * D + n * 8 + t4 * 2] = o_acc[n][0];
          wacc[(warp * G8 + g) * D + n * 8 + t4 * 2 + 1] = o_acc[n][1];
        }
      }
    }
    __syncthreads();
    for (int idx = tid; idx < cta_rows * CPR; idx += NT) {
      const int r = idx / CPR, l = idx % CPR;
      float fm = kNegInf, fd = 0.f, fa[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      const int w_head = shift ? r / group : 0;  // the head of row r: its warps hold the row's states
#pragma unroll
      for (int w = 0; w < NW; ++w) {
        if (shift && (w >> 1) != w_head) continue;
        const float mw = wstate[(w * G8 + r) * 2], dw = wstate[(w * G8 + r) * 2 + 1];
        MergeScales ms = V::kSoftmax ? merge_scales(fm, mw) : MergeScales{0.f, 1.f, 1.f};
        fd = fd * ms.a + dw * ms.b;
#pragma unroll
        for (int e = 0; e < 8; ++e) fa[e] = fa[e] * ms.a + wacc[(w * G8 + r) * D + l * 8 + e] * ms.b;
        fm = ms.m;
      }
      const float lse_v = normalise_state8<V::kSoftmax>(fm, fd, fa);
#pragma unroll
      for (int e = 0; e < 8; ++e) rows[r * D + l * 8 + e] = fa[e];
      if (l == 0) row_lse[r] = lse_v;
    }
    __syncthreads();

    if (cur.part_row0 >= 0) {  // partial state for merge.cuh; the output transform runs after the merge
      for (int idx = tid; idx < cta_rows * CPR; idx += NT) {
        const int r = idx / CPR, l = idx % CPR;
        const int64_t row = cur.part_row0 + qh0 + r;
        float4* dst = reinterpret_cast<float4*>(P.part_o + row * D + l * 8);
        const float* src = rows + r * D + l * 8;
        dst[0] = make_float4(src[0], src[1], src[2], src[3]);
        dst[1] = make_float4(src[4], src[5], src[6], src[7]);
        if (l == 0) P.part_lse[row] = row_lse[r];
      }
      if (P.plan != nullptr) {
        const DecodePlanView plan(P.plan);
        static_assert(merge_partial_heads_floats<D, NT>() <= NW * G8 * D, "the fused merge fits the merge region");
        if (plan.merge_counters != nullptr)
          merge_if_last<V, T, D, NT>(P, hp, plan, b, cta_slot, (P.num_kv_heads * parts) >> shift, qh0, cta_rows,
                                     wacc, tid);
      }
    } else {
      finish_rows<V, T, D>(rows, rows + G8 * D, row_lse, cta_rows, b, qo_pos, qh0, P.num_qo_heads,
                           static_cast<T*>(P.o), P.lse, hp, tid, NT, P.empty_lse());
    }
  }
  copy_wait<0>();
}

// Grid mode (no plan): grid (num_chunks, Hkv, B), an even split of each request's visible keys.
// Plan mode (P.plan set): grid (num_ctas, Hkv); CTA x runs its work items of the plan in order. With KV-head
// pairs (kv_head_shift 1) the grid has Hkv / 2 rows.
template <class V, class T, int D, int S, class KV = T>
__global__ void __launch_bounds__(DecodeTCTile<D, S>::kThreads)
decode_tc_kernel(DecodeProblemOf<KV> P, typename V::Params hp) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  allow_dependent_launch();  // the split-KV merge may launch now; it waits for this grid's writes
  // launched as a dependent of whatever ran before on the stream (sm_90): its launch and block setup
  // overlapped that kernel's tail; its q, cache and plan may come from it, so wait before reading any
  grid_dependency_wait();
  const int cta_slot = blockIdx.y;  // the CTA's KV head, or pair of KV heads (kv_head_shift 1)
  // one inlined copy of the item loop for both modes (grid mode: one item, found from the block index)
  const int32_t* work = nullptr;
  int count = 1;
  if (P.plan != nullptr) {
    const DecodePlanView plan(P.plan);
    const int w0 = plan.cta_indptr[blockIdx.x];
    work = plan.work + 5 * w0;
    count = plan.cta_indptr[blockIdx.x + 1] - w0;
  }
  const DecodeTCItems<V> items{P, hp, work, count};
  if constexpr (kIsFp8<KV>) decode_tc_items<V, T, D, S, KV>(P, hp, smem_raw, cta_slot, items, P.scales);
  else decode_tc_items<V, T, D, S>(P, hp, smem_raw, cta_slot, items);
}

}  // namespace attngen
