// Batch decode over a paged KV cache on CUDA cores.
//
// One CTA = (KV chunk, KV head, request). Threads are (lane x, head y, token lane z):
// a K/V row of D elements is spread over L = D/8 lanes (16-byte vectors), the y
// dimension holds the query heads of the KV head's group (GQA), z splits a tile's
// tokens. K/V tiles of T tokens are gathered from their pages into shared memory
// with cp.async (zero-filled past the end), S stages deep, each element read from
// memory once for the whole group. Online softmax in fp32, base 2. The mask's
// bounds (causal, sliding window) shrink the visited KV range before any page is
// touched. With several chunks the CTA writes a partial state for merge.cuh.
// K/V may be fp8 (KV = __nv_fp8_e4m3 / __nv_fp8_e5m2, fp8_kv.cuh): tiles hold the fp8 bytes, rows are
// dequantised as they are read from shared memory, k_scale goes into the query's scale (or before the key
// hook) and v_scale into the accumulated row.
#pragma once
#include "common.cuh"
#include "cp_async.cuh"
#include "epilogue.cuh"
#include "fp8_kv.cuh"
#include "kv_rows.cuh"
#include "tvm_rope.cuh"
#include "tvm_window.cuh"

namespace attngen {

// Where cta_indptr starts in every packed plan: right behind its 8 header words (decode_plan_pack.h plan_layout
// puts it first), so that a CTA loads its cta_indptr entries with the header, not behind header word 2.
constexpr int kDecodePlanCtaIndptrAt = 8;

// The split-KV plan on the device: one int32 buffer whose header gives the offsets of its arrays
// (packed by decode_plan_pack.h write_decode_plan): [0] merges, [1] CTAs, [2..6] offsets of cta_indptr (always
// kDecodePlanCtaIndptrAt), work items (5 ints each), merge tiles (request, query tile), merge_indptr,
// merge_partials.
struct DecodePlanView {
  const int32_t *cta_indptr, *work, *merge_tiles, *merge_indptr, *merge_partials;
  int num_merges;
  // fused merge (header word 7 > 0: its offset): one arrival counter per (merge, KV head), zero between
  // launches; the decode CTA that completes a split request's last partial merges it (no merge kernel)
  int32_t* merge_counters;
  __device__ __forceinline__ explicit DecodePlanView(const int32_t* buf)
      : cta_indptr(buf + kDecodePlanCtaIndptrAt), work(buf + buf[3]), merge_tiles(buf + buf[4]),
        merge_indptr(buf + buf[5]), merge_partials(buf + buf[6]), num_merges(buf[0]),
        merge_counters(buf[7] > 0 ? const_cast<int32_t*>(buf) + buf[7] : nullptr) {}
};

struct DecodeProblem {
  const void* q;    // [B, Hq, D], token rows q_stride elements apart
  int64_t q_stride; // elements from one token's query heads to the next's (Hq * D when packed)
  void* o;          // [B, Hq, D]
  float* lse;       // [B, Hq], base 2
  float* part_o;    // [B, C, Hq, D] partial outputs when num_chunks > 1
  float* part_lse;  // [B, C, Hq]
  int batch, num_qo_heads, num_kv_heads, group, num_chunks;
  int backend;  // a DecodeBackend (attngen_enums.h, from schedules/ffi_enums.py)
  const int32_t* plan;  // DecodePlanView buffer (tensor-core template), nullptr: even split by num_chunks
  int plan_ctas, plan_max_merges;  // grid of the plan-mode decode and merge kernels
  int tvm_conventions;  // 1: rows with no key store lse = -5e4 (TVM PagedKVCache); 0: -inf
  __host__ __device__ float empty_lse() const { return tvm_conventions ? kTvmEmptyLse : kNegInf; }
  float sm_scale;
  KVRows kv;  // paged (page_size > 0)
  PositionWindow win;  // TVM's positions and layer window: read by the windowed instances only (tvm_window.cuh)
  RopeFreq rope;       // TVM's inline RoPE at win's positions: read by the RoPE instances only (tvm_rope.cuh)
  int kv_head_shift;  // log2 of the KV heads one tensor-core decode CTA serves: 0, or 1 (decode_tc_pairs_kv_heads)
  int group_parts;    // tensor-core CTAs per KV head: 0 or 1, or a group above the tile's rows cut in parts of 8
};

// A decode problem over an fp8 cache: the scales its elements are stored with.
struct ScaledDecodeProblem : DecodeProblem {
  KVScales scales;
};

// The problem a decode kernel reading K/V of type KV takes.
template <class KV>
using DecodeProblemOf = std::conditional_t<kIsFp8<KV>, ScaledDecodeProblem, DecodeProblem>;

struct KeyRange {
  int lo, hi;
};

// Keys a decode query (position kv_len - 1) may see, from the mask's bounds on qo_pos - kv_pos
// (causal, sliding window); 64-bit arithmetic so huge windows cannot wrap.
template <class V>
__device__ __forceinline__ KeyRange visible_keys(int kv_len, const typename V::Params& hp) {
  const long long qo_pos = kv_len - 1;
  long long lo64 = 0, hi64 = kv_len;
  if constexpr (V::kHasUpper) lo64 = max(lo64, qo_pos - V::mask_upper(hp));
  if constexpr (V::kHasLower) hi64 = min(hi64, qo_pos - V::mask_lower(hp) + 1);
  return {int(min(lo64, (long long)kv_len)), int(max(hi64, 0LL))};
}

// Keys request b's decode query may see: visible_keys, and in windowed instances TVM's position window
// (tvm_window.cuh; TVM's decode has no causal flag).
template <class V>
__device__ __forceinline__ KeyRange request_keys(const DecodeProblem& P, int b, int kv_len,
                                                 const typename V::Params& hp) {
  KeyRange r = visible_keys<V>(kv_len, hp);
  if constexpr (tvm_windowed<V>()) {
    if (P.win.limits_rows()) {
      int lo, hi;
      P.win.key_bounds(b, P.win.q_pos[b], lo, hi);
      r.hi = min(r.hi, hi);
      r.lo = min(max(r.lo, lo), r.hi);
    }
  }
  return r;
}

// Piece `chunk` of `n` equal pieces of `vis`, as the planner cuts a request (planner.h chunk_end):
// none is empty while vis holds at least n keys. The even-split grid launch's share of a request.
__device__ __forceinline__ KeyRange even_chunk(KeyRange vis, int chunk, int n) {
  const int64_t span = max(vis.hi - vis.lo, 0);
  return {vis.lo + int(span * chunk / n), vis.lo + int(span * (chunk + 1) / n)};
}

// Tile configuration (FA3's tile_size.h style): G = query heads per CTA (power of two >= the
// group), Z token lanes so that a CTA has about 128 threads, T tokens per stage, S stages.
template <int D, int G>
struct DecodeTile {
  static_assert(D == 64 || D == 128 || D == 256, "decode supports head_dim 64, 128, 256");
  static_assert(G == 1 || G == 2 || G == 4 || G == 8, "decode group tiles are 1, 2, 4, 8 heads");
  static constexpr int kLanes = D / 8;
  static constexpr int kZ = (kLanes * G >= 128) ? 1 : 128 / (kLanes * G);
  static constexpr int kThreads = kLanes * G * kZ;
  static constexpr int kTokens = D == 256 ? 16 : 32;  // tokens per stage
  static constexpr int kStages = 3;
  static constexpr int kTileElems = kTokens * D;      // one of K or V, one stage
  static_assert(kTokens % kZ == 0, "token lanes must divide the tile");
};

template <class V, class T, int D, int G, class KV = T>
constexpr size_t decode_smem_bytes() {
  using Tile = DecodeTile<D, G>;
  size_t tiles = size_t(Tile::kStages) * 2 * Tile::kTileElems * sizeof(KV);
  size_t keys = V::kHasKeyTransform ? 2 * size_t(Tile::kTokens) * D * sizeof(float) : 0;
  size_t merge = (size_t(Tile::kZ) * G * (D + 2) + 2 * size_t(G) * D + G) * sizeof(float);
  size_t qrows = 2 * size_t(G) * D * sizeof(float);
  size_t body = tiles + keys;
  size_t m = merge > qrows ? merge : qrows;
  return body > m ? body : m;
}

template <class V, class T, int D, int G, class KV = T>
__global__ void __launch_bounds__(DecodeTile<D, G>::kThreads)
decode_kernel(DecodeProblemOf<KV> P, typename V::Params hp) {
  allow_dependent_launch();  // the split-KV merge may launch now; it waits for this grid's writes
  using Tile = DecodeTile<D, G>;
  constexpr int L = Tile::kLanes, Z = Tile::kZ, NT = Tile::kThreads, TOK = Tile::kTokens, S = Tile::kStages;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* smem = reinterpret_cast<float*>(smem_raw);
  const int chunk = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x, gy = threadIdx.y, tz = threadIdx.z;
  const int tid = lane + L * (gy + G * tz);
  const int group = P.group, qh0 = hk * group, qh = qh0 + gy;
  const bool head_active = gy < group;

  const int kv_len = view_length<V>(P.kv, b);
  const int qo_pos = kv_len - 1;
  const KeyRange mine = even_chunk(request_keys<V>(P, b, kv_len, hp), chunk, P.num_chunks);
  const int start = mine.lo, end = mine.hi;

  // ---- this thread's 8 query elements: load, transform, scale ------------------------
  float q[8];
  const T* qrow = static_cast<const T*>(P.q) + int64_t(b) * P.q_stride + int64_t(qh) * D;
  if constexpr (V::kHasQueryTransform) {
    for (int idx = tid; idx < group * L; idx += NT) {
      float v[8];
      load8(static_cast<const T*>(P.q) + int64_t(b) * P.q_stride + int64_t(qh0 + idx / L) * D + (idx % L) * 8, v);
#pragma unroll
      for (int e = 0; e < 8; ++e) smem[idx * 8 + e] = v[e];
    }
    __syncthreads();
    float* out = smem + G * D;
    for (int idx = tid; idx < group * L; idx += NT) {
      const int r = idx / L, l = idx % L;
      if constexpr (V::kQueryElementwise) {
#pragma unroll
        for (int e = 0; e < 8; ++e) out[r * D + l * 8 + e] = V::query_elem(hp, smem + r * D, l * 8 + e, qo_pos, qh0 + r);
      } else if (l == 0) {
        V::query_row(hp, smem + r * D, out + r * D, qo_pos, qh0 + r);
      }
    }
    __syncthreads();
#pragma unroll
    for (int e = 0; e < 8; ++e) q[e] = head_active ? out[gy * D + lane * 8 + e] : 0.f;
    __syncthreads();
  } else if (head_active) {
    load8(qrow + lane * 8, q);
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) q[e] = 0.f;
  }
  float qscale = P.sm_scale * (V::kQScaleLog2e ? kLog2e : 1.f);
  if constexpr (kIsFp8<KV> && !V::kHasKeyTransform) qscale *= P.scales.k_of(hk);  // q . (k s) = (q s) . k
#pragma unroll
  for (int e = 0; e < 8; ++e) q[e] *= qscale;

