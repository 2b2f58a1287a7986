// The tail split of the persistent Hopper prefill (hopper_prefill.cuh): where a launch's work items leave its
// last round part-empty (2048 equal items over 132 CTAs: 15.52 rounds, 64 CTAs idle through the sixteenth), the
// plan (runtime/work_tail.py) takes the last items out of the rounds and cuts their key tiles into stretches
// that even out the CTAs' work; where the items are fewer than the SMs (an append of a few query rows over many
// keys), every item is cut, at the same multiples of one chunk of key tiles, one piece a CTA. Every CTA runs its
// rounds as before (the order holds the taken items' pairs shifted past the pairs' range, pair + B * q_tiles,
// which the rounds skip), then its pieces. A piece that covers a whole item is an item; the pieces of a split
// item each leave their unnormalised state (the consumers' accumulators, row max and partial row sums, per
// thread) in a partial slot, and in each consumer warp the piece that finishes last (a counter per item and warp)
// merges every slot, in slot order (in two levels where the item has more than kTailGroup slots), and runs the
// item's epilogue for its rows as an unsplit item would; where the plan runs one piece a CTA and no rounds (the
// header's spread word), the pieces of an item of D / 16 slots or more wait for each other and each merges and
// stores a 16-column stripe of the item's rows (hopper_tail_merge_stripe).
//
// The tail rides behind the plan's work order ([B * q_tiles] int32) in the same tensor; a section of
// kTailHeader ints, then the arrays it names (int offsets from the section's start):
//   [magic, split_from, ctas, pieces, slots, cta_ptr, piece_at, split_at, counters, partials, head_dim, spread]
//   spread: 1 where every item is cut and each CTA runs at most one piece, no rounds (split_from 0): the pieces of an
//     item then merge side by side (hopper_tail_merge_stripe), which waits on the other pieces, so only such plans
//     take it; else 0
//   cta_ptr [ctas + 1]: CTA c runs pieces cta_ptr[c] .. cta_ptr[c + 1] - 1
//   piece_at [pieces][4]: item (pair * KV heads + KV head), first key tile, end key tile (kTailToEnd: the item's
//     last), partial slot (-1: the whole item, no merge); a split item's pieces have consecutive slots; room for
//     max(pieces, ctas) pieces, -1 past the pieces (each CTA loads piece blockIdx.x with the header, before it
//     knows the count)
//   split_at [slots][2]: the first slot of the slot's item and the item's slot count
//   counters [slots][8]: per consumer warp, at the item's first slot (at each group's first slot and the item's
//     second slot where it merges in two levels: hopper_tail_merge); zero between launches (the last finisher
//     resets its own)
//   partials (floats, 16-byte aligned): [slot][2 consumers][D / 8 + 1][128 threads][4] (softmax states use the
//     first D / 16 + 1 chunks of a slot's part: hopper_tail_leave_packed)
// The kernel checks the section against its own launch and the tensor's length once (hopper_tail_load_pieces);
// one that does not fit (a grid not the plan's) traps: the taken items would otherwise be lost. Pieces' tiles are
// clamped to their item's, and a split item's last piece runs to the item's end, so a batch whose lengths moved
// under the plan still runs every key.
#pragma once
#include "common.cuh"
#include "hopper_sync.cuh"
#include "hopper_tile.cuh"
#include "mma.cuh"

