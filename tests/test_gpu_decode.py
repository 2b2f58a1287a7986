"""GPU: the CUDA decode template for every built-in variant against the float64 reference.

fp16 and bf16, head dims 64/128/256 (``VARIANT_CONFIGS``: every variant at 128 / bf16 and at one more of the
six configurations, the variants whose code differs per configuration at all six), GQA ratios 1, 4, 8 and 5,
NHD and HND pages with
random permutations and spare pages, a request with no keys, split-KV forced and
automatic, outputs poisoned with NaN before each run; every case runs on both decode templates
(CUDA cores and tensor cores).

``ATTNGEN_TEST_LINK=lto`` builds this file's libraries and tests/test_gpu_prefill.py's (``cuda_module``) as
linked builds (BuildConfig.link) instead of whole-program ones: the same cases then check the linked kernels
of every built-in, the alternatives linked on first use among them.
"""
import os

import numpy as np
import pytest

from attngen.runtime.reference import gather_pages, reference_attention
from attngen.testing import Problem, compare, random_params, random_problem, tolerance
from attngen.variants import BUILTINS, builtin

pytestmark = pytest.mark.gpu

HEAD_DIMS = (64, 128, 256)
DTYPES = ("float16", "bfloat16")
CONFIGS = [(d, dt) for d in HEAD_DIMS for dt in DTYPES]
# (variant, head dim, dtype) cases of the decode and prefill matrices. At every configuration: the plain variant
# (tiles and shared memory per head dim), rope (element-wise query/key hooks, a key-staging pass), the row-hook
# variant (whole-row hooks, their scratch at 256) and custom_mask (a tensor-read mask, the tile map per tile
# shape). Every other variant, whose hooks read no head-dim or dtype dependent state, at 128 / bf16 and at one
# more configuration in turn, so that every configuration serves several of them. (A library per case: the
# device's build time is most of the suite's.)
EVERY_CONFIG = ("vanilla", "rope", "whole_row_hooks", "custom_mask")
HOME = (128, "bfloat16")
OTHER_CONFIGS = [c for c in CONFIGS if c != HOME]
VARIANT_CONFIGS = [(name, d, dt) for name in EVERY_CONFIG for d, dt in CONFIGS] + [
    (name, d, dt) for i, name in enumerate(n for n in BUILTINS if n not in EVERY_CONFIG)
    for d, dt in (HOME, OTHER_CONFIGS[i % len(OTHER_CONFIGS)])]
_libs = {}
TEST_LINK = os.environ.get("ATTNGEN_TEST_LINK", "whole")  # BuildConfig.link of cuda_module's libraries


def variant(name):
    if name == "whole_row_hooks":
        from .row_hook_variants import make

        return make()
    return builtin(name)


def cuda_module(name, build_cache, head_dims=HEAD_DIMS, dtypes=DTYPES, kernels=("decode", "prefill")):
    """The variant's CUDA library for these configurations (a test asks only for what it runs, so that
    parallel test workers compile small libraries side by side)."""
    from attngen.runtime import CUDAAttention

    key = (name, tuple(head_dims), tuple(dtypes), tuple(kernels))
    if key not in _libs:
        _libs[key] = CUDAAttention.build(variant(name), head_dims=head_dims, dtypes=dtypes, kernels=kernels,
                                         cache=build_cache, link=TEST_LINK)
    return _libs[key]


def plain_decode_module(build_cache, head_dim=128):
    """The plain variant's float16 decode library at ``head_dim`` for the planner, argument-check and CUDA-graph
    tests below: the library test_decode_matches_reference builds for that head dim, shared through the cache."""
    return cuda_module("vanilla", build_cache, (head_dim,), ("float16",), ("decode",))


def to_torch(x, dtype=None):
    import torch

    t = torch.from_numpy(np.ascontiguousarray(x))
    return (t.to(getattr(torch, dtype)) if dtype else t).cuda()