  // ---- pipelined K/V tiles ------------------------------------------------------------
  KV* tiles = reinterpret_cast<KV*>(smem_raw);  // [S][2][TOK][D]
  float* kf = reinterpret_cast<float*>(smem_raw + size_t(S) * 2 * Tile::kTileElems * sizeof(KV));  // [2][TOK][D]
  const KV* pages = static_cast<const KV*>(P.kv.base);
  const int32_t* page_ids = P.kv.indices + P.kv.indptr[b];
  SinkShift sinks{};  // windowed instances: TVM's sliding-window view of request b
  if constexpr (tvm_windowed<V>()) sinks = P.kv.sinks(b);
  const int64_t head_off = int64_t(hk) * P.kv.stride_head;
  const int num_tiles = (end - start + TOK - 1) / TOK;

  constexpr int CE = kElemsPer16B<KV>, LC = D / CE;  // elements of one 16-byte copy, copies per row (L for 16-bit)
  auto load_tile = [&](int tile, int stage) {
    const int t0 = start + tile * TOK;
    for (int c = tid; c < 2 * TOK * LC; c += NT) {
      const int kv = c / (TOK * LC), r = (c / LC) % TOK, l = c % LC;
      const int j = t0 + r;
      const bool ok = j < end;
      const KV* src = pages;
      if (ok) {
        const int jr = view_row<V>(sinks, j);
        const int page = page_ids[jr / P.kv.page_size];
        src = pages + int64_t(page) * P.kv.stride_page + int64_t(jr % P.kv.page_size) * P.kv.stride_slot +
              head_off + kv * P.kv.stride_kv + l * CE;
      }
      copy16_async(tiles + ((stage * 2 + kv) * TOK + r) * D + l * CE, src, ok);
    }
  };

#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < num_tiles) load_tile(s, s);
    copy_commit();
  }

  float m = kNegInf, den = 0.f, acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int tile = 0; tile < num_tiles; ++tile) {
    if (tile + S - 1 < num_tiles) load_tile(tile + S - 1, (tile + S - 1) % S);
    copy_commit();
    copy_wait<S - 1>();
    __syncthreads();
    const int stage = tile % S;
    const KV* ktile = tiles + (stage * 2 + 0) * TOK * D;
    const KV* vtile = tiles + (stage * 2 + 1) * TOK * D;
    const int t0 = start + tile * TOK;
    if constexpr (V::kHasKeyTransform) {  // K rows to fp32, transformed once per token for the group
      for (int idx = tid; idx < TOK * L; idx += NT) {
        float v[8];
        load8_shared(ktile + idx * 8, v);
        if constexpr (kIsFp8<KV>) {  // the key hook sees dequantised keys
#pragma unroll
          for (int e = 0; e < 8; ++e) v[e] *= P.scales.k_of(hk);
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) kf[idx * 8 + e] = v[e];
      }
      __syncthreads();
      float* kout = kf + TOK * D;
      for (int idx = tid; idx < TOK * L; idx += NT) {
        const int r = idx / L, l = idx % L, j = t0 + r;
        if (j >= end) continue;
        if constexpr (V::kKeyElementwise) {
#pragma unroll
          for (int e = 0; e < 8; ++e) kout[r * D + l * 8 + e] = V::key_elem(hp, kf + r * D, l * 8 + e, j, hk);
        } else if (l == 0) {
          V::key_row(hp, kf + r * D, kout + r * D, j, hk);
        }
      }
      __syncthreads();
    }
    // scores of this thread's R tokens first (independent shuffles), then one rescale per tile
    constexpr int R = TOK / Z;
    float s[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int r = tz + i * Z;
      float k[8];
      if constexpr (V::kHasKeyTransform) {
#pragma unroll
        for (int e = 0; e < 8; ++e) k[e] = kf[TOK * D + r * D + lane * 8 + e];
      } else {
        load8_shared(ktile + r * D + lane * 8, k);
      }
      float dot = 0.f;
#pragma unroll
      for (int e = 0; e < 8; ++e) dot = fmaf(q[e], k[e], dot);
      s[i] = group_sum<L>(dot);
    }
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int j = t0 + tz + i * Z;
      bool visible = j < end && head_active;
      if constexpr (V::kHasLogits) {
        if (visible) s[i] = V::logits(hp, s[i], b, qo_pos, j, qh, hk) * (V::kLogitsLog2e ? kLog2e : 1.f);
      }
      if constexpr (V::kHasMask) {
        if (visible) visible = V::mask(hp, b, qo_pos, j, qh, hk);
      }
      if (!visible) s[i] = V::kSoftmax ? kNegInf : 0.f;
    }
    if constexpr (V::kSoftmax) {
      // fmax_nan: a NaN score makes mt NaN, which passes the test below and turns den and acc into NaN
      // (with fmaxf a tile of NaN and masked scores on a -inf max would be skipped as empty)
      float mt = m;
#pragma unroll
      for (int i = 0; i < R; ++i) mt = fmax_nan(mt, s[i]);
      if (mt != kNegInf) {
        const float sc = exp2f(m - mt);
        den *= sc;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] *= sc;
#pragma unroll
        for (int i = 0; i < R; ++i) {
          const float w = exp2f(s[i] - mt);
          float v[8];
          load8_shared(vtile + (tz + i * Z) * D + lane * 8, v);
          den += w;
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[e] = fmaf(w, v[e], acc[e]);
        }
        m = mt;
      }
    } else {
#pragma unroll
      for (int i = 0; i < R; ++i) {
        float v[8];
        load8_shared(vtile + (tz + i * Z) * D + lane * 8, v);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] = fmaf(s[i], v[e], acc[e]);
      }
    }
    __syncthreads();  // this stage is refilled next iteration
  }
  copy_wait<0>();
  __syncthreads();
  if constexpr (kIsFp8<KV>) {  // sum_j p_j (v_j s) = s sum_j p_j v_j: once per row, not per key
    const float vs = P.scales.v_of(hk);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] *= vs;
  }

  // ---- merge the token lanes, normalise -------------------------------------------------
  float* zstate = smem;                      // [Z][G][2]
  float* zacc = smem + Z * G * 2;            // [Z][G][D]
  float* rows = zacc + Z * G * D;            // [G][D] final rows, then [G][D] scratch
  float* row_lse = rows + 2 * G * D;         // [G]
  if (lane == 0) {
    zstate[(tz * G + gy) * 2] = m;
    zstate[(tz * G + gy) * 2 + 1] = den;
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) zacc[(tz * G + gy) * D + lane * 8 + e] = acc[e];
  __syncthreads();
  for (int idx = tid; idx < group * L; idx += NT) {
    const int g = idx / L, l = idx % L;
    float fm = kNegInf, fd = 0.f, fa[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int z = 0; z < Z; ++z) {
      fold_state8<V::kSoftmax>(fm, fd, fa, zstate[(z * G + g) * 2], zstate[(z * G + g) * 2 + 1],
                               [&](int e) { return zacc[(z * G + g) * D + l * 8 + e]; });
    }
    const float lse_v = normalise_state8<V::kSoftmax>(fm, fd, fa);
#pragma unroll
    for (int e = 0; e < 8; ++e) rows[g * D + l * 8 + e] = fa[e];
    if (l == 0) row_lse[g] = lse_v;
  }
  __syncthreads();

  if (P.num_chunks > 1) {  // partial state for merge.cuh; the output transform runs after the merge
    for (int idx = tid; idx < group * L; idx += NT) {
      const int g = idx / L, l = idx % L;
      const int64_t r = (int64_t(b) * P.num_chunks + chunk) * P.num_qo_heads + qh0 + g;
      float4* dst = reinterpret_cast<float4*>(P.part_o + r * D + l * 8);
      const float* src = rows + g * D + l * 8;
      dst[0] = make_float4(src[0], src[1], src[2], src[3]);
      dst[1] = make_float4(src[4], src[5], src[6], src[7]);
      if (l == 0) P.part_lse[r] = row_lse[g];
    }
    return;
  }
  finish_rows<V, T, D>(rows, rows + G * D, row_lse, group, b, qo_pos, qh0, P.num_qo_heads,
                       static_cast<T*>(P.o), P.lse, hp, tid, NT, P.empty_lse());
}

}  // namespace attngen
