// Hopper (sm_90a) batch prefill / append: warp-specialised, wgmma, ragged or paged KV.
//
// One work item = (query tile of 128 packed rows, KV head, request); rows are the (token, head) pairs of
// one KV head's group (row = token * group + head), as in the mma.sync template (prefill.cuh), so GQA groups
// share every K/V tile. The kernel is persistent: one CTA per SM walks the items request by request, the
// last query tiles (under causal masks, the longest) first, in snake order over the CTAs; its stages and barrier phases run
// on from item to item, so the producer loads the next item's K/V while the consumers finish this one's
// softmax and epilogue (what short requests of a ragged batch lose without it); it also loads the next
// item's query rows into a second Q buffer (D <= 128). Three warpgroups:
// - the producer (warpgroup 0, registers released to kProducerRegs) copies each item's query rows into a
//   Q buffer (one thread's bulk tensor copy where the GQA group divides the tile's rows, hopper_tma.cuh;
//   per-thread copies had held the next item's rows back on batches of short prompts), gathers K/V tiles
//   from pages or ragged rows with cp.async into kStages shared-memory stages each for K and V, with their
//   own barriers, and applies the key transform (hopper_producer.cuh);
// - two consumers (64 rows each, registers raised to kConsumerRegs) transform their query rows,
//   then per KV tile: S = Q K^T (wgmma, both operands in shared memory), the logits hook, mask and
//   online softmax on the fp32 accumulators in registers, O += P V (wgmma, P from registers), and the
//   epilogue (normalise, lse base 2, output transform, store).
// The accumulator fragments of a wgmma's warp are laid out as mma.sync's (rows g and g + 8 of the warp's
// 16, two columns per 8-column block), so the softmax, the P packing and the register epilogue follow
// prefill.cuh. The mask's bounds restrict the KV range of each tile (causal / sliding-window tile
// skipping), a consumer whose rows see none of a tile's keys skips its MMAs, and a warp whose 16 rows see
// every key of a tile takes the interior path (no mask hook, no checks).
// Tail split (hopper_tail.cuh, runtime/work_tail.py): where a maskless launch's last round of items is part-filled,
// the plan takes those items out of the rounds and each CTA runs its pieces of them after its rounds (key-tile
// stretches; a split item's pieces merge in the epilogue of the last to finish); where a launch has fewer items
// than SMs (appends: verify steps), every item is cut in even chunks over the SMs, causal ones in a Split
// instance.
// fp8 K/V (KV = __nv_fp8_e4m3 / __nv_fp8_e5m2; KV = T for 16-bit caches): the producer stages each tile's bytes in
// its stage and widens them in place (produce_fp8_tiles; hopper_fp8_stage.cuh says how, and how the scales apply).
#pragma once
#include "common.cuh"
#include "cp_async.cuh"
#include "device_info.cuh"
#include "hopper_epilogue.cuh"
#include "hopper_producer.cuh"
#include "hopper_sync.cuh"
#include "hopper_tail.cuh"
#include "hopper_tile.cuh"
#include "hopper_tma.cuh"
#include "hopper_work.cuh"
#include "mma.cuh"
#include "poly_exp2.h"
#include "prefill.cuh"
#include "row_hook.cuh"
#include "score_rules.cuh"
#include "tvm_window.cuh"
#include "wgmma_ops.cuh"