def run_case(att, variant, rng, *, group, head_dim, dtype, layout, kv_lens, num_chunks):
    import torch

    num_kv = 2
    prob = random_problem(rng, [1] * len(kv_lens), kv_lens, num_kv * group, num_kv, head_dim,
                          page_size=16, dtype="float32", layout=layout)
    pages = to_torch(prob.paged.pages, dtype)
    q = to_torch(prob.q, dtype)
    # the reference sees exactly the rounded inputs the kernel sees
    pages_r = pages.float().cpu().numpy()
    q_r = q.float().cpu().numpy()
    keys, values = gather_pages(pages_r, prob.paged.indptr, prob.paged.indices, prob.paged.last_page_len, layout)
    ref_prob = Problem(q_r, prob.qo_indptr, prob.ragged, prob.paged, keys, values, prob.qo_lens, kv_lens)
    params = random_params(variant, rng, ref_prob)
    sm_scale = 1.0 / np.sqrt(head_dim)
    ref_o, ref_l = reference_attention(variant, q_r, keys, values, prob.qo_indptr, sm_scale, params)
    from attngen.runtime import PagedKV

    kv = PagedKV(pages, to_torch(prob.paged.indptr), to_torch(prob.paged.indices),
                 to_torch(prob.paged.last_page_len), layout)
    dev_params = {k: (to_torch(v) if isinstance(v, np.ndarray) else v) for k, v in params.items()}
    tol = tolerance(ref_prob, ref_o, dtype, sm_scale)
    results = []
    for tensor_cores in (False, True):  # both decode templates on the same inputs
        plan = att.plan_decode(kv, q.shape[1], head_dim, num_chunks=num_chunks, tensor_cores=tensor_cores)
        out = torch.full_like(q, float("nan"))
        lse = torch.full(q.shape[:2], float("nan"), device="cuda")
        att.decode(q, kv, plan=plan, sm_scale=sm_scale, params=dev_params, out=out, lse=lse)
        torch.cuda.synchronize()
        results.append(compare(out.float().cpu().numpy(), lse.cpu().numpy(), ref_o, ref_l, tol=tol, lse_tol=2e-2,
                               what=f"{variant.name} decode {layout} {dtype} d{head_dim} g{group} "
                                    f"chunks={plan.num_chunks} tensor_cores={tensor_cores}"))
    return results


@pytest.mark.parametrize("name,head_dim,dtype", VARIANT_CONFIGS)
def test_decode_matches_reference(name, head_dim, dtype, build_cache, rng):
    att = cuda_module(name, build_cache, (head_dim,), (dtype,), ("decode",))
    v = variant(name)
    for group, layout, chunks in [(1, "NHD", None), (4, "HND", 3), (8, "NHD", 1), (5, "HND", None)]:
        run_case(att, v, rng, group=group, head_dim=head_dim, dtype=dtype, layout=layout,
                 kv_lens=[37, 0, 300, 1, 129], num_chunks=chunks)


def test_decode_long_sequences_split(build_cache, rng):
    att = cuda_module("sliding_window_causal", build_cache, (128,), ("bfloat16",), ("decode",))
    v = builtin("sliding_window_causal")
    for chunks in (None, 1, 7):
        run_case(att, v, rng, group=4, head_dim=128, dtype="bfloat16", layout="NHD", kv_lens=[5000, 17, 2500],
                 num_chunks=chunks)


def test_decode_rejects_bad_page_index(build_cache, rng):
    from attngen.runtime import AttentionArgumentError, PagedKV

    att = plain_decode_module(build_cache)
    prob = random_problem(rng, [1, 1], [20, 30], 8, 2, 128, page_size=16)
    bad = prob.paged.indices.copy()
    bad[-1] = prob.paged.pages.shape[0] + 5
    kv = PagedKV(to_torch(prob.paged.pages, "float16"), to_torch(prob.paged.indptr), to_torch(bad),
                 to_torch(prob.paged.last_page_len))
    with pytest.raises(AttentionArgumentError, match=r"kv.indices: page id .* outside the cache"):
        att.plan_decode(kv, 8, 128)


