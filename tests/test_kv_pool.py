"""Page pools that are not one contiguous [num_pages, 2, ...] array (runtime/kv_pool.py): vLLM's [2, num_pages,
...] cache transposed, FlashInfer's pair (k_pages, v_pages) of views of one allocation, pools with gaps. The CPU
backend reads each with the results of a contiguous copy; appends and cascades take them; the checks the CUDA
backend runs (check_tensor's "pages") accept what the kernels read in place and refuse the rest by name (the
kernels reading them: tests/test_gpu_kv_pool.py)."""
import numpy as np
import pytest

from attngen.runtime import CPUAttention, PagedKV
from attngen.runtime.append import append_paged_kv
from attngen.runtime.checks import AttentionArgumentError, check_paged, check_tensor, pool_layout_error
from attngen.runtime.kv_pool import heads_adjacent, pool_of_pair, same_pool
from attngen.variants import builtin

D, HQ, HKV, PS = 32, 4, 2, 4
KV_LENS = [9, 1, 0, 16]
_modules = {}


def cpu_module(name, build_cache):
    if name not in _modules:
        _modules[name] = CPUAttention.build(builtin(name), head_dims=(D,), dtypes=("float32",), cache=build_cache)
    return _modules[name]


def table(rng, num_pages):
    n = [(x + PS - 1) // PS for x in KV_LENS]
    indptr = np.concatenate([[0], np.cumsum(n)]).astype(np.int32)
    indices = rng.permutation(num_pages)[:sum(n)].astype(np.int32)
    last = np.array([x - PS * (m - 1) if m else 1 for x, m in zip(KV_LENS, n)], np.int32)
    return indptr, indices, last


def forms(rng, layout, lib="numpy"):
    """The same values as 'contiguous' [P, 2, ...], 'vllm' ([2, P, ...] transposed), 'pair' (its halves) and
    'gaps' (a slot and a third half of unused rows after each page)."""
    num_pages = sum((x + PS - 1) // PS for x in KV_LENS) + 2
    inner = (PS, HKV, D) if layout == "NHD" else (HKV, PS, D)
    base = rng.standard_normal((num_pages, 2, *inner)).astype(np.float32)
    cache = np.ascontiguousarray(base.swapaxes(0, 1))
    padded = np.full((num_pages, 3, inner[0] + 1, *inner[1:]), np.nan, np.float32)
    padded[:, :2, :inner[0]] = base
    if lib == "torch":
        import torch

        base, cache, padded = (torch.from_numpy(x) for x in (base, cache, padded))
    out = {"contiguous": base, "vllm": cache.swapaxes(0, 1) if lib == "numpy" else cache.transpose(0, 1),
           "pair": (cache[0], cache[1]), "gaps": padded[:, :2, :inner[0]]}
    return out, table(rng, num_pages)


@pytest.mark.parametrize("lib", ["numpy", "torch"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_the_cpu_backend_reads_every_form_as_a_contiguous_pool(layout, lib, build_cache, rng):
    att = cpu_module("causal", build_cache)
    pools, tab = forms(rng, layout, lib)
    ref = PagedKV(pools["contiguous"], *tab, layout)
    q = rng.standard_normal((len(KV_LENS), HQ, D)).astype(np.float32)
    qo = np.array([0, 3, 4, 4, 9], np.int32)
    qp = rng.standard_normal((9, HQ, D)).astype(np.float32)
    if lib == "torch":
        import torch

        q, qp = torch.from_numpy(q), torch.from_numpy(qp)
    ref_d = att.decode(q, ref)
    ref_p = att.prefill(qp, ref, qo)
    for form in ("vllm", "pair", "gaps"):
        kv = PagedKV(pools[form], *tab, layout)
        assert tuple(kv.pages.shape) == tuple(ref.pages.shape)
        assert np.array_equal(np.asarray(kv.pages), np.asarray(ref.pages), equal_nan=True), form
        for got, want in zip(att.decode(q, kv) + att.prefill(qp, kv, qo), ref_d + ref_p):
            assert np.array_equal(np.asarray(got), np.asarray(want)), form


def test_the_pair_becomes_one_view_of_the_cache(rng):
    import torch

    cache = torch.randn(2, 5, PS, HKV, D)
    pages = pool_of_pair(cache[0], cache[1], "NHD")
    assert pages.data_ptr() == cache.data_ptr() and tuple(pages.shape) == (5, 2, PS, HKV, D)
    assert pages.stride() == cache.transpose(0, 1).stride() and torch.equal(pages, cache.transpose(0, 1))
    assert same_pool(pages, PagedKV((cache[0], cache[1]), *table(rng, 5)).pages)
    assert not same_pool(pages, cache.transpose(0, 1).contiguous())
    flat = torch.randn(5, 2, PS, HKV, D)  # the halves of a [P, 2, ...] pool are a pair too
    assert pool_of_pair(flat[:, 0], flat[:, 1], "NHD").stride() == flat.stride()
    arr = np.random.default_rng(0).standard_normal((2, 5, PS, HKV, D)).astype(np.float32)
    view = pool_of_pair(arr[0], arr[1], "NHD")
    assert np.array_equal(view, arr.swapaxes(0, 1)) and view.strides == arr.swapaxes(0, 1).strides


def test_a_pair_of_no_pages_is_an_empty_pool(build_cache):
    """(The fuzzer's find: an empty batch's pair of [0, ...] halves, both at the cache's address, was refused as V
    before K.) Each library's pair of empty halves is a [0, 2, ...] pool that an empty batch reads."""
    import torch

    empty = np.zeros(0, np.int32)
    for cache in (torch.zeros(2, 0, PS, HKV, D), np.zeros((2, 0, PS, HKV, D), np.float32)):
        kv = PagedKV((cache[0], cache[1]), np.zeros(1, np.int32), empty, empty)
        assert tuple(kv.pages.shape) == (0, 2, PS, HKV, D) and pool_layout_error(kv.pages) is None
    out, lse = cpu_module("vanilla", build_cache).decode(np.zeros((0, HQ, D), np.float32), kv)
    assert out.shape == (0, HQ, D) and lse.shape == (0, HQ)


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2", "bfloat16"])
def test_numpy_pairs_of_ml_dtypes_elements_are_one_view(dtype):
    """(The fuzzer's find: numpy's as_strided cannot describe ml_dtypes' elements, so a pair of fp8 numpy pages
    raised a TypeError.) The pair becomes the [P, 2, ...] view of the cache, elements and bits unchanged."""
    import ml_dtypes

    cache = np.random.default_rng(1).standard_normal((2, 5, PS, HKV, D)).astype(getattr(ml_dtypes, dtype))
    pages = PagedKV((cache[0], cache[1]), *table(np.random.default_rng(0), 5)).pages
    assert pages.dtype == cache.dtype and pages.shape == (5, 2, PS, HKV, D)
    assert pages.strides == cache.swapaxes(0, 1).strides and np.shares_memory(pages, cache)
    assert np.array_equal(pages.view(np.uint8), cache.swapaxes(0, 1).view(np.uint8))


def test_pairs_the_kernels_cannot_address_are_refused_by_name():
    import torch

    cache = torch.randn(2, 5, PS, HKV, D)
    cases = [((torch.randn(5, PS, HKV, D), torch.randn(5, PS, HKV, D)), "separate allocations"),
             ((cache[1], cache[0]), "must lie after k_pages"),
             ((cache[0], cache[1, :4]), "one shape and dtype"),
             ((cache[0], cache[1].half()), "one shape and dtype"),
             ((cache[0], cache[1].transpose(1, 2)), "one shape and dtype|same strides"),
             ((cache[0].reshape(5, -1), cache[1].reshape(5, -1)), "expected a 4-dim tensor"),
             ((cache[0], cache[1], cache[1]), "a pair")]
    for pair, msg in cases:
        with pytest.raises(AttentionArgumentError, match=f"kv.pages.*({msg})"):
            PagedKV(pair, *table(np.random.default_rng(0), 5))
    arrays = np.zeros((2, 5, PS, HKV, D), np.float32), np.zeros((2, 5, PS, HKV, D), np.float32)
    with pytest.raises(AttentionArgumentError, match="separate allocations"):
        pool_of_pair(arrays[0][0], arrays[1][1], "NHD")


def test_the_cuda_checks_take_what_the_kernels_read_and_refuse_the_rest():
    import torch

    good = {"contiguous": torch.zeros(3, 2, PS, HKV, D, dtype=torch.float16),
            "vllm": torch.zeros(2, 3, PS, HKV, D, dtype=torch.float16).transpose(0, 1),
            "gaps": torch.zeros(3, 3, PS + 1, HKV, D + 8, dtype=torch.float16)[:, :2, :PS, :, :D],
            "one head, odd head stride": torch.zeros(3, 2, PS, 1, D, dtype=torch.float16).as_strided(
                (3, 2, PS, 1, D), (2 * PS * D, PS * D, D, 3, 1))}
    for name, pages in good.items():
        assert pool_layout_error(pages) is None, name
        check_tensor(pages, "kv.pages", 5, "float16", strided="pages")
    bad = {"rows": (torch.zeros(3, 2, PS, HKV, 2 * D, dtype=torch.float16)[..., ::2], "not contiguous"),
           "heads 2 elements apart": (torch.zeros(3, 2, PS, HKV, D + 2, dtype=torch.float16)[..., :D],
                                      "multiples of 16 bytes"),
           "address": (torch.zeros(3 * 2 * PS * HKV * D + 4, dtype=torch.float16)[4:].view(3, 2, PS, HKV, D),
                       "16-byte aligned"),
           "overlap": (torch.zeros(3, 2, PS, HKV, D, dtype=torch.float16).as_strided(
               (3, 2, PS, HKV, D), (2 * PS * HKV * D, PS * HKV * D, HKV * D, D // 2, 1)), "overlap|multiples"),
           "repeated pages": (torch.zeros(1, 2, PS, HKV, D, dtype=torch.float16).expand(3, 2, PS, HKV, D),
                              "positive multiples")}
    for name, (pages, msg) in bad.items():
        assert pool_layout_error(pages) is not None, name
        with pytest.raises(AttentionArgumentError, match=f"kv.pages: the kernels cannot read .*({msg})"):
            check_tensor(pages, "kv.pages", 5, "float16", strided="pages")
    # the CPU backend packs any pool itself: the same pool passes its check
    kv = PagedKV(bad["rows"][0], np.array([0, 1], np.int32), np.array([2], np.int32), np.array([3], np.int32))
    assert check_paged(kv, D, "float16", None, strided="any") == 1
    with pytest.raises(AttentionArgumentError, match="cannot read this page pool"):
        check_paged(kv, D, "float16", None)


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_appends_land_in_the_cache_behind_the_view(lib, rng):
    pools, (indptr, indices, last) = forms(rng, "NHD", lib)
    cache = pools["pair"][0]  # k half of the [2, P, ...] cache: writes through the pair must land in it
    kv = PagedKV(pools["pair"], indptr, indices, last)
    flat = PagedKV(pools["contiguous"].copy() if lib == "numpy" else pools["contiguous"].clone(), indptr, indices, last)
    new = np.array([0, 2, 3, 3, 5], np.int32)
    k = rng.standard_normal((5, HKV, D)).astype(np.float32)
    v = rng.standard_normal((5, HKV, D)).astype(np.float32)
    if lib == "torch":
        import torch

        k, v = torch.from_numpy(k), torch.from_numpy(v)
    append_paged_kv(kv, k, v, new)
    append_paged_kv(flat, k, v, new)
    assert np.array_equal(np.asarray(kv.pages), np.asarray(flat.pages))
    assert np.array_equal(np.asarray(cache), np.asarray(flat.pages)[:, 0])


def test_a_cascade_takes_levels_made_from_one_pair(build_cache, rng):
    """Levels of a cascade must view one cache; two PagedKVs made from the same pair do (same_pool), though each
    holds its own view object. Both modes give flat attention over each request's prefix and suffix pages."""
    from attngen.runtime import CascadeAttention, CascadeLevel

    att = cpu_module("vanilla", build_cache)
    cache = rng.standard_normal((2, 6, PS, HKV, D)).astype(np.float32)
    pair = (cache[0], cache[1])
    # one group of two requests: prefix pages [0, 1] shared; suffixes [2] (2 keys) and [3, 4] (PS + 3 keys)
    shared = PagedKV(pair, np.array([0, 2], np.int32), np.array([0, 1], np.int32), np.array([PS], np.int32))
    unique = PagedKV(pair, np.array([0, 1, 3], np.int32), np.array([2, 3, 4], np.int32), np.array([2, 3], np.int32))
    assert shared.pages is not unique.pages and same_pool(shared.pages, unique.pages)
    q = rng.standard_normal((5, HQ, D)).astype(np.float32)
    levels = [CascadeLevel(np.array([0, 5], np.int32), shared), CascadeLevel(np.array([0, 2, 5], np.int32), unique)]
    flat = PagedKV(np.ascontiguousarray(cache.swapaxes(0, 1)), np.array([0, 3, 7], np.int32),
                   np.array([0, 1, 2, 0, 1, 3, 4], np.int32), np.array([2, 3], np.int32))
    ref_o, ref_l = att.prefill(q, flat, np.array([0, 2, 5], np.int32))
    cascade = CascadeAttention(att)
    for mode in ("cascade", "flat"):
        out, lse = cascade.run(q, plan=cascade.plan(levels, 5, D, mode=mode))
        assert np.abs(out - ref_o).max() < 1e-5 and np.abs(lse - ref_l).max() < 1e-5, mode


def test_heads_adjacent_says_where_a_pair_of_heads_reads_one_run():
    import torch

    assert heads_adjacent(torch.zeros(2, 2, PS, HKV, D), "NHD")
    assert heads_adjacent(torch.zeros(2, 2, 3, PS, HKV, D)[:, :, 0].transpose(0, 0), "NHD")
    assert not heads_adjacent(torch.zeros(2, 2, PS, HKV, D + 8)[..., :D], "NHD")  # heads D + 8 apart
    assert not heads_adjacent(torch.zeros(2, 2, HKV, PS, D), "HND")
    assert heads_adjacent(torch.zeros(2, 2, PS, 1, D + 8)[..., :D], "NHD")  # one head: nothing to pair apart


def test_block_sparse_runs_take_the_pair(build_cache, rng):
    from attngen.runtime import BlockSparseAttention, BlockSparseView

    bsa = BlockSparseAttention(cpu_module("vanilla", build_cache))
    cache = rng.standard_normal((2, 3, PS, HKV, D)).astype(np.float32)
    view = BlockSparseView(np.array([0, 2, 3], np.int32), np.array([0, 2, 1], np.int32), 3, 5, 3 * PS)
    q = rng.standard_normal((5, HQ, D)).astype(np.float32)
    out, lse = bsa.run(q, (cache[0], cache[1]), view)
    ref_o, ref_l = bsa.run(q, np.ascontiguousarray(cache.swapaxes(0, 1)), view)
    assert np.array_equal(out, ref_o) and np.array_equal(lse, ref_l)


def test_numpy_pairs_with_byte_strides_off_the_elements_are_refused():
    rec = np.zeros((2, 3, PS, HKV, D), dtype=[("a", np.int8), ("x", np.float32)])["x"]  # 5-byte steps
    with pytest.raises(AttentionArgumentError, match="byte strides .* not multiples"):
        pool_of_pair(rec[0], rec[1], "NHD")