namespace attngen {

// Mapped: the CTA walks the plan's list of its non-empty key tiles (P.tiles, tile_map.cuh), running the
// full ones without the mask hook; else the key range the mask's bounds leave. KV: the cache's element type
// (fp8: staged and widened by the producer, see the file comment).
// Wide: the 176-key (D 128) or 192-key (D 64) tiling (hopper_tile.cuh: the launch's choice among the variant's
// tilings). Split: the instance of a masked variant that runs a plan's tail split (kTailable below): launched only
// with one (hopper_launch.cuh), so that the tail's code costs the variant's other launches nothing.
template <class V, class T, int D, bool Mapped, class KV = T, bool Wide = hopper_wide_tiles<V, T, KV>(),
          bool Split = false>
__global__ void __launch_bounds__(HopperTile<D>::kThreads, 1)
hopper_prefill_kernel(PrefillProblemOf<KV> P, typename V::Params hp, const __grid_constant__ HopperKVMaps maps,
                      int q_tiles) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr bool kStaged = kv_staged<T, KV>();
  static_assert(std::is_same_v<KV, T> || (kStaged && kIsFp8<KV>), "K/V in the query dtype, or fp8");
  using Tile = HopperTile<D, Wide>;
  constexpr int RQ = Tile::kRows, TK = Tile::kKeys, NS = Tile::kStages, NQ = Tile::kQBuffers;
  constexpr int NKT = TK / 8;
  extern __shared__ __align__(16) unsigned char hopper_smem[];
  unsigned char* smem =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(hopper_smem) + 1023) & ~uintptr_t(1023));
  T* sq = reinterpret_cast<T*>(smem);  // [NQ][RQ * D]
  T* sk = sq + NQ * RQ * D;       // [NS][TK * D]
  T* sv = sk + NS * TK * D;       // [NS][TK * D]
  float* scratch_all = reinterpret_cast<float*>(sv + NS * TK * D);
  uint64_t* page_rows = reinterpret_cast<uint64_t*>(scratch_all + (Tile::kThreads / 32) * 2 * D);
  uint64_t* full_k = page_rows + 2 * TK;
  uint64_t* empty_k = full_k + NS;
  uint64_t* full_v = empty_k + NS;
  uint64_t* empty_v = full_v + NS;
  uint64_t* full_q = empty_v + NS;
  uint64_t* empty_q = full_q + NQ;
  HopperItem* ring = reinterpret_cast<HopperItem*>(empty_q + NQ);  // [NQ]: the item of each Q buffer
  // this CTA's pieces of a tail split (hopper_tail.cuh), copied here at the start, and their count
  int4* tail_pieces = reinterpret_cast<int4*>(ring + NQ);  // [kTailMaxPieces]
  int* tail_count = reinterpret_cast<int*>(tail_pieces + kTailMaxPieces);  // then kTailMetaInts (hopper_tail_at)
  static_assert(1 + kTailMetaInts <= 4, "the pieces' count and the tail's offsets share 16 bytes");

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, wg = tid / 128;
  float* scratch = scratch_all + warp * 2 * D;
  const int group = P.group;
  const int per_request = q_tiles * P.num_kv_heads, items = per_request * P.batch;
  // the CTA's item of each round of gridDim.x items, in snake order (rounds alternate direction), so that
  // over the descending item sizes every CTA gets about the same work
  auto work_index = [&](int round) {
    const int i = (round & 1) ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x);
    return round * int(gridDim.x) + i;
  };

  // The tail split (hopper_tail.cuh): the plan's pieces of the last round's items (of every item, where they
  // are fewer than the SMs), each an item with a stretch of its key tiles; variants without a mask, and in their
  // Split instance those whose mask is its bounds (causal, windows: a piece's tiles are checked by their
  // positions as the item's are; the tail's code in their one instance spilled 21 local-memory instructions and
  // put an R2UR among the HGMMAs, sass_stats.py); never with tile maps, fp8 stages or TVM's instances; nor with a
  // logits hook (soft-cap full L 8k ran 542 -> 532 TFLOP/s with it on an H100, where the plain kernel gained 1.7%)
  constexpr bool kTailable = !Mapped && !kStaged && !tvm_instance<V>() && !V::kHasLogits &&
                             (!V::kHasMask || (Split && V::kMaskExact));
  // the tail's arrays, for a split item's epilogue (the order's address made opaque where it is read: nothing
  // of the tail is hoisted out of the consumers' loop into registers, the uniform ones their MMA descriptors
  // need included)
  auto tail_of = [&]() {
    const int32_t* order = P.work_order;
    int batch = P.batch;  // (the batch too: the loops' item count is not kept for it)
    asm volatile("" : "+l"(order), "+r"(batch));
    return hopper_tail_at(order, batch * q_tiles, tail_count + 1);
  };
  // work item idx (hopper_work.cuh; piece: the item of a tail split's piece)
  auto item_at = [&](int idx, HopperItem& w, bool piece = false) {
    return hopper_item_at<V, Tile, Mapped>(P, hp, q_tiles, idx, w, piece);
  };

  hopper_prefetch_indices(P, tid);  // (split launches of few requests: index lines and page ids into L1 meanwhile)
  if (tid == 0) {
    *tail_count = hopper_tail_load_pieces<D, kTailable>(P.work_order, P.batch * q_tiles, P.work_tail_len, items,
                                                         tail_pieces, tail_count + 1);
    for (int s = 0; s < NS; ++s) {
      mbar_init(&full_k[s], 128);
      mbar_init(&full_v[s], 128);
      mbar_init(&empty_k[s], 128 * Tile::kConsumers);
      mbar_init(&empty_v[s], 128 * Tile::kConsumers);
    }
    for (int s = 0; s < NQ; ++s) {
      mbar_init(&full_q[s], 128 + 1);  // the producer's copies, and its thread 0 publishing the item
      mbar_init(&empty_q[s], 128 * Tile::kConsumers);
    }
  }
  __syncthreads();

  if (wg == 0) {
    // ================= producer =================
    regs_release<hopper_producer_regs<V, D>()>();
    // the key transform on each tile, unless the row-hook pass applied it (hook_pass.cuh)
    const bool hook_keys = V::kHasKeyTransform && !(P.hooks_applied & kKeysApplied);
    int it = 0;  // K/V tiles this CTA has issued before the item (stages and phases run on across items)
    int qn = 0;  // items whose query rows this CTA has loaded before
    // one item (or a piece of one) from the producer's side: its query rows, then its K/V tiles
    auto produce = [&](const HopperItem& w) {
      const int b = w.b, hk = w.hk, q0 = w.q0, rows_total = w.rows_total, row0 = w.row0;
      const int lo = w.lo, hi = w.hi, num_kt = w.num_kt;
      const int32_t* tile_list = w.tile_list;
      // the first key of the item's kt-th tile, and whether every score of it is visible (mapped: a full tile)
      auto tile_start = [&](int kt) { return Mapped ? (tile_list[kt] >> 1) * TK : lo + kt * TK; };
      // fp8: the thread index opaque per item (query copy offsets formed per item, not held across items: spills)
      int ptid = tid;
      if constexpr (kStaged) asm volatile("" : "+r"(ptid));
      {  // the item's query rows into Q buffer qn % NQ, once the consumers released it: by one thread's bulk
        // tensor copies (maps.q), else by cp.async, zero past the end
        constexpr int CPR = D / 8;
        const int qs = qn % NQ;
        if (qn >= NQ) mbar_wait(&empty_q[qs], ((qn / NQ) - 1) & 1);
        if (ptid == 0) ring[qs] = w;  // the consumers read the item with its rows (no decoding of their own)
        unsigned char* qb = reinterpret_cast<unsigned char*>(sq + qs * RQ * D);
        if (maps.use_q) {
          if (ptid == 0) {
            mbar_expect_bytes(&full_q[qs], uint32_t(RQ * D * sizeof(T)));
#pragma unroll
            for (int c = 0; c < D / 64; ++c)
              tma_load_4d(qb + c * RQ * 128, &maps.q, c * 64, 0, hk, q0 + row0 / group, &full_q[qs]);
          } else {
            mbar_arrive(&full_q[qs]);
          }
        } else {
          for (int c = ptid; c < RQ * CPR; c += 128) {
            const int r = c / CPR, l = c % CPR, pr = row0 + r;
            const bool ok = pr < rows_total;
            const T* src = static_cast<const T*>(P.q);
            if (ok) src += int64_t(q0 + pr / group) * P.q_stride + int64_t(hk * group + pr % group) * D + l * 8;
            copy16_async(qb + sw128_offset(r, l * 8, RQ), src, ok);
          }
          copy_arrive_on(&full_q[qs]);
          copy_commit();
        }
        if (ptid == 0) mbar_arrive(&full_q[qs]);  // (release: the item written above is seen with the rows)
        ++qn;
      }
      SinkShift sinks{};  // windowed instances: TVM's sliding-window view of request b
      if constexpr (tvm_windowed<V>()) sinks = P.kv.sinks(b);
      const KVGather<KV, D, TK, tvm_windowed<V>()> gather{P.kv, P.kv.indptr[b], lo, hi, hk, P.kv.page_shift(),
                                                            reinterpret_cast<const KV**>(page_rows), sinks};
      if constexpr (kStaged) {
        produce_fp8_tiles<V, T, KV, D, TK, NS>(gather, KVStageRing<T>{sk, sv, full_k, empty_k, full_v, empty_v}, it,
                                               num_kt, tile_start, hp, V::kHasKeyTransform ? P.scales.k_of(hk) : 1.f,
                                               scratch, warp, lane, ptid);
        it += num_kt;
        return;
      }
      // K / V with tensor maps: tiles whose keys all exist come by bulk copies (hopper_tma.cuh bulk_kv_tile: a
      // ragged tile's boxes from one thread, a paged tile's from a thread per page, its page looked up before the
      // stage's wait); the last, partial tile (and a paged one not starting on a box) is gathered with its rows
      // past `hi` zero-filled, so that no other request's values (maybe not finite) meet a masked 0 weight
      const int kv_start = gather.kv_start;  // (P.kv.indptr[b], read once for the item)
#pragma unroll 1
      for (int kt = 0; kt < num_kt; ++kt) {
        const int n = it + kt, s = n % NS;  // the CTA's n-th K/V tile: its stage and (n >= NS) the phase
        const uint32_t drained = ((n / NS) - 1) & 1;  // of the consumers' release to wait for
        const int js = tile_start(kt);
        // (uniform over the producer warpgroup)
        const bool bulk = maps.use && js + TK <= hi && (maps.page_box == 0 || (js & (maps.page_box - 1)) == 0);
        int2 box = make_int2(-1, 0);
        if (bulk) {
          box = paged_box_of<D, TK>(maps, P.kv, kv_start, js, gather.page_shift, ptid);
        } else {
          gather.look_up(js, n % 2, ptid);
        }
        if (n >= NS) mbar_wait(&empty_k[s], drained);
        if (bulk) {
          bulk_kv_tile<T, D, TK>(maps, &maps.k, sk + s * TK * D, hk, int64_t(kv_start) + js, box, &full_k[s], ptid);
        } else {
          gather.issue(js, n % 2, sk + s * TK * D, 0, ptid);
          if (!hook_keys) copy_arrive_on(&full_k[s]);
          copy_commit();
        }
        if (n >= NS) mbar_wait(&empty_v[s], drained);
        if (bulk) {
          bulk_kv_tile<T, D, TK>(maps, &maps.v, sv + s * TK * D, hk, int64_t(kv_start) + js, box, &full_v[s], ptid);
        } else {
          gather.issue(js, n % 2, sv + s * TK * D, P.kv.stride_kv, ptid);
          copy_arrive_on(&full_v[s]);
          copy_commit();
        }
        if (hook_keys) {
          copy_wait<1>();      // this thread's K copies of tile kt have landed (its V copies may not have)
          named_sync(1, 128);  // and every producer thread's
          transform_key_tile<V, T, D, TK>(hp, sk + s * TK * D, js, hi, hk, scratch, warp, lane);
          fence_proxy_async();
          mbar_arrive(&full_k[s]);
        }
      }
      it += num_kt;
    };
    // the rounds, then (rounds past the items) this CTA's pieces of a tail split: one loop, nothing of the
    // tail held across it (the producer has no register to spare)
#pragma unroll 1
    for (int round = 0;; ++round) {
      int idx = work_index(round);
      int n = -1;  // this CTA's n-th piece of a tail split (read from shared memory where used: few registers)
      if (idx >= items) {
        if constexpr (!kTailable) break;
        n = hopper_tail_piece_of_round(round, items);
        if (n >= *tail_count) break;
        idx = tail_pieces[n].x;
      }
      HopperItem w;
      if (!item_at(idx, w, n >= 0)) {
        if (n < 0) continue;  // (the consumers never see it)
        w.pos_base = w.lo = w.hi = w.num_kt = 0;  // (a piece's tile past its request's rows: it still counts)
        w.tile_list = nullptr;
      }
      if (n >= 0) hopper_tail_cut<TK>(tail_pieces[n], w);
      produce(w);
    }
    {  // no more items: a sentinel in the next Q buffer's slot ends the consumers' loop
      const int qs = qn % NQ;
      if (qn >= NQ) mbar_wait(&empty_q[qs], ((qn / NQ) - 1) & 1);
      if (tid == 0) {
        ring[qs].b = -1;
        mbar_arrive(&full_q[qs]);
      }
      mbar_arrive(&full_q[qs]);
    }
    copy_wait<0>();  // leave no copy in flight behind the exiting threads
    return;
  }

  // ================= consumers =================
  regs_claim<hopper_consumer_regs<V, D>()>();
  // the consumer index and the warp's index in it broadcast from lane 0: the compiler then knows them (and every
  // branch on them, the mainloop's included) are uniform, and keeps the asynchronous MMAs in flight across that
  // code (a branch it cannot prove uniform makes it wait for each wgmma right after issuing it; the output hook's
  // row loop, which ends at a row counted from the warp's, cost the attention sink's mainloop 92 R2UR among its
  // HGMMAs while the warp index was ctid / 32 unbroadcast)
  const int cw = __shfl_sync(0xffffffffu, wg - 1, 0), ctid = tid - 128 * (cw + 1);
  const int cwarp = __shfl_sync(0xffffffffu, ctid / 32, 0);
  const int wrow0 = 64 * cw;  // this consumer's first row in the tile
  int it = 0;  // K/V tiles this CTA has consumed before the item (stages and phases run on across items)
  int qn = 0;  // items this CTA has run before (their Q buffers and phases)
  constexpr int kTurnBar = 4;  // named barriers kTurnBar + cw: the consumers' turns at issuing MMAs
  if (cw == 1) named_arrive(kTurnBar, 256);  // the first consumer takes the first turn
  // the stage and phase of the item's kt-th tile
  auto stage = [&](int kt) { return (it + kt) % NS; };
  auto phase = [&](int kt) { return uint32_t((it + kt) / NS) & 1; };
