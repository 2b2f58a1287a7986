// Bulk tensor copies (TMA) of K / V tiles for the Hopper prefill, landing 128-byte swizzled, exactly the layout
// the wgmma descriptors read (hopper_sync.cuh), completing on the stage's mbarrier:
// - ragged: one tensor map per K and V over the [rows, Hkv, D] tensor, boxes of 64 columns x 1 head x Keys
//   rows, which one producer thread issues (and expects the bytes of); rows past the tensor's end arrive as
//   zeros, rows of the next request in the tensor arrive as they are and are masked by the consumers (j >= hi);
// - paged: one map per K and V over the pool seen as (D, Hkv, page slots, pages), boxes of 64 columns x 1 head x
//   page_box rows (a power of two dividing page and tile: a page, a tile, or less), each issued by its own
//   producer thread, dealt over the four producer warps (paged_box_index), after it looked up its page
//   (paged_box_of) and expected its bytes. So come the tiles whose keys all exist and start on a box; the others
//   are gathered (hopper_producer.cuh). A cp.async gather costs
//   the producer an address and a copy per 16 bytes: over pages of 16 it left the consumers waiting for K (ncu:
//   12% of the stall samples on that wait) and ran causal appends at 0.70-0.74 of the same work over ragged K/V.
//
// The maps are encoded on the host through the driver's cuTensorMapEncodeTiled, looked up by the
// runtime (cudaGetDriverEntryPointByVersion), so the library still links only the static CUDA runtime.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

#include "hopper_sync.cuh"
#include "kv_rows.cuh"

namespace attngen {

// The kernel's by-value descriptors (__grid_constant__): `use` is 0 when the producer gathers K / V with
// cp.async, `use_q` 0 when it copies the query rows with cp.async.
struct HopperKVMaps {  // CUtensorMap carries its own alignment
  CUtensorMap k, v, q;
  int use, use_q;
  // paged maps: rows per box (paged_box_rows: the largest power of two dividing tile and page, 8-256 rows, a tile's
  // boxes at most the 128 producer threads); 0: ragged
  int page_box;
};

// Which box of a paged tile producer thread ptid issues: box i goes to lane i / 4 of warp i % 4, so that the
// four producer warps issue a quarter of the tile's boxes each, side by side. A bulk tensor copy takes its operands
// in uniform registers: the compiler issues the copies of a warp's lanes one lane after another (a loop of
// R2UR moves and one UTMALDG per lane), so that a tile of 16 boxes (pages of 16 at D 128) from one warp's lanes
// cost a 16-step chain per K and V tile.
__host__ __device__ constexpr int paged_box_index(int ptid) { return (ptid % 32) * 4 + ptid / 32; }

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void mbar_expect_bytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}

// Box of a 4-d map into `dst`, completing on `bar`: a query map's (c0 columns, c1 head in the group, c2 KV head,
// c3 tokens), a paged K/V map's (columns, KV head, slot in the page, page).
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                            uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
      ::"r"(smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
      "r"(smem_addr(bar))
      : "memory");
}

// Box (c0 columns, c1 head, c2 rows) of `map` into shared memory at `dst`, completing on `bar`.
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, int c0, int c1, int c2, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
      ::"r"(smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar))
      : "memory");
}

// The box of the paged tile at key js that producer thread ptid issues: its page (-1: the thread has none; the
// tile's boxes are Keys / page_box x D / 64) and the box's first slot in it; loaded ahead of the stage's wait.
template <int D, int Keys>
__device__ __forceinline__ int2 paged_box_of(const HopperKVMaps& maps, const KVRows& kv, int kv_start, int js,
                                             int page_shift, int ptid) {
  constexpr int kChunks = D / 64;
  const int box = maps.page_box, i = paged_box_index(ptid);
  if (box == 0 || i >= (Keys / box) * kChunks) return make_int2(-1, 0);
  return kv.page_slot(kv_start, js + (i / kChunks) * box, page_shift);
}

