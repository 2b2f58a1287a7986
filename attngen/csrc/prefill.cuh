// FA2-class batch prefill / append on tensor cores (mma.sync), ragged or paged KV.
//
// One CTA = (query tile, KV head, request). GQA head-group fusion: the CTA's rows are the (token, head) pairs of one KV
// head's group, packed row = token * group + head, so a K/V tile is read once for the whole group and a decode step
// (one token, group heads) fills tensor-core rows too. Four warps, each owning one or two 16-row MMA tiles (64 or 128
// rows): with two, every K/V fragment read from shared memory feeds two MMAs and each warp has two independent softmax
// chains in flight. K/V tiles are gathered from pages (or ragged rows) into shared memory with cp.async,
// double-buffered where shared memory allows (one barrier per tile: the next tile is issued, right after it, into the
// stage the previous step read); rows unpadded, 16-byte chunks swizzled (kv_tile_layout.cuh); S = Q K^T and O += P V
// with m16n8k16 (two m16n8k8 on sm_75); online softmax in fp32, base 2; P, packed from the S accumulators as soon as an
// m-tile's softmax is done, is the A operand of P V. A KV tile is one compute step (a step size below the tile is a
// tuning knob: at two m-tiles, 32-key steps avoid a small spill but measured slower), and a warp skips a step whose
// keys all lie past its rows' last visible key. The mask's bounds restrict the KV range of each query tile (causal /
// sliding-window tile skipping); the mask hook decides every remaining score. Row hooks run per warp on one row at a
// time through a float scratch row. P enters the P.V product in the input dtype (as in FA2): softmax weights lie in [0,
// 1]; sum-state weights (e.g. sigmoid) too, but a sum-state variant whose weights exceed the dtype's range would
// overflow here. Without an output hook each thread stores its output fragments straight from registers; with one, rows
// go through shared memory to the hook. (H200, causal L 4k / 16k: the register epilogue and the single barrier took 316
// / 370 to 349 / 370 TFLOP/s.)
// fp8 K/V (KV = __nv_fp8_e4m3 / __nv_fp8_e5m2, fp8_kv.cuh; the 16-bit instantiations have KV = T and compile as
// before): the loader copies each tile's fp8 rows into a staging area (kv_staging.cuh), and after its own copies land
// each thread widens the chunks it copied into one 16-bit K/V tile; the next tile's copies are issued right after that
// tile is published, so they stay in flight through this tile's compute, with two barriers per tile (one 16-bit tile
// plus the staging area: less shared memory than two 16-bit stages). k_scale multiplies the score scale (or the key
// hook's input), v_scale the normalised output rows, as on the CPU backend.
#pragma once
#include "common.cuh"
#include "cp_async.cuh"
#include "cubin_launch.h"
#include "decode.cuh"
#include "device_info.cuh"
#include "hook_abi.h"
#include "kv_rows.cuh"
#include "kv_staging.cuh"
#include "kv_tile_layout.cuh"
#include "mma.cuh"
#include "prefill_problem.cuh"
#include "prefill_split.cuh"
#include "prefill_tile.cuh"
#include "row_hook.cuh"
#include "score_rules.cuh"
#include "tile_map.cuh"
#include "tvm_rope.cuh"
#include "tvm_tree.cuh"
#include "tvm_window.cuh"