namespace attngen {

// The arrays a split item's epilogue reads (hopper_tail_merge), found without checks (hopper_tail_load_pieces
// checked the section once per launch and left what locates them in shared memory: hopper_tail_at)
struct HopperTail {
  const int2* split_at;
  int* counters;
  float4* partials;
  int slots;    // partial slots
  bool spread;  // the header's spread word (side-by-side merges)
};

// Float4 chunks a consumer thread leaves per partial slot: its D / 2 accumulators, then (m_row, d_row).
template <int D>
constexpr int kTailChunks = D / 8 + 1;
constexpr int kTailCounters = 8;  // per slot: one per consumer warp

// Ints of shared memory hopper_tail_load_pieces leaves for hopper_tail_at: the section's split_at and partials
// offsets and its slot count (counters follow split_at: the plan's layout, checked)
constexpr int kTailMetaInts = 3;
constexpr int kTailSpreadBit = 1 << 30;  // in the slot count's word of that shared memory: the header's spread

// The tail's arrays from the section behind `pairs` order ints and what hopper_tail_load_pieces left in `meta`
// (shared memory, read at each call: the epilogue waits on no header word in global memory, and nothing is
// held in registers across the consumers' loop)
__device__ __forceinline__ HopperTail hopper_tail_at(const int32_t* order, int pairs, const volatile int* meta) {
  int* s = const_cast<int*>(order) + pairs;
  const int split = meta[0], part = meta[1], slots = meta[2] & (kTailSpreadBit - 1);
  return HopperTail{reinterpret_cast<const int2*>(s + split), s + split + 2 * slots,
                    reinterpret_cast<float4*>(s + part), slots, (meta[2] & kTailSpreadBit) != 0};
}

// Where piece_at starts in a section behind `pairs` order ints for `ctas` CTAs (ints from the section's start): the
// plan's layout (runtime/work_tail.py piece_offset: cta_ptr right behind the header, piece_at past it on the next
// 16-byte boundary of the order), so that a CTA finds its cta_ptr entries and a piece without the header's offsets
__host__ __device__ __forceinline__ int hopper_tail_piece_offset(int pairs, int ctas) {
  const int at = kTailHeader + ctas + 1;
  return at + (-(pairs + at) & 3);
}

// Thread 0 of a CTA at the kernel's start: this CTA's pieces into `pieces` (shared memory, kTailMaxPieces), and
// their count. The header, the CTA's two cta_ptr entries and piece blockIdx.x (its piece where every CTA runs one,
// as where the items are fewer than the SMs) load at once, each where the section's length `len` holds it, and
// are checked after: one round trip, where a check of each word before the next load took about eleven. The
// section must fit the launch: every array inside `len` and aligned for its reads, the plan's layout
// (hopper_tail_piece_offset), grid and head dim. A tail split the launch cannot run (a kernel without one, a
// section that does not fit) would lose the items it takes out of the rounds: it traps, rather than return a
// silently wrong result. meta: kTailMetaInts of shared memory for hopper_tail_at.
template <int D, bool Tailable>
__device__ __forceinline__ int hopper_tail_load_pieces(const int32_t* order, int pairs, int len, int items,
                                                       int4* pieces, int* meta) {
  if (len <= 0) return 0;
  if (!Tailable || order == nullptr) __trap();
  const int* s = order + pairs;
  const int c = int(blockIdx.x), ctas = int(gridDim.x), at = hopper_tail_piece_offset(pairs, ctas);
  const auto aligned = [&](long long off, int bytes) { return reinterpret_cast<uintptr_t>(s + off) % bytes == 0; };
  const bool head = len >= kTailHeader + ctas + 1LL, pieces_aligned = aligned(at, 16);
  const bool guess_in = len >= at + 4LL * (c + 1) && pieces_aligned;
  int h[kTailHeader];
#pragma unroll
  for (int i = 0; i < kTailHeader; ++i) h[i] = head ? s[i] : 0;
  const int p0 = head ? s[kTailHeader + c] : -1, p1 = head ? s[kTailHeader + c + 1] : -1;
  const int4 guess = guess_in ? reinterpret_cast<const int4*>(s + at)[c] : make_int4(-1, 0, 0, 0);
  const int n = h[3], slots = h[4];
  const long long part_ints = int64_t(slots) * 2 * kTailChunks<D> * 128 * 4;  // (floats: an int's size each)
  // (& rather than &&: no load waits on the test of another)
  const bool fits = head & (h[0] == kTailMagic) & (h[10] == D) & (h[2] == ctas) & (h[1] >= 0) & (h[1] <= items) &
                    (n >= 0) & (slots >= 0) & (h[5] == kTailHeader) & (h[6] == at) & (at + 4LL * n <= len) &
                    (h[7] >= 0) & (h[7] + 2LL * slots <= len) & (h[8] == h[7] + 2LL * slots) &
                    (h[8] + int64_t(kTailCounters) * slots <= len) & (h[9] >= 0) & (h[9] + part_ints <= len) &
                    pieces_aligned & aligned(h[7], 8) & aligned(h[9], 16) & (slots < kTailSpreadBit) &
                    ((h[11] == 0) | ((h[11] == 1) & (h[1] == 0)));
  // (a spread plan's CTA runs one piece at most: its merge waits on the item's other pieces, none of which may
  // wait behind a piece of another item)
  if (!fits || p0 < 0 || p1 < p0 || p1 > n || p1 - p0 > (h[11] ? 1 : kTailMaxPieces)) __trap();
  meta[0] = h[7];
  meta[1] = h[9];
  meta[2] = slots | (h[11] ? kTailSpreadBit : 0);
  const int4* piece_at = reinterpret_cast<const int4*>(s + at);
  int count = 0;
  for (int p = p0; p < p1; ++p) {
    const int4 pc = p == c && guess_in ? guess : piece_at[p];
    if (pc.x < 0 || pc.x >= items || pc.w >= slots) __trap();
    pieces[count++] = pc;
  }
  return count;
}

// Which of this CTA's pieces its round `round` (past the items: work_index(round) >= items) runs: the rounds that
// dealt it an item are the full ones, and the last unless that came after the items (the kernel's snake order).
__device__ __forceinline__ int hopper_tail_piece_of_round(int round, int items) {
  const int ctas = int(gridDim.x), full = items / ctas;
  const int i = (full & 1) ? ctas - 1 - int(blockIdx.x) : int(blockIdx.x);
  return round - full - (i < items - full * ctas ? 1 : 0);
}

// w cut to piece pc's key tiles [first, end) of the item's (TK keys a tile; clamped to the item's tiles, so that a
// batch whose lengths moved under the plan still runs every key of a split item in one of its pieces; end
// kTailToEnd: the item's last); a split item's piece carries its partial slot s as tile -1 - s (the consumers of
// these kernels read no tile: only tile maps do, which take no tail split)
template <int TK>
__device__ __forceinline__ void hopper_tail_cut(const int4& pc, HopperItem& w) {
  const bool split = pc.w >= 0;
  const int first = split ? min(max(pc.y, 0), w.num_kt) : 0;
  const int end = !split || pc.z == kTailToEnd ? w.num_kt : min(max(pc.z, first), w.num_kt);
  const int lo = w.lo;
  w.lo = lo + first * TK;
  w.hi = max(min(w.hi, lo + end * TK), w.lo);
  w.num_kt = end - first;
  if (split) w.tile = -1 - pc.w;
}

// Softmax states leave a slot packed: each row divided by its quad's row sum l (so |o / l| <= max |v|) in the
// output type T, 8 values a 16-byte chunk (D / 16 chunks), then (m0, m1, l0, l1) as floats: half the float32
// accumulators' bytes, so that a merge holds kTailBatch slots' chunks in registers at once and waits on one L2
// round trip per batch, not per slot (verify B1 q8 kv8k on an H100: the one-by-one reads of 16 slots took about
// 10 us of 28.5). Rounding to T adds at most half an ulp of T of max |v| to a slot's share, as the output's own
// rounding does (split-KV partial outputs in the output type, as other attention libraries keep them); a group's
// merged state (two levels: kTailGroup) is rounded once more, half an ulp of its own max |v|.
// Sum states (no row sum bounds their rows) leave the float32 accumulators and merge one slot at a time.
template <class V>
constexpr bool tail_packed() {
  return V::kSoftmax;
}
// slots a merge reads at once: as many as registers hold beside the accumulators without more spill (ptxas, sm_90a;
// loads under a slot-count predicate spilled from 2 slots at D 128, unpredicated ones from none up to 4)
template <int D>
constexpr int kTailBatch = D == 64 ? 8 : D == 128 ? 4 : 2;
// Packed slots of one group (softmax states): an item cut in more pieces merges in two levels. In each warp the
// piece that finishes a group of kTailGroup consecutive slots last merges the group and leaves the group's state
// in its first slot; the piece that finishes the item's last group merges the groups' states. Each level reads
// a few slots on one SM, several SMs merge groups at once: verify B1 q8 kv8k on an H100 (16 slots, read by one
// SM's two warps 3 + 1 a batch behind the states) took 6.7 us from the last count to the merged rows.
template <int D>
constexpr int kTailGroup = kTailBatch<D> > 4 ? kTailBatch<D> : 4;

// This thread's slot part (its first float4 chunk: `mine`, chunks 128 apart), packed as above: rows rounded to T
// after division by their quad's row sum (0 for a row without a live key; a NaN sum stays NaN), then the state.
template <class T, int D>
__device__ __forceinline__ void hopper_tail_leave_packed(float4* mine, const float (&o_acc)[D / 2],
                                                         const float (&m_row)[2], const float (&d_row)[2]) {
  float l[2], inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] = d_row[h] + __shfl_xor_sync(0xffffffffu, d_row[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);  // (the same sum in the quad's four lanes: a butterfly)
    inv[h] = l[h] != 0.f ? 1.f / l[h] : 0.f;
  }
#pragma unroll
  for (int k = 0; k < D / 16; ++k) {  // o_acc[4 j + {0, 1}]: row g, [4 j + {2, 3}]: row g + 8
    const float* o = o_acc + 8 * k;
    __stcg(reinterpret_cast<uint4*>(mine + k * 128),
           make_uint4(pack2<T>(o[0] * inv[0], o[1] * inv[0]), pack2<T>(o[2] * inv[1], o[3] * inv[1]),
                      pack2<T>(o[4] * inv[0], o[5] * inv[0]), pack2<T>(o[6] * inv[1], o[7] * inv[1])));
  }
  __stcg(mine + (D / 16) * 128, make_float4(m_row[0], m_row[1], l[0], l[1]));
}

