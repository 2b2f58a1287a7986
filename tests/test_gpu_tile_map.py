"""GPU: mask-derived tile maps (csrc/tile_map.cuh, runtime/tile_map.py) -- the device classifier against the
NumPy reference, and both prefill templates walking the map against the float64 reference, mapped and
unmapped, on packed documents (document ids from a tensor parameter) and prefix-LM."""
import runpy
from pathlib import Path

import numpy as np
import pytest

from .test_gpu_prefill import run_prefill, skip_unless_runs
from .tile_map_reference import reference_row_keys, reference_tile_classes

pytestmark = pytest.mark.gpu

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
_libs = {}


def view_arrays(kv_lens, dev, page_size=0):
    """What the classifier takes of a KV view with these lengths: (kv_indptr, last_page_len, page_size) of a
    ragged view (page_size 0) or of a paged one."""
    import torch

    if not page_size:
        return (torch.tensor(np.concatenate([[0], np.cumsum(kv_lens)]), dtype=torch.int32, device=dev), None, 0)
    pages = [-(-n // page_size) for n in kv_lens]
    last = [n - (p - 1) * page_size if p else 0 for n, p in zip(kv_lens, pages)]
    return (torch.tensor(np.concatenate([[0], np.cumsum(pages)]), dtype=torch.int32, device=dev),
            torch.tensor(last, dtype=torch.int32, device=dev), page_size)


def example(name, build_cache, link="whole"):
    """The example's variant and its prefill library (``link``: whole-program or linked, BuildConfig.link)."""
    module = runpy.run_path(str(EXAMPLES / f"{name}.py"))
    if (name, link) not in _libs:
        from attngen.runtime import CUDAAttention

        _libs[name, link] = CUDAAttention.build(module["variant"], head_dims=(128,), dtypes=("bfloat16",),
                                                kernels=("prefill",), cache=build_cache, link=link)
    return module, _libs[name, link]


@pytest.mark.parametrize("group,link,labels", [(1, "whole", "growing"), (4, "whole", "growing"),
                                               (3, "whole", "growing"), (4, "lto", "growing"),
                                               (4, "whole", "recurring"), (3, "lto", "recurring")])
def test_classifier_matches_the_reference(group, link, labels, build_cache, rng):
    """The classifier of a whole-program build and of a linked one (its kernel from the linked cubin): the map,
    and each map row's key interval (row_keys) where asked for; without row_keys the same map. Document ids
    growing along the row (the key term's range test skips most tiles) or recurring out of order (a label
    shared by separate stretches: ranges overlap, and the tiles are evaluated)."""
    import torch

    module, att = example("document_mask", build_cache, link)
    qo_lens, kv_lens = [300, 0, 77, 700, 5], [300, 9, 200, 700, 0]
    ids = np.zeros((len(kv_lens), max(kv_lens)), np.int32)
    for b, n in enumerate(kv_lens):
        for cut in np.sort(rng.integers(0, max(n, 1), size=6)):
            ids[b, cut:] += 1
    if labels == "recurring":
        ids = (rng.permutation(7)[ids] % 3).astype(np.int32)

    def visible(b, qp, kp, qh, kh):
        return kp <= qp and ids[b, kp] == ids[b, qp]

    ref = reference_tile_classes(visible, qo_lens, kv_lens, group=group, num_kv_heads=2, rows=128, keys=128,
                                 reads_heads=False)
    lists = int(np.prod(ref.shape[:3]))
    ref_rows = reference_row_keys(visible, qo_lens, kv_lens, group=group, num_kv_heads=2, rows=128,
                                  reads_heads=False).reshape(lists, 128, 2)
    dev = torch.device("cuda")
    qo_indptr = torch.tensor(np.concatenate([[0], np.cumsum(qo_lens)]), dtype=torch.int32, device=dev)
    kv_view = view_arrays(kv_lens, dev)
    classify = att.function("prefill_tile_map", "bfloat16", 128)
    ids_dev = torch.from_numpy(ids).to(dev)
    out = torch.full(ref.shape, 7, dtype=torch.uint8, device=dev)
    row_keys = torch.full((lists, 128, 2), 7, dtype=torch.int32, device=dev)
    classify(qo_indptr, *kv_view, out, row_keys, None, None, group, 2, 0, 128, 128, ids_dev)
    np.testing.assert_array_equal(out.cpu().numpy(), ref)
    np.testing.assert_array_equal(row_keys.cpu().numpy(), ref_rows)
    out = torch.full(ref.shape, 7, dtype=torch.uint8, device=dev)
    classify(qo_indptr, *kv_view, out, None, None, None, group, 2, 0, 128, 128, ids_dev)  # no row keys wanted
    np.testing.assert_array_equal(out.cpu().numpy(), ref)
    out = torch.full(ref.shape, 7, dtype=torch.uint8, device=dev)  # the same lengths as a paged view's
    classify(qo_indptr, *view_arrays(kv_lens, dev, page_size=16), out, None, None, None, group, 2, 0, 128, 128,
             ids_dev)
    np.testing.assert_array_equal(out.cpu().numpy(), ref)


@pytest.mark.parametrize("group,heads,link", [(1, 1, "whole"), (4, 1, "whole"), (3, 2, "whole"), (4, 1, "lto")])
def test_device_lists_match_the_reference(group, heads, link, build_cache, rng):
    """The classifier's call with lists and room (csrc/tile_map.cuh tile_lists_kernel, one CTA after the
    classifier): indptr, each list's entries in key order, each (request, query tile)'s tiles over its head
    rows and the counts by class, from the map the classifier made, over enough lists (1000+) that the scan
    runs several chunks of 1024; a head-reading mask (the striped one) for two map head rows."""
    import torch

    att = head_striped(build_cache) if heads == 2 else example("document_mask", build_cache, link)[1]
    qo_lens, kv_lens = [3000, 0, 77, 2520, 5, 40000], [3000, 9, 200, 2520, 0, 40000]
    ids = np.zeros((len(kv_lens), max(kv_lens)), np.int32)
    for b, n in enumerate(kv_lens):
        for cut in np.sort(rng.integers(0, max(n, 1), size=12)):
            ids[b, cut:] += 1
    dev = torch.device("cuda")
    qo_indptr = torch.tensor(np.concatenate([[0], np.cumsum(qo_lens)]), dtype=torch.int32, device=dev)
    kv_view = view_arrays(kv_lens, dev)
    batch, q_tiles, k_tiles = len(qo_lens), -(-max(qo_lens) * group // 128), -(-max(kv_lens) // 128)
    n_lists, pairs = batch * heads * q_tiles, batch * q_tiles
    assert n_lists > 1024
    classify = att.function("prefill_tile_map", "bfloat16", 128)
    extras = () if heads == 2 else (torch.from_numpy(ids).to(dev),)
    out = torch.full((batch, heads, q_tiles, k_tiles), 7, dtype=torch.uint8, device=dev)
    made = torch.full((n_lists + 1 + pairs + 3 + pairs,), -7, dtype=torch.int32, device=dev)
    room = torch.full((n_lists * k_tiles,), -7, dtype=torch.int32, device=dev)
    classify(qo_indptr, *kv_view, out, None, made, room, group, 2, 0, 128, 128, *extras)
    cls = out.cpu().numpy()
    # the striped mask's map rows hold query heads of both parities, so none of its tiles is full (class 2)
    assert set(np.unique(cls).tolist()) == ({0, 1} if heads == 2 else {0, 1, 2})
    flat = cls.reshape(n_lists, k_tiles)
    live = flat != 0
    ref_indptr = np.concatenate([[0], np.cumsum(live.sum(1))])
    got = made.cpu().numpy()
    np.testing.assert_array_equal(got[:n_lists + 1], ref_indptr)
    ref_entries = np.concatenate([np.flatnonzero(r) * 2 + (r[r != 0] == 2) for r in flat])
    np.testing.assert_array_equal(room.cpu().numpy()[:ref_indptr[-1]], ref_entries)
    ref_tiles = live.sum(1).reshape(batch, heads, q_tiles).sum(1).reshape(-1)
    np.testing.assert_array_equal(got[n_lists + 1:n_lists + 1 + pairs], ref_tiles)
    np.testing.assert_array_equal(got[n_lists + 1 + pairs:n_lists + 4 + pairs], [(flat == c).sum() for c in range(3)])
    # the work order (the lists kernel's counting sort): the pairs by listed tiles, most first, ties in pair order
    np.testing.assert_array_equal(got[n_lists + 4 + pairs:], np.argsort(-ref_tiles, kind="stable"))


def test_a_map_of_more_key_tiles_than_the_order_counts_is_sorted_by_the_plan(build_cache, rng):
    """A pair may list more key tiles than the lists kernel's counting sort has counts for (ORDER_BINS): the
    kernel writes the identity and build_tile_map sorts the pairs' tiles itself -- the same order either way."""
    import torch

    from attngen.runtime import RaggedKV
    from attngen.runtime.tile_map import ORDER_BINS, build_tile_map

    module, att = example("document_mask", build_cache)
    qo_lens, kv_lens = [300, 200], [ORDER_BINS * 128 + 1000, 900]  # the first: more than ORDER_BINS key tiles
    ids = np.zeros((2, max(kv_lens)), np.int32)
    for b, n in enumerate(kv_lens):
        for cut in np.sort(rng.integers(n - 600, n, size=4)):
            ids[b, cut:] += 1
    dev = torch.device("cuda")
    qo_indptr = torch.tensor(np.concatenate([[0], np.cumsum(qo_lens)]), dtype=torch.int32, device=dev)
    kv_indptr = torch.tensor(np.concatenate([[0], np.cumsum(kv_lens)]), dtype=torch.int32, device=dev)
    kv = RaggedKV(torch.zeros(sum(kv_lens), 2, 8, device=dev), torch.zeros(sum(kv_lens), 2, 8, device=dev),
                  kv_indptr)
    ids_dev = torch.from_numpy(ids).to(dev)
    tm = build_tile_map(att.function("prefill_tile_map", "bfloat16", 128), module["variant"], qo_indptr, kv,
                        max_qo_len=max(qo_lens), group=4, num_kv_heads=2, rows=128, keys=128, extras=(ids_dev,),
                        params={"doc_ids": ids_dev}, device_lists=True)
    tiles = torch.diff(tm.indptr).view(2, tm.heads, -1).sum(1).reshape(-1).cpu().numpy()
    assert tiles.max() > 0 and len(set(tiles.tolist())) > 1
    np.testing.assert_array_equal(tm.order.cpu().numpy(), np.argsort(-tiles, kind="stable"))


@pytest.mark.parametrize("qo_len,kv_len,group", [(700, 700, 1), (300, 900, 4), (130, 1000, 3)])
def test_row_keys_under_the_causal_flag(qo_len, kv_len, group, build_cache, rng):
    """causal=1 passed to the classifier (one request of packed documents, its queries the last of its keys):
    the key tiles past the last row's position are not evaluated, and every row's interval is still the
    reference's under causal attention."""
    import torch

    _, att = example("document_mask", build_cache)
    ids = np.zeros((1, kv_len), np.int32)
    for cut in np.sort(rng.integers(0, kv_len, size=3)):
        ids[0, cut:] += 1

    def visible(b, qp, kp, qh, kh):
        return kp <= qp and ids[b, kp] == ids[b, qp]

    ref = reference_tile_classes(visible, [qo_len], [kv_len], group=group, num_kv_heads=2, rows=128, keys=128,
                                 reads_heads=False, causal=True)
    lists = int(np.prod(ref.shape[:3]))
    ref_rows = reference_row_keys(visible, [qo_len], [kv_len], group=group, num_kv_heads=2, rows=128,
                                  reads_heads=False, causal=True).reshape(lists, 128, 2)
    assert not ((ref_rows[..., 0] == -1) & (ref_rows[..., 1] == -1)).any()  # causal inside documents: intervals
    dev = torch.device("cuda")
    qo_indptr = torch.tensor([0, qo_len], dtype=torch.int32, device=dev)
    kv_view = view_arrays([kv_len], dev)
    out = torch.full(ref.shape, 7, dtype=torch.uint8, device=dev)
    row_keys = torch.full((lists, 128, 2), 7, dtype=torch.int32, device=dev)
    att.function("prefill_tile_map", "bfloat16", 128)(qo_indptr, *kv_view, out, row_keys, None, None, group, 2, 1,
                                                      128, 128, torch.from_numpy(ids).to(dev))
    np.testing.assert_array_equal(out.cpu().numpy(), ref)
    np.testing.assert_array_equal(row_keys.cpu().numpy(), ref_rows)


def test_row_keys_of_another_shape_are_refused(build_cache):
    """row_keys holds one interval per map row of every list: [batch x map heads x query tiles, 128, 2]; the lists
    and room their sizes; the KV view's index arrays their own."""
    import torch

    _, att = example("document_mask", build_cache)
    dev = torch.device("cuda")
    qo_indptr = torch.tensor([0, 300], dtype=torch.int32, device=dev)
    kv_view = view_arrays([300], dev)
    ids = torch.zeros((1, 300), dtype=torch.int32, device=dev)
    out = torch.zeros((1, 1, 3, 3), dtype=torch.uint8, device=dev)  # group 1: 3 query tiles, 3 key tiles
    classify = att.function("prefill_tile_map", "bfloat16", 128)
    for shape in [(2, 128, 2), (4, 128, 2), (3, 64, 2), (3, 128, 1)]:
        row_keys = torch.zeros(shape, dtype=torch.int32, device=dev)
        with pytest.raises(Exception, match=r"row_keys must be"):
            classify(qo_indptr, *kv_view, out, row_keys, None, None, 1, 2, 0, 128, 128, ids)
    classify(qo_indptr, *kv_view, out, torch.zeros((3, 128, 2), dtype=torch.int32, device=dev), None, None, 1, 2, 0,
             128, 128, ids)  # the right one
    lists = torch.zeros(3 + 1 + 3 + 3 + 3, dtype=torch.int32, device=dev)  # 3 lists + 1, 3 pairs, 3 counts, order
    for made, room, match in [(lists, None, "lists and room come together"),
                              (lists[1:], torch.zeros(9, dtype=torch.int32, device=dev), "lists must hold 13 int32"),
                              (lists, torch.zeros(8, dtype=torch.int32, device=dev), "room must hold at least 9")]:
        with pytest.raises(Exception, match=match):
            classify(qo_indptr, *kv_view, out, None, made, room, 1, 2, 0, 128, 128, ids)
    # the KV view's arrays: a paged view's last_page_len, one per request, with a positive page size
    kv_indptr, paged_last = kv_view[0], torch.tensor([12], dtype=torch.int32, device=dev)
    for view, match in [((kv_indptr, None, 16), "page_size describes a paged view"),
                        ((kv_indptr, paged_last, 0), "page_size must be positive"),
                        ((kv_indptr, torch.tensor([12, 3], dtype=torch.int32, device=dev), 16),
                         "last_page_len needs one entry per request"),
                        ((kv_indptr[:1], None, 0), "kv_indptr needs batch \\+ 1 entries")]:
        with pytest.raises(Exception, match=match):
            classify(qo_indptr, *view, out, None, None, None, 1, 2, 0, 128, 128, ids)


def head_striped(build_cache):
    """A causal mask whose query heads see alternate key tiles (head h: tiles k with (k + h) even): a head-reading
    mask whose map must be evaluated per query head, also with a single KV head."""
    if "head_striped" not in _libs:
        import tvm
        from tvm.script import tirx as T

        from attngen import Variant
        from attngen.runtime import CUDAAttention

        mask = tvm.script.from_source(
            "@T.prim_func\ndef striped(batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, "
            "kv_head: T.int32) -> T.bool:\n    return kv_pos <= qo_pos and (kv_pos // 128 + qo_head) % 2 == 0\n",
            extra_vars={"T": T})
        variant = Variant("head_striped", logits_mask=mask)
        _libs["head_striped"] = CUDAAttention.build(variant, head_dims=(128,), dtypes=("bfloat16",),
                                                    kernels=("prefill",), cache=build_cache)
    return _libs["head_striped"]


@pytest.mark.parametrize("num_kv,group", [(1, 2), (1, 4), (2, 3)])
def test_a_head_reading_mask_is_classified_per_query_head(num_kv, group, build_cache):
    """Found by the GPU fuzzer: with one KV head the classifier took a head-reading mask for a head-free one
    (heads == 1) and evaluated head 0 only, so tiles only other heads see were skipped."""
    import torch

    att = head_striped(build_cache)
    qo_lens, kv_lens = [300, 2, 77, 520], [300, 2, 200, 700]

    def visible(b, qp, kp, qh, kh):
        return kp <= qp and (kp // 128 + qh) % 2 == 0

    ref = reference_tile_classes(visible, qo_lens, kv_lens, group=group, num_kv_heads=num_kv, rows=128, keys=128,
                                 reads_heads=True)
    lists = int(np.prod(ref.shape[:3]))
    ref_rows = reference_row_keys(visible, qo_lens, kv_lens, group=group, num_kv_heads=num_kv, rows=128,
                                  reads_heads=True).reshape(lists, 128, 2)
    # the even query heads' rows past position 255 see key tiles 0 and 2: not one interval
    assert ((ref_rows[..., 0] == -1) & (ref_rows[..., 1] == -1)).any()
    dev = torch.device("cuda")
    qo_indptr = torch.tensor(np.concatenate([[0], np.cumsum(qo_lens)]), dtype=torch.int32, device=dev)
    kv_view = view_arrays(kv_lens, dev)
    out = torch.full(ref.shape, 7, dtype=torch.uint8, device=dev)
    row_keys = torch.full((lists, 128, 2), 7, dtype=torch.int32, device=dev)
    classify = att.function("prefill_tile_map", "bfloat16", 128)
    classify(qo_indptr, *kv_view, out, row_keys, None, None, group, num_kv, 0, 128, 128)
    np.testing.assert_array_equal(out.cpu().numpy(), ref)
    np.testing.assert_array_equal(row_keys.cpu().numpy(), ref_rows)
    with pytest.raises(Exception, match=r"map's head rows must be num_kv_heads \(the mask reads a head index\)"):
        classify(qo_indptr, *kv_view, torch.zeros((4, num_kv + 1) + ref.shape[2:], dtype=torch.uint8, device=dev),
                 None, None, None, group, num_kv, 0, 128, 128)


@pytest.mark.parametrize("template", ["hopper", "mma_sync"])
@pytest.mark.parametrize("num_kv,group,kv_mode", [(1, 2, "ragged"), (1, 4, "NHD"), (2, 2, "HND")])
def test_mapped_prefill_with_a_head_reading_mask(template, num_kv, group, kv_mode, build_cache, rng):
    """Both templates walking a head-reading mask's map, against the float64 reference (one and two KV heads)."""
    skip_unless_runs(template)
    att = head_striped(build_cache)
    plans = []
    run_prefill(att, att.variant, rng, group=group, head_dim=128, dtype="bfloat16", kv_mode=kv_mode,
                qo_lens=[300, 2, 600], kv_lens=[300, 2, 800], template=template, plans=plans, num_kv=num_kv)
    for plan in plans:
        (tm,) = plan.maps.values()
        assert tm.heads == num_kv and tm.counts["empty"] > 0


@pytest.mark.parametrize("template", ["hopper", "mma_sync"])
@pytest.mark.parametrize("name", ["document_mask", "prefix_lm"])
@pytest.mark.parametrize("group,kv_mode", [(1, "ragged"), (4, "NHD"), (8, "HND")])
def test_mapped_prefill_matches_the_reference(template, name, group, kv_mode, build_cache, rng):
    """Long enough requests that the map has empty, partial and full tiles; the same case unmapped too (the
    mma.sync template on both its query tiles)."""
    skip_unless_runs(template)
    module, att = example(name, build_cache)
    make = next(f for n, f in module.items() if n in ("prefix_lengths", "packed_documents"))
    for tile_map in (None, False):
        plans = []
        run_prefill(att, module["variant"], rng, group=group, head_dim=128, dtype="bfloat16", kv_mode=kv_mode,
                    qo_lens=[700, 0, 1000, 33], kv_lens=[700, 12, 1300, 33], template=template, make_params=make,
                    tile_map=tile_map, plans=plans)
        for plan in plans:
            if tile_map is None:
                (tm,) = plan.maps.values()
                assert tm.counts["empty"] > 0 and tm.counts["full"] > 0, tm.counts
            else:
                assert not plan.maps


def softcap_documents(build_cache):
    """Soft-capped logits over packed documents: a logits hook beside a mask the map serves, so a mapped partial
    tile whose rows see intervals runs the hook inside them (ScoreRules::apply_mapped) instead of the mask."""
    if "softcap_documents" not in _libs:
        from attngen import Variant
        from attngen.runtime import CUDAAttention

        soft = runpy.run_path(str(EXAMPLES / "logits_softcap.py"))["variant"]
        docs = runpy.run_path(str(EXAMPLES / "document_mask.py"))["variant"]
        variant = Variant("softcap_documents", logits_transform=soft.hooks["logits_transform"],
                          logits_mask=docs.hooks["logits_mask"], params=[*soft.params, *docs.params])
        _libs["softcap_documents"] = CUDAAttention.build(variant, head_dims=(128,), dtypes=("bfloat16",),
                                                         kernels=("prefill",), cache=build_cache)
    return _libs["softcap_documents"]


@pytest.mark.parametrize("template", ["hopper", "mma_sync"])
@pytest.mark.parametrize("group,kv_mode", [(1, "ragged"), (4, "NHD")])
def test_mapped_prefill_with_a_logits_hook(template, group, kv_mode, build_cache, rng):
    """Soft-cap over packed documents, mapped and unmapped, against the float64 reference."""
    skip_unless_runs(template)
    att = softcap_documents(build_cache)
    documents = runpy.run_path(str(EXAMPLES / "document_mask.py"))["packed_documents"]

    def make(variant, rng_, problem):
        return {**documents(variant, rng_, problem), "soft_cap": 8.0}  # (a cap that bends the logits)

    for tile_map in (None, False):
        plans = []
        run_prefill(att, att.variant, rng, group=group, head_dim=128, dtype="bfloat16", kv_mode=kv_mode,
                    qo_lens=[700, 0, 1000, 33], kv_lens=[700, 12, 1300, 33], template=template, make_params=make,
                    tile_map=tile_map, plans=plans)
        for plan in plans:
            assert bool(plan.maps) == (tile_map is None)
            if tile_map is None:
                (tm,) = plan.maps.values()
                assert tm.counts["partial"] > 0 and tm.counts["full"] > 0, tm.counts


@pytest.mark.parametrize("template", ["hopper", "mma_sync"])
def test_linked_build_walks_the_map(template, build_cache, rng):
    """link="lto": the plan's map from the linked classifier, the mapped kernels taken from the linked cubins by
    name (the mma.sync one from the part linked on first use on sm_90a), against the float64 reference."""
    skip_unless_runs(template)
    module, att = example("document_mask", build_cache, link="lto")
    plans = []
    run_prefill(att, module["variant"], rng, group=4, head_dim=128, dtype="bfloat16", kv_mode="NHD",
                qo_lens=[700, 0, 1000, 33], kv_lens=[700, 12, 1300, 33], template=template,
                make_params=module["packed_documents"], plans=plans)
    for plan in plans:
        (tm,) = plan.maps.values()
        assert tm.counts["empty"] > 0 and tm.counts["full"] > 0, tm.counts


class _OneLongRequest:
    """One ragged request of n rows (bfloat16, 8 query heads over 2 KV heads, D 128) and one plan of it, for
    calls of the same plan with other mask parameters, each checked against the float64 reference."""

    def __init__(self, att, n: int = 900, hq: int = 8, hkv: int = 2, d: int = 128):
        import torch

        from attngen.runtime import RaggedKV

        dev = torch.device("cuda")
        self.att, self.n, self.d = att, n, d
        self.q = torch.randn(n, hq, d, device=dev).bfloat16()
        self.k = torch.randn(n, hkv, d, device=dev).bfloat16()
        self.v = torch.randn(n, hkv, d, device=dev).bfloat16()
        self.indptr = torch.tensor([0, n], dtype=torch.int32, device=dev)
        self.kv = RaggedKV(self.k, self.v, self.indptr)
        self.plan = att.plan_prefill(self.indptr, self.kv, d)

    def check(self, params: dict, host_params: dict, what: str) -> None:
        from attngen.runtime.reference import reference_attention
        from attngen.testing import compare

        out, lse = self.att.prefill(self.q, self.kv, self.indptr, plan=self.plan, params=params)
        ref_o, ref_l = reference_attention(self.att.variant, self.q.float().cpu().numpy(),
                                           [self.k.float().cpu().numpy()], [self.v.float().cpu().numpy()],
                                           np.array([0, self.n], np.int32), self.d ** -0.5, host_params)
        compare(out.float().cpu().numpy(), lse.cpu().numpy(), ref_o, ref_l, tol=2e-2, lse_tol=2e-2, what=what)
        assert len(self.plan.maps) == 1


def test_a_plan_derives_a_new_map_for_new_mask_tensors(build_cache, rng):
    import torch

    _, att = example("document_mask", build_cache)
    req = _OneLongRequest(att)
    for cuts in ([100, 400], [650, 651]):
        ids = np.zeros((1, req.n), np.int32)
        for c in cuts:
            ids[0, c:] += 1
        req.check({"doc_ids": torch.from_numpy(ids).cuda()}, {"doc_ids": ids}, f"documents cut at {cuts}")


def test_a_plan_derives_a_new_map_for_a_new_scalar_mask_parameter(build_cache, rng):
    """A mask reading a scalar (one prefix length for the whole batch: prefix-LM) is mapped; the same plan called
    with another prefix walks a map of that prefix, then the first one's again, each against the reference."""
    from attngen.ir import ScalarParam, Variant
    from attngen.runtime import CUDAAttention

    from .test_tile_map import _scalar_prefix_mask

    v = Variant("scalar_prefix_lm", logits_mask=_scalar_prefix_mask, params=[ScalarParam("prefix", "int32", 16)])
    req = _OneLongRequest(CUDAAttention.build(v, head_dims=(128,), dtypes=("bfloat16",), kernels=("prefill",),
                                              cache=build_cache))
    assert req.plan.tile_map
    for prefix in (16, 600, 16):
        req.check({"prefix": prefix}, {"prefix": prefix}, f"prefix {prefix}")


def test_tile_maps_are_refused_where_nothing_walks_them(build_cache):
    import torch

    from attngen.runtime import CUDAAttention, RaggedKV
    from attngen.runtime.checks import AttentionArgumentError
    from attngen.variants import builtin

    _, att = example("document_mask", build_cache)
    dev = torch.device("cuda")
    k = torch.zeros(16, 2, 128, device=dev, dtype=torch.bfloat16)
    indptr = torch.tensor([0, 16], dtype=torch.int32, device=dev)
    kv = RaggedKV(k, k, indptr)
    for template in (None, "mma_sync"):
        assert att.plan_prefill(indptr, kv, 128, template=template, tile_map=True).tile_map is True
    causal = CUDAAttention.build(builtin("causal"), head_dims=(128,), dtypes=("bfloat16",), kernels=("prefill",),
                                 cache=build_cache)
    with pytest.raises(AttentionArgumentError, match=r"tile_map: variant 'causal' has no mask beyond its bounds"):
        causal.plan_prefill(indptr, kv, 128, tile_map=True)
