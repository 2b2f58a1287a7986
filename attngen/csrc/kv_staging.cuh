// fp8 K/V tiles of the mma.sync prefill template (prefill.cuh): the rows are copied as stored (one byte per
// element, half the bytes of a 16-bit tile) into a staging area, then widened in shared memory into the
// 16-bit tile of the query dtype that ldmatrix reads (exact: every fp8 value is a half and a bfloat16 value,
// fp8_kv.cuh). Scales are not applied here: the kernel folds k_scale into the score scale (or into the key
// hook's input) and v_scale into the output rows.
//
// Each thread copies, and later widens, the same 16-byte chunks of every tile: one column chunk (16 fp8
// elements) of every kRowStep-th row of K and of V. A thread reads only what it copied, so its own
// cp.async wait is enough before widening; the barrier after widening publishes the 16-bit tile.
#pragma once
#include <stdint.h>

#include "cp_async.cuh"
#include "fp8_kv.cuh"
#include "kv_rows.cuh"
#include "kv_tile_layout.cuh"

namespace attngen {

// K/V narrower than the query dtype (fp8) are staged and widened into 16-bit tiles.
template <class T, class KV>
constexpr bool kv_staged() {
  return sizeof(KV) < sizeof(T);
}

// A K/V tile of TK keys at head_dim D, staged as KV (fp8) and widened to T, by NT threads.
template <class T, class KV, int D, int TK, int NT>
struct StagedKVTile {
  static_assert(kIsFp8<KV>, "the staging area holds fp8 rows");
  static constexpr int kChunks = D / 16;          // 16-byte chunks per staged row
  static constexpr int kRowStep = NT / kChunks;   // rows between one thread's chunks
  static constexpr int kPasses = TK / kRowStep;  // chunks per thread of the K (and of the V) tile
  static_assert(NT % kChunks == 0 && TK % kRowStep == 0, "staged K/V rows split evenly over the threads");
  // The staging area: K then V, [2][TK][D] (prefill_smem_bytes counts it), rows unpadded and unswizzled: a
  // warp's copies and reads are consecutive 16-byte chunks.

  // Issues this thread's copies of keys [j0, j0 + TK) of KV head hk of request `start` (its kv.indptr entry)
  // into `staged`; rows at or past `hi` are zero-filled.
  __device__ __forceinline__ static void load(KV* staged, int tid, const KVRows& kv, int hk, int start,
                                              int page_shift, int j0, int hi) {
    const int row = tid / kChunks, col = (tid % kChunks) * 16;
    const KV* base = static_cast<const KV*>(kv.base);  // also the address of the zero-filled rows (never read)
    const KV* column = base + int64_t(hk) * kv.stride_head + col;
    // not unrolled: the row addresses are formed one at a time (the output accumulators stay in registers)
#pragma unroll 1
    for (int i = 0; i < kPasses; ++i) {
      const int r = row + i * kRowStep, j = j0 + r;
      const bool ok = j < hi;
      const KV* src = ok ? column + kv.key_offset(start, j, page_shift) : base;
      KV* dst = staged + r * D + col;
      copy16_async(dst, src, ok);
      copy16_async(dst + TK * D, ok ? src + kv.stride_kv : base, ok);
    }
  }

  // Widens this thread's staged chunks into `tile` [2][TK][D] (K then V, kv_tile_at layout). A chunk becomes
  // two 16-byte chunks of the row, 2c and 2c + 1; threads whose chunk index has bit 2 set store 2c + 1
  // first, so that the 8 threads of a quarter warp (one row at D >= 128) store to 8 distinct bank groups.
  __device__ __forceinline__ static void widen(const KV* staged, T* tile, int tid) {
    const int row = tid / kChunks, chunk = tid % kChunks, col = chunk * 16;
    const bool odd_first = (chunk & 4) != 0;
#pragma unroll 1
    for (int i = 0; i < kPasses; ++i) {
      const int r = row + i * kRowStep;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const uint4 raw = *reinterpret_cast<const uint4*>(staged + (half * TK + r) * D + col);
        const uint4 lo = widen8_fp8<T, KV>(make_uint2(raw.x, raw.y));
        const uint4 hi = widen8_fp8<T, KV>(make_uint2(raw.z, raw.w));
        T* base = tile + half * TK * D;
        uint4* first = reinterpret_cast<uint4*>(base + kv_tile_at<D>(r, odd_first ? col + 8 : col));
        uint4* second = reinterpret_cast<uint4*>(base + kv_tile_at<D>(r, odd_first ? col : col + 8));
        *first = odd_first ? hi : lo;
        *second = odd_first ? lo : hi;
      }
    }
  }
};

}  // namespace attngen
