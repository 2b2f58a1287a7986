"""Split-KV of the mma.sync prefill template (runtime/mma_split.py, csrc/prefill_split.cuh), on the CPU: when a plan
splits, the section it writes and the launcher's reading of it, the kernel's cut of a key range into chunks, and
the merge of the chunks' states in chunk order (checked against the float64 softmax)."""
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from attngen.runtime import mma_split
from attngen.runtime.cuda_plans import PrefillPlan

from .conftest import requires_nvcc

CSRC = Path(__file__).resolve().parents[1] / "attngen" / "csrc"


def launcher_splits(pairs: int, length: int, items: int, head_dim: int) -> int:
    """csrc/prefill_split.cuh mma_split_count: the splits a section of `length` ints holds, from its length alone."""
    at, per = mma_split.partials_at(pairs, items), items * mma_split.slot_floats(head_dim)
    if length <= at or (length - at) % per:
        return 0
    s = (length - at) // per
    return s if 2 <= s <= 65535 else 0


def test_constants_match_the_kernel():
    src = (CSRC / "prefill_split.cuh").read_text()
    header, magic = re.search(r"kMmaSplitHeader = (\d+), kMmaSplitMagic = (0x[0-9A-Fa-f]+)", src).groups()
    assert int(header) == mma_split.HEADER and int(magic, 16) == mma_split.MAGIC
    assert "return int64_t(NT) * 4 * (MT * (D / 8) + MT);" in src and mma_split.slot_floats(128) == 128 * 4 * 17
    assert f"constexpr int kOrderRows = {mma_split.ORDER_ROWS};" in src
    assert "const int64_t at = kMmaSplitHeader + items;" in src and "(4 - (pairs + at) % 4) % 4" in src


@pytest.mark.parametrize("qo,kv,group,heads,want", [
    ([8], [8192], 4, 8, (32, 256)),  # a verify step: 8 CTAs, 32 chunks of 256 keys each
    ([8] * 4, [8192] * 4, 4, 8, (8, 1024)),  # 32 CTAs: 8 chunks (two CTAs per SM)
    ([16] * 8, [16384] * 8, 4, 8, (4, 4096)),
    ([8] * 32, [4096] * 32, 4, 8, None),  # 256 CTAs: enough
    ([512], [32768], 4, 8, None),  # 2048 packed rows: 128-row tiles may serve
    ([8], [300], 4, 8, None),  # too few keys for two chunks of 256
])
def test_splits_where_the_launch_has_few_ctas(qo, kv, group, heads, want):
    got = mma_split.split_plan(max(qo), np.array(kv), group=group, kv_heads=heads, head_dim=128, sms=132)
    assert got == want
    if got:
        splits, chunk = got
        assert chunk % 64 == 0 and chunk >= mma_split.MIN_CHUNK_KEYS
        assert (splits - 1) * chunk < max(kv) <= splits * chunk


@pytest.mark.parametrize("max_qo,batch,heads,sms,want", [
    (8, 1, 8, 132, True),  # a verify step: 8 CTAs at group 1
    (1, 132, 1, 132, True),  # as many CTAs as SMs: two chunks each still fit
    (1, 133, 1, 132, False),
    (255, 1, 8, 132, True), (256, 1, 8, 132, False),  # 256 packed rows at group 1: 128-row tiles may serve
    (0, 1, 8, 132, False), (8, 1, 8, 0, False),  # no rows; no SMs known
])
def test_a_plan_reads_key_lengths_only_where_a_split_may_serve(max_qo, batch, heads, sms, want):
    """may_split: whether some GQA group's launch could split (group 1's rows and CTAs are the fewest); where it
    says no, split_plan says no at every group and key length."""
    assert mma_split.may_split(max_qo, batch, heads, sms) == want
    if not want and sms:
        for group in (1, 2, 4, 8):
            assert mma_split.split_plan(max_qo, np.array([1 << 20] * batch), group=group, kv_heads=heads,
                                        head_dim=128, sms=sms) is None


@pytest.mark.parametrize("head_dim,rows_64,splits", [(128, False, False), (64, False, False), (256, False, True),
                                                      (128, True, True)])
def test_appends_of_256_rows_or_more_split_where_no_128_row_tile_serves(head_dim, rows_64, splits):
    """A chunk of 64 tokens at GQA 4 (256 packed rows) over 16k keys: 32 CTAs. 128-row tiles (head dims up to 128)
    take no split; at head dim 256, or with 64-row tiles forced, the launch's tiles are 64 rows and split."""
    kv = np.array([16384])
    got = mma_split.split_plan(64, kv, group=4, kv_heads=8, head_dim=head_dim, sms=132, rows_64=rows_64)
    assert (got is not None) == splits
    assert mma_split.may_split(64, 1, 8, 132, head_dim=head_dim, rows_64=rows_64)  # (group 1: 64 rows, split)
    assert mma_split.may_split(256, 1, 8, 132, head_dim=head_dim, rows_64=rows_64) == splits  # (group 1: 256 rows)
    if got:
        assert got[0] >= 2 and mma_split.items_of(64, 4, 8, 1) * got[0] <= 2 * 132