def test_decode_groups_above_the_tile_rows_run_on_tensor_cores(build_cache, rng):
    """A GQA group of 16, or 12 (its second part holding 4 heads), runs on the tensor-core template in parts of 8
    query heads per CTA row (csrc/decode_tc_tile.cuh decode_tc_group_parts), against the float64 reference, through
    the load-balanced plan (fused merge and merge kernel) and the even split; the CUDA-core template, built for
    max_group_size=8, refuses it by name."""
    import torch

    from attngen.runtime import PagedKV
    from attngen.testing import check_decode_plans

    att = plain_decode_module(build_cache, 64)
    for group in (16, 12):
        kv_lens = [20, 300, 0, 1000, 1]
        prob = random_problem(rng, [1] * len(kv_lens), kv_lens, 2 * group, 2, 64, page_size=16, dtype="float32")
        pages = to_torch(prob.paged.pages, "float16")
        q = to_torch(prob.q, "float16")
        keys, values = gather_pages(pages.float().cpu().numpy(), prob.paged.indptr, prob.paged.indices,
                                    prob.paged.last_page_len, "NHD")
        ref_prob = Problem(q.float().cpu().numpy(), prob.qo_indptr, prob.ragged, prob.paged, keys, values,
                           prob.qo_lens, kv_lens)
        ref_o, ref_l = reference_attention(builtin("vanilla"), ref_prob.q, keys, values, prob.qo_indptr, 64 ** -0.5,
                                           {})
        kv = PagedKV(pages, to_torch(prob.paged.indptr), to_torch(prob.paged.indices),
                     to_torch(prob.paged.last_page_len))
        check_decode_plans(att, q, kv, 64, ({}, {"tensor_cores": True, "fused_merge": True}, {"fused_merge": False},
                                            {"num_chunks": 3}), ref_o, ref_l,
                           tol=tolerance(ref_prob, ref_o, "float16", 64 ** -0.5), lse_eps=1e-3,
                           what=f"group {group}")
        with pytest.raises(Exception, match=rf"group size {group} .* above this library's max_group_size=8, which "
                                            r"bounds the CUDA-core template"):
            att.decode(q, kv, plan=att.plan_decode(kv, 2 * group, 64, tensor_cores=False))
    torch.cuda.synchronize()