// One batch of packed slots merged into acc / m / l_sum (the merge's running state): the first `live` of the B slots
// (st: their states, raw: NCH chunks of each), weighed against one max per row, so that the merged rows are
// rescaled once per batch and each slot adds its rows with one FFMA per value (the batch's slots in slot order, as
// one by one up to rounding)
template <class T, int NCH, int B>
__device__ __forceinline__ void tail_merge_batch(const uint4 (&raw)[B][NCH], const float4 (&st)[B], int live,
                                                 float (&acc)[8 * NCH], float (&m)[2], float (&l_sum)[2]) {
  float mb[2] = {m[0], m[1]};
#pragma unroll
  for (int b = 0; b < B; ++b)
    if (b < live) {
      mb[0] = fmaxf(mb[0], st[b].x);
      mb[1] = fmaxf(mb[1], st[b].y);
    }
  float a[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    a[h] = m[h] == kNegInf ? 0.f : exp2f(m[h] - mb[h]);
    l_sum[h] *= a[h];
    m[h] = mb[h];
  }
#pragma unroll
  for (int i = 0; i < 8 * NCH; ++i) acc[i] *= a[(i >> 1) & 1];
#pragma unroll
  for (int b = 0; b < B; ++b)
    if (b < live) {
      const float pm[2] = {st[b].x, st[b].y}, pl[2] = {st[b].z, st[b].w};
      float cl[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        cl[h] = pm[h] == kNegInf ? 0.f : exp2f(pm[h] - mb[h]) * pl[h];
        l_sum[h] += cl[h];
      }
#pragma unroll
      for (int k = 0; k < NCH; ++k) {
        float v[8];
        convert8<T>(raw[b][k], v);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[8 * k + e] = fmaf(v[e], cl[(e >> 1) & 1], acc[8 * k + e]);
      }
    }
}

