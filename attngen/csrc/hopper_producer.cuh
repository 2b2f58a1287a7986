// The producer warpgroup of the Hopper prefill template: brings K/V tiles from pages or ragged rows into
// 128-byte-swizzled shared memory (bulk tensor copies for the tiles whose keys all exist and start on a box,
// hopper_tma.cuh; cp.async gathers for the others), applies the key transform where the variant has one,
// and hands each stage to the consumers through mbarriers.
//
// K and V have their own stages and barriers (full_k / empty_k, full_v / empty_v, kStages each): the
// consumers read K of tile kt for S = Q K^T and release it as soon as that product completes, while V of
// tile kt - 1 is still in use by O += P V, so the next K tile lands while the current one's softmax and
// P V run. The producer issues tile kt's K copies, then its V copies, each after its stage has drained, and
// does not wait for them: cp.async.mbarrier.arrive.noinc makes each thread's copies arrive on the stage's
// full barrier when they land. A variant with a key transform waits for its K copies (its V copies stay
// in flight), transforms the tile and then arrives, after the proxy fence its ordinary stores need.
//
// Paged views: the tile's row addresses are looked up once, one key row per producer thread, into a
// double-buffered row of shared memory that every thread's copies then read.
//
// fp8 caches: the same gather copies the stored bytes into the stage's staging half, and the producer waits
// for them and widens them into the stage before it arrives (hopper_fp8_stage.cuh).
#pragma once
#include "cp_async.cuh"
#include "hopper_fp8_stage.cuh"
#include "hopper_sync.cuh"
#include "kv_rows.cuh"
#include "mma.cuh"
#include "row_hook.cuh"