#pragma unroll 1
  for (;;) {
    // the next item, as the producer decoded it, with its query rows
    const int qs = qn % NQ;
    mbar_wait(&full_q[qs], (qn / NQ) & 1);
    const HopperItem w = warp_uniform_item(ring[qs]);
    if (w.b < 0) break;  // the producer's sentinel: no more items
    const int b = w.b, hk = w.hk, q0 = w.q0, rows_total = w.rows_total, row0 = w.row0, pos_base = w.pos_base;
    const int lo = w.lo, hi = w.hi, num_kt = w.num_kt;
    const int32_t* tile_list = w.tile_list;
    // the first key of the item's kt-th tile, and whether every score of it is visible (mapped: a full tile)
    auto tile_start = [&](int kt) { return Mapped ? (tile_list[kt] >> 1) * TK : lo + kt * TK; };
    auto tile_full = [&](int kt) { return Mapped && (tile_list[kt] & 1) != 0; };
    // (mapped: the map rows' key intervals of the item's list; the item's query tile is the map tile)
    const int2* map_rows = Mapped ? P.tiles.row_keys + int64_t(P.tiles.list(b, hk, w.tile)) * RQ : nullptr;
    // ---- Q rows of this consumer (landed with the item): query transform ----------------------
    {
      unsigned char* qb = reinterpret_cast<unsigned char*>(sq + qs * RQ * D);
      if (V::kHasQueryTransform && !(P.hooks_applied & kQueriesApplied)) {
        named_sync(2 + cw, 128);
        for (int r = wrow0 + cwarp; r < wrow0 + 64; r += 4) {
          const int pr = row0 + r;
          if (pr >= rows_total) continue;
          const int qo_pos = pos_base + pr / group, qh = hk * group + pr % group;
          for (int i = lane; i < D; i += 32) scratch[i] = to_float(*reinterpret_cast<T*>(qb + sw128_offset(r, i, RQ)));
          __syncwarp();
          warp_row_hook<D, V::kQueryElementwise>(
              scratch, scratch + D, [&](float* row, int i) { return V::query_elem(hp, row, i, qo_pos, qh); },
              [&](float* in, float* out) { V::query_row(hp, in, out, qo_pos, qh); }, lane);
          for (int i = lane; i < D; i += 32) *reinterpret_cast<T*>(qb + sw128_offset(r, i, RQ)) = from_float<T>(scratch[D + i]);
          __syncwarp();
        }
      }
      fence_proxy_async();
      named_sync(2 + cw, 128);
    }

    // ---- per-thread state: rows g and g + 8 of this warp's 16 -------------------------------
    const int g = lane / 4, t4 = lane % 4;
    const int wrow = wrow0 + cwarp * 16;  // this warp's first row in the tile
    float o_acc[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o_acc[i] = 0.f;
    float m_row[2] = {kNegInf, kNegInf}, d_row[2] = {0.f, 0.f};
    const int prow0 = row0 + wrow + g;
    float scale = P.sm_scale * ((V::kHasLogits || !V::kSoftmax) ? 1.f : kLog2e);
    if constexpr (kStaged && !V::kHasKeyTransform) scale *= P.scales.k_of(hk);  // (q . k) s = q . (k s)
    long long mask_lo = 0, mask_hi = 0;
    if constexpr (V::kHasLower) mask_lo = V::mask_lower(hp);
    if constexpr (V::kHasUpper) mask_hi = V::mask_upper(hp);
    // interior bounds of this consumer's 64 rows (see prefill.cuh; per consumer, not per warp, so that the
    // branch is warpgroup-uniform): tile keys [js, js + TK) are interior iff js + TK - 1 <= int_jmax and
    // js >= int_j0min (windowed instances whose rows see different keys check every tile)
    int int_jmax, int_j0min;
    {
      const int r0 = row0 + wrow0;
      long long jmax = -1, j0min = 0;
      const bool rows_limited = tvm_windowed<V>() && P.win.limits_rows();
      if (V::kMaskExact && r0 + 64 <= rows_total && !rows_limited) {
        const long long first = pos_base + r0 / group, last = pos_base + (r0 + 63) / group;
        jmax = hi - 1;
        if (P.causal) jmax = min(jmax, first);
        if constexpr (V::kHasLower) jmax = min(jmax, first - mask_lo);
        if constexpr (V::kHasUpper) j0min = last - mask_hi;
      }
      int_jmax = int(max(jmax, -1LL));
      int_j0min = int(min(max(j0min, -0x7fffffffLL), 0x7fffffffLL));
    }
    // the last key any row of this consumer may see: tiles past it skip their MMAs (warpgroup-uniform)
    int cons_jmax;
    {
      const int last_row = min(row0 + wrow0 + 64, rows_total) - 1;
      const long long last = pos_base + last_row / group;
      long long jm = last_row < row0 + wrow0 ? -1 : hi - 1;
      if (P.causal) jm = min(jm, last);
      if constexpr (V::kHasLower) jm = min(jm, last - mask_lo);
      cons_jmax = int(max(jm, -1LL));
    }
    constexpr bool kFoldScale = V::kSoftmax && !V::kHasLogits;
    const bool fold = kFoldScale && scale > 0.f;

    const ScoreRules<V> score_rules{P.causal, hp, b, hk, group, rows_total, pos_base, hi, t4, scale, P.win, q0};
    typename ScoreRules<V>::RowTerms row_terms;
    score_rules.row_terms(prow0, row_terms);
    const bool affine = V::kLogitsAffine && score_rules.affine_rows(row_terms);  // (warp-uniform)
    const bool post_scaled = ScoreRules<V>::kPostScale >= 0 && score_rules.post_rows(prow0, row_terms);  // (the same)
    // a bounded one over a bf16 P: the row max fixed at 0, none taken on interior tiles (the same)
    const bool fixed_max = score_rules.template fix_row_max<T>(prow0, row_terms, m_row);
    // mapped: the rows' key intervals from the map, where every row of the warp sees one (warp-uniform)
    int map_lo[2] = {0, 0}, map_hi[2] = {0, 0};
    bool mapped_iv = false;
    if constexpr (Mapped && ScoreRules<V>::kMappedIntervals)
      mapped_iv = score_rules.mapped_intervals(map_rows, row0, prow0, map_lo, map_hi);

    // ---- mainloop: S_kt = Q K_kt^T issued with O += P_(kt-1) V_(kt-1) ----------------------------
    // The softmax of tile kt runs while P V of tile kt - 1 is on the tensor cores (its P packed into `pk`
    // beforehand; the new weights stay fp32 in `sacc` until that product completes, then O is rescaled and
    // they are packed). The two consumers take turns issuing their MMAs (named barriers kTurnBar + cw), so
    // one's softmax overlaps the other's MMAs. Tiles past the consumer's last visible key (a prefix of
    // n_active tiles is visible) issue nothing but still wait for and release their stage. The MMAs sit in
    // straight-line code of a loop with uniform bounds: a conditional issue or wait makes the compiler
    // serialise every wgmma.
    const uint32_t q_addr = smem_addr(sq + qs * RQ * D) + wrow0 * 128;
    // (mapped: every listed tile, the count broadcast so that the MMA loop's bounds are known uniform)
    const int n_active = Mapped ? __shfl_sync(0xffffffffu, num_kt, 0)
                                : (cons_jmax >= lo ? min(num_kt, (cons_jmax - lo) / TK + 1) : 0);
    float sacc[TK / 2];
    uint32_t pk[TK / 16][4];
    float (&sfr)[NKT][4] = *reinterpret_cast<float (*)[NKT][4]>(sacc);
    auto issue_s = [&](int stage) {
      // (the queries' address opaque at each issue: their D / 16 descriptors are formed next to the MMAs, not
      // hoisted out of the key loop, where D 256's sixteen held 32 uniform registers for the whole loop and, in
      // kernels whose hooks need more (RoPE, an output hook), ptxas moved some to ordinary registers and back
      // before each MMA: 17-24 R2UR among the HGMMAs; benchmarks/sass_stats.py)
      uint32_t qa = q_addr;
      asm volatile("" : "+r"(qa));
      const uint64_t q_desc = desc_k_major(qa), k_desc = desc_k_major(smem_addr(sk + stage * TK * D));
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < D / 16; ++k) {
        const uint32_t koff = (k % 4) * 32;  // 16 elements along the 128-byte row
        wgmma_ss<T, TK>(sacc, desc_advance(q_desc, (k / 4) * RQ * 128 + koff),
                        desc_advance(k_desc, (k / 4) * TK * 128 + koff), k > 0);
      }
      wgmma_commit();
    };
    auto issue_pv = [&](int stage) {
      const uint64_t v_desc = desc_mn_major(smem_addr(sv + stage * TK * D), TK * 128);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < TK / 16; ++kk) wgmma_rs<T, D>(o_acc, pk[kk], desc_advance(v_desc, kk * 16 * 128), 1);
      wgmma_commit();
    };
    // hooks, mask and online softmax of tile kt's scores in sacc (fp32 weights left in place); returns
    // the factors O must be rescaled by
    auto softmax = [&](int kt, float (&rescale)[2]) {
      const int js = tile_start(kt);
      const bool interior = Mapped ? tile_full(kt) : (js + TK - 1 <= int_jmax && js >= int_j0min);
      float mt_max[2] = {m_row[0], m_row[1]};
      float sfac[2] = {1.f, 1.f}, koff[2] = {0.f, 0.f};  // the exponent: 2^(s * sfac + koff - m)
      // (a checked tile of rows whose keys form intervals runs the same way, its hidden scores made -inf first;
      // mapped: where the map found every row of the warp seeing one interval)
      if (fold && (interior || ScoreRules<V>::kIntervalRows || mapped_iv)) {
        if constexpr (ScoreRules<V>::kIntervalRows && kFoldScale) {
          if (!interior) score_rules.mask_outside(sfr, prow0, js);
        } else if constexpr (Mapped && kFoldScale) {
          if (!interior) score_rules.mapped_outside(sfr, js, map_lo, map_hi);
        }
        float raw_max[2];
        tile_row_reduce<NKT>(sfr, raw_max, [](float x, float y) { return fmaxf(x, y); });
        mt_max[0] = fmaxf(mt_max[0], raw_max[0] * scale);
        mt_max[1] = fmaxf(mt_max[1], raw_max[1] * scale);
        sfac[0] = sfac[1] = scale;
      } else if (V::kLogitsAffine && interior && affine) {
        score_rules.apply_affine(sfr, js, mt_max, sfac, koff, row_terms,
                                 [](auto&&... a) { tile_row_reduce<NKT>(a...); });
      } else if (interior && (ScoreRules<V>::kPostScale < 0 || post_scaled)) {
        // (a post-scaled hook's warp whose rows fail post_rows takes the checked path below: one copy of the
        // per-score code less in the loop)
        if constexpr (ScoreRules<V>::kPostScale >= 0)
          score_rules.apply_post_scaled(sfr, prow0, js, mt_max, sfac, row_terms,
                                        [](auto&&... a) { tile_row_reduce<NKT>(a...); }, fixed_max);
        else
          score_rules.apply(sfr, prow0, js, mt_max, false, row_terms);
      } else if (Mapped && ScoreRules<V>::kMappedIntervals && mapped_iv) {
        if constexpr (Mapped && ScoreRules<V>::kMappedIntervals)
          score_rules.apply_mapped(sfr, prow0, js, mt_max, row_terms, map_lo, map_hi);
      } else {
        score_rules.apply(sfr, prow0, js, mt_max, true, row_terms);
      }
      if constexpr (V::kSoftmax) {
        float msub[2];
        // (common.cuh: the max moves on a rise past the slack; a fixed row max holds on interior tiles)
        step_or_hold_row_max(ScoreRules<V>::kPostBounded && fixed_max && interior, mt_max, m_row, koff, rescale, msub);
#pragma unroll
        for (int h = 0; h < 2; ++h) d_row[h] *= rescale[h];
        // (weights i with i * kPoly % 16 < kPoly, spread evenly over the tile, on the FMA pipe)
        constexpr int kPoly = hopper_poly_exp2_of_16<D>(V::kScoreSfuCalls);
#pragma unroll
        for (int n = 0; n < NKT; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float x = fmaf(sfr[n][e], sfac[e / 2], -msub[e / 2]);
            sfr[n][e] = (n * 4 + e) * kPoly % 16 < kPoly ? poly_exp2(x) : fast_exp2(x);
          }
        float tile_sum[2];
        tile_row_reduce<NKT>(sfr, tile_sum, [](float x, float y) { return x + y; });
        d_row[0] += tile_sum[0];
        d_row[1] += tile_sum[1];
      }
    };

    // Turns: both consumers take num_kt + 1 of them, alternating (the first consumer first). The second
    // consumer's last turn of an item hands on to the first one's first turn of the next item, so that the
    // first starts the next item while the second runs this one's epilogue (the first absorbs the last
    // hand-on after its last item). A consumer's active tiles take n_active + 1 turns (S of the first tile;
    // S of tile kt with P V of kt - 1; P V of the last), its other turns issue nothing.
    const int turns = num_kt + 1;
    int turn = 0;
    auto turn_begin = [&]() { named_sync(kTurnBar + cw, 256); };
    auto turn_end = [&]() {
      named_arrive(kTurnBar + 1 - cw, 256);
      ++turn;
    };
    auto pack_p = [&]() {
#pragma unroll
      for (int kk = 0; kk < TK / 16; ++kk) {
        pk[kk][0] = pack2<T>(sfr[2 * kk][0], sfr[2 * kk][1]);
        pk[kk][1] = pack2<T>(sfr[2 * kk][2], sfr[2 * kk][3]);
        pk[kk][2] = pack2<T>(sfr[2 * kk + 1][0], sfr[2 * kk + 1][1]);
        pk[kk][3] = pack2<T>(sfr[2 * kk + 1][2], sfr[2 * kk + 1][3]);
      }
    };
    // A stage the tensor cores read next was written by cp.async or the key transform in the producer's
    // threads: the barrier orders it, this fence hands it to the async proxy.
    auto wait_k = [&](int kt) {
      mbar_wait(&full_k[stage(kt)], phase(kt));
      fence_proxy_async();
    };
    auto wait_v = [&](int kt) {
      mbar_wait(&full_v[stage(kt)], phase(kt));
      fence_proxy_async();
    };
    if (n_active > 0) {
      float rescale[2] = {1.f, 1.f};  // a sum-state variant keeps them
      wait_k(0);
      turn_begin();
      issue_s(stage(0));
      turn_end();
      wgmma_wait<0>();
      pin_registers(sacc);
      mbar_arrive(&empty_k[stage(0)]);
      softmax(0, rescale);  // O is still zero: nothing to rescale
      pack_p();
#pragma unroll 1
      for (int kt = 1; kt < n_active; ++kt) {
        wait_k(kt);
        wait_v(kt - 1);
        turn_begin();
        issue_s(stage(kt));
        issue_pv(stage(kt - 1));
        turn_end();
        wgmma_wait<1>();  // S of tile kt; P V of kt - 1 still runs
        pin_registers(sacc);
        mbar_arrive(&empty_k[stage(kt)]);
        softmax(kt, rescale);
        // O is rescaled only where a row of the warp raised its max (late in a long row, rarely; never for a
        // sum-state variant): a warp-uniform branch saves D / 2 multiplies per thread and tile
        const bool grew = __any_sync(0xffffffffu, rescale[0] != 1.f || rescale[1] != 1.f);
        wgmma_wait<0>();
        pin_registers(o_acc);
        mbar_arrive(&empty_v[stage(kt - 1)]);
        if (grew) {
#pragma unroll
          for (int i = 0; i < D / 2; ++i) o_acc[i] *= rescale[(i % 4) / 2];
        }
        pack_p();
      }
      wait_v(n_active - 1);
      turn_begin();
      issue_pv(stage(n_active - 1));
      turn_end();
      wgmma_wait<0>();
      pin_registers(o_acc);
      mbar_arrive(&empty_v[stage(n_active - 1)]);
    }
    // the remaining turns; tiles past this consumer's rows ride on them (tile kt on turn kt + 1, as the
    // other consumer's P V of kt would): wait for its K and V stages, release them. Waiting for them all
    // without taking turns would deadlock with the other consumer, whose turns need this one's.