namespace attngen {

// Mapped: the CTA walks the plan's list of non-empty key tiles of the map tile its rows lie in (P.tiles,
// tile_map.cuh), each split into this tile's key steps, running the full ones without the mask hook; else
// the key range the mask's bounds leave. KV: the cache's element type (fp8: staged, see the file comment).
template <class V, class T, int D, bool Small, int MT, bool Mapped = false, class KV = T>
__global__ void __launch_bounds__(PrefillTile<D, Small, MT>::kThreads)
prefill_kernel(PrefillProblemOf<KV> P, typename V::Params hp) {
  using Tile = PrefillTile<D, Small, MT>;
  constexpr bool kStaged = kv_staged<T, KV>();
  static_assert(std::is_same_v<KV, T> || (kStaged && kIsFp8<KV>), "K/V in the query dtype, or fp8");
  // staged K/V: one 16-bit tile (the loop below), whatever the tile's stage count
  constexpr int RQ = Tile::kRows, TK = Tile::kKeys, ST = Tile::kStride, NS = kStaged ? 1 : Tile::kStages;
  constexpr int NT = Tile::kThreads;
  // keys per compute step (a KV tile is loaded whole; a step forms, softmaxes and multiplies its scores into
  // O). One step per tile: at MT = 2 its 16 independent Q K^T accumulator chains cost 72 bytes of spill,
  // yet measured 10% faster on the H200 than two 32-key steps without spill (more MMAs in flight per warp)
  constexpr int TS = TK;
  constexpr int NKT = TS / 8;   // n-tiles of S per warp and compute step
  constexpr int NDT = D / 8;    // n-tiles of O per warp
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sq = reinterpret_cast<T*>(smem_raw);   // [RQ][ST]
  T* skv = sq + RQ * ST;                    // [NS][2][TK][D], kv_tile_at
  static_assert(RQ * ST * sizeof(T) % 128 == 0, "the K/V tiles start 128-byte aligned");
  float* scratch_all = reinterpret_cast<float*>(
      smem_raw + (prefill_smem_bytes<V, T, D, Small, MT, KV>() - size_t(Tile::kWarps) * 2 * D * sizeof(float)));
  using Staged = StagedKVTile<T, KV, D, TK, Tile::kThreads>;  // staged K/V only

  // blockIdx.x runs over (query tile, KV head) with the head fastest and the last query tiles first: under
  // a causal mask those see the most keys, so the long CTAs of every head start before any short one
  const int hk = blockIdx.x % P.num_kv_heads, b = blockIdx.z;
  const int tile = (gridDim.x - 1 - blockIdx.x) / P.num_kv_heads;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  float* scratch = scratch_all + warp * 2 * D;
  const int group = P.group;
  const int q0 = P.qo_indptr[b], qo_len = P.qo_indptr[b + 1] - q0;
  const int rows_total = qo_len * group;
  const int row0 = tile * RQ;
  if (row0 >= rows_total) return;
  const int kv_len = view_length<V>(P.kv, b);
  const int pos_base = kv_len - qo_len;  // qo_pos of token i = pos_base + i

  // ---- Q tile: load (zero rows past the end) into smem; its hooks run once it has landed -----
  for (int c = tid; c < RQ * (D / 8); c += NT) {
    const int r = c / (D / 8), l = c % (D / 8), pr = row0 + r;
    const bool ok = pr < rows_total;
    const T* src = static_cast<const T*>(P.q);
    if (ok) src += int64_t(q0 + pr / group) * P.q_stride + int64_t(hk * group + pr % group) * D + l * 8;
    copy16_async(sq + r * ST + l * 8, src, ok);
  }
  copy_commit();  // waited for after tile 0's K/V are issued: the two loads overlap

  // ---- KV range of this tile from the mask's bounds ------------------------------------
  // The causal bound: TVM's run-time flag, or in tree instances the tree's (TreeMask::causal)
  const int tree_causal = tvm_tree<V>() ? P.tree.causal(b) : 0;
  const int& causal = tvm_tree<V>() ? tree_causal : P.causal;
  const int first_pos = pos_base + row0 / group;
  const int last_pos = pos_base + (min(row0 + RQ, rows_total) - 1) / group;
  long long lo64 = 0, hi64 = kv_len;  // 64-bit so huge windows cannot wrap
  if constexpr (V::kHasUpper) lo64 = max(lo64, (long long)first_pos - V::mask_upper(hp));
  if constexpr (V::kHasLower) hi64 = min(hi64, (long long)last_pos - V::mask_lower(hp) + 1);
  if (causal) hi64 = min(hi64, (long long)last_pos + 1);
  int lo = int(min(lo64, (long long)kv_len)), hi = int(max(hi64, 0LL));
  // split-KV (prefill_split.cuh): the CTA's chunk of its range (the section read again at the epilogue, not held).
  // Only 64-row tiles split (prefill_launch.cuh); the 128-row ones are compiled without it (it cost them 24 bytes
  // of spill and 5% on an H100, causal L 4k)
  constexpr bool kSplits = !Mapped && MT == 1;
  if (kSplits && gridDim.y > 1) mma_split_cut(mma_split_at<D, MT, NT>(P.work_order, P.work_tail_len, RQ), lo, hi);
  int num_kt = hi > lo ? (hi - lo + TK - 1) / TK : 0;
  constexpr int kMapKeys = MapTile<D>::kKeys, kParts = kMapKeys / TK;
  static_assert(kMapKeys % TK == 0 && MapTile<D>::kRows % RQ == 0, "the tile lies in one map tile");
  const int32_t* tile_list = nullptr;
  const int2* map_rows = nullptr;  // mapped: the map rows' key intervals of the CTA's map tile
  const int map_row0 = row0 / MapTile<D>::kRows * MapTile<D>::kRows;
  if constexpr (Mapped) {
    const int l = P.tiles.list(b, hk, row0 / MapTile<D>::kRows);
    tile_list = P.tiles.entries + P.tiles.indptr[l];
    map_rows = P.tiles.row_keys + int64_t(l) * MapTile<D>::kRows;
    num_kt = (P.tiles.indptr[l + 1] - P.tiles.indptr[l]) * kParts;
  }
  // the first key of the CTA's kt-th tile, and whether every score of it is visible (mapped: in a full tile)
  auto tile_start = [&](int kt) {
    return Mapped ? (tile_list[kt / kParts] >> 1) * kMapKeys + (kt % kParts) * TK : lo + kt * TK;
  };
  auto tile_full = [&](int kt) { return Mapped && (tile_list[kt / kParts] & 1) != 0; };

  const T* kvbase = static_cast<const T*>(P.kv.base);
  const int64_t head_off = int64_t(hk) * P.kv.stride_head;
  const int kv_start = P.kv.indptr[b];
  // each thread copies one 16-byte column chunk of every RPP-th key row, its K row and its V row
  constexpr int CPR = D / 8, RPP = NT / CPR;
  static_assert(NT % CPR == 0 && TK % RPP == 0, "K/V rows split evenly over the threads");
  const T* kv_col = kvbase + head_off + (tid % CPR) * 8;  // this thread's column of KV head hk
  const int page_shift = P.kv.page_shift();
  const SinkShift sinks = tvm_windowed<V>() ? P.kv.sinks(b) : SinkShift{};  // windowed: TVM's view of request b
  auto load_kv = [&](int kt, int stage) {
    const int j0 = tile_start(kt) + tid / CPR;
    T* const dst_k = skv + stage * 2 * TK * D;
    // row tid / CPR + i * RPP; where RPP is a multiple of 8 the chunk swizzle is the same for every i
    const int first = kv_tile_at<D>(tid / CPR, (tid % CPR) * 8);
    auto dst_at = [&](int i) {
      if constexpr (RPP % 8 == 0) return dst_k + first + i * RPP * D;
      else return dst_k + kv_tile_at<D>(tid / CPR + i * RPP, (tid % CPR) * 8);
    };
    // not unrolled: the row addresses are formed one at a time, so the output accumulators
    // (live across the loads) keep their registers
    if (P.kv.page_size == 0) {
      // ragged: this thread's rows lie RPP rows apart, so one pointer (formed once per tile) walks them
      const int64_t step = int64_t(RPP) * P.kv.stride_slot;
      const T* src = kv_col + int64_t(kv_start + j0) * P.kv.stride_slot;
#pragma unroll 1
      for (int i = 0; i < TK / RPP; ++i, src += step) {
        const int j = j0 + i * RPP;
        const bool ok = j < hi;
        T* dst = dst_at(i);
        copy16_async(dst, ok ? src : kvbase, ok);
        copy16_async(dst + TK * D, ok ? src + P.kv.stride_kv : kvbase, ok);
      }
    } else {
#pragma unroll 1
      for (int i = 0; i < TK / RPP; ++i) {
        const int j = j0 + i * RPP;
        const bool ok = j < hi;
        const T* src = ok ? kv_col + P.kv.key_offset(kv_start, view_row<V>(sinks, j), page_shift) : kvbase;
        T* dst = dst_at(i);
        copy16_async(dst, src, ok);
        copy16_async(dst + TK * D, ok ? src + P.kv.stride_kv : src, ok);
      }
    }
  };

  // ---- per-thread state: rows g and g+8 of each of this warp's MT m-tiles ---------------
  const int g = lane / 4, t4 = lane % 4;
  const int wrow = warp * 16 * MT;  // this warp's first row in the tile
  float o_acc[MT][NDT][4];
  float m_row[MT][2], d_row[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int n = 0; n < NDT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o_acc[mt][n][e] = 0.f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m_row[mt][h] = kNegInf;
      d_row[mt][h] = 0.f;
    }
  }
  // row pr = prow0 + 16 mt + 8 h of the request (recomputed where used: registers are scarce at MT = 2)
  const int prow0 = row0 + wrow + g;
  float scale = P.sm_scale * ((V::kHasLogits || !V::kSoftmax) ? 1.f : kLog2e);
  if constexpr (kStaged && !V::kHasKeyTransform) scale *= P.scales.k_of(hk);  // (q . k) s = q . (k s)
  long long mask_lo = 0, mask_hi = 0;
  if constexpr (V::kHasLower) mask_lo = V::mask_lower(hp);
  if constexpr (V::kHasUpper) mask_hi = V::mask_upper(hp);
  // The interior path's bounds per m-tile, computed once so that the KV loop divides by nothing: a KV tile [j0, j0 +
  // TK) is interior (all 16 rows present, every (row, key) pair inside the mask's bounds, no mask hook needed) iff
  // j0 + TK - 1 <= int_jmax[mt] and j0 >= int_j0min[mt] (none in windowed instances whose rows see different keys).
  int int_jmax[MT], int_j0min[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int r0 = row0 + wrow + mt * 16;
    long long jmax = -1, j0min = 0;
    if (V::kMaskExact && r0 + 16 <= rows_total && !(tvm_windowed<V>() && P.win.limits_rows())) {
      const long long first = pos_base + r0 / group, last = pos_base + (r0 + 15) / group;
      jmax = hi - 1;
      // tree instances: only keys before the tree are visible to every row
      if constexpr (tvm_tree<V>()) jmax = min(jmax, (long long)(kv_len - P.tree.tree_len(b)) - 1);
      if (causal) jmax = min(jmax, first);
      if constexpr (V::kHasLower) jmax = min(jmax, first - mask_lo);
      if constexpr (V::kHasUpper) j0min = last - mask_hi;
    }
    int_jmax[mt] = int(max(jmax, -1LL));
    int_j0min[mt] = int(min(max(j0min, -0x7fffffffLL), 0x7fffffffLL));
  }
  // The last key any row of this warp may see (its last row's position under the causal and lower
  // bounds): compute steps past it are skipped, which trims the diagonal tiles of a causal mask.
  int warp_jmax = hi - 1;
  {
    const int last_row = min(row0 + wrow + 16 * MT, rows_total) - 1;  // < row0 + wrow: no rows
    const long long last = pos_base + last_row / group;
    long long jm = last_row < row0 + wrow ? -1 : hi - 1;
    if (causal) jm = min(jm, last);
    if constexpr (V::kHasLower) jm = min(jm, last - mask_lo);
    warp_jmax = int(max(jm, -1LL));
  }
  // staged K/V: the staging area after the 16-bit tile (named only in the staged branches)
  constexpr size_t kStagingOffset = (size_t(RQ) * ST + 2 * size_t(TK) * D) * sizeof(T);
  if constexpr (kStaged) {
    if (num_kt > 0)
      Staged::load(reinterpret_cast<KV*>(smem_raw + kStagingOffset), tid, P.kv, hk, kv_start, page_shift,
                   tile_start(0), hi);
  } else {
    if (num_kt > 0) load_kv(0, 0);
  }
  copy_commit();
  // the query rows (the first group) have landed; tile 0 stays in flight through the query hooks
  copy_wait<1>();
  __syncthreads();
  if constexpr (tvm_rope<V>()) {  // TVM's inline RoPE, before the variant's query transform
    // (the row bounds by value: captured by reference, they reorder the kernel's row arithmetic in the PTX)
    rope_rotate_tile<D, RQ, Tile::kWarps>(
        [&](int r, int i) -> T& { return sq[r * ST + i]; }, [row0, rows_total](int r) { return row0 + r < rows_total; },
        [&P, q0, row0, group](int r) { return P.win.q_pos[q0 + (row0 + r) / group]; }, scratch, P.rope, warp, lane);
  }
  if (V::kHasQueryTransform && !(P.hooks_applied & kQueriesApplied)) {
    for (int r = warp; r < RQ; r += Tile::kWarps) {
      const int pr = row0 + r;
      if (pr >= rows_total) continue;
      const int qo_pos = pos_base + pr / group, qh = hk * group + pr % group;
      for (int i = lane; i < D; i += 32) scratch[i] = to_float(sq[r * ST + i]);
      __syncwarp();
      warp_row_hook<D, V::kQueryElementwise>(
          scratch, scratch + D, [&](float* row, int i) { return V::query_elem(hp, row, i, qo_pos, qh); },
          [&](float* in, float* out) { V::query_row(hp, in, out, qo_pos, qh); }, lane);
      for (int i = lane; i < D; i += 32) sq[r * ST + i] = from_float<T>(scratch[D + i]);
      __syncwarp();
    }
    __syncthreads();
  }