namespace attngen {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The mbarrier `bar` receives one arrival when every cp.async this thread issued so far has landed.
__device__ __forceinline__ void copy_arrive_on(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ uint64_t ld_shared_u64(uint32_t addr) {
  uint64_t v;
  asm volatile("ld.shared.u64 %0, [%1];\n" : "=l"(v) : "r"(addr));
  return v;
}

// The producer's view of one CTA's KV range: what to copy and where to publish it. E: the cache's element
// type, 16-bit (copied into the 128-byte-swizzled stage) or fp8 (into the stage's staging half, in the
// staging layout: staged8_offset). Windowed: the request's keys through TVM's sliding-window view
// (tvm_window.cuh).
template <class E, int D, int Keys, bool Windowed = false>
struct KVGather {
  const KVRows& kv;
  int kv_start, lo, hi, hk, page_shift;
  const E** rows;  // paged: [2][Keys] row addresses of the tiles being issued (shared memory)
  SinkShift sinks;  // windowed: the request's sink rows and window shift
  static_assert(sizeof(E) == 2 || sizeof(E) == 1, "16-bit or fp8 K/V");
  // elements per 16-byte chunk, chunks per row, rows per pass of 128 threads, bytes per row of a column block
  static constexpr int kEPC = 16 / int(sizeof(E)), kCPR = D / kEPC, kRPP = 128 / kCPR, kRowBytes = 64 * int(sizeof(E));
  static_assert(Keys % kRPP == 0, "K/V rows split evenly over the producer warpgroup");

  // Paged: the addresses of the key rows of the tile starting at key js (KV head hk, column 0; rows past `hi` get the pool's base,
  // a readable address their zero-filling copies do not read), a row per thread and pass (two passes for wide
  // tiles), visible to the producer warpgroup on return (named barrier 1). Ragged views compute theirs in `issue`.
  // `js`: the tile's first key; `buf`: its slot of the double buffer (the tile's index % 2).
  __device__ __forceinline__ void look_up(int js, int buf, int ptid) const {
    if (kv.page_size == 0) return;
    const E* head = static_cast<const E*>(kv.base) + int64_t(hk) * kv.stride_head;
#pragma unroll
    for (int r = ptid; r < Keys; r += 128) {
      const int j = js + r;
      rows[buf * Keys + r] = j < hi ? head + kv.key_offset(kv_start, Windowed ? sinks.row(j) : j, page_shift)
                                    : static_cast<const E*>(kv.base);
    }
    named_sync(1, 128);
  }

  // Copies K (plane 0) or V (plane = stride_kv) rows of the tile of keys js ... js + Keys - 1 into dst; rows
  // past `hi` are zero-filled, so that 0-weight (masked) products with them stay 0. The producer warps issue
  // only between the consumers' instructions and wait out their own latencies, so the loop is unrolled
  // with the shared-memory destination and (ragged) the source advanced by constant steps: a copy and a
  // few integer operations per row.
  // `dst`: the stage (16-bit E) or its staging half (fp8 E).
  __device__ __forceinline__ void issue(int js, int buf, void* dst, int64_t plane, int ptid) const {
    const int c = ptid % kCPR, r0 = ptid / kCPR, j0 = js + r0;
    const uint32_t d0 =
        smem_addr(dst) + (sizeof(E) == 2 ? sw128_offset(r0, c * 8, Keys) : staged8_offset(r0, c, Keys));
    const int hi_ = hi;
    if (kv.page_size == 0) {
      const E* fill = static_cast<const E*>(kv.base);  // readable; zero-filling copies read nothing
      const E* src = static_cast<const E*>(kv.base) + int64_t(hk) * kv.stride_head + c * kEPC + plane +
                     int64_t(kv_start + j0) * kv.stride_slot;
      const int64_t step = int64_t(kRPP) * kv.stride_slot;
#pragma unroll
      for (int i = 0; i < Keys / kRPP; ++i) {
        const bool ok = j0 + i * kRPP < hi_;
        copy16_async_to(pass_dst(d0, i), ok ? src : fill, ok);
        src += step;
      }
    } else {
      const uint32_t row_addr = smem_addr(rows + buf * Keys + r0);
      const int64_t col = c * kEPC + plane;
#pragma unroll
      for (int i = 0; i < Keys / kRPP; ++i) {
        const bool ok = j0 + i * kRPP < hi_;
        const E* row = reinterpret_cast<const E*>(ld_shared_u64(row_addr + i * kRPP * 8));
        copy16_async_to(pass_dst(d0, i), ok ? row + col : row, ok);
      }
    }
  }

  // The destination of pass i: kRPP rows further; the swizzle (row % 8) is the first row's when kRPP is a
  // multiple of 8, and alternates by 4 rows (chunk ^ 4) when kRPP is 4 (16-bit rows of head_dim 256).
  static __device__ __forceinline__ uint32_t pass_dst(uint32_t d0, int i) {
    static_assert(kRPP % 8 == 0 || (kRPP == 4 && sizeof(E) == 2), "rows per pass keep a fixed or alternating swizzle");
    const uint32_t d = d0 + uint32_t(i * kRPP * kRowBytes);
    return (kRPP == 4 && i % 2 == 1) ? d ^ (4u << 4) : d;
  }
};

// The key transform on a landed K tile, by the producer's four warps (row hooks through fp32 scratch rows).
// k_scale: multiplies the keys before the hook (an fp8 cache's, so that the hook sees dequantised keys; 1 else).
template <class V, class T, int D, int Keys>
__device__ __forceinline__ void transform_key_tile(const typename V::Params& hp, T* k_tile, int j0, int hi, int hk,
                                                   float* scratch, int pwarp, int lane, float k_scale = 1.f) {
  unsigned char* kb = reinterpret_cast<unsigned char*>(k_tile);
  for (int r = pwarp; r < Keys; r += 4) {
    const int j = j0 + r;
    if (j >= hi) continue;
    for (int i = lane; i < D; i += 32)
      scratch[i] = to_float(*reinterpret_cast<T*>(kb + sw128_offset(r, i, Keys))) * k_scale;
    __syncwarp();
    warp_row_hook<D, V::kKeyElementwise>(
        scratch, scratch + D, [&](float* row, int i) { return V::key_elem(hp, row, i, j, hk); },
        [&](float* in, float* out) { V::key_row(hp, in, out, j, hk); }, lane);
    for (int i = lane; i < D; i += 32) *reinterpret_cast<T*>(kb + sw128_offset(r, i, Keys)) = from_float<T>(scratch[D + i]);
    __syncwarp();
  }
}

// The K and V stages of a CTA and their barriers (hopper_prefill_kernel's shared memory), kStages each.
template <class T>
struct KVStageRing {
  T* k;  // [stages][Keys * D]
  T* v;
  uint64_t *full_k, *empty_k, *full_v, *empty_v;
};

// The producer's loop over one item's tiles of an fp8 cache: tile kt's K copies, then (once they are in flight)
// the previous tile's V widened and published, then tile kt's K widened (and the key hook applied) and
// published, then tile kt's V copies, which land during the next tile's K copies; the item's last V is
// published after its loop. `it`: the CTA's K/V tiles before the item; `tile_start(kt)`: the first key of
// its kt-th tile; `k_scale`: the KV head's (before a key hook). Each wait for copies is followed by a producer
// barrier: every thread widens chunks that others copied.
template <class V, class T, class KV, int D, int Keys, int Stages, bool Windowed, class TileStart>
__device__ __forceinline__ void produce_fp8_tiles(const KVGather<KV, D, Keys, Windowed>& gather,
                                                  const KVStageRing<T>& ring, int it, int num_kt,
                                                  TileStart tile_start, const typename V::Params& hp, float k_scale,
                                                  float* scratch, int pwarp, int lane, int ptid) {
  auto publish_v = [&](int n) {  // V of the CTA's n-th tile, its copies landed in this thread
    const int s = n % Stages;
    named_sync(1, 128);
    widen_staged_tile<T, KV, D, Keys>(ring.v + s * Keys * D, ptid);
    fence_proxy_async();
    mbar_arrive(&ring.full_v[s]);
  };
#pragma unroll 1
  for (int kt = 0; kt < num_kt; ++kt) {
    const int n = it + kt, s = n % Stages;          // the CTA's n-th K/V tile: its stage and (n >= Stages) the
    const uint32_t drained = ((n / Stages) - 1) & 1;  // phase of the consumers' release to wait for
    const int js = tile_start(kt);
    T* k = ring.k + s * Keys * D;
    // the thread index opaque per tile: the copies' and the widening's offsets are formed again from it (a few
    // integer operations) instead of being hoisted out of the item loop into registers the producer lacks
    int tid = ptid;
    asm volatile("" : "+r"(tid));
    gather.look_up(js, n % 2, tid);
    if (n >= Stages) mbar_wait(&ring.empty_k[s], drained);
    gather.issue(js, n % 2, staging_of<T, D, Keys>(k), 0, tid);
    copy_commit();
    if (kt > 0) {
      copy_wait<1>();  // the previous tile's V copies (committed before this tile's K copies)
      publish_v(n - 1);
    }
    copy_wait<0>();
    named_sync(1, 128);
    widen_staged_tile<T, KV, D, Keys>(k, tid);
    if constexpr (V::kHasKeyTransform) {
      named_sync(1, 128);  // the hook reads whole rows, widened by other threads
      transform_key_tile<V, T, D, Keys>(hp, k, js, gather.hi, gather.hk, scratch, pwarp, lane, k_scale);
    }
    fence_proxy_async();
    mbar_arrive(&ring.full_k[s]);
    if (n >= Stages) mbar_wait(&ring.empty_v[s], drained);
    gather.issue(js, n % 2, staging_of<T, D, Keys>(ring.v + s * Keys * D), gather.kv.stride_kv, tid);
    copy_commit();
  }
  if (num_kt > 0) {
    copy_wait<0>();
    publish_v(it + num_kt - 1);
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace attngen