// Batch s0 of the packed slots first, first + stride, .., count of them: each slot's state and its chunks k0 ..
// k0 + NCH - 1 of this thread's rows (unpredicated loads: past the last slot, the last again, which
// tail_merge_batch does not merge)
template <int D, int NCH, int B>
__device__ __forceinline__ void tail_load_batch(const HopperTail& t, int first, int count, int stride, int s0, int k0,
                                                int cw, int ctid, uint4 (&raw)[B][NCH], float4 (&st)[B]) {
  constexpr int NC = kTailChunks<D>, NP = D / 16;
#pragma unroll
  for (int b = 0; b < B; ++b) {
    const int slot = first + min(s0 + b, count - 1) * stride;
    const float4* p = t.partials + (int64_t(slot) * 2 + cw) * NC * 128 + ctid;
    st[b] = __ldcg(p + NP * 128);
#pragma unroll
    for (int k = 0; k < NCH; ++k) raw[b][k] = __ldcg(reinterpret_cast<const uint4*>(p + (k0 + k) * 128));
  }
}

// The packed slots first, first + stride, .., count of them, merged in slot order from an empty state into o_acc /
// m_row / d_row, kTailBatch slots' loads at a time; d_row gets a quarter of each merged row sum, which the
// epilogue's quad sum makes whole again (exactly: a power of two)
template <class T, int D>
__device__ __forceinline__ void hopper_tail_merge_packed(const HopperTail& t, int first, int count, int stride, int cw,
                                                         int ctid, float (&o_acc)[D / 2], float (&m_row)[2],
                                                         float (&d_row)[2]) {
  constexpr int NP = D / 16, B = kTailBatch<D>;
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o_acc[i] = 0.f;
  m_row[0] = m_row[1] = kNegInf;
  float l_sum[2] = {0.f, 0.f};
#pragma unroll 1
  for (int s0 = 0; s0 < count; s0 += B) {
    uint4 raw[B][NP];
    float4 st[B];
    tail_load_batch<D, NP, B>(t, first, count, stride, s0, 0, cw, ctid, raw, st);
    tail_merge_batch<T, NP, B>(raw, st, count - s0, o_acc, m_row, l_sum);
  }
  d_row[0] = l_sum[0] * 0.25f;
  d_row[1] = l_sum[1] * 0.25f;
}

