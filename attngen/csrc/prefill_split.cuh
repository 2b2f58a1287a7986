// Split-KV of the mma.sync prefill template (prefill.cuh) for launches with few work items: an append of a few
// query rows over many keys (speculative decoding's verify step, a short chunk of a long prompt) gives one CTA per
// (query tile, KV head, request), a few dozen CTAs each walking every key of its request. The plan
// (runtime/mma_split.py) asks for `splits` chunks of `chunk_keys` keys: CTA (x, y, z) runs chunk y of its key
// range (its bounds narrowed, so that every check downstream sees the chunk as the CTA's whole range), leaves its
// unnormalised state (per thread: the O accumulators, row max and partial row sums) in its slot, and the CTA that
// finishes an item's last chunk (a counter per item) merges the slots in chunk order and runs the item's epilogue
// as an unsplit CTA would (the same sums whichever chunk ends last: a deterministic result).
//
// The section rides behind the plan's work order (B * q_tiles int32 entries of the Hopper template's grid, which
// this template does not read) in the same tensor:
//   [magic, splits, chunk_keys, items, slot_floats, counters_at, partials_at, rows]
//   counters [items]: zero between launches (the last finisher resets its own)
//   partials (floats, 16-byte aligned): [items][splits][slot_floats], a slot [fields][threads] float4s
// The launcher derives the split count from the section's length (no device read; mma_split_count) and splits
// only a launch whose tile has the plan's rows (else it runs unsplit, the section unread); the kernel checks the
// header against its grid once and traps where it does not fit (its chunks would otherwise be lost).
#pragma once
#include <stdint.h>

#include "common.cuh"