#pragma unroll 1
    while (turn < turns) {
      const int kt = turn - 1;
      const bool tile = kt >= n_active && kt >= 0;
      if (tile) {
        mbar_wait(&full_k[stage(kt)], phase(kt));
        mbar_wait(&full_v[stage(kt)], phase(kt));
      }
      turn_begin();
      turn_end();
      if (tile) {
        mbar_arrive(&empty_k[stage(kt)]);
        mbar_arrive(&empty_v[stage(kt)]);
      }
    }
    mbar_arrive(&empty_q[qs]);  // every S of the item has completed: its Q buffer may take another item's rows

    // ---- epilogue: a split item's piece leaves its state, the last merges the rest (hopper_tail.cuh); ----
    // ---- normalise, lse, output transform, store (hopper_epilogue.cuh) --------------------------
    // (no early exit from the loop here: a second path back to its head costs the mainloop its known-uniform
    // values, R2UR among the HGMMAs)
    int finish = kTailWholeRows;
    if constexpr (kTailable)
      if (w.tile < 0)  // (a split item's piece: its partial slot, hopper_tail_cut)
        finish = hopper_tail_merge<V, T, D>(tail_of(), -1 - w.tile, cw, ctid, w.row0 + wrow < w.rows_total, o_acc,
                                            m_row, d_row);
    if (finish != kTailNoFinish) {
      float lse_row[2];
      hopper_normalise_rows<V, kStaged, D>(o_acc, m_row, d_row, P, hk, lse_row);
      hopper_store_rows<V, T, D>(o_acc, lse_row, w, wrow, P, hp, scratch, lane, finish);
    }
    it += num_kt;
    ++qn;
  }
  if (cw == 0) named_sync(kTurnBar, 256);  // the second consumer's hand-on after its last turn
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

}  // namespace attngen
