// The per-score rules the tile templates (prefill.cuh, hopper_prefill.cuh) apply to a thread's fragment of
// S = Q K^T: sm_scale, the logits hook and, where a tile needs checking, the row, key-range, causal and
// mask-hook tests (and, in TVM's windowed instances, the window and causal tests at TVM's positions:
// tvm_window.cuh; in TVM's tree instances, the token-tree test on keys inside the tree: tvm_tree.cuh). Masked scores become -inf (0 for a non-softmax variant); a softmax variant's running
// row maxima take the new scores in.
//
// Fragments are mma.sync / wgmma accumulators: sm[n][e] is row prow (e < 2) or prow + 8 (e >= 2), key
// j0 + 8 n + 2 t4 + e % 2, where t4 is the thread's lane within its quad.
#pragma once
#include "common.cuh"
#include "tvm_tree.cuh"
#include "tvm_window.cuh"

namespace attngen {

template <class V>
struct ScoreRules {
  // Each row's visible keys form one interval: no mask hook, or one that is exactly its bounds (the mask
  // analysis's `exact`: lower <= qo_pos - kv_pos <= upper and nothing else), outside TVM's window and tree
  // instances. A checked tile then tests each score against the row's interval (row_intervals) and skips the
  // mask hook.
  static constexpr bool kIntervalRows = !tvm_windowed<V>() && !tvm_tree<V>() && (!V::kHasMask || V::kMaskExact);
  // A mapped kernel's rows may see intervals the tile map found (tile_map.cuh row key intervals): its partial
  // tiles then compare keys with them instead of running the mask hook (mapped_outside, apply_mapped).
  static constexpr bool kMappedIntervals = !tvm_windowed<V>() && !tvm_tree<V>();
  // The logits hook runs split (codegen/logits_split.py): its row terms once per query row and work item
  // (row_terms, before the key loop), the rest per score from the raw score (logits_from_terms, which
  // applies sm_scale and the base-2 factor itself).
  static constexpr int kRowTerms = V::kLogitsRowTerms > 0 ? V::kLogitsRowTerms : 1;
  static constexpr int kMaskTerms = V::kMaskRowTerms > 0 ? V::kMaskRowTerms : 1;
  // rows prow and prow + 8 of a fragment: the logits hook's terms, and the mask hook's (its row-invariant
  // reads, codegen/mask_split.py); windowed instances: the rows' positions relative to the keys
  // (set_row_positions); tree instances: the request's tree and the rows' nodes (set_row_tree)
  struct RowTerms : RowPositions<tvm_windowed<V>()>, RowTree<tvm_tree<V>()> {
    float logits[2][kRowTerms];
    int mask[2][kMaskTerms];
    float key_ratio[2];  // affine logits hooks: rt[1] / rt[0] (affine_scores)
  };

  const int& causal;  // the problem's run-time causal flag (read where tested, as a kernel parameter)
  const typename V::Params& hp;
  int batch, kv_head, group, rows_total, pos_base, hi, t4;
  float scale;  // sm_scale, times log2 e where the exponent is base 2 and no logits hook rescales
  // windowed instances only: the problem's TVM positions and window, the request's first query row in the call
  const PositionWindow& win;
  int q0;