  // Softmax without a logits hook folds the scale into the exponent on interior tiles: the max is taken
  // over raw scores (times scale > 0 afterwards) and p = 2^(s * scale - m) is one FFMA and one EX2.
  constexpr bool kFoldScale = V::kSoftmax && !V::kHasLogits;
  const bool fold = kFoldScale && scale > 0.f;
  // Q fragments stay in registers for the whole KV loop where they fit (one m-tile, D <= 128)
  constexpr bool kQInRegs = MT == 1 && D <= 128;
  uint32_t qfrag[kQInRegs ? D / 16 : 1][4];
  if constexpr (kQInRegs) {
#pragma unroll
    for (int k0 = 0; k0 < D; k0 += 16)
      ldmatrix_x4(qfrag[k0 / 16], sq + (wrow + (lane % 8) + ((lane / 8) % 2) * 8) * ST + k0 + (lane / 16) * 8);
  }

  // the scores of one m-tile off the folded fast path (score_rules.cuh)
  const ScoreRules<V> score_rules{causal, hp, b, hk, group, rows_total, pos_base, hi, t4, scale, P.win, q0};
  typename ScoreRules<V>::RowTerms row_terms[MT];
  bool affine[MT];  // an affine logits hook's interior path (score_rules.cuh), per warp and m-tile
  bool post_scaled[MT];  // a post-scaled one's (the same)
  bool fixed_max[MT];    // a bounded one's over a bf16 P: the row max fixed at 0 (score_rules.cuh fix_row_max)
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    score_rules.row_terms(prow0 + mt * 16, row_terms[mt]);
    if constexpr (tvm_tree<V>())
      set_row_tree(row_terms[mt], P.tree, b, qo_len, kv_len, prow0 + mt * 16, group, rows_total);
    affine[mt] = V::kLogitsAffine && score_rules.affine_rows(row_terms[mt]);
    post_scaled[mt] = ScoreRules<V>::kPostScale >= 0 && score_rules.post_rows(prow0 + mt * 16, row_terms[mt]);
    fixed_max[mt] = score_rules.template fix_row_max<T>(prow0 + mt * 16, row_terms[mt], m_row[mt]);
  }
  for (int kt = 0; kt < num_kt; ++kt) {
    const int stage = NS == 1 ? 0 : kt % 2;
    if constexpr (kStaged) {
      // Tile kt's staged chunks of this thread have landed, and every warp has passed the previous tile's
      // closing barrier: widen them into the 16-bit tile. Once the barrier publishes it (every thread's
      // staged reads are done), tile kt + 1 is issued into the staging area, in flight through this tile.
      KV* staged = reinterpret_cast<KV*>(smem_raw + kStagingOffset);
      copy_wait<0>();
      Staged::widen(staged, skv, tid);
      __syncthreads();
      if (kt + 1 < num_kt) Staged::load(staged, tid, P.kv, hk, kv_start, page_shift, tile_start(kt + 1), hi);
      copy_commit();
    } else {
      // One barrier per tile with two stages: once every thread has passed it, tile kt has landed and the
      // other stage (tile kt - 1) is no longer read, so tile kt + 1 is issued into it right after. A single
      // buffer is refilled after the previous tile's closing barrier instead.
      if (NS == 1 && kt > 0) load_kv(kt, 0);
      if (NS == 1) copy_commit();
      copy_wait<0>();
      __syncthreads();
      if (NS == 2 && kt + 1 < num_kt) load_kv(kt + 1, (kt + 1) % 2);
      if (NS == 2) copy_commit();
    }
    T* sk = skv + (stage * 2 + 0) * TK * D;
    T* sv = skv + (stage * 2 + 1) * TK * D;
    const int j0 = tile_start(kt);
    const bool full_tile = tile_full(kt);
    if constexpr (tvm_rope<V>()) {  // TVM's inline RoPE at the keys' positions, before the key transform
      rope_rotate_tile<D, TK, Tile::kWarps>(
          [&](int r, int i) -> T& { return sk[kv_tile_at<D>(r, i)]; }, [&](int r) { return j0 + r < hi; },
          [&](int r) { return P.win.k_pos0[b] + (j0 + r); }, scratch, P.rope, warp, lane);
    }
    if (V::kHasKeyTransform && !(P.hooks_applied & kKeysApplied)) {
      for (int r = warp; r < TK; r += Tile::kWarps) {
        const int j = j0 + r;
        if (j >= hi) continue;
        for (int i = lane; i < D; i += 32) scratch[i] = to_float(sk[kv_tile_at<D>(r, i)]);
        if constexpr (kStaged) {  // the key hook sees dequantised keys
          const float k_scale = P.scales.k_of(hk);
          for (int i = lane; i < D; i += 32) scratch[i] *= k_scale;
        }
        __syncwarp();
        warp_row_hook<D, V::kKeyElementwise>(
            scratch, scratch + D, [&](float* row, int i) { return V::key_elem(hp, row, i, j, hk); },
            [&](float* in, float* out) { V::key_row(hp, in, out, j, hk); }, lane);
        for (int i = lane; i < D; i += 32) sk[kv_tile_at<D>(r, i)] = from_float<T>(scratch[D + i]);
        __syncwarp();
      }
      __syncthreads();
    }
#pragma unroll 1
    for (int ks = 0; ks < TK; ks += TS) {
    const int js = j0 + ks;  // first key of this compute step
    if (js > warp_jmax) break;  // every later key is hidden from all of this warp's rows
    // the lane index as the K/V fragment addresses see it: opaque per step, so their swizzled offsets are
    // recomputed (a few integer ops) instead of being hoisted out of the tile loop into registers
    int ln = lane;
    asm volatile("" : "+r"(ln));
    // this lane's ldmatrix rows of K and V, and the swizzle of their chunk columns (kv_tile_at: the row's low
    // three bits are ln % 8, the column's chunk a compile-time even number plus one lane bit)
    const T* krow = sk + (ks + (ln % 8) + (ln / 16) * 8) * D;
    const T* vrow = sv + (ks + (ln % 8) + ((ln / 8) % 2) * 8) * D;
    const int kx = ((ln / 8) % 2) ^ (ln % 8), vx = (ln / 16) ^ (ln % 8);
    // S = Q K^T for this warp's MT x 16 rows x TS keys; each K fragment feeds every m-tile
    float s[MT][NKT][4];  // set by the first k-step's MMAs (zero accumulator), then accumulated
    uint32_t pk[MT][TS / 16][4];  // P in the input dtype, the A operand of P V (packed as soon as it is final)
#pragma unroll
    for (int k0 = 0; k0 < D; k0 += 16) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if constexpr (kQInRegs) {
#pragma unroll
          for (int i = 0; i < 4; ++i) a[mt][i] = qfrag[k0 / 16][i];
        } else {
          ldmatrix_x4(a[mt], sq + (wrow + mt * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * ST + k0 + (lane / 16) * 8);
        }
      }
#pragma unroll
      for (int n = 0; n < NKT; n += 2) {
        uint32_t bk[4];
        ldmatrix_x4(bk, krow + n * 8 * D + kv_chunk_at(k0 / 8, kx) * 8);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if (k0 == 0) {
            mma16816_first<T>(s[mt][n], a[mt], bk[0], bk[1]);
            mma16816_first<T>(s[mt][n + 1], a[mt], bk[2], bk[3]);
          } else {
            mma16816<T>(s[mt][n], a[mt], bk[0], bk[1]);
            mma16816<T>(s[mt][n + 1], a[mt], bk[2], bk[3]);
          }
        }
      }
    }
    // hooks, mask, online softmax (rows g and g+8; a row's values live in one quad). An m-tile whose
    // rows all exist, whose keys all lie in [lo, hi) and, for a mask that is exactly its bounds,
    // whose every (row, key) pair lies inside them, takes the interior path: no mask hook, no checks.
    const int j_last = js + TS - 1;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const bool interior = Mapped ? full_tile : (j_last <= int_jmax[mt] && js >= int_j0min[mt]);
      float mt_max[2] = {m_row[mt][0], m_row[mt][1]};
      // the factor still to apply to s in the exponent, and an offset: 2^(s * sfac + koff - m)
      float sfac[2] = {1.f, 1.f}, koff[2] = {0.f, 0.f};
      // (a checked tile of rows whose keys form intervals runs the same way, its hidden scores made -inf first;
      // mapped: where the map found every row of the warp seeing one interval)
      // (read per checked tile: the 128-row tiles have no registers to keep them)
      int map_lo[2], map_hi[2];
      bool mapped_iv = false;
      if constexpr (Mapped && ScoreRules<V>::kMappedIntervals) {
        if (!interior) mapped_iv = score_rules.mapped_intervals(map_rows, map_row0, prow0 + mt * 16, map_lo, map_hi);
      }
      if (fold && (interior || ScoreRules<V>::kIntervalRows || mapped_iv)) {
        if constexpr (ScoreRules<V>::kIntervalRows && kFoldScale) {
          if (!interior) score_rules.mask_outside(s[mt], prow0 + mt * 16, js);
        } else if constexpr (Mapped && kFoldScale) {
          if (!interior) score_rules.mapped_outside(s[mt], js, map_lo, map_hi);
        }
        float raw_max[2];
        row_tree<NKT>(s[mt], raw_max, [](float x, float y) { return fmaxf(x, y); });
        mt_max[0] = fmaxf(mt_max[0], raw_max[0] * scale);
        mt_max[1] = fmaxf(mt_max[1], raw_max[1] * scale);
        sfac[0] = sfac[1] = scale;
      } else if (V::kLogitsAffine && interior && affine[mt]) {
        score_rules.apply_affine(s[mt], js, mt_max, sfac, koff, row_terms[mt],
                                 [](auto&&... a) { row_tree<NKT>(a...); });
      } else if (interior && (ScoreRules<V>::kPostScale < 0 || post_scaled[mt])) {
        // (a post-scaled hook's warp whose rows fail post_rows takes the checked path below)
        if constexpr (ScoreRules<V>::kPostScale >= 0)
          score_rules.apply_post_scaled(s[mt], prow0 + mt * 16, js, mt_max, sfac, row_terms[mt],
                                        [](auto&&... a) { row_tree<NKT>(a...); }, fixed_max[mt]);
        else
          score_rules.apply(s[mt], prow0 + mt * 16, js, mt_max, false, row_terms[mt]);  // interior: no checks
      } else if (Mapped && ScoreRules<V>::kMappedIntervals && mapped_iv) {
        if constexpr (Mapped && ScoreRules<V>::kMappedIntervals)
          score_rules.apply_mapped(s[mt], prow0 + mt * 16, js, mt_max, row_terms[mt], map_lo, map_hi);
      } else {
        score_rules.apply(s[mt], prow0 + mt * 16, js, mt_max, true, row_terms[mt]);
      }
      if constexpr (V::kSoftmax) {
        float rescale[2], msub[2];
        const bool grew = step_or_hold_row_max(ScoreRules<V>::kPostBounded && fixed_max[mt] && interior, mt_max,
                                               m_row[mt], koff, rescale, msub);  // (common.cuh)
#pragma unroll
        for (int h = 0; h < 2; ++h) d_row[mt][h] *= rescale[h];
#pragma unroll
        for (int n = 0; n < NKT; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][n][e] = fast_exp2(fmaf(s[mt][n][e], sfac[e / 2], -msub[e / 2]));
        float tile_sum[2];
        row_tree<NKT>(s[mt], tile_sum, [](float x, float y) { return x + y; });
        d_row[mt][0] += tile_sum[0];
        d_row[mt][1] += tile_sum[1];
        // the output is rescaled only when some row of the warp's m-tile raised its max (late in a long
        // row, almost never): a warp-uniform branch saves D / 2 multiplies per thread and KV tile
        if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
          for (int n = 0; n < NDT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) o_acc[mt][n][e] *= rescale[e / 2];
        }
      }
      // P of this m-tile is final: pack it now, so that its 32-bit floats die before the next m-tile's
      // softmax and the P V loop (16 keys = two n-tiles per k-step)