// A whole tile of keys js ... js + Keys - 1 into the stage `dst` by bulk copies, completing on `bar`; every producer
// thread calls it once per tile (the barrier's 128 arrivals). Ragged: thread 0 expects the tile's bytes and issues
// its D / 64 boxes at row `row0`; paged: each thread with a box (`box`, paged_box_of) expects its bytes and issues
// it (its own expectation before its own copy's completion), the others arrive.
template <class T, int D, int Keys>
__device__ __forceinline__ void bulk_kv_tile(const HopperKVMaps& maps, const CUtensorMap* map, T* dst, int hk,
                                             int64_t row0, int2 box, uint64_t* bar, int ptid) {
  constexpr int kChunks = D / 64;
  if (maps.page_box == 0) {
    if (ptid == 0) {
      mbar_expect_bytes(bar, uint32_t(Keys * D * sizeof(T)));
#pragma unroll
      for (int c = 0; c < kChunks; ++c) tma_load_3d(dst + c * Keys * 64, map, c * 64, hk, int(row0), bar);
    } else {
      mbar_arrive(bar);
    }
  } else if (box.x >= 0) {
    const int i = paged_box_index(ptid), c = i % kChunks, p = i / kChunks;
    mbar_expect_bytes(bar, uint32_t(maps.page_box * 64 * sizeof(T)));
    tma_load_4d(dst + c * Keys * 64 + p * maps.page_box * 64, map, c * 64, hk, box.y, box.x, bar);
  } else {
    mbar_arrive(bar);
  }
}
#endif

using TensorMapEncode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                     const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                     CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The tensor-map element type of T (half or bfloat16).
template <class T>
constexpr CUtensorMapDataType tensor_map_type() {
  return std::is_same_v<T, half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
}

// The driver's cuTensorMapEncodeTiled, or nullptr where the driver lacks it.
inline TensorMapEncode tensor_map_encoder() {
  static TensorMapEncode encode = []() -> TensorMapEncode {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult status{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &status) !=
            cudaSuccess ||
        status != cudaDriverEntryPointSuccess)
      return nullptr;
    return reinterpret_cast<TensorMapEncode>(fn);
  }();
  return encode;
}