// Lane 0 of a warp counts at `counter` (GPU scope: a release of the warp's slot stores before it, an acquire of
// the other counts' stores) and resets it where its count is the `of`th (every piece has counted: ready for the
// next launch); every lane gets whether it was
__device__ __forceinline__ bool tail_count_last(int* counter, int of, int lane) {
  __syncwarp();  // the warp's slot stores before lane 0's count (its release covers them)
  int last = 0;
  if (lane == 0) {
    const int done = count_acq_rel(counter) + 1;
    if (done == of) *counter = 0;
    last = done == of;
  }
  last = __shfl_sync(0xffffffffu, last, 0);
  __syncwarp();  // lane 0's acquire before every lane's slot loads
  return last;
}

// Spread merges (plans whose header says spread: every piece in its own CTA, all of them resident): an item of at
// least D / 16 slots (one packed chunk of a thread's rows per piece) merges side by side. Each piece leaves its
// state and counts; piece j < D / 16 then waits for the item's other pieces and merges chunk j of every slot, its
// rows' 16-column stripe (hopper_store_rows stores only that stripe), where one warp per item would read every
// chunk of every slot: each SM reads about one slot's worth instead of the item's, in one L2 round trip per
// kTailStripeBatch slots, and no count lies behind a merge.
constexpr int kTailStripeBatch = 16;
// A warp's finish of a split item's piece (hopper_tail_merge): none (another piece stores these rows), the whole
// rows, or chunk k >= 0 of them (a spread merge's stripe)
constexpr int kTailNoFinish = -2, kTailWholeRows = -1;
// polls of a spread merge's count after which a missing piece (a launch whose CTAs were not all resident) traps
// rather than hang: a few seconds
constexpr int kTailSpinLimit = 1 << 22;
// the base of a spread merge counter's second generation (tail_count_wait); the first counts from 0
constexpr int kTailCountGeneration = 1 << 30;

// Lane 0 of a warp counts its piece at `counter` (acquire-release at GPU scope, as tail_count_last) and, where
// `wait`, waits until the item's `of` pieces have all counted; every lane then sees their slot stores. The counter
// runs in two generations, from 0 and from kTailCountGeneration: the count that completes one (the of-th of its base)
// moves it to the other's base with a release, which every waiting lane 0 takes as done (a count outside its
// base's range) and acquires; the next launch of the plan counts from there. No reset waits on the waiters.
__device__ __forceinline__ void tail_count_wait(int* counter, int of, bool wait, int lane) {
  __syncwarp();  // the warp's slot stores before lane 0's count
  int old = 0;
  if (lane == 0) old = count_acq_rel(counter);
  old = __shfl_sync(0xffffffffu, old, 0);
  const int base = old >= kTailCountGeneration ? kTailCountGeneration : 0;
  if (old + 1 - base == of) {
    if (lane == 0) store_release(counter, kTailCountGeneration - base);
  } else if (wait) {
    // (lane 0 polls; the loop's test on its broadcast value: a loop known warp-uniform, where one inside lane 0's
    // branch cost the mainloop its uniform registers, R2UR among the HGMMAs)
    for (int spin = 0;; ++spin) {
      int v = 0;
      if (lane == 0) v = load_acquire(counter);
      v = __shfl_sync(0xffffffffu, v, 0);
      if (v < base || v >= base + of) break;
      if (spin == kTailSpinLimit) __trap();
    }
  }
  __syncwarp();  // lane 0's acquire before every lane's slot loads
}