def _static_batch(rng, batch, num_pages, hq, hkv, d):
    """Fixed-address q / page-table buffers and a function refilling them with a random batch."""
    import torch

    from attngen.runtime import PagedKV

    pages = torch.randn(num_pages, 2, 16, hkv, d, dtype=torch.float16, device="cuda")
    q = torch.empty(batch, hq, d, dtype=torch.float16, device="cuda")
    indptr = torch.zeros(batch + 1, dtype=torch.int32, device="cuda")
    indices = torch.zeros(num_pages, dtype=torch.int32, device="cuda")
    last = torch.ones(batch, dtype=torch.int32, device="cuda")
    kv = PagedKV(pages, indptr, indices, last)

    def refill(lens):
        n = [(x + 15) // 16 for x in lens]
        ptr = np.concatenate([[0], np.cumsum(n)]).astype(np.int32)
        indptr.copy_(torch.from_numpy(ptr))
        indices.copy_(torch.from_numpy(rng.permutation(num_pages).astype(np.int32)))
        last.copy_(torch.from_numpy(np.array([x - 16 * (k - 1) if k else 1 for x, k in zip(lens, n)], np.int32)))
        q.copy_(torch.randn(batch, hq, d, dtype=torch.float16))
    return q, kv, refill


@pytest.mark.parametrize("fused_merge", [True, False, None])
def test_decode_balanced_plan_skewed_and_superseded(build_cache, rng, fused_merge):
    """The load-balanced plan splits a long request among many CTAs (and matches an even split), its
    split requests merged by the decode kernel itself or by the merge kernel (None: the plan chooses,
    fusing here since short requests write their outputs directly); a plan superseded by a later one of
    the same shape is refused."""
    import torch

    from attngen.runtime import AttentionArgumentError

    att = plain_decode_module(build_cache)
    lens = [9000] + list(rng.integers(0, 300, size=15))
    q, kv, refill = _static_batch(rng, 16, 1024, 16, 2, 128)
    refill(lens)
    plan = att.plan_decode(kv, 16, 128, fused_merge=fused_merge)
    assert plan.work is not None and len(plan.split.merge_tiles) >= 1
    assert plan.fused_merge == (True if fused_merge is None else fused_merge)
    assert plan.num_merges == (0 if plan.fused_merge else len(plan.split.merge_tiles))  # merge kernel blocks
    assert (plan.split.work[:, 0] == 0).sum() > 4  # the long request is cut into many chunks
    out, lse = att.decode(q, kv, plan=plan)
    ref_o, ref_l = att.decode(q, kv, plan=att.plan_decode(kv, 16, 128, num_chunks=1, tensor_cores=False))
    torch.cuda.synchronize()
    assert torch.allclose(out.float(), ref_o.float(), atol=2e-3, rtol=0)
    assert torch.allclose(lse, ref_l, atol=1e-3, rtol=0)
    att.plan_decode(kv, 16, 128, fused_merge=fused_merge)
    with pytest.raises(AttentionArgumentError, match="superseded"):
        att.decode(q, kv, plan=plan)
    with pytest.raises(AttentionArgumentError, match="graph_safe / fixed_chunk: need the load-balanced plan"):
        att.plan_decode(kv, 16, 128, num_chunks=2, graph_safe=True)
    # a fixed chunk far below the balanced one needs more work items than the workspace had: it grows
    plan = att.plan_decode(kv, 16, 128, fixed_chunk=64, fused_merge=fused_merge)
    assert (plan.split.work[:, 0] == 0).sum() == -(-9000 // 64)
    out_f, _ = att.decode(q, kv, plan=plan)
    torch.cuda.synchronize()
    assert torch.allclose(out_f.float(), ref_o.float(), atol=2e-3, rtol=0)
    # the fused merge's counters are back at zero after each launch: a second run gives the same bits
    out_g, _ = att.decode(q, kv, plan=plan)
    torch.cuda.synchronize()
    assert torch.equal(out_f, out_g)


def test_decode_merge_choice_of_an_all_split_batch(build_cache, rng):
    """When every request is split, the load-balanced plan launches the merge kernel (spread over the GPU);
    a graph-safe plan, or fused_merge=True, fuses the merge; all three give the same output."""
    import torch

    att = plain_decode_module(build_cache)
    q, kv, refill = _static_batch(rng, 1, 1024, 16, 2, 128)
    refill([12000])
    outs = []
    for kw, fused in (({"tensor_cores": True}, False), ({"graph_safe": True}, True), ({"fused_merge": True}, True)):
        plan = att.plan_decode(kv, 16, 128, **kw)
        assert (plan.split.work[:, 4] >= 0).all() and len(plan.split.merge_tiles) == 1  # one request, split
        assert plan.fused_merge == fused
        assert plan.num_merges == (0 if fused else 1)
        outs.append(att.decode(q, kv, plan=plan)[0].float())
    ref_o, _ = att.decode(q, kv, plan=att.plan_decode(kv, 16, 128, num_chunks=1, tensor_cores=False))
    torch.cuda.synchronize()
    for out in outs:
        assert torch.allclose(out, ref_o.float(), atol=2e-3, rtol=0)


def test_decode_uniform_batch_takes_the_grid_launch_the_rule_picks(build_cache, rng):
    """For a uniform batch the automatic choice follows decode_plan.grid_chunks_for_uniform_batch: one long
    request split over every CTA column gets the even-split grid launch with the plan's chunk count, and
    matches the unsplit CUDA-core result."""
    import torch

    from attngen.runtime.decode_plan import grid_chunks_for_uniform_batch
    from attngen.schedules.ffi_enums import DecodeBackend

    att = plain_decode_module(build_cache)
    q, kv, refill = _static_batch(rng, 1, 1024, 16, 2, 128)
    refill([12000])
    balanced = att.plan_decode(kv, 16, 128, tensor_cores=True)
    expect = grid_chunks_for_uniform_batch(np.array([12000]), balanced.split, 2, balanced.work.resident_slots)
    assert expect == len(balanced.split.work) > 1  # one item per CTA: the same partition as the grid's
    ref_o, ref_l = att.decode(q, kv, plan=att.plan_decode(kv, 16, 128, num_chunks=1, tensor_cores=False))
    plan = att.plan_decode(kv, 16, 128)
    assert plan.work is None and plan.backend == DecodeBackend.TENSOR_CORES and plan.num_chunks == expect
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:2], float("nan"), device="cuda")
    att.decode(q, kv, plan=plan, out=out, lse=lse)
    torch.cuda.synchronize()
    assert torch.allclose(out.float(), ref_o.float(), atol=2e-3, rtol=0)
    assert torch.allclose(lse, ref_l, atol=1e-3, rtol=0)