// Encodes the query map: q [q_rows, Hq, D] seen as (D, group, Hkv, q_rows), so that a box of 64 columns x
// `group` heads x 1 KV head x Rows / group tokens lands as a query tile's packed rows (row = token * group +
// head), 128-byte swizzled like the K / V tiles; rows past the tensor's end arrive as zeros, rows of the
// next request as they are (their outputs are never stored, and no other row reads them). False (use_q = 0)
// where the group does not divide the tile's rows or the driver refuses: the producer copies with cp.async.
template <class T, int D, int Rows>
bool encode_query_map(HopperKVMaps& maps, const void* q, int64_t q_rows, int64_t q_stride, int num_kv_heads,
                      int group) {
  maps.use_q = 0;
  TensorMapEncode encode = tensor_map_encoder();
  if (encode == nullptr || q_rows <= 0 || group <= 0 || Rows % group != 0 ||
      reinterpret_cast<uintptr_t>(q) % 16 != 0 || q_stride * int64_t(sizeof(T)) % 16 != 0)
    return false;
  const cuuint64_t dims[4] = {cuuint64_t(D), cuuint64_t(group), cuuint64_t(num_kv_heads), cuuint64_t(q_rows)};
  const cuuint64_t strides[3] = {cuuint64_t(D) * sizeof(T), cuuint64_t(group) * D * sizeof(T),
                                 cuuint64_t(q_stride) * sizeof(T)};
  const cuuint32_t box[4] = {64, cuuint32_t(group), 1, cuuint32_t(Rows / group)}, unit[4] = {1, 1, 1, 1};
  if (encode(&maps.q, tensor_map_type<T>(), 4, const_cast<void*>(q), dims, strides, box, unit,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
    return false;
  maps.use_q = 1;
  return true;
}

// Encodes the K and V maps of a ragged problem (rows known on the host); false (use = 0) where the driver
// entry point is missing or refuses the tensor, so that the caller falls back to the cp.async gather.
template <class T, int D, int Keys>
bool encode_ragged_kv_maps(HopperKVMaps& maps, const KVRows& kv, int num_kv_heads) {
  maps.use = 0;
  if (kv.page_size != 0 || kv.rows <= 0) return false;
  TensorMapEncode encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[3] = {cuuint64_t(D), cuuint64_t(num_kv_heads), cuuint64_t(kv.rows)};
  const cuuint64_t strides[2] = {cuuint64_t(kv.stride_head) * sizeof(T), cuuint64_t(kv.stride_slot) * sizeof(T)};
  const cuuint32_t box[3] = {64, 1, Keys}, unit[3] = {1, 1, 1};
  const T* k = static_cast<const T*>(kv.base);
  for (int which = 0; which < 2; ++which) {
    const T* base = which == 0 ? k : k + kv.stride_kv;
    if (reinterpret_cast<uintptr_t>(base) % 16 != 0) return false;
    if (encode(which == 0 ? &maps.k : &maps.v, tensor_map_type<T>(), 3, const_cast<T*>(base), dims, strides, box, unit,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
      return false;
  }
  maps.use = 1;
  return true;
}

// Rows of a paged tile's box for pages of `page` rows under tiles of Keys keys at head dim D: the largest power of
// two dividing both (the tile itself where it is one and pages hold whole tiles; pages of 64 under tiles of 176
// keys: 16), so that every tile starts on a box and no box crosses a page; 0 (no boxes) where that is under 8 rows,
// above TMA's 256 or needs more issuing threads than the producer's 128.
template <int D, int Keys>
constexpr int paged_box_rows(int page) {
  if (page <= 0) return 0;
  const int box = (page & -page) < (Keys & -Keys) ? (page & -page) : (Keys & -Keys);
  return box % 8 != 0 || box > 256 || (Keys / box) * (D / 64) > 128 ? 0 : box;
}

// Whether tiles of WideKeys keys over pages of `page` rows (0: ragged) come in boxes large enough: as large as
// tiles of Keys keys get, or 64 rows (which stream at the ragged speed: paged_gather_2026-12-06_23b7c58_h100.md).
// Pages of 64 or 128 under 176-key tiles give boxes of 16 rows, 22 a tile against 4 of 64 rows or 2 of 128 under
// 128-key tiles; on the 128-key tiling a causal prompt of 16k rows over pages of 64 runs at 0.94 of ragged K/V
// against 0.84 on the wide one (paged_gather_2026-12-07_paged_boxes_ab_h100.md). A launch with both tilings then
// runs the 128-key one (hopper_launch.cuh).
template <int D, int Keys, int WideKeys>
constexpr bool paged_boxes_kept(int page) {
  const int narrow = paged_box_rows<D, Keys>(page);
  return page == 0 || paged_box_rows<D, WideKeys>(page) >= (narrow < 64 ? narrow : 64);
}

// Encodes the K and V maps of a paged view (the pool's pages known on the host: kv.rows) for tiles of Keys keys:
// the pool seen as (D, Hkv, page slots, pages) with its own strides (NHD or HND), boxes of paged_box_rows rows;
// false (use = 0) where the page size gives none, the pool is not 16-byte aligned or the driver refuses: the
// producer gathers every tile.
template <class T, int D, int Keys>
bool encode_paged_kv_maps(HopperKVMaps& maps, const KVRows& kv, int num_kv_heads) {
  maps.use = 0;
  maps.page_box = 0;
  const int page = kv.page_size, box = paged_box_rows<D, Keys>(page);
  if (box == 0 || kv.rows <= 0) return false;
  TensorMapEncode encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[4] = {cuuint64_t(D), cuuint64_t(num_kv_heads), cuuint64_t(page), cuuint64_t(kv.rows)};
  const cuuint64_t strides[3] = {cuuint64_t(kv.stride_head) * sizeof(T), cuuint64_t(kv.stride_slot) * sizeof(T),
                                 cuuint64_t(kv.stride_page) * sizeof(T)};
  const cuuint32_t boxes[4] = {64, 1, cuuint32_t(box), 1}, unit[4] = {1, 1, 1, 1};
  const T* k = static_cast<const T*>(kv.base);
  for (int which = 0; which < 2; ++which) {
    const T* base = which == 0 ? k : k + kv.stride_kv;
    if (reinterpret_cast<uintptr_t>(base) % 16 != 0) return false;
    if (encode(which == 0 ? &maps.k : &maps.v, tensor_map_type<T>(), 4, const_cast<T*>(base), dims, strides, boxes,
               unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
      return false;
  }
  maps.use = 1;
  maps.page_box = box;
  return true;
}

}  // namespace attngen