// Chunk k (packed: 8 values of rows g and g + 8) of the packed slots first .. first + count - 1, merged in slot
// order from an empty state into o_acc's chunk k (its other values 0) and m_row / d_row as
// hopper_tail_merge_packed leaves them; kTailStripeBatch slots' loads at a time
template <class T, int D>
__device__ __forceinline__ void hopper_tail_merge_stripe(const HopperTail& t, int first, int count, int k, int cw,
                                                         int ctid, float (&o_acc)[D / 2], float (&m_row)[2],
                                                         float (&d_row)[2]) {
  constexpr int NP = D / 16, B = kTailStripeBatch;
  float acc[8], m[2] = {kNegInf, kNegInf}, l_sum[2] = {0.f, 0.f};
#pragma unroll
  for (int e = 0; e < 8; ++e) acc[e] = 0.f;
#pragma unroll 1
  for (int s0 = 0; s0 < count; s0 += B) {
    uint4 raw[B][1];
    float4 st[B];
    tail_load_batch<D, 1, B>(t, first, count, 1, s0, k, cw, ctid, raw, st);
    tail_merge_batch<T, 1, B>(raw, st, count - s0, acc, m, l_sum);
  }
#pragma unroll
  for (int j = 0; j < NP; ++j)
#pragma unroll
    for (int e = 0; e < 8; ++e) o_acc[8 * j + e] = j == k ? acc[e] : 0.f;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    m_row[h] = m[h];
    d_row[h] = l_sum[h] * 0.25f;
  }
}

