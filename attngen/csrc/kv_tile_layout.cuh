// Shared-memory layout of K/V tiles (decode_tc.cuh, prefill.cuh): rows of D elements, unpadded, with
// their 16-byte chunks XOR-swizzled by row.
#pragma once

namespace attngen {

// K/V tile rows are D elements wide, unpadded, with their 16-byte chunks permuted: chunk c of row r sits
// at c ^ (r % 8). A row's chunks stay in the row, so (with the tiles 128-byte aligned) the 8 lanes that
// copy a 128-byte line of a row write one aligned 128-byte line of shared memory, and ldmatrix's 8 rows of
// one chunk column hit 8 distinct banks. A destination straddling two lines (padded rows, or a misaligned
// stage) reaches L2 as split requests that fetch sectors twice: on the H200 that was 1.5x (padded) and 2x
// (swizzled, 32 bytes off) the L2 sectors per DRAM sector, and 5% (12%) of decode bandwidth.
template <int D>
__host__ __device__ __forceinline__ int kv_tile_at(int row, int col) {
  return row * D + ((((col >> 3) ^ row) & 7) | ((col >> 3) & ~7)) * 8 + (col & 7);
}

// The chunk part of kv_tile_at for a lane that holds its row's swizzle x = row % 8 (0 <= x < 8): where chunk
// `chunk` of that row sits (kv_tile_at(row, 8 c) = row * D + 8 kv_chunk_at(c, row % 8)). The fragment loops
// keep x per lane instead of the row. (Written apart from kv_tile_at: folding one into the other changed
// the decode kernel's instruction schedule.)
__host__ __device__ __forceinline__ int kv_chunk_at(int chunk, int x) { return (chunk & ~7) | ((chunk & 7) ^ x); }

}  // namespace attngen
