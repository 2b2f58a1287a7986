"""Mask-derived tile maps (runtime/tile_map.py): which variants get one, and the compaction of a classified
map into the lists the Hopper template walks (here with the NumPy reference classifier standing in for the
device's, on CPU tensors; tests/test_gpu_tile_map.py runs the device classifier and the mapped kernels)."""
import runpy
from pathlib import Path

import numpy as np
import pytest
from tvm.script import tirx as T

from attngen.variants import builtin

from .tile_map_reference import decode_lists, reference_row_keys, reference_tile_classes

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def example(name):
    return runpy.run_path(str(EXAMPLES / f"{name}.py"))["variant"]


def test_which_variants_get_a_map():
    from attngen.ir.mask_class import mask_needs_map
    from attngen.runtime.tile_map import mask_params, mask_reads_heads

    assert not mask_needs_map(builtin("vanilla"))  # no mask
    assert not mask_needs_map(builtin("causal"))  # its bounds: the CTA's key range already skips tiles
    docs = example("document_mask")
    assert mask_needs_map(docs) and not mask_reads_heads(docs) and mask_params(docs) == ("doc_ids",)
    assert mask_needs_map(example("prefix_lm"))


def test_the_classifier_tells_head_reading_masks_by_a_trait():
    """The classifier's per-token / per-head mode is a trait of the hooks (not heads == 1, which a head-reading
    mask with one KV head also has: the GPU fuzzer's find); the link-time traits carry it for masks beyond their
    bounds (the classifier's only users) and say false for the others (causal: the same template objects as
    before the classifier had a linked part)."""
    from attngen.codegen.cuda_variant import abi_traits_source, traits_source
    from attngen.codegen.hooks_cuda import lower_hooks_cuda
    from attngen.ir.mask_class import MaskKind

    from .fuzz_engine import Recipe, make_variant

    striped = make_variant(Recipe((), ("stripe",), "none", "none", "none"))
    for v, reads in [(striped, True), (example("document_mask"), False), (builtin("causal"), False)]:
        assert v.analysis.mask_reads_heads == reads
        hs = lower_hooks_cuda(v, 64, "sm_80")
        assert f"static constexpr bool kMaskReadsHeads = {str(reads).lower()};" in traits_source(v, hs, 64)
        maps = v.analysis.mask.kind is MaskKind.ARBITRARY
        assert f"kMaskReadsHeads = {str(reads and maps).lower()};" in abi_traits_source(v, hs, 64)


def _doc_ids(rng, kv_lens):
    width = max(kv_lens)
    ids = np.zeros((len(kv_lens), width), np.int32)
    for b, n in enumerate(kv_lens):
        # the longest request opens with a long document (>= 3/4 of it), so the map always has full tiles
        low = 3 * n // 4 if n == width else 0
        for cut in np.sort(rng.integers(low, max(n, 1), size=3)):
            ids[b, cut:] += 1
    return ids


def emulate_device_lists(cls, lists, room, batch, heads, q_tiles):
    """What csrc/tile_map.cuh tile_lists_kernel writes, from the torch compaction (a fake classifier's share)."""
    import torch

    from attngen.runtime.tile_map import compact_lists

    flat = cls.reshape(batch * heads * q_tiles, -1)
    indptr, entries = compact_lists(flat)
    n = int(indptr[-1])
    room[:n] = entries[:n]
    tiles = torch.diff(indptr).view(batch, heads, q_tiles).sum(1).reshape(-1)
    counts = torch.tensor([int((flat == c).sum()) for c in range(3)], dtype=torch.int32)
    order = torch.from_numpy(np.argsort(-tiles.numpy(), kind="stable").astype(np.int32))  # most tiles first
    lists.copy_(torch.cat([indptr, tiles.to(torch.int32), counts, order]))