def test_the_slots_memory_is_bounded():
    """A long cache over a few CTAs of a device of many SMs: the chunks' slots stay within MAX_PARTIAL_BYTES
    (fewer, longer chunks than the SMs ask for)."""
    splits, chunk = mma_split.split_plan(60, np.array([1 << 20]), group=4, kv_heads=8, head_dim=256, sms=2000)
    items = 4 * 8
    assert splits < 2 * 2000 // items
    assert items * splits * mma_split.slot_floats(256) * 4 <= mma_split.MAX_PARTIAL_BYTES
    assert splits * chunk >= 1 << 20


@pytest.mark.parametrize("qo,kv", [([8], [8192]), ([3, 16, 0, 5], [2000, 6000, 40, 5]), ([13], [100000])])
def test_the_section_and_the_launchers_reading_of_it(qo, kv):
    """[pairs] unread entries, then the header, zero counters and the partial slots (device-allocated), 16-byte
    aligned from the tensor's start; the launcher finds the plan's split count from the length alone."""
    group, heads, d = 4, 8, 128
    qo_max = max(qo)
    pairs = mma_split.order_pairs(qo_max, group, len(qo))
    out = mma_split.split_order(qo_max, np.array(kv), group=group, kv_heads=heads, head_dim=d, sms=132,
                                pairs=pairs, device="cpu")
    splits, chunk = mma_split.split_plan(qo_max, np.array(kv), group=group, kv_heads=heads, head_dim=d, sms=132)
    items = mma_split.items_of(qo_max, group, heads, len(qo))
    assert items == -(-qo_max * group // 64) * heads * len(qo)
    sec = out[pairs:].numpy()
    at = int(sec[6])
    assert list(sec[:8]) == [mma_split.MAGIC, splits, chunk, items, mma_split.slot_floats(d), 8, at, 64]
    assert not sec[8:8 + items].any() and (pairs + at) % 4 == 0
    assert len(sec) == at + items * splits * mma_split.slot_floats(d)
    assert launcher_splits(pairs, len(sec), items, d) == splits
    assert launcher_splits(pairs, len(sec), items + 1, d) == 0  # (another grid reads no split)


def test_plans_split_once_and_only_where_asked():
    kv_lens = np.array([8192])
    plan = PrefillPlan(1, 8, 8, (), mma_kv_lens=kv_lens)
    first = plan.mma_split_order(4, 128, 8, "cpu", sms=132)
    assert first is not None and first[1].item() == mma_split.MAGIC  # (behind 1 entry: one tile of 8 x 4 rows)
    assert plan.mma_split_order(4, 128, 8, "cpu", sms=132) is first  # made once
    off = PrefillPlan(1, 8, 8, (), mma_kv_lens=kv_lens, tail_split=False)
    assert off.mma_split_order(4, 128, 8, "cpu", sms=132) is None
    assert PrefillPlan(1, 8, 8, ()).mma_split_order(4, 128, 8, "cpu", sms=132) is None  # (the Hopper template's plan)
    assert PrefillPlan(1, 8, 8, (), mma_kv_lens=kv_lens).mma_split_order(4, 128, 8, "cpu") is None  # (no SMs known)


def cut(lo: int, hi: int, y: int, splits: int, chunk: int) -> tuple[int, int]:
    """csrc/prefill_split.cuh mma_split_cut."""
    a = min(lo + y * chunk, hi)
    e = hi if y + 1 == splits else min(a + chunk, hi)
    return a, e


@pytest.mark.parametrize("lo,hi,splits,chunk", [(0, 8192, 32, 256), (0, 8000, 4, 2048), (100, 5000, 3, 1024),
                                                 (0, 300, 8, 256), (0, 20000, 4, 2048)])
def test_the_chunks_cover_the_range_once(lo, hi, splits, chunk):
    """Every key of [lo, hi) in one chunk, chunks starting on 64-key boundaries from lo; past splits x chunk keys
    (a batch replayed under the plan's bounds) the last chunk runs to hi."""
    seen = []
    for y in range(splits):
        a, e = cut(lo, hi, y, splits, chunk)
        assert (a - lo) % 64 == 0 or a == hi
        seen.extend(range(a, e))
    assert seen == list(range(lo, hi))


def test_the_merge_in_chunk_order_is_the_softmax():
    """Chunks' (unnormalised O, max, sum) states merged as the kernel merges them, from an empty state, an empty
    chunk among them: the float64 softmax."""
    rng = np.random.default_rng(0)
    s = rng.normal(size=1000) * 3
    v = rng.normal(size=(1000, 8))
    bounds = [(0, 256), (256, 512), (512, 512), (512, 1000)]
    m, d, o = -np.inf, 0.0, np.zeros(8)
    for a, e in bounds:
        pm = s[a:e].max() if e > a else -np.inf
        p = np.exp2(s[a:e] - pm) if e > a else np.zeros(0)
        pd, po = p.sum(), p @ v[a:e]
        mn = max(m, pm)
        aa = 0.0 if m == -np.inf else np.exp2(m - mn)
        cc = 0.0 if pm == -np.inf else np.exp2(pm - mn)
        d, o, m = d * aa + pd * cc, o * aa + po * cc, mn
    w = np.exp2(s - s.max())
    np.testing.assert_allclose(o / d, (w / w.sum()) @ v, rtol=1e-12)
    np.testing.assert_allclose(m + np.log2(d), s.max() + np.log2(w.sum()), rtol=1e-12)


FITS_PROGRAM = r"""
#include <cstdio>
#include <cstdlib>
#include "prefill_split.cuh"
using namespace attngen;
// stdin: cases of (pairs, items, splits, rows, slot, n, m) and the first m of the n ints of a plan's order tensor
// (the rest: the partial slots, zero); stdout a case: 1 / 0, whether mma_split_fits takes the section behind the
// pairs, the tensor placed as the allocator places it (256-byte aligned), and the launcher's split count
int main() {
  long long pairs, items, splits, rows, slot, n, m;
  while (std::scanf("%lld %lld %lld %lld %lld %lld %lld", &pairs, &items, &splits, &rows, &slot, &n, &m) == 7) {
    int32_t* t = static_cast<int32_t*>(std::aligned_alloc(256, ((n * 4 + 255) / 256) * 256));
    for (long long i = 0; i < n; ++i) t[i] = 0;
    for (long long i = 0; i < m; ++i) std::scanf("%d", &t[i]);
    const int64_t len = n - pairs;  // (the launcher's count: of the section's length alone)
    const int count = slot == mma_split_slot_floats<64, 1, 128>()    ? mma_split_count<64, 1, 128>(pairs, len, items)
                      : slot == mma_split_slot_floats<128, 1, 128>() ? mma_split_count<128, 1, 128>(pairs, len, items)
                                                                     : mma_split_count<256, 1, 128>(pairs, len, items);
    std::printf("%d %d\n", int(mma_split_fits(t + pairs, len, items, splits, int(rows), slot)), count);
    std::free(t);
  }
  return 0;
}
"""


@requires_nvcc
def test_the_kernels_header_check_takes_every_plans_section(tmp_path):
    """The kernel traps on a section its launch does not fit (prefill_split.cuh mma_split_fits, compiled for the
    host here): it takes every section the plan writes (batches of 1-6 requests, groups 1-8, head dims 64-256, so
    that the entries before the section are any number mod 4) and refuses one whose header or length is off. The
    launcher's split count (mma_split_count, compiled too) is the plan's, and launcher_splits's here."""
    rng = np.random.default_rng(1)
    lines, want, counts = [], [], []
    while len(want) < 120:
        b, group, heads, d = int(rng.integers(1, 7)), int(rng.choice([1, 2, 4, 8])), int(rng.integers(1, 9)), \
            int(rng.choice([64, 128, 256]))
        qo = rng.integers(0, 256 // group, size=b)
        kv = rng.integers(1, 20000, size=b)
        qo_max = int(qo.max())
        pairs = mma_split.order_pairs(qo_max, group, b)
        out = mma_split.split_order(qo_max, kv, group=group, kv_heads=heads, head_dim=d, sms=132, pairs=pairs,
                                    device="cpu")
        if out is None:
            continue
        n = len(out)
        items, splits, slot = int(out[pairs + 3]), int(out[pairs + 1]), mma_split.slot_floats(d)
        head = out[:pairs + 8 + items].numpy()  # (behind it the partial slots, device memory the kernel writes)
        cases = [(head, n, items, splits, 1)]
        if len(want) % 4 == 0:  # a spoilt header or length, or another launch: refused
            bad = head.copy()
            bad[pairs + int(rng.integers(0, 8))] += 1
            cases += [(bad, n, items, splits, 0), (head, n - 1, items, splits, 0), (head, n, items + 1, splits, 0),
                      (head, n, items, splits + 1, 0)]
        for ints, length, it, sp, ok in cases:
            lines.append(f"{pairs} {it} {sp} {mma_split.ROWS} {slot} {length} {len(ints)}\n" + " ".join(map(str, ints)))
            want.append(ok)
            counts.append(launcher_splits(pairs, length - pairs, it, d))
            assert not ok or counts[-1] == splits
    src = tmp_path / "fits.cu"
    src.write_text(FITS_PROGRAM)
    exe = tmp_path / "fits"
    subprocess.run(["nvcc", "-std=c++17", f"-I{CSRC}", "-o", str(exe), str(src)], check=True, capture_output=True)
    got = subprocess.run([str(exe)], input="\n".join(lines), check=True, capture_output=True, text=True).stdout.split()
    assert list(map(int, got[0::2])) == want
    assert list(map(int, got[1::2])) == counts