// A split item's piece at its epilogue (slot: the piece's; consumer cw, its thread ctid of 128): leaves this
// thread's state in the piece's slot; in each warp (16 rows of the item), the warp that finishes the item's last
// piece merges every slot into o_acc / m_row / d_row (the same sums whichever piece is last: slots in slot order,
// groups in group order) and returns kTailWholeRows (it then runs the item's epilogue for its rows), the others
// kTailNoFinish. Counters per warp: no barrier beyond the warp's. Softmax states: each slot's rows rescaled to the
// larger max (an empty row, max -inf, adds nothing), packed, and merged in two levels where the item has more
// than kTailGroup slots (the groups' counters at their first slots, the item's at its second slot: no group
// starts there). The threads hold the same rows and columns in every piece, so the merge is per thread (packed
// slots: after the quad's row sums). A warp none of whose 16 rows the item has (rows: whether it has any; the
// same in every piece of the item) leaves, counts and merges nothing: an append of 8 query rows packs 32 rows of
// the tile's 128, so a quarter of the slots' traffic. Spread plans (t.spread) merge items of D / 16 slots or more
// side by side instead (hopper_tail_merge_stripe; softmax states, no output transform, whose rows the stripes
// would split). Returns what the warp then stores of its rows: kTailNoFinish, kTailWholeRows or a stripe.
template <class V, class T, int D>
__device__ __forceinline__ int hopper_tail_merge(const HopperTail& t, int slot, int cw, int ctid, bool rows,
                                                  float (&o_acc)[D / 2], float (&m_row)[2], float (&d_row)[2]) {
  constexpr int NC = kTailChunks<D>, G = kTailGroup<D>;
  if (!__shfl_sync(0xffffffffu, int(rows), 0)) return kTailNoFinish;  // (lane 0's: known warp-uniform, as below)
  const int lane = ctid % 32, warp = cw * 4 + ctid / 32;
  // lane 0 reads the slot's item (its first slot and slot count) before the slot stores, which it overlaps
  int2 info = make_int2(-1, 0);
  if (lane == 0) info = t.split_at[slot];
  const auto part = [&](int s) { return t.partials + (int64_t(s) * 2 + cw) * NC * 128 + ctid; };
  if constexpr (tail_packed<V>()) {
    hopper_tail_leave_packed<T, D>(part(slot), o_acc, m_row, d_row);
  } else {
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
      __stcg(part(slot) + j * 128, make_float4(o_acc[4 * j], o_acc[4 * j + 1], o_acc[4 * j + 2], o_acc[4 * j + 3]));
    __stcg(part(slot) + (D / 8) * 128, make_float4(m_row[0], m_row[1], d_row[0], d_row[1]));
  }
  // the item's first slot and its slot count, broadcast from lane 0: every branch on them is then known
  // warp-uniform to the compiler (one it cannot prove uniform costs the next item's mainloop its uniform
  // registers: R2UR among the HGMMAs); a table the plan did not make: the piece's own keys alone, no read out of
  // bounds
  int first = slot, count = 1;
  if (lane == 0 && info.x >= 0 && info.y >= 1 && info.x <= slot && slot < info.x + info.y &&
      info.x + info.y <= t.slots) {
    first = info.x;
    count = info.y;
  }
  first = __shfl_sync(0xffffffffu, first, 0);
  count = __shfl_sync(0xffffffffu, count, 0);
  if constexpr (tail_packed<V>() && !V::kHasOutputTransform) {
    // (the plan's word, from shared memory, broadcast as the slot count is: a branch known warp-uniform)
    if (__shfl_sync(0xffffffffu, int(t.spread), 0) && count >= D / 16) {
      const int j = __shfl_sync(0xffffffffu, slot - first, 0);  // (this piece's place in its item: uniform)
      tail_count_wait(t.counters + first * kTailCounters + warp, count, j < D / 16, lane);
      if (j >= D / 16) return kTailNoFinish;
      hopper_tail_merge_stripe<T, D>(t, first, count, j, cw, ctid, o_acc, m_row, d_row);
      return j;
    }
  }
  if constexpr (tail_packed<V>()) {
    // level 0: this slot's group of G (where the item has more than G slots); level 1: the item's slots, or its
    // groups' first slots (one loop: one copy of the merge's code)
    const bool two = count > G;
    const int group = first + (slot - first) / G * G, in_group = min(G, first + count - group);
#pragma unroll 1
    for (int level = two ? 0 : 1; level < 2; ++level) {
      const int at = level == 0 ? group : first, n = level == 0 ? in_group : two ? (count + G - 1) / G : count;
      const int counter_slot = level == 1 && two ? first + 1 : at, stride = level == 1 && two ? G : 1;
      if (n == 1) continue;  // (a group of one slot: its state is in its first slot)
      if (!tail_count_last(t.counters + counter_slot * kTailCounters + warp, n, lane)) return kTailNoFinish;
      hopper_tail_merge_packed<T, D>(t, at, n, stride, cw, ctid, o_acc, m_row, d_row);
      if (level == 0) hopper_tail_leave_packed<T, D>(part(group), o_acc, m_row, d_row);
    }
    return kTailWholeRows;
  }
  if (count > 1 && !tail_count_last(t.counters + first * kTailCounters + warp, count, lane)) return kTailNoFinish;
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o_acc[i] = 0.f;
  m_row[0] = m_row[1] = kNegInf;
  d_row[0] = d_row[1] = 0.f;
#pragma unroll 1
  for (int s = first; s < first + count; ++s) {
    const float4* p = part(s);
    const float4 st = __ldcg(p + (D / 8) * 128);
    const float pd[2] = {st.z, st.w};
#pragma unroll
    for (int h = 0; h < 2; ++h) d_row[h] += pd[h];
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const float4 v = __ldcg(p + j * 128);
      o_acc[4 * j] += v.x;
      o_acc[4 * j + 1] += v.y;
      o_acc[4 * j + 2] += v.z;
      o_acc[4 * j + 3] += v.w;
    }
  }
  return kTailWholeRows;
}

}  // namespace attngen