  // The hooks' row terms of rows prow and prow + 8 (zeros for rows past the request's), and in windowed
  // instances the rows' positions.
  __device__ __forceinline__ void row_terms(int prow, RowTerms& rt) const {
    if constexpr (tvm_windowed<V>()) set_row_positions(rt, win, batch, q0, prow, group, rows_total);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int i = 0; i < kRowTerms; ++i) rt.logits[h][i] = 0.f;
#pragma unroll
      for (int i = 0; i < kMaskTerms; ++i) rt.mask[h][i] = 0;
      const int pr = prow + 8 * h;
      if (pr >= rows_total) continue;
      const int qo_pos = pos_base + pr / group, qo_head = kv_head * group + pr % group;
      if constexpr (V::kHasLogits)
        V::logits_row_terms(hp, batch, qo_pos, qo_head, kv_head, scale, V::kLogitsLog2e ? kLog2e : 1.f,
                            rt.logits[h]);
      if constexpr (V::kLogitsAffineKv) rt.key_ratio[h] = rt.logits[h][1] / rt.logits[h][0];
      if constexpr (V::kHasMask && V::kMaskRowTerms > 0)
        V::mask_row_terms(hp, batch, qo_pos, qo_head, kv_head, rt.mask[h]);
    }
  }

  // Affine logits hooks (V::kLogitsAffine, codegen/logits_split.py: rt[0] * s + rt[1] * kv_pos_f + rt[2]) on
  // an interior tile, where every row of the warp has rt[0] > 0 (affine_rows, warp-uniform): the score becomes
  // y = s + (rt[1] / rt[0]) * (key - the thread's first key of the tile), one FFMA with a compile-time
  // offset, and the logit is rt[0] * y + k, where k = rt[1] * (first key) + rt[2] per row and tile: the row
  // max is rt[0] * max(y) + k, and the exponent's FFMA takes rt[0] (fac) and k in, 2^(y * fac + k - m).
  // Against the hook's two FFMAs and the key's conversion per score, one FFMA.
  __device__ __forceinline__ bool affine_rows(const RowTerms& rt) const {
    bool ok = true;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      ok = ok && rt.logits[h][0] > 0.f;
      if constexpr (V::kLogitsAffineKv) ok = ok && isfinite(rt.key_ratio[h]);
    }
    return __all_sync(0xffffffffu, ok);
  }

  // Post-scaled logits hooks (V::kLogitsPostScale = k >= 0, codegen/logits_split.py: the per-score rest is
  // g * rt[k] with rt[k] read nowhere in g, as soft-cap's tanh(s * rt[0]) * rt[1]) on an interior tile, where every
  // row of the warp that is one of the request's has rt[k] > 0 (post_rows, warp-uniform): the scores become g (the
  // hook called with rt[k] = 1, whose multiply then folds away), the row max rt[k] * max(g), and the exponent's
  // FFMA takes rt[k] in (fac), 2^(g * fac - m). One FMUL less per score; the logit g * rt[k] is rounded once
  // inside the FFMA instead of before it.
  static constexpr int kPostScale = V::kLogitsPostScale;
  __device__ __forceinline__ bool post_rows(int prow, const RowTerms& rt) const {
    if constexpr (kPostScale < 0) {
      return false;
    } else {
      return post_scale_within(prow, rt, 3.40282347e38f);  // (the largest finite float: rt[k] finite)
    }
  }

  // A bounded post-scaled hook (V::kLogitsPostBounded: g a tanh, so every logit of a row lies in [-rt[k], rt[k]])
  // may run with the row max fixed at 0, the middle of that interval (the kernel sets m_row so before its first
  // tile): the weights 2^(g * rt[k]) lie in [2^-rt[k], 2^rt[k]], and interior tiles take no row max and never
  // rescale O (a checked tile still takes its max, which moves m_row only past the slack, as always). Where every
  // row of the warp that is one of the request's has 0 < rt[k] <= kFixedMaxLimit (log2 units, Gemma 2's cap 50
  // included): the weights, their row sums (< 2^(80 + 24)) and their products with any value row of magnitude
  // 2^-46 to 2^20 stay normal float32, and a bf16 P holds them with its usual relative precision (an fp16 P
  // would overflow: the kernel asks for bf16).
  static constexpr bool kPostBounded = V::kLogitsPostBounded;
  static constexpr float kFixedMaxLimit = 80.f;
  __device__ __forceinline__ bool fixed_max_rows(int prow, const RowTerms& rt) const {
    if constexpr (!kPostBounded || kPostScale < 0) {
      return false;
    } else {
      return post_scale_within(prow, rt, kFixedMaxLimit);
    }
  }
  // Whether every row of the warp that is one of the request's has 0 < rt[k] <= limit (warp-uniform; a NaN
  // rt[k] fails, as does an infinite one under a finite limit). Post-scaled hooks only (kPostScale >= 0).
  __device__ __forceinline__ bool post_scale_within(int prow, const RowTerms& rt, float limit) const {
    bool ok = true;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float c = rt.logits[h][kPostScale];
      ok = ok && (prow + 8 * h >= rows_total || (c > 0.f && c <= limit));
    }
    return __all_sync(0xffffffffu, ok);
  }
  // Whether the warp's rows fix their max (fixed_max_rows, over a bf16 P: T the tiles' type), once per work item;
  // if so m_row (rows prow and prow + 8) is set to it, 0, before the first tile (warp-uniform)
  template <class T>
  __device__ __forceinline__ bool fix_row_max(int prow, const RowTerms& rt, float (&m_row)[2]) const {
    if constexpr (!kPostBounded || !std::is_same_v<T, __nv_bfloat16>) {
      return false;
    } else {
      const bool fixed = fixed_max_rows(prow, rt);
      if (fixed) m_row[0] = m_row[1] = 0.f;
      return fixed;
    }
  }

  // fixed_max: the row max is fixed (fix_row_max): none is taken
  template <int NKT, class Reduce>
  __device__ __forceinline__ void apply_post_scaled(float (&sm)[NKT][4], int prow, int j0, float (&row_max)[2],
                                                    float (&fac)[2], const RowTerms& rt, Reduce reduce,
                                                    bool fixed_max = false) const {
    static_assert(kPostScale >= 0 && kPostScale < kRowTerms && V::kSoftmax, "a post-scaled softmax hook");
    float unit[2][kRowTerms];
    int rpos[2], rhead[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int i = 0; i < kRowTerms; ++i) unit[h][i] = i == kPostScale ? 1.f : rt.logits[h][i];
      const int pr = prow + 8 * h;
      rpos[h] = pos_base + pr / group;
      rhead[h] = kv_head * group + pr % group;
    }