namespace attngen {

constexpr int kMmaSplitHeader = 8, kMmaSplitMagic = 0x5B11;
// Rows of the Hopper template's query tiles, by which the order's entries (B x q_tiles) before the section count
// (hopper_tile.cuh HopperTile::kRows; entry_prefill.h checks they agree)
constexpr int kOrderRows = 128;

// Floats of one slot: per thread, MT x D / 8 float4s of accumulators and MT float4s of (max, max, sum, sum).
template <int D, int MT, int NT>
constexpr int64_t mma_split_slot_floats() {
  return int64_t(NT) * 4 * (MT * (D / 8) + MT);
}

// Ints from the section's start to its partials (16-byte aligned from the order's start, `pairs` ints before).
__host__ __device__ inline int64_t mma_split_partials_at(int64_t pairs, int64_t items) {
  const int64_t at = kMmaSplitHeader + items;
  return at + (4 - (pairs + at) % 4) % 4;
}

// The splits a section of `len` ints holds for `items` items of this tile (0: none, or not this tile's layout).
template <int D, int MT, int NT>
inline int mma_split_count(int64_t pairs, int64_t len, int64_t items) {
  if (len <= 0 || items <= 0) return 0;
  const int64_t at = mma_split_partials_at(pairs, items), per = items * mma_split_slot_floats<D, MT, NT>();
  if (len <= at || (len - at) % per != 0) return 0;
  const int64_t s = (len - at) / per;
  return s >= 2 && s <= 65535 ? int(s) : 0;
}

struct MmaSplit {
  int splits, chunk_keys;
  int* counters;
  float4* partials;
};

// Whether the section `s` (`len` ints; the plan's header, runtime/mma_split.py) holds the split of a launch of
// `items` items and `splits` chunks of tiles of `rows` rows, slots of `slot` floats: its partials lie behind the
// header and the counters, 16-byte aligned in memory (the plan aligns them from the order tensor's start, which
// the section follows by `pairs` ints), and its length is theirs.
__host__ __device__ inline bool mma_split_fits(const int32_t* s, int64_t len, int64_t items, int64_t splits, int rows,
                                               int64_t slot) {
  return s != nullptr && len >= kMmaSplitHeader && s[0] == kMmaSplitMagic && s[1] == splits && s[2] > 0 &&
         s[2] % 64 == 0 && s[3] == items && s[4] == slot && s[5] == kMmaSplitHeader && s[7] == rows &&
         s[6] >= kMmaSplitHeader + items && len == s[6] + items * splits * slot &&
         reinterpret_cast<uintptr_t>(s + s[6]) % 16 == 0;
}

// The section at `sec` (the launcher points P.work_order at it), checked against this launch: gridDim.y chunks of
// items gridDim.x * gridDim.z with `rows` rows each, `len` ints long.
template <int D, int MT, int NT>
__device__ __forceinline__ MmaSplit mma_split_at(const int32_t* sec, int len, int rows) {
  const int64_t items = int64_t(gridDim.x) * gridDim.z;
  if (!mma_split_fits(sec, len, items, gridDim.y, rows, mma_split_slot_floats<D, MT, NT>())) __trap();
  const int* s = sec;
  return MmaSplit{s[1], s[2], const_cast<int*>(s + s[5]), reinterpret_cast<float4*>(const_cast<int*>(s + s[6]))};
}

// Chunk blockIdx.y of the key range [lo, hi): keys lo + y * chunk_keys on (a multiple of 64 keys: of every tile's
// keys, so the chunks start on the CTA's own tile boundaries), empty past hi.
// The last chunk runs to hi, so that a batch replayed under the plan's bounds with longer requests still runs
// every key.
__device__ __forceinline__ void mma_split_cut(const MmaSplit& sp, int& lo, int& hi) {
  const long long first = (long long)lo + (long long)blockIdx.y * sp.chunk_keys;
  const int a = int(first < hi ? first : hi);
  const int e = blockIdx.y + 1 == gridDim.y ? hi : int(min((long long)a + sp.chunk_keys, (long long)hi));
  lo = a;
  hi = e;
}

// At the epilogue of chunk blockIdx.y of item `item` (every thread of the CTA calls it): leaves the thread's state
// in its slot; in the CTA whose chunk is the item's last to finish, the state becomes every slot's, merged from an
// empty state in chunk order (softmax: each rescaled to the larger max; an empty one, max -inf, adds nothing), and
// it returns true (the caller then runs the item's epilogue); false elsewhere. The threads hold the same rows and
// columns in every chunk, so the merge is per thread, before the quad's row sums are reduced.
// `flag`: a word of the CTA's shared memory no thread reads once every thread has finished the KV loop (the K/V
// stages): no static shared memory beside the configuration's, which may fill the device's opt-in.
template <class V, int D, int MT, int NT>
__device__ __forceinline__ bool mma_split_merge(const MmaSplit& sp, int item, int tid, int* flag,
                                                float (&o)[MT][D / 8][4], float (&m)[MT][2], float (&d)[MT][2]) {
  constexpr int NDT = D / 8, F4 = MT * NDT + MT;
  float4* mine = sp.partials + (int64_t(item) * sp.splits + blockIdx.y) * F4 * NT + tid;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int n = 0; n < NDT; ++n)
      __stcg(mine + (mt * NDT + n) * NT, make_float4(o[mt][n][0], o[mt][n][1], o[mt][n][2], o[mt][n][3]));
    __stcg(mine + (MT * NDT + mt) * NT, make_float4(m[mt][0], m[mt][1], d[mt][0], d[mt][1]));
  }
  __syncthreads();  // every thread's slot stores before thread 0's count, whose release covers them (and every
                    // thread is past the KV loop: `flag` is free)
  if (tid == 0) {
    const int done = count_acq_rel(sp.counters + item) + 1;  // (its acquire: the other chunks' slots)
    *flag = done == sp.splits;
    if (done == sp.splits) sp.counters[item] = 0;  // every chunk has counted: ready for the next launch
  }
  __syncthreads();  // (thread 0's acquire before every thread's slot loads)
  const bool last = *flag != 0;
  __syncthreads();  // (every thread has read it before the epilogue reuses the memory)
  if (!last) return false;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int n = 0; n < NDT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][n][e] = 0.f;
    m[mt][0] = m[mt][1] = kNegInf;
    d[mt][0] = d[mt][1] = 0.f;
  }
#pragma unroll 1
  for (int s = 0; s < sp.splits; ++s) {
    const float4* p = sp.partials + (int64_t(item) * sp.splits + s) * F4 * NT + tid;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const float4 st = __ldcg(p + (MT * NDT + mt) * NT);
      const float pm[2] = {st.x, st.y}, pd[2] = {st.z, st.w};
      float a[2], c[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (V::kSoftmax) {
          const float mn = fmaxf(m[mt][h], pm[h]);
          a[h] = m[mt][h] == kNegInf ? 0.f : exp2f(m[mt][h] - mn);
          c[h] = pm[h] == kNegInf ? 0.f : exp2f(pm[h] - mn);
          m[mt][h] = mn;
        } else {
          a[h] = c[h] = 1.f;
        }
        d[mt][h] = d[mt][h] * a[h] + pd[h] * c[h];
      }
#pragma unroll
      for (int n = 0; n < NDT; ++n) {
        const float4 v = __ldcg(p + (mt * NDT + n) * NT);
        o[mt][n][0] = o[mt][n][0] * a[0] + v.x * c[0];
        o[mt][n][1] = o[mt][n][1] * a[0] + v.y * c[0];
        o[mt][n][2] = o[mt][n][2] * a[1] + v.z * c[1];
        o[mt][n][3] = o[mt][n][3] * a[1] + v.w * c[1];
      }
    }
  }
  return true;
}

}  // namespace attngen