def test_decode_fixed_chunk_is_batch_invariant(build_cache, rng):
    """With fixed_chunk, a request's output is bit-identical whatever else is in the batch."""
    import torch

    att = plain_decode_module(build_cache, 64)
    q, kv, refill = _static_batch(rng, 6, 1024, 8, 2, 64)
    refill([3000, 10, 500, 0, 2000, 64])
    plan = att.plan_decode(kv, 8, 64, fixed_chunk=512)
    first = att.decode(q, kv, plan=plan)[0][0].clone()
    # same request 0 (same pages and q row), the rest of the batch changed
    q0, ind0 = q[0].clone(), kv.indices[:188].clone()
    refill([3000, 1500, 7, 4000, 1, 900])
    q[0].copy_(q0)
    kv.indices[:188].copy_(ind0)
    kv.indices[188:].copy_(torch.from_numpy(rng.permutation(np.arange(188, 1024)).astype(np.int32)))
    plan = att.plan_decode(kv, 8, 64, fixed_chunk=512)
    second = att.decode(q, kv, plan=plan)[0][0]
    torch.cuda.synchronize()
    assert torch.equal(first, second)


def test_a_graph_safe_workspace_refuses_to_grow(build_cache, rng):
    """Once a graph-safe plan was made in the shape's workspace (a captured graph reads its buffers), a batch
    or a fixed-chunk plan beyond its bounds is an error naming the bound, not a new workspace the graph would
    not see; declared with the first plan, the same bounds serve."""
    from attngen.runtime import AttentionArgumentError

    att = plain_decode_module(build_cache)
    q, kv, refill = _static_batch(rng, 8, 1024, 12, 2, 128)  # (12 query heads: a workspace of its own here)
    refill([300] * 8)
    plan = att.plan_decode(kv, 12, 128, graph_safe=True)
    big_q, big_kv, big_refill = _static_batch(rng, 100, 1024, 12, 2, 128)
    big_refill([5] * 100)
    with pytest.raises(AttentionArgumentError, match=r"max_batch: this plan needs 100, the decode workspace holds "
                                                     r"64; a graph-safe plan was made in it"):
        att.plan_decode(big_kv, 12, 128, graph_safe=True)
    with pytest.raises(AttentionArgumentError, match=r"max_work_items: this plan needs \d+, the decode workspace "
                                                     r"holds \d+"):
        att.plan_decode(kv, 12, 128, graph_safe=True, fixed_chunk=4)  # 8 x 75 items
    att.decode(q, kv, plan=plan)  # the graph-safe plan still runs in its workspace
    # bounds declared with the first plan of a shape (7 query heads over one KV head: a fresh workspace)
    q7, kv7, refill7 = _static_batch(rng, 8, 1024, 7, 1, 128)
    refill7([300] * 8)
    att.plan_decode(kv7, 7, 128, graph_safe=True, max_batch=100, max_work_items=700)
    big7_q, big7_kv, big7_refill = _static_batch(rng, 100, 1024, 7, 1, 128)
    big7_refill([5] * 100)
    out, _ = att.decode(big7_q, big7_kv, plan=att.plan_decode(big7_kv, 7, 128, graph_safe=True))
    assert out.isfinite().all()
    att.plan_decode(kv7, 7, 128, graph_safe=True, fixed_chunk=4)  # 8 x 75 items <= 700


def test_a_plan_from_host_index_arrays_runs_with_the_device_ones(build_cache, rng):
    """The planner reads the page table on the host: planned from host copies of the index arrays (no device
    read), the decode with the device arrays gives the bits of a plan made from the device arrays."""
    import torch

    from attngen.runtime import PagedKV

    att = plain_decode_module(build_cache)
    q, kv, refill = _static_batch(rng, 8, 1024, 16, 2, 128)
    refill([9000, 5, 300, 0, 64, 1200, 2, 77])
    host = PagedKV(kv.pages, kv.indptr.cpu(), kv.indices.cpu(), kv.last_page_len.cpu(), kv.layout)
    a = att.decode(q, kv, plan=att.plan_decode(host, 16, 128))[0].clone()
    b = att.decode(q, kv, plan=att.plan_decode(kv, 16, 128))[0]
    torch.cuda.synchronize()
    assert torch.equal(a, b)