#pragma unroll
    for (int n = 0; n < NKT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e / 2, j = j0 + n * 8 + t4 * 2 + (e % 2);
        const float jf = float(j0 + t4 * 2) + float(n * 8 + (e % 2));
        sm[n][e] = V::logits_from_terms(hp, sm[n][e], batch, rpos[h], j, jf, rhead[h], kv_head, unit[h]);
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) fac[h] = rt.logits[h][kPostScale];
    if (fixed_max) return;
    float raw_max[2];
    reduce(sm, raw_max, [](float x, float y) { return fmaxf(x, y); });
#pragma unroll
    for (int h = 0; h < 2; ++h) row_max[h] = fmaxf(row_max[h], raw_max[h] * fac[h]);
  }

  // (reduce(sm, out, op): the template's per-thread row reduction, common.cuh tile_row_reduce or its like)
  template <int NKT, class Reduce>
  __device__ __forceinline__ void apply_affine(float (&sm)[NKT][4], int j0, float (&row_max)[2], float (&fac)[2],
                                               float (&k)[2], const RowTerms& rt, Reduce reduce) const {
    if constexpr (V::kLogitsAffineKv) {
#pragma unroll
      for (int n = 0; n < NKT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) sm[n][e] = fmaf(float(n * 8 + (e % 2)), rt.key_ratio[e / 2], sm[n][e]);
    }
    float raw_max[2];
    reduce(sm, raw_max, [](float x, float y) { return fmaxf(x, y); });
    const float first = float(j0 + 2 * t4);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      fac[h] = rt.logits[h][0];
      k[h] = V::kLogitsAffineKv ? fmaf(first, rt.logits[h][1], rt.logits[h][2]) : rt.logits[h][2];
      row_max[h] = fmaxf(row_max[h], fmaf(raw_max[h], fac[h], k[h]));
    }
  }

  // kIntervalRows: the keys rows prow and prow + 8 see, as offsets from the thread's first key of the tile j0:
  // [a, z] (empty for a row past the request's). Computed per checked tile rather than kept per row: the
  // mma.sync template's 128-row tiles have no registers to spare.
  __device__ __forceinline__ void row_intervals(int prow, int j0, int (&a)[2], int (&z)[2]) const {
    const int base = j0 + 2 * t4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int pr = prow + 8 * h;
      const long long qo_pos = pos_base + pr / group;
      long long klo = 0, khi = (long long)hi - 1;
      if (causal) khi = min(khi, qo_pos);
      if constexpr (V::kHasLower) khi = min(khi, qo_pos - V::mask_lower(hp));
      if constexpr (V::kHasUpper) klo = max(klo, qo_pos - V::mask_upper(hp));
      const bool valid = pr < rows_total;
      a[h] = valid ? int(min(klo, (long long)hi)) - base : 1;  // (an empty interval stays empty: khi < hi)
      z[h] = valid ? int(max(khi, -1LL)) - base : 0;
    }
  }

  // Scores outside their row's interval [a, z] (offsets from the thread's first key of the tile, row_intervals or
  // mapped_intervals) become -inf, the others stay raw (sm_scale not applied): a softmax variant without a
  // logits hook then runs a checked tile as an interior one, with sm_scale in the exponent. Each test compares
  // a compile-time offset from the thread's first key with two values per row.
  template <int NKT>
  __device__ __forceinline__ void hide_outside(float (&sm)[NKT][4], const int (&a)[2], const int (&z)[2]) const {
    static_assert(V::kSoftmax, "softmax state: hidden scores are -inf");
#pragma unroll
    for (int n = 0; n < NKT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = n * 8 + e % 2, h = e / 2;
        if (c < a[h] || c > z[h]) sm[n][e] = kNegInf;
      }
  }

  // kIntervalRows: hide_outside with the rows' intervals from the mask's bounds.
  template <int NKT>
  __device__ __forceinline__ void mask_outside(float (&sm)[NKT][4], int prow, int j0) const {
    static_assert(kIntervalRows, "rows whose keys form an interval");
    int a[2], z[2];
    row_intervals(prow, j0, a, z);
    hide_outside(sm, a, z);
  }

  // Mapped tiles: the keys rows prow and prow + 8 see, from the tile map's row key intervals (tile_map.cuh;
  // `rows`: the list's map rows, whose first is packed row map_row0 of the request), within the causal bound,
  // as absolute keys [klo, khi] (rows past the request's: empty). Loaded once per work item. False
  // (warp-uniform) where a row of the warp sees keys that are not one interval: its tiles then run the hook.
  __device__ __forceinline__ bool mapped_intervals(const int2* rows, int map_row0, int prow, int (&klo)[2],
                                                   int (&khi)[2]) const {
    bool one = true;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int pr = prow + 8 * h;
      klo[h] = 1;
      khi[h] = 0;
      if (pr >= rows_total) continue;
      const int i = V::kMaskReadsHeads ? pr - map_row0 : pr / group - map_row0 / group;
      const int2 iv = rows[i];
      one = one && iv.x >= 0;
      klo[h] = iv.x;
      khi[h] = causal ? min(iv.y, pos_base + pr / group) : iv.y;
    }
    return __all_sync(0xffffffffu, one);
  }

  // hide_outside with the intervals of mapped_intervals, on the tile from key j0.
  template <int NKT>
  __device__ __forceinline__ void mapped_outside(float (&sm)[NKT][4], int j0, const int (&klo)[2],
                                                 const int (&khi)[2]) const {
    const int base = j0 + 2 * t4;
    const int a[2] = {klo[0] - base, klo[1] - base}, z[2] = {khi[0] - base, khi[1] - base};
    hide_outside(sm, a, z);
  }

  // Mapped tiles whose rows see intervals (mapped_intervals): the logits hook on the scores inside them, the
  // others hidden; no mask hook (variants whose tiles do not run as interior ones: a logits hook, sum state).
  template <int NKT>
  __device__ __forceinline__ void apply_mapped(float (&sm)[NKT][4], int prow, int j0, float (&row_max)[2],
                                               RowTerms& rt, const int (&klo)[2], const int (&khi)[2]) const {
    static_assert(kMappedIntervals, "mapped rows' intervals: not TVM's window or tree instances");
    const int base = j0 + 2 * t4;
    int rpos[2], rhead[2], a[2], z[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int pr = prow + 8 * h;
      rpos[h] = pos_base + pr / group;
      rhead[h] = kv_head * group + pr % group;
      a[h] = klo[h] - base;
      z[h] = khi[h] - base;
    }
#pragma unroll
    for (int n = 0; n < NKT; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e / 2, c = n * 8 + e % 2, j = base + c;
        const bool visible = c >= a[h] && c <= z[h];
        float x = sm[n][e] * scale;
        if constexpr (V::kHasLogits) {
          const float jf = float(base) + float(c);
          if (visible) x = V::logits_from_terms(hp, sm[n][e], batch, rpos[h], j, jf, rhead[h], kv_head, rt.logits[h]);
        }
        sm[n][e] = visible ? x : (V::kSoftmax ? kNegInf : 0.f);
        if constexpr (V::kSoftmax) row_max[h] = fmaxf(row_max[h], sm[n][e]);
      }
    }
  }

  // `check` false: a tile every score of which is visible (no mask hook, no tests). Called with a constant
  // `check`, so that an interior tile's copy carries no visibility state.
  template <int NKT>
  __device__ __forceinline__ void apply(float (&sm)[NKT][4], int prow, int j0, float (&row_max)[2], bool check,
                                        RowTerms& rt) const {
    int rpos[2], rhead[2];
    bool rvalid[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int pr = prow + 8 * h;
      rvalid[h] = pr < rows_total;
      rpos[h] = pos_base + pr / group;
      rhead[h] = kv_head * group + pr % group;
    }
    int a[2] = {0, 0}, z[2] = {0, 0};  // kIntervalRows: the rows' visible keys
    if constexpr (kIntervalRows) {
      if (check) row_intervals(prow, j0, a, z);
    }
#pragma unroll
    for (int n = 0; n < NKT; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e / 2, j = j0 + n * 8 + t4 * 2 + (e % 2);
        bool visible = true;
        if constexpr (kIntervalRows) {
          const int c = n * 8 + e % 2;
          if (check) visible = c >= a[h] && c <= z[h];
        } else {
          if (check) visible = rvalid[h] && j < hi && (!causal || j <= rpos[h]);
        }
        if constexpr (tvm_windowed<V>()) {
          if (check && win.limits_rows()) visible = visible && win.sees(rt.rel_pos[h] - j);
        }
        if constexpr (tvm_tree<V>()) {
          if (check) visible = visible && rt.sees(h, j);  // (after the row and key tests: no read past the tree)
        }
        float x;
        if constexpr (V::kHasLogits) {
          x = sm[n][e];
          // the key position as a float: one conversion per tile and thread, constants added per score
          const float jf = float(j0 + t4 * 2) + float(n * 8 + (e % 2));
          if (visible) x = V::logits_from_terms(hp, x, batch, rpos[h], j, jf, rhead[h], kv_head, rt.logits[h]);
        } else {
          x = sm[n][e] * scale;
        }
        if constexpr (kIntervalRows) {
          // (the interval is the mask: no hook)
        } else if constexpr (V::kHasMask && V::kMaskTotal) {  // no read depends on the tests: one per key
          if (check) {
            const bool admitted = V::mask_from_terms(hp, batch, rpos[h], j, rhead[h], kv_head, rt.mask[h]);
            visible = visible && admitted;
          }
        } else if constexpr (V::kHasMask) {
          if (check && visible) visible = V::mask_from_terms(hp, batch, rpos[h], j, rhead[h], kv_head, rt.mask[h]);
        }
        sm[n][e] = visible ? x : (V::kSoftmax ? kNegInf : 0.f);
        if constexpr (V::kSoftmax) row_max[h] = fmaxf(row_max[h], sm[n][e]);
      }
    }
  }
};

}  // namespace attngen
