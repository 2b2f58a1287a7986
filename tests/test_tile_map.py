"""Mask-derived tile maps (runtime/tile_map.py): which variants get one, and the compaction of a classified
map into the lists the Hopper template walks (here with the NumPy reference classifier standing in for the
device's, on CPU tensors; tests/test_gpu_tile_map.py runs the device classifier and the mapped kernels)."""
import runpy
from pathlib import Path

import numpy as np
import pytest

from attngen.variants import builtin

from .tile_map_reference import decode_lists, reference_tile_classes

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def example(name):
    return runpy.run_path(str(EXAMPLES / f"{name}.py"))["variant"]


def test_which_variants_get_a_map():
    from attngen.runtime.tile_map import mask_needs_map, mask_params, mask_reads_heads

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


@pytest.mark.parametrize("group,rows,keys", [(4, 128, 128), (1, 128, 64), (3, 128, 128)])
def test_compacted_lists_stand_for_the_map(group, rows, keys, rng):
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

    def classify(qo_indptr, kv_len, out, g, hkv, causal, r, k, *extras):
        assert (g, hkv, causal, r, k) == (group, 2, 0, rows, keys)
        assert kv_len.tolist() == kv_lens
        out.copy_(torch.from_numpy(ref))

    qo_indptr = torch.tensor(np.concatenate([[0], np.cumsum(qo_lens)]), dtype=torch.int32)
    kv_indptr = torch.tensor(np.concatenate([[0], np.cumsum(kv_lens)]), dtype=torch.int32)
    kv = RaggedKV(torch.zeros(sum(kv_lens), 2, 64), torch.zeros(sum(kv_lens), 2, 64), kv_indptr)
    params = {"doc_ids": torch.from_numpy(ids)}
    tm = build_tile_map(classify, docs, qo_indptr, kv, max_qo_len=max(qo_lens), group=group, num_kv_heads=2,
                        rows=rows, keys=keys, extras=(), params=params)
    assert tm.heads == 1 and (tm.rows, tm.keys) == (rows, keys)
    back = decode_lists(tm.indptr.numpy(), tm.entries.numpy(), ref.shape)
    np.testing.assert_array_equal(back, ref)
    assert tm.counts == {"empty": int((ref == 0).sum()), "partial": int((ref == 1).sum()),
                         "full": int((ref == 2).sum())}
    assert tm.ffi_args() == (tm.indptr, tm.entries, 1)
    # the work order: every (request, query tile) pair once, by its non-empty key tiles, most first
    order = tm.order.numpy()
    assert sorted(order.tolist()) == list(range(ref.shape[0] * ref.shape[2]))
    live = (ref != 0).sum(3).sum(1).reshape(-1)
    assert np.all(np.diff(live[order]) <= 0)


@pytest.mark.parametrize("qo_lens,kv_lens", [([], []), ([3, 0], [0, 0]), ([0], [0])])
def test_a_batch_without_keys_maps_to_empty_lists(qo_lens, kv_lens):
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
                        group=2, num_kv_heads=2, rows=128, keys=128, extras=(), params={})
    q_tiles = -(-max(qo_lens, default=0) * 2 // 128)
    assert tm.indptr.tolist() == [0] * (len(qo_lens) * q_tiles + 1)
    assert tm.entries.numel() == 0 and tm.counts == {"empty": 0, "partial": 0, "full": 0}
    assert sorted(tm.order.tolist()) == list(range(len(qo_lens) * q_tiles))

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
