"""Appending a step's keys and values into a paged cache by the view's page table (runtime/append.py,
FlashInfer's append_paged_kv_cache convention): the rows land where the view reads its last keys, nothing else
changes, fp8 caches quantise with their scales, and bad calls are refused by name."""
import numpy as np
import pytest

from attngen.runtime import PagedKV
from attngen.runtime.append import append_paged_kv, append_slots
from attngen.runtime.checks import AttentionArgumentError
from attngen.runtime.fp8 import kv_bits, quantize_kv
from attngen.runtime.reference import gather_pages

S, H, D = 4, 2, 8


def grown_view(rng, old_lens, new_lens, num_pages=40, layout="NHD", dtype=np.float32):
    """A cache of random pages and the view of requests of old + new keys over a random page permutation."""
    lens = np.array(old_lens) + np.array(new_lens)
    n = (lens + S - 1) // S
    shape = (num_pages, 2, S, H, D) if layout == "NHD" else (num_pages, 2, H, S, D)
    pages = rng.standard_normal(shape).astype(dtype)
    ids = rng.permutation(num_pages)[:int(n.sum())].astype(np.int32)
    last = np.where(n > 0, lens - S * (n - 1), 1).astype(np.int32)
    return PagedKV(pages, np.concatenate([[0], np.cumsum(n)]).astype(np.int32), ids, last, layout), lens


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_new_rows_land_where_the_view_reads_its_last_keys(layout, lib, rng):
    old, new = [5, 0, 3, 7, 0], [1, 6, 0, 9, 0]  # across page boundaries, empty requests, no-op requests
    kv, lens = grown_view(rng, old, new, layout=layout)
    before = kv.pages.copy()
    k = rng.standard_normal((sum(new), H, D)).astype(np.float32)
    v = rng.standard_normal((sum(new), H, D)).astype(np.float32)
    append_indptr = np.concatenate([[0], np.cumsum(new)]).astype(np.int32)
    if lib == "torch":
        import torch

        kv = PagedKV(torch.from_numpy(kv.pages), kv.indptr, kv.indices, kv.last_page_len, layout)
        append_paged_kv(kv, torch.from_numpy(k), torch.from_numpy(v), torch.from_numpy(append_indptr))
        pages = kv.pages.numpy()
    else:
        append_paged_kv(kv, k, v, append_indptr)
        pages = kv.pages
    view_pages = pages if layout == "NHD" else pages.transpose(0, 1, 3, 2, 4)
    keys, vals = gather_pages(view_pages, kv.indptr, kv.indices, kv.last_page_len)
    for b in range(len(old)):
        lo, hi = append_indptr[b], append_indptr[b + 1]
        assert np.array_equal(keys[b][old[b]:], k[lo:hi]) and np.array_equal(vals[b][old[b]:], v[lo:hi])
    # nothing but the new rows changed
    slots = append_slots(kv, append_indptr)
    touched = np.zeros(pages.shape[0] * S, bool)
    touched[slots] = True
    flat_before = (before if layout == "NHD" else before.transpose(0, 1, 3, 2, 4)).transpose(0, 2, 1, 3, 4)
    flat_after = view_pages.transpose(0, 2, 1, 3, 4)
    same = flat_before.reshape(-1, 2, H, D)[~touched] == flat_after.reshape(-1, 2, H, D)[~touched]
    assert same.all()