def test_decode_cuda_graph_replays_100_random_batches(build_cache, rng):
    """Capture decode once with a graph-safe plan, then replay it for 100 random batches (lengths, page
    tables, split decisions) planned into the same workspace: bit-identical to eager runs."""
    import torch

    att = plain_decode_module(build_cache)
    batch, hq, hkv, d = 8, 16, 2, 128
    q, kv, refill = _static_batch(rng, batch, 2048, hq, hkv, d)
    refill([100] * batch)
    plan = att.plan_decode(kv, hq, d, graph_safe=True)
    out = torch.empty_like(q)
    lse = torch.empty(batch, hq, device="cuda")
    att.decode(q, kv, plan=plan, out=out, lse=lse)  # warm-up outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        att.decode(q, kv, plan=plan, out=out, lse=lse)
    torch.cuda.current_stream().wait_stream(stream)
    splits = set()
    for _ in range(100):
        long = int(rng.integers(0, 20000)) if rng.random() < 0.5 else 0
        lens = list(rng.integers(0, 1500, size=batch))
        lens[int(rng.integers(0, batch))] = long
        if sum((x + 15) // 16 for x in lens) > 2048:
            continue
        refill(lens)
        plan = att.plan_decode(kv, hq, d, graph_safe=True)
        splits.add(int((plan.split.merge_indptr[1:] - plan.split.merge_indptr[:-1]).sum()))
        out.fill_(float("nan"))
        graph.replay()
        eager_o, eager_l = att.decode(q, kv, plan=plan)
        torch.cuda.synchronize()
        assert torch.equal(out, eager_o) and torch.equal(lse, eager_l)
    assert len(splits) > 3  # the split decisions really changed between replays


@pytest.mark.parametrize("plan_kw", [{}, {"fused_merge": True}, {"fused_merge": False}, {"num_chunks": 4},
                                     {"num_chunks": 1, "tensor_cores": True}])
def test_chained_decodes_read_and_write_in_stream_order(plan_kw, build_cache, rng):
    """Decode kernels launch as programmatic dependents of the kernel before them (sm_90: the next call's kernel
    starts while the split-KV merge or the previous decode still runs, and waits for it before any global
    access). Calls queued behind a busy device, each reading the previous call's output as its queries and the last
    writing over the first one's queries, give the bits of the same calls run one at a time with the device
    synchronised between them: a split batch (merged by the decode kernel, by the merge kernel, or as the plan
    chooses), an even grid split and an unsplit plan."""
    import torch

    att = plain_decode_module(build_cache)
    batch, hq, hkv, d = 4, 16, 2, 128
    q, kv, refill = _static_batch(rng, batch, 1024, hq, hkv, d)
    refill([6000, 37, 0, 2500])
    plan = att.plan_decode(kv, hq, d, **plan_kw)
    expected, x = [], q.clone()
    for _ in range(3):
        x = att.decode(x, kv, plan=plan)[0]
        torch.cuda.synchronize()
        expected.append(x.clone())
    outs = [torch.full_like(q, float("nan")) for _ in range(2)]
    q_in = q.clone()
    torch.cuda.synchronize()
    for _ in range(3):  # (three times over: a race shows in some runs only)
        q_in.copy_(q)
        for o in outs:
            o.fill_(float("nan"))
        torch.cuda._sleep(50_000_000)  # the calls below queue up behind this and then run back to back
        att.decode(q_in, kv, plan=plan, out=outs[0])
        att.decode(outs[0], kv, plan=plan, out=outs[1])
        att.decode(outs[1], kv, plan=plan, out=q_in)  # (over the first call's queries)
        torch.cuda.synchronize()
        assert torch.equal(outs[0], expected[0]) and torch.equal(outs[1], expected[1])
        assert torch.equal(q_in, expected[2])