@pytest.mark.parametrize("device_lists", [False, True])
@pytest.mark.parametrize("group,rows,keys", [(4, 128, 128), (1, 128, 64), (3, 128, 128)])
def test_compacted_lists_stand_for_the_map(group, rows, keys, device_lists, rng):
    import torch

    from attngen.runtime import RaggedKV
    from attngen.runtime.tile_map import build_tile_map

    docs = example("document_mask")
    qo_lens, kv_lens = [300, 0, 77, 520], [300, 9, 200, 520]
    ids = _doc_ids(rng, kv_lens)

    def visible(b, qp, kp, qh, kh):
        return kp <= qp and ids[b, kp] == ids[b, qp]

    ref = reference_tile_classes(visible, qo_lens, kv_lens, group=group, num_kv_heads=2, rows=rows, keys=keys,
                                 reads_heads=False)
    assert {0, 1, 2} <= set(np.unique(ref).tolist())  # the case exercises every class
    ref_rows = reference_row_keys(visible, qo_lens, kv_lens, group=group, num_kv_heads=2, rows=rows,
                                  reads_heads=False)
    lists = int(np.prod(ref.shape[:3]))

    def classify(qo_indptr, kv_ptr, last_page_len, page_size, out, row_keys, made, room, g, hkv, causal, r, k,
                 *extras):
        assert (g, hkv, causal, r, k) == (group, 2, 0, rows, keys)
        assert (made is None) == (room is None) == (not device_lists)
        # a ragged view's own index arrays (the classifier computes the lengths)
        assert last_page_len is None and page_size == 0 and torch.diff(kv_ptr).tolist() == kv_lens
        # the intervals: one per map row of every list, the classifier's to write (each of them)
        assert row_keys.dtype == torch.int32 and tuple(row_keys.shape) == (lists, rows, 2)
        out.copy_(torch.from_numpy(ref))
        row_keys.copy_(torch.from_numpy(ref_rows.reshape(lists, rows, 2)))
        if device_lists:  # the zero-filled outputs of the device's lists, written as its kernel would
            assert made.dtype == torch.int32 and not made.any() and not room.any()
            assert room.numel() >= lists * out.shape[3]
            emulate_device_lists(out, made, room, *out.shape[:3])

    qo_indptr = torch.tensor(np.concatenate([[0], np.cumsum(qo_lens)]), dtype=torch.int32)
    kv_indptr = torch.tensor(np.concatenate([[0], np.cumsum(kv_lens)]), dtype=torch.int32)
    kv = RaggedKV(torch.zeros(sum(kv_lens), 2, 64), torch.zeros(sum(kv_lens), 2, 64), kv_indptr)
    params = {"doc_ids": torch.from_numpy(ids)}
    tm = build_tile_map(classify, docs, qo_indptr, kv, max_qo_len=max(qo_lens), group=group, num_kv_heads=2,
                        rows=rows, keys=keys, extras=(), params=params, device_lists=device_lists)
    assert tm.heads == 1 and (tm.rows, tm.keys) == (rows, keys)
    # the host's wall time by step adds up to the whole
    assert [name for name, _ in tm.build_host_steps] == ["setup", "classifier call", "lists and order"]
    assert sum(ms for _, ms in tm.build_host_steps) == pytest.approx(tm.build_host_ms, rel=1e-6)
    head = tm.entries[:tm.entries.numel() - tm.row_keys.numel()]  # the lists: the head of entries
    back = decode_lists(tm.indptr.numpy(), head.numpy(), ref.shape)
    np.testing.assert_array_equal(back, ref)
    # the map rows' key intervals: the tail of entries, [lists, rows, 2]
    assert tm.row_keys.dtype == torch.int32 and tuple(tm.row_keys.shape) == (lists, rows, 2)
    np.testing.assert_array_equal(tm.row_keys.numpy(), ref_rows.reshape(lists, rows, 2))
    assert tm.entries.numel() >= tm.row_keys.numel() + int(tm.indptr[-1])
    assert torch.equal(tm.entries[-tm.row_keys.numel():], tm.row_keys.reshape(-1))
    assert tm.row_keys.data_ptr() == tm.entries.data_ptr() + 4 * (tm.entries.numel() - tm.row_keys.numel())
    assert (tm.row_keys.data_ptr() - tm.entries.data_ptr()) % 128 == 0  # (read as int2; on 128 bytes on CUDA)
    # causal attention inside each document: every existing row sees one interval, from its document's first
    # key to its own position
    assert not ((ref_rows[..., 0] == -1) & (ref_rows[..., 1] == -1)).any()
    for b, n in enumerate(qo_lens):
        for t in range(ref.shape[2]):
            row0 = t * rows
            if row0 >= n * group:
                assert (ref_rows[b, 0, t] == (0, -1)).all()
                continue
            first, last = row0 // group, (min(row0 + rows, n * group) - 1) // group
            for i in range(rows):
                token = first + i
                if token > last:
                    assert tuple(ref_rows[b, 0, t, i]) == (0, -1)
                else:
                    pos = kv_lens[b] - n + token
                    start = int(np.flatnonzero(ids[b, :kv_lens[b]] == ids[b, pos])[0])
                    assert tuple(ref_rows[b, 0, t, i]) == (start, pos)
    assert tm.counts == {"empty": int((ref == 0).sum()), "partial": int((ref == 1).sum()),
                         "full": int((ref == 2).sum())}
    assert tm.ffi_args() == (tm.indptr, tm.entries, 1)
    # the work order: every (request, query tile) pair once, by its non-empty key tiles, most first
    order = tm.order.numpy()
    assert sorted(order.tolist()) == list(range(ref.shape[0] * ref.shape[2]))
    live = (ref != 0).sum(3).sum(1).reshape(-1)
    assert np.all(np.diff(live[order]) <= 0)