def test_an_fp8_cache_takes_the_rows_quantised_with_its_scales(rng):
    kv, _ = grown_view(rng, [3, 2], [2, 5])
    fp8 = PagedKV(quantize_kv(kv.pages.reshape(-1, H, D), "float8_e4m3fn").reshape(kv.pages.shape), kv.indptr,
                  kv.indices, kv.last_page_len)
    k = rng.standard_normal((7, H, D)).astype(np.float32)
    v = rng.standard_normal((7, H, D)).astype(np.float32)
    append_indptr = np.array([0, 2, 7], np.int32)
    scales = np.array([0.5, 2.0], np.float32)
    append_paged_kv(fp8, k, v, append_indptr, k_scale=scales, v_scale=0.25)
    slots = append_slots(fp8, append_indptr)
    bits = kv_bits(fp8.pages)
    assert np.array_equal(bits[slots // S, 0, slots % S], kv_bits(quantize_kv(k, "float8_e4m3fn", scales)))
    assert np.array_equal(bits[slots // S, 1, slots % S], kv_bits(quantize_kv(v, "float8_e4m3fn", 0.25)))
    with pytest.raises(AttentionArgumentError, match="k_scale"):
        append_paged_kv(fp8, k, v, append_indptr)


def test_bad_appends_are_refused_by_name(rng):
    kv, _ = grown_view(rng, [3, 0], [1, 2])
    k = np.zeros((3, H, D), np.float32)
    with pytest.raises(AttentionArgumentError, match="append_indptr: request 1 appends 4 rows but its view holds 2"):
        append_paged_kv(kv, np.zeros((5, H, D), np.float32), np.zeros((5, H, D), np.float32),
                        np.array([0, 1, 5], np.int32))
    with pytest.raises(AttentionArgumentError, match="append_indptr: has 2 entries, expected batch_size"):
        append_paged_kv(kv, k, k, np.array([0, 3], np.int32))
    with pytest.raises(AttentionArgumentError, match=r"k: shape \(3, 2, 4\), expected \[3, 2, 8\]"):
        append_paged_kv(kv, np.zeros((3, H, 4), np.float32), k, np.array([0, 1, 3], np.int32))
    with pytest.raises(AttentionArgumentError, match="v: expected dtype float32, got float16"):
        append_paged_kv(kv, k, k.astype(np.float16), np.array([0, 1, 3], np.int32))
    with pytest.raises(AttentionArgumentError, match="scale"):
        append_paged_kv(kv, k, k, np.array([0, 1, 3], np.int32), k_scale=1.0)


def test_edge_cases_of_the_page_table(rng):
    """An empty batch appends nothing; a last page length outside [1, page_size] (which would place rows in the
    next request's page) and two new rows on one slot are refused; NumPy rows into torch pages are named."""
    import torch

    kv, _ = grown_view(rng, [], [])
    assert len(append_slots(kv, np.array([0], np.int32))) == 0
    append_paged_kv(kv, np.zeros((0, H, D), np.float32), np.zeros((0, H, D), np.float32), np.array([0], np.int32))
    bad = PagedKV(kv.pages, np.array([0, 1, 2], np.int32), np.array([0, 1], np.int32), np.array([6, 1], np.int32))
    with pytest.raises(AttentionArgumentError, match=r"kv.last_page_len: must be in \[1, page_size=4\]"):
        append_slots(bad, np.array([0, 2, 2], np.int32))
    shared = PagedKV(kv.pages, np.array([0, 1, 2], np.int32), np.array([3, 3], np.int32), np.array([2, 2], np.int32))
    with pytest.raises(AttentionArgumentError, match="two new rows share a cache slot"):
        append_slots(shared, np.array([0, 1, 2], np.int32))
    torch_kv = PagedKV(torch.from_numpy(kv.pages), np.array([0, 1], np.int32), np.array([2], np.int32),
                       np.array([1], np.int32))
    with pytest.raises(AttentionArgumentError, match="torch tensors for torch pages"):
        append_paged_kv(torch_kv, np.zeros((1, H, D), np.float32), np.zeros((1, H, D), np.float32),
                        np.array([0, 1], np.int32))


def test_the_library_and_layout_are_checked_before_writing(rng):
    import torch

    kv, _ = grown_view(rng, [1], [1])
    fp8 = PagedKV(quantize_kv(torch.from_numpy(kv.pages.reshape(-1, H, D)), "float8_e4m3fn").reshape(kv.pages.shape),
                  kv.indptr, kv.indices, kv.last_page_len)
    rows = np.zeros((1, H, D), np.float32)
    with pytest.raises(AttentionArgumentError, match="torch tensors for torch pages"):
        append_paged_kv(fp8, rows, rows, np.array([0, 1], np.int32), k_scale=1.0, v_scale=1.0)
    with pytest.raises(AttentionArgumentError, match="kv.layout: 'nhd' is not 'NHD' or 'HND'"):
        append_slots(PagedKV(kv.pages, kv.indptr, kv.indices, kv.last_page_len, "nhd"), np.array([0, 1], np.int32))


@pytest.mark.gpu
def test_an_append_on_the_gpu_writes_what_the_host_append_writes(rng):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU on this machine (run `pytest -m gpu` on a GPU machine)")
    kv, _ = grown_view(rng, [5, 1, 9], [3, 7, 2], dtype=np.float16)
    k = rng.standard_normal((12, H, D)).astype(np.float16)
    v = rng.standard_normal((12, H, D)).astype(np.float16)
    append_indptr = np.array([0, 3, 10, 12], np.int32)
    dev = PagedKV(torch.from_numpy(kv.pages.copy()).cuda(), torch.from_numpy(kv.indptr).cuda(),
                  torch.from_numpy(kv.indices).cuda(), torch.from_numpy(kv.last_page_len).cuda())
    append_paged_kv(dev, torch.from_numpy(k).cuda(), torch.from_numpy(v).cuda(), append_indptr)
    append_paged_kv(kv, k, v, append_indptr)
    assert np.array_equal(dev.pages.cpu().numpy(), kv.pages)