#pragma unroll
      for (int kk = 0; kk < TS / 16; ++kk) {
        pk[mt][kk][0] = pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        pk[mt][kk][1] = pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        pk[mt][kk][2] = pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        pk[mt][kk][3] = pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
    }
    // O += P V: P packed from the S accumulators; each V fragment feeds every m-tile
#pragma unroll
    for (int kk = 0; kk < TS / 16; ++kk) {
#pragma unroll
      for (int n = 0; n < NDT; n += 2) {
        uint32_t bv[4];
        ldmatrix_x4_trans(bv, vrow + kk * 16 * D + kv_chunk_at(n, vx) * 8);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma16816<T>(o_acc[mt][n], pk[mt][kk], bv[0], bv[1]);
          mma16816<T>(o_acc[mt][n + 1], pk[mt][kk], bv[2], bv[3]);
        }
      }
    }
    }  // compute steps
    if constexpr (NS == 1) __syncthreads();  // the single stage is refilled by the next iteration
  }
  copy_wait<0>();
  if (kSplits && gridDim.y > 1 &&  // (split-KV: the item's last chunk to finish merges the chunks and goes on)
      !mma_split_merge<V, D, MT, NT>(mma_split_at<D, MT, NT>(P.work_order, P.work_tail_len, RQ),
                                     blockIdx.x + gridDim.x * blockIdx.z, tid, reinterpret_cast<int*>(skv), o_acc,
                                     m_row, d_row))
    return;

  // ---- epilogue: normalise, lse, output transform, store -------------------------------
  float lse_row[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float dsum = d_row[mt][h];
      dsum += __shfl_xor_sync(0xffffffffu, dsum, 1);
      dsum += __shfl_xor_sync(0xffffffffu, dsum, 2);
      // dsum is 0 only for a row without a live key; a NaN or +inf score made it NaN (the exponent base
      // msub keeps a NaN score's weight NaN even on a -inf max), and NaN must reach O and lse: "== 0"
      float inv = (V::kSoftmax && dsum != 0.f) ? 1.f / dsum : (V::kSoftmax ? 0.f : 1.f);
      if constexpr (kStaged) inv *= P.scales.v_of(hk);  // sum_j p_j (v_j s) = s sum_j p_j v_j
#pragma unroll
      for (int n = 0; n < NDT; ++n) {
        o_acc[mt][n][2 * h] *= inv;
        o_acc[mt][n][2 * h + 1] *= inv;
      }
      lse_row[mt][h] = V::kSoftmax ? (dsum != 0.f ? m_row[mt][h] + log2f(dsum) : kNegInf) : 0.f;
    }
  if constexpr (!V::kHasOutputTransform) {
    // no output hook: every thread stores its own fragments straight from registers, two outputs per 32-bit
    // store (a quad writes 16 contiguous bytes of a row), and its rows' lse from the quad's first lane. The
    // first row is opaque here, so that the row addresses are formed after the KV loop, not hoisted above it
    // into registers the loop needs.
    int pr0 = prow0;
    asm volatile("" : "+r"(pr0));
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int pr = pr0 + mt * 16 + 8 * h;
        if (pr >= rows_total) continue;
        const int tok = q0 + pr / group, qh = hk * group + pr % group;
        T* dst = static_cast<T*>(P.o) + (int64_t(tok) * P.num_qo_heads + qh) * D + t4 * 2;
#pragma unroll
        for (int n = 0; n < NDT; ++n)
          *reinterpret_cast<uint32_t*>(dst + n * 8) = pack2<T>(o_acc[mt][n][2 * h], o_acc[mt][n][2 * h + 1]);
        const float l = lse_row[mt][h];
        if (t4 == 0) P.lse[int64_t(tok) * P.num_qo_heads + qh] = l == kNegInf ? P.empty_lse() : l;
      }
    return;
  }
  __syncthreads();
  float* sout = reinterpret_cast<float*>(smem_raw);  // [RQ][D] fp32 rows, then [RQ] lse
  float* slse = sout + RQ * D;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int r = wrow + mt * 16 + g;
