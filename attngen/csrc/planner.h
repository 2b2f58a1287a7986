// Split-KV planner (the paper's Algorithm 2), host C++ with no dependencies.
//
// Work W = sum over query tiles of their visible KV length; chunk limit L0 = ceil(W / C)
// (or a fixed chunk for batch-invariant results). Where L0 splits a tile, a few larger
// limits that cut the longest tile into fewer equal pieces are tried too, and the one
// whose greedy schedule has the smallest makespan wins (16 requests of 16k keys on 33
// CTAs: L0 cuts 48 chunks, a makespan of two; 8192 cuts 32, a makespan of one). Every
// query tile's visible KV range is cut into ceil(len / L) equal chunks (fixed chunks:
// pieces of exactly L); chunks sorted longest first (ties by id, so the plan is
// deterministic), each given to the least-loaded CTA of a min-heap keyed by
// (cost, CTA id) under cost = alpha * rows + beta * kv. A tile cut into one chunk
// writes its output directly; a tile cut into several gets one partial state per
// chunk and an ordered entry in the merge map.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <queue>
#include <stdexcept>
#include <string>
#include <vector>

namespace attngen {

// One plan call's input, filled by field name (PlanInput in; in.kv_len = ...;): the fields every caller
// leaves alone keep the defaults below.
struct PlanInput {
  const int32_t* qo_len = nullptr;  // [batch] query tokens per request
  const int32_t* kv_len = nullptr;  // [batch] keys per request
  int batch = 0;
  int group = 1;                    // query heads per KV head (rows per token in a fused tile)
  int tile_rows = 16;               // Tq
  int num_ctas = 0;                 // C
  double alpha = 0.0, beta = 1.0;   // cost model: alpha * rows + beta * keys
  int64_t fixed_chunk = 0;          // > 0: fixed chunk length (batch-invariant mode); 0: max(ceil(W / C), min_chunk)
  int64_t min_chunk = 1;            // shortest chunk worth a work item of its own
  // bounds on qo_pos - kv_pos of visible keys (none: unbounded on that side)
  std::optional<int32_t> mask_lower, mask_upper;
};

struct PlanCapacity {  // the declared upper bounds the workspace was sized for
  int64_t max_work_items = 0, max_partials = 0, max_merge_tiles = 0;
};

struct Plan {
  // work items, grouped by CTA (cta_indptr), in execution order
  std::vector<int32_t> cta_indptr, work_request, work_qtile, work_kv_start, work_kv_end, work_partial;
  // merge map: for each split tile, the ordered partial states to merge into it
  std::vector<int32_t> merge_request, merge_qtile, merge_indptr, merge_partials;
  std::vector<double> cta_cost;
  int64_t chunk_limit = 0;
};

inline void visible_range(const PlanInput& in, int b, int tile, int32_t* lo, int32_t* hi) {
  const int64_t rows = int64_t(in.qo_len[b]) * in.group;
  const int64_t r0 = int64_t(tile) * in.tile_rows, r1 = std::min(rows, r0 + in.tile_rows);
  const int64_t base = int64_t(in.kv_len[b]) - in.qo_len[b];
  const int64_t first_pos = base + r0 / in.group, last_pos = base + (r1 - 1) / in.group;
  int64_t l = 0, h = in.kv_len[b];
  if (in.mask_upper) l = std::max<int64_t>(l, first_pos - *in.mask_upper);
  if (in.mask_lower) h = std::min<int64_t>(h, last_pos - *in.mask_lower + 1);
  *lo = int32_t(l);
  *hi = int32_t(std::max(l, h));
}

struct PlanTile {
  int32_t b, tile, lo, hi, rows;
};

// Chunk boundaries of a tile's range [lo, hi) under limit L: pieces of exactly L (fixed) or
// ceil(len / L) equal pieces; a tile with no visible key keeps one empty chunk.
// (limit is at most kMaxChunkLimit, so none of this overflows)
inline int64_t chunk_count(int64_t len, int64_t limit) { return len > 0 ? 1 + (len - 1) / limit : 1; }
inline int64_t chunk_end(int64_t lo, int64_t len, int64_t limit, int64_t k, int64_t n, bool fixed) {
  return fixed ? lo + std::min<int64_t>(len, (k + 1) * limit) : lo + (len * (k + 1)) / n;
}

// Chunk limits are clamped to the key range an int32 length can have.
constexpr int64_t kMaxChunkLimit = int64_t(1) << 31;

// Greedy makespan under the cost model of cutting every tile with limit L, chunks taken longest first
// as plan_split_kv takes them.
inline double greedy_makespan(const PlanInput& in, const std::vector<PlanTile>& tiles, int64_t limit) {
  std::vector<std::pair<int64_t, double>> chunks;  // (keys, cost)
  for (const PlanTile& t : tiles) {
    const int64_t len = t.hi - t.lo, n = chunk_count(len, limit);
    for (int64_t k = 0, lo = t.lo; k < n; ++k) {
      const int64_t hi = chunk_end(t.lo, len, limit, k, n, false);
      chunks.push_back({hi - lo, in.alpha * t.rows + in.beta * double(hi - lo)});
      lo = hi;
    }
  }
  std::stable_sort(chunks.begin(), chunks.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::priority_queue<double, std::vector<double>, std::greater<double>> heap;
  for (int c = 0; c < in.num_ctas; ++c) heap.push(0.0);
  double makespan = 0.0;
  for (const auto& [keys, c] : chunks) {
    const double t = heap.top() + c;
    heap.pop();
    heap.push(t);
    makespan = std::max(makespan, t);
  }
  return makespan;
}

// The chunk limit: L0 = max(ceil(W / C), min_chunk), or a larger limit that cuts the longest tile
// into fewer equal pieces where that schedules strictly better.
inline int64_t choose_chunk_limit(const PlanInput& in, const std::vector<PlanTile>& tiles, int64_t work) {
  const int64_t l0 = std::min<int64_t>(
      kMaxChunkLimit, std::max<int64_t>(std::max<int64_t>(1, in.min_chunk), (work + in.num_ctas - 1) / in.num_ctas));
  int64_t longest = 0;
  for (const PlanTile& t : tiles) longest = std::max<int64_t>(longest, t.hi - t.lo);
  if (longest <= l0) return l0;  // nothing is split: a larger limit changes nothing
  int64_t best = l0;
  double best_cost = greedy_makespan(in, tiles, l0);
  const int64_t pieces = longest / l0;  // the most pieces of the longest tile a limit >= l0 allows
  for (int64_t k = pieces; k >= std::max<int64_t>(1, pieces - 2); --k) {
    const int64_t limit = (longest + k - 1) / k;
    if (limit <= l0) continue;
    const double c = greedy_makespan(in, tiles, limit);
    if (c < best_cost * (1.0 - 1e-9)) {
      best = limit;
      best_cost = c;
    }
  }
  return best;
}

inline Plan plan_split_kv(const PlanInput& in, const PlanCapacity& cap) {
  if (in.num_ctas <= 0 || in.tile_rows <= 0 || in.group <= 0)
    throw std::invalid_argument("num_ctas, tile_rows and group must be positive");
  struct Chunk {
    int32_t b, tile, lo, hi, rows, id;
  };
  using Tile = PlanTile;
  std::vector<Tile> tiles;
  int64_t work = 0;
  for (int b = 0; b < in.batch; ++b) {
    if (in.qo_len[b] < 0 || in.kv_len[b] < 0) throw std::invalid_argument("negative length in request " + std::to_string(b));
    const int64_t rows = int64_t(in.qo_len[b]) * in.group;
    const int n_tiles = int((rows + in.tile_rows - 1) / in.tile_rows);
    for (int t = 0; t < n_tiles; ++t) {
      Tile x{b, t, 0, 0, int32_t(std::min<int64_t>(in.tile_rows, rows - int64_t(t) * in.tile_rows))};
      visible_range(in, b, t, &x.lo, &x.hi);
      work += x.hi - x.lo;
      tiles.push_back(x);
    }
  }
  Plan p;
  const bool fixed = in.fixed_chunk > 0;
  p.chunk_limit = fixed ? std::min<int64_t>(in.fixed_chunk, kMaxChunkLimit) : choose_chunk_limit(in, tiles, work);
  std::vector<Chunk> chunks;
  std::vector<int32_t> tile_chunks(tiles.size(), 0), tile_first_partial(tiles.size(), -1);
  for (size_t i = 0; i < tiles.size(); ++i) {
    const Tile& t = tiles[i];
    const int64_t len = t.hi - t.lo, n = chunk_count(len, p.chunk_limit);
    for (int64_t k = 0, lo = t.lo; k < n; ++k) {
      const int64_t hi = chunk_end(t.lo, len, p.chunk_limit, k, n, fixed);
      chunks.push_back({t.b, t.tile, int32_t(lo), int32_t(hi), t.rows, int32_t(i)});
      ++tile_chunks[i];
      lo = hi;
    }
  }
  if (int64_t(chunks.size()) > cap.max_work_items)
    throw std::length_error("max_work_items: the plan needs " + std::to_string(chunks.size()) +
                            " work items, the workspace was sized for " + std::to_string(cap.max_work_items));
  // partial-state slots in tile order (so merges read contiguous slots)
  int32_t partials = 0, merges = 0;
  for (size_t i = 0; i < tiles.size(); ++i) {
    if (tile_chunks[i] > 1) {
      tile_first_partial[i] = partials;
      partials += tile_chunks[i];
      ++merges;
    }
  }
  if (partials > cap.max_partials)
    throw std::length_error("max_partials: the plan needs " + std::to_string(partials) +
                            " partial states, the workspace was sized for " + std::to_string(cap.max_partials));
  if (merges > cap.max_merge_tiles)
    throw std::length_error("max_merge_tiles: the plan needs " + std::to_string(merges) +
                            " merges, the workspace was sized for " + std::to_string(cap.max_merge_tiles));
  std::vector<int32_t> chunk_partial(chunks.size(), -1);
  {
    std::vector<int32_t> seen(tiles.size(), 0);
    for (size_t c = 0; c < chunks.size(); ++c) {
      const int32_t t = chunks[c].id;
      if (tile_first_partial[t] >= 0) chunk_partial[c] = tile_first_partial[t] + seen[t]++;
    }
  }
  std::vector<int32_t> order(chunks.size());
  for (size_t c = 0; c < order.size(); ++c) order[c] = int32_t(c);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return chunks[a].hi - chunks[a].lo > chunks[b].hi - chunks[b].lo;
  });
  using Slot = std::pair<double, int32_t>;  // (cost, cta): ties go to the lower CTA id
  std::priority_queue<Slot, std::vector<Slot>, std::greater<Slot>> heap;
  for (int32_t c = 0; c < in.num_ctas; ++c) heap.push({0.0, c});
  std::vector<std::vector<int32_t>> per_cta(in.num_ctas);
  p.cta_cost.assign(in.num_ctas, 0.0);
  for (int32_t c : order) {
    Slot s = heap.top();
    heap.pop();
    per_cta[s.second].push_back(c);
    s.first += in.alpha * chunks[c].rows + in.beta * (chunks[c].hi - chunks[c].lo);
    p.cta_cost[s.second] = s.first;
    heap.push(s);
  }
  p.cta_indptr.push_back(0);
  for (int32_t cta = 0; cta < in.num_ctas; ++cta) {
    for (int32_t c : per_cta[cta]) {
      p.work_request.push_back(chunks[c].b);
      p.work_qtile.push_back(chunks[c].tile);
      p.work_kv_start.push_back(chunks[c].lo);
      p.work_kv_end.push_back(chunks[c].hi);
      p.work_partial.push_back(chunk_partial[c]);
    }
    p.cta_indptr.push_back(int32_t(p.work_request.size()));
  }
  p.merge_indptr.push_back(0);
  for (size_t i = 0; i < tiles.size(); ++i) {
    if (tile_first_partial[i] < 0) continue;
    p.merge_request.push_back(tiles[i].b);
    p.merge_qtile.push_back(tiles[i].tile);
    for (int k = 0; k < tile_chunks[i]; ++k) p.merge_partials.push_back(tile_first_partial[i] + k);
    p.merge_indptr.push_back(int32_t(p.merge_partials.size()));
  }
  return p;
}

}  // namespace attngen