@pytest.mark.parametrize("device_lists", [False, True])
@pytest.mark.parametrize("qo_lens,kv_lens", [([], []), ([3, 0], [0, 0]), ([0], [0])])
def test_a_batch_without_keys_maps_to_empty_lists(qo_lens, kv_lens, device_lists):
    """No request, or requests without keys: no key tile, so every query tile's list is empty (no classifier
    launch, no reshape of an empty map)."""
    import torch

    from attngen.runtime import RaggedKV
    from attngen.runtime.tile_map import build_tile_map

    def classify(*args):
        raise AssertionError("the classifier runs on an empty map")

    qo_indptr = torch.tensor(np.concatenate([[0], np.cumsum(qo_lens)]), dtype=torch.int32)
    kv_indptr = torch.tensor(np.concatenate([[0], np.cumsum(kv_lens)]), dtype=torch.int32)
    kv = RaggedKV(torch.zeros(0, 2, 64), torch.zeros(0, 2, 64), kv_indptr)
    tm = build_tile_map(classify, example("document_mask"), qo_indptr, kv, max_qo_len=max(qo_lens, default=0),
                        group=2, num_kv_heads=2, rows=128, keys=128, extras=(), params={},
                        device_lists=device_lists)
    q_tiles = -(-max(qo_lens, default=0) * 2 // 128)
    lists = len(qo_lens) * q_tiles
    assert tm.indptr.tolist() == [0] * (lists + 1)  # the lists: all empty
    assert tm.counts == {"empty": 0, "partial": 0, "full": 0}
    # entries holds no list entry, then the map rows' key intervals, each (0, -1): no row sees a key
    assert tuple(tm.row_keys.shape) == (lists, 128, 2) and tm.row_keys.dtype == torch.int32
    assert (tm.row_keys[..., 0] == 0).all() and (tm.row_keys[..., 1] == -1).all()
    assert tm.entries.numel() == 32 + tm.row_keys.numel()  # (the lists' room: the empty tiles' slot, padded)
    assert torch.equal(tm.entries[32:], tm.row_keys.reshape(-1))
    assert sorted(tm.order.tolist()) == list(range(lists))



@pytest.mark.parametrize("tiles", [1, 2, 3])
def test_row_keys_start_on_128_bytes_whatever_the_list_length(tiles):
    """The kernels read each row's interval as one int2: the lists' room (one slot per map tile, 3 here, and
    one for the empty tiles) is padded to 32 entries, so the intervals at entries' end start 128 bytes into it
    (on 128 bytes where the allocator aligns entries so: CUDA's does)."""
    import torch

    from attngen.runtime import RaggedKV
    from attngen.runtime.tile_map import build_tile_map

    def classify(qo_indptr, kv_ptr, last_page_len, page_size, out, row_keys, *rest):
        out.zero_()
        out[0, 0, 0, :tiles] = 2  # the first query tile lists ``tiles`` full key tiles, the rest none
        row_keys[0, :, 1] = 5

    kv_lens = [64 * 3]
    qo_indptr = torch.tensor([0, 100], dtype=torch.int32)
    kv_indptr = torch.tensor([0, kv_lens[0]], dtype=torch.int32)
    kv = RaggedKV(torch.zeros(kv_lens[0], 2, 64), torch.zeros(kv_lens[0], 2, 64), kv_indptr)
    tm = build_tile_map(classify, example("document_mask"), qo_indptr, kv, max_qo_len=100, group=1,
                        num_kv_heads=2, rows=128, keys=64, extras=(), params={})
    assert tm.indptr.tolist() == [0, tiles]
    assert tm.entries[:tiles].tolist() == [2 * t + 1 for t in range(tiles)]  # key tile * 2 + 1: full
    head = tm.entries.numel() - tm.row_keys.numel()  # the lists' room (one slot per map tile), padded
    assert head >= 3 and head % 32 == 0
    assert (tm.row_keys.data_ptr() - tm.entries.data_ptr()) % 128 == 0 and tm.row_keys.data_ptr() % 8 == 0
    assert (tm.row_keys[0, :, 1] == 5).all() and (tm.row_keys[0, :, 0] == 0).all()


def test_the_classifier_gets_the_views_own_index_arrays():
    """build_tile_map hands the classifier the KV view's index arrays, not lengths it computed: a paged view's
    page indptr, last_page_len and page size (the kernel computes each request's keys, csrc/tile_map.cuh
    kv_length), a ragged view's indptr with no last page and page size 0."""
    import torch

    from attngen.runtime import PagedKV, RaggedKV
    from attngen.runtime.tile_map import build_tile_map

    seen = []

    def classify(qo_indptr, kv_ptr, last_page_len, page_size, out, *rest):
        seen.append((kv_ptr, last_page_len, page_size))
        out.zero_()

    qo_indptr = torch.tensor([0, 100, 130], dtype=torch.int32)
    paged = PagedKV(torch.zeros(6, 2, 16, 2, 64), torch.tensor([0, 3, 5], dtype=torch.int32),
                    torch.tensor([4, 0, 2, 1, 3], dtype=torch.int32), torch.tensor([5, 16], dtype=torch.int32), "NHD")
    ragged = RaggedKV(torch.zeros(300, 2, 64), torch.zeros(300, 2, 64), torch.tensor([0, 200, 300], dtype=torch.int32))
    for kv, k_tiles in ((paged, 1), (ragged, 4)):  # the longest request: 37 keys paged, 200 ragged (64 per tile)
        tm = build_tile_map(classify, example("document_mask"), qo_indptr, kv, max_qo_len=100, group=1,
                            num_kv_heads=2, rows=128, keys=64, extras=(), params={})
        assert int(tm.class_counts.sum()) == 2 * k_tiles  # two requests, one query tile each
    (p_ptr, p_last, p_size), (r_ptr, r_last, r_size) = seen
    assert p_ptr is paged.indptr and p_last is paged.last_page_len and p_size == 16
    assert r_ptr is ragged.indptr and r_last is None and r_size == 0


def test_a_known_longest_kv_sizes_the_map_without_a_device_read():
    """The plan's longest KV length (from its host copies) sizes the map; only for the planned index arrays,
    unchanged since: another array, or the same one written in place, gets none (the device is read)."""
    import torch

    from attngen.runtime import PagedKV, RaggedKV
    from attngen.runtime.cuda import PrefillPlan
    from attngen.runtime.tile_map import KVBound, build_tile_map

    def classify(qo_indptr, kv_ptr, last_page_len, page_size, out, row_keys, *rest):
        out.zero_()

    qo_indptr = torch.tensor([0, 100], dtype=torch.int32)
    kv = RaggedKV(torch.zeros(300, 2, 64), torch.zeros(300, 2, 64), torch.tensor([0, 300], dtype=torch.int32))
    widths = []
    for bound in (None, 1000):  # 300 keys: 5 tiles of 64 read from the lengths; a bound of 1000: 16
        tm = build_tile_map(classify, example("document_mask"), qo_indptr, kv, max_qo_len=100, group=1,
                            num_kv_heads=2, rows=128, keys=64, extras=(), params={}, max_kv_len=bound)
        widths.append(int(tm.class_counts.sum()))
    assert widths == [5, 16]
    plan = PrefillPlan(1, 100, 100, (0, 0), kv_bound=KVBound(kv, 300))
    assert plan.max_kv_len(kv) == 300
    other = RaggedKV(kv.k, kv.v, kv.indptr.clone())
    assert plan.max_kv_len(other) is None
    kv.indptr[1] = 200  # written in place: a new version
    assert plan.max_kv_len(kv) is None
    # a freed array's id may come back for a new one (of version 0): the weak reference tells them apart
    fresh = torch.tensor([0, 300], dtype=torch.int32)
    plan = PrefillPlan(1, 100, 100, (0, 0), kv_bound=KVBound(RaggedKV(kv.k, kv.v, fresh), 300))
    del fresh
    for _ in range(50):
        again = RaggedKV(kv.k, kv.v, torch.tensor([0, 5000], dtype=torch.int32))
        assert plan.max_kv_len(again) is None
    assert PrefillPlan(1, 100, 100, (0, 0)).max_kv_len(kv) is None  # planned without a map
    pages = torch.zeros(4, 2, 16, 2, 64)
    paged = PagedKV(pages, torch.tensor([0, 3], dtype=torch.int32), torch.tensor([0, 1, 2], dtype=torch.int32),
                    torch.tensor([5], dtype=torch.int32), "NHD")
    plan = PrefillPlan(1, 100, 100, (0, 0), kv_bound=KVBound(paged, 37))
    assert plan.max_kv_len(paged) == 37
    paged.last_page_len.fill_(16)
    assert plan.max_kv_len(paged) is None

def test_reference_row_keys_on_a_hand_made_case():
    """reference_row_keys itself, where the answer is known by hand: rows of 4 packed rows, one request of 6
    tokens at positions 2..7 (kv_len 8), group 2."""
    rows, group = 4, 2
    qo_lens, kv_lens = [6], [8]  # packed rows 0..11: three query tiles, tokens 0..5 at positions 2..7

    # head-free: map row i of tile k is token 2k + i (tile k's packed rows 4k..4k+3 are tokens 2k, 2k + 1);
    # map rows 2 and 3 exist in no tile
    def striped(b, qp, kp, qh, kh):  # even keys only (not one interval), none at all for position 4
        return kp % 2 == 0 and qp != 4

    got = reference_row_keys(striped, qo_lens, kv_lens, group=group, num_kv_heads=3, rows=rows,
                             reads_heads=False)
    assert got.shape == (1, 1, 3, rows, 2) and got.dtype == np.int32
    want = np.array([[[-1, -1], [-1, -1], [0, -1], [0, -1]],  # tokens 0, 1 (positions 2, 3); no tokens 2, 3
                     [[0, -1], [-1, -1], [0, -1], [0, -1]],   # token 2 (position 4) sees none; token 3
                     [[-1, -1], [-1, -1], [0, -1], [0, -1]]])  # tokens 4, 5
    np.testing.assert_array_equal(got[0, 0], want)
    # every key under ``causal``: position p sees the interval 0..p
    got = reference_row_keys(lambda *a: True, qo_lens, kv_lens, group=group, num_kv_heads=3, rows=rows,
                             reads_heads=False, causal=True)
    np.testing.assert_array_equal(got[0, 0, :, :2], [[[0, 2], [0, 3]], [[0, 4], [0, 5]], [[0, 6], [0, 7]]])
    np.testing.assert_array_equal(got[0, 0, :, 2:], np.tile([0, -1], (3, 2, 1)))
    got = reference_row_keys(striped, [1], [1], group=1, num_kv_heads=1, rows=rows, reads_heads=False,
                             causal=True)
    # position 0 under ``causal`` sees key 0 alone of the striped keys: the interval (0, 0)
    np.testing.assert_array_equal(got[0, 0, 0], [[0, 0], [0, -1], [0, -1], [0, -1]])

    # head-reading: map rows are packed rows (token r // 2, query head kv_head * 2 + r % 2); query heads of
    # KV head 1 are 2 and 3. Head 3 sees keys 5..7 under causal, head 2 keys 1 and 3 (not one interval)
    def by_head(b, qp, kp, qh, kh):
        assert kh == qh // group
        return {0: kp == 0, 1: False, 2: kp in (1, 3), 3: kp >= 5}[qh]

    got = reference_row_keys(by_head, qo_lens, kv_lens, group=group, num_kv_heads=2, rows=rows,
                             reads_heads=True, causal=True)
    assert got.shape == (1, 2, 3, rows, 2)
    np.testing.assert_array_equal(got[0, 0], np.tile([[0, 0], [0, -1]], (3, 2, 1)))
    # KV head 1: tile k's rows are (token 2k, head 2), (2k, 3), (2k + 1, 2), (2k + 1, 3), the tokens at
    # positions 2k + 2, 2k + 3. Head 2 sees key 1 at position 2, keys 1 and 3 from position 3 on; head 3 sees
    # keys 5..pos from position 5 on
    np.testing.assert_array_equal(got[0, 1], [[[1, 1], [0, -1], [-1, -1], [0, -1]],
                                              [[-1, -1], [0, -1], [-1, -1], [5, 5]],
                                              [[-1, -1], [5, 6], [-1, -1], [5, 7]]])
    # a request shorter than the batch's longest: its tiles past its end are (0, -1); none at all: empty
    got = reference_row_keys(lambda *a: True, [6, 1], [8, 3], group=group, num_kv_heads=2, rows=rows,
                             reads_heads=True)
    np.testing.assert_array_equal(got[1, :, 0, :2], np.tile([0, 2], (2, 2, 1)))  # token 0 of request 1
    assert (got[1, :, 0, 2:] == (0, -1)).all() and (got[1, :, 1:] == (0, -1)).all()
    assert reference_row_keys(striped, [], [], group=2, num_kv_heads=2, rows=rows, reads_heads=True).shape == \
        (0, 2, 0, rows, 2)
    assert reference_row_keys(striped, [0], [5], group=2, num_kv_heads=2, rows=rows,
                              reads_heads=False).shape == (1, 1, 0, rows, 2)


def test_map_provenance_follows_the_mask_tensors():
    """A plan keys its map by the mask's tensor parameters: another tensor or an in-place change is a new key."""
    import torch

    from attngen.runtime.tile_map import params_key

    docs = example("document_mask")
    ids = torch.zeros(1, 8, dtype=torch.int32)
    key = params_key(docs, {"doc_ids": ids})
    assert params_key(docs, {"doc_ids": ids}) == key
    ids.add_(1)  # the same tensor, changed in place: its version moved on
    assert params_key(docs, {"doc_ids": ids}) != key
    assert params_key(docs, {"doc_ids": ids.clone()}) != params_key(docs, {"doc_ids": ids})
    assert params_key(builtin("vanilla"), {}) == ()


@T.prim_func
def _scalar_prefix_mask(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32,
                        prefix: T.int32) -> T.bool:
    return kv_pos < prefix or kv_pos <= qo_pos


def test_map_provenance_follows_scalar_mask_parameters_and_tensor_identity():
    """A mask that reads a scalar parameter (a prefix of one length for the whole batch) needs a map; the map
    is keyed by the scalar's value, and a map made from one tensor is not taken for another that came back at
    the freed one's id, version and address."""
    import gc

    import torch

    from attngen.ir import ScalarParam, Variant
    from attngen.ir.mask_class import mask_needs_map
    from attngen.runtime.tile_map import TileMap, param_refs, params_key

    prefix_lm = Variant("scalar_prefix_lm", logits_mask=_scalar_prefix_mask,
                        params=[ScalarParam("prefix", "int32", 16)])
    assert mask_needs_map(prefix_lm)
    assert params_key(prefix_lm, {"prefix": 16}) == params_key(prefix_lm, {"prefix": 16})
    assert params_key(prefix_lm, {"prefix": 16}) != params_key(prefix_lm, {"prefix": 4096})
    assert params_key(prefix_lm, {}) != params_key(prefix_lm, {"prefix": 4096})  # the default, then a value

    docs = example("document_mask")
    ids = torch.zeros(1, 8, dtype=torch.int32)
    made = TileMap(None, None, 1, 128, 128, params_key(docs, {"doc_ids": ids}),
                   param_refs=param_refs(docs, {"doc_ids": ids}))
    assert made.made_from({"doc_ids": ids})
    assert not made.made_from({"doc_ids": ids.clone()})
    del ids
    gc.collect()
    other = torch.ones(1, 8, dtype=torch.int32)  # may reuse the freed tensor's id and storage
    assert not made.made_from({"doc_ids": other})


def test_the_plan_and_the_lists_kernel_agree_on_the_order_bins():
    """build_tile_map takes the lists kernel's work order only where that kernel's counting sort had a count per
    value (ORDER_BINS, csrc/tile_map.cuh kOrderBins); the two constants must be one."""
    import re

    from attngen.codegen.lto import CSRC
    from attngen.runtime.tile_map import ORDER_BINS

    found = re.search(r"constexpr int kOrderBins = (\d+);", (CSRC / "tile_map.cuh").read_text())
    assert found and int(found.group(1)) == ORDER_BINS


def test_paged_lengths_on_the_device_side():
    import torch

    from attngen.runtime import PagedKV
    from attngen.runtime.tile_map import kv_lengths

    pages = torch.zeros(6, 2, 16, 1, 8)
    kv = PagedKV(pages, torch.tensor([0, 2, 2, 5], dtype=torch.int32), torch.arange(5, dtype=torch.int32),
                 torch.tensor([3, 0, 16], dtype=torch.int32), "NHD")
    assert kv_lengths(kv).tolist() == [19, 0, 48]


@pytest.mark.parametrize("lists,k_tiles", [(1, 1), (5, 7), (64, 33), (3, 0)])
def test_compaction_keeps_every_list_in_order(lists, k_tiles, rng):
    """compact_lists (no host synchronisation: places from a running count, empty tiles to a slot past the
    lists) gives each list its non-empty key tiles in order, whatever the mix of classes and empty lists."""
    import torch

    from attngen.runtime.tile_map import compact_lists

    flat = rng.choice(3, size=(lists, k_tiles), p=[0.6, 0.2, 0.2]).astype(np.uint8)
    if lists > 2:
        flat[1] = 0  # an empty list
        flat[2] = 2  # an all-full one
    indptr, entries = compact_lists(torch.from_numpy(flat))
    assert indptr.dtype == torch.int32 and entries.dtype == torch.int32
    assert entries.numel() >= int(indptr[-1])
    back = decode_lists(indptr.numpy(), entries.numpy(), (lists, 1, 1, k_tiles))
    np.testing.assert_array_equal(back.reshape(lists, k_tiles), flat)
    for i in range(lists):  # ascending key tiles within a list
        seg = entries[indptr[i]:indptr[i + 1]].numpy() >> 1
        assert np.all(np.diff(seg) > 0)