#pragma unroll
    for (int n = 0; n < NDT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) sout[(r + 8 * (e / 2)) * D + n * 8 + t4 * 2 + (e % 2)] = o_acc[mt][n][e];
    if (t4 == 0) {
      slse[r] = lse_row[mt][0];
      slse[r + 8] = lse_row[mt][1];
    }
  }
  __syncthreads();
  for (int r = warp; r < RQ; r += Tile::kWarps) {
    const int pr = row0 + r;
    if (pr >= rows_total) continue;
    const int tok = q0 + pr / group, qh = hk * group + pr % group;
    const float* src = sout + r * D;
    if constexpr (V::kHasOutputTransform) {
      const int qo_pos = pos_base + pr / group;
      const float l = slse[r];
      for (int i = lane; i < D; i += 32) scratch[i] = src[i];
      __syncwarp();
      warp_row_hook<D, V::kOutputElementwise>(
          scratch, scratch + D, [&](float* row, int i) { return V::output_elem(hp, row, i, b, qo_pos, qh, l); },
          [&](float* in, float* out) { V::output_row(hp, in, out, b, qo_pos, qh, l); }, lane);
      src = scratch + D;
    }
    T* dst = static_cast<T*>(P.o) + (int64_t(tok) * P.num_qo_heads + qh) * D;
    for (int i = lane; i < D; i += 32) dst[i] = from_float<T>(src[i]);
    if (lane == 0) P.lse[int64_t(tok) * P.num_qo_heads + qh] = slse[r] == kNegInf ? P.empty_lse() : slse[r];
    __syncwarp();
  }
}

}  // namespace attngen
