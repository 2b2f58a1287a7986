"""GPU: the CUDA decode template for every built-in variant against the float64 reference.

fp16 and bf16, head dims 64/128/256, GQA ratios 1, 4, 8 and 5, NHD and HND pages with
random permutations and spare pages, a request with no keys, split-KV forced and
automatic, outputs poisoned with NaN before each run; every case runs on both decode templates
(CUDA cores and tensor cores).
"""
import numpy as np
import pytest

from attngen.runtime.reference import gather_pages, reference_attention
from attngen.testing import Problem, compare, random_params, random_problem, tolerance
from attngen.variants import BUILTINS, builtin

pytestmark = pytest.mark.gpu

HEAD_DIMS = (64, 128, 256)
DTYPES = ("float16", "bfloat16")
_libs = {}


def variant(name):
    if name == "whole_row_hooks":
        from .row_hook_variants import make

        return make()
    return builtin(name)


def cuda_module(name, build_cache):
    from attngen.runtime import CUDAAttention

    if name not in _libs:
        _libs[name] = CUDAAttention.build(variant(name), head_dims=HEAD_DIMS, dtypes=DTYPES, cache=build_cache)
    return _libs[name]


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


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("name", list(BUILTINS) + ["whole_row_hooks"])
def test_decode_matches_reference(name, head_dim, dtype, build_cache, rng):
    att = cuda_module(name, build_cache)
    v = variant(name)
    for group, layout, chunks in [(1, "NHD", None), (4, "HND", 3), (8, "NHD", 1), (5, "HND", None)]:
        run_case(att, v, rng, group=group, head_dim=head_dim, dtype=dtype, layout=layout,
                 kv_lens=[37, 0, 300, 1, 129], num_chunks=chunks)


def test_decode_long_sequences_split(build_cache, rng):
    att = cuda_module("sliding_window_causal", build_cache)
    v = builtin("sliding_window_causal")
    for chunks in (None, 1, 7):
        run_case(att, v, rng, group=4, head_dim=128, dtype="bfloat16", layout="NHD", kv_lens=[5000, 17, 2500],
                 num_chunks=chunks)


def test_decode_rejects_bad_page_index(build_cache, rng):
    from attngen.runtime import AttentionArgumentError, PagedKV

    att = cuda_module("vanilla", build_cache)
    prob = random_problem(rng, [1, 1], [20, 30], 8, 2, 128, page_size=16)
    bad = prob.paged.indices.copy()
    bad[-1] = prob.paged.pages.shape[0] + 5
    kv = PagedKV(to_torch(prob.paged.pages, "float16"), to_torch(prob.paged.indptr), to_torch(bad),
                 to_torch(prob.paged.last_page_len))
    with pytest.raises(AttentionArgumentError, match=r"kv.indices: page id .* outside the cache"):
        att.plan_decode(kv, 8, 128)


def test_decode_refuses_group_above_build_bound(build_cache, rng):
    import torch

    from attngen.runtime import PagedKV

    att = cuda_module("vanilla", build_cache)
    prob = random_problem(rng, [1], [20], 16, 1, 64, page_size=16)
    kv = PagedKV(to_torch(prob.paged.pages, "float16"), to_torch(prob.paged.indptr), to_torch(prob.paged.indices),
                 to_torch(prob.paged.last_page_len))
    with pytest.raises(Exception, match=r"group size 16 .* above this library's max_group_size=8"):
        att.decode(to_torch(prob.q, "float16"), kv)
    torch.cuda.synchronize()
