"""The CUDA API's argument checks, on a machine without a GPU: the library loads (static CUDA
runtime, no driver call until a launch) and every check runs before any launch."""
import subprocess

import pytest
import torch

from attngen.runtime import AttentionArgumentError, CUDAAttention, PagedKV, RaggedKV
from attngen.runtime.cuda import DecodeLaunch
from attngen.schedules.ffi_enums import DecodeBackend, PrefillTemplate, PrefillTileRows
from attngen.testing import random_problem
from attngen.variants import builtin

from .conftest import requires_nvcc

D = 64


@pytest.fixture(scope="module")
def att(tmp_path_factory):
    if requires_nvcc.args[0]:
        pytest.skip("nvcc is not on PATH")
    from attngen.codegen.cache import BuildCache

    return CUDAAttention.build(builtin("alibi"), head_dims=(D,), dtypes=("float16",), archs=("sm_80",),
                               layouts=("NHD",), cache=BuildCache(tmp_path_factory.mktemp("cache")))


def _paged(prob, **over):
    parts = dict(pages=torch.from_numpy(prob.paged.pages).half(), indptr=torch.from_numpy(prob.paged.indptr),
                 indices=torch.from_numpy(prob.paged.indices), last_page_len=torch.from_numpy(prob.paged.last_page_len))
    parts.update(over)
    return PagedKV(parts["pages"], parts["indptr"], parts["indices"], parts["last_page_len"])


def test_library_exports_decode_and_prefill(att):
    assert att.functions == {"batch_decode_paged_nhd_f16_d64", "batch_prefill_paged_nhd_f16_d64",
                             "batch_prefill_ragged_f16_d64", "prefill_tile_map_f16_d64"}
    ldd = subprocess.run(["ldd", str(att.library)], capture_output=True, text=True).stdout
    assert "libtvm_ffi" in ldd and "libcudart" not in ldd  # static CUDA runtime: only the driver at run time


def test_plan_checks_the_page_table(att, rng):
    prob = random_problem(rng, [1, 1], [20, 7], 8, 2, D, page_size=16)
    bad = prob.paged.indices.copy()
    bad[0] = 999
    with pytest.raises(AttentionArgumentError, match=r"kv.indices: page id 999 is outside the cache's"):
        att.plan_decode(_paged(prob, indices=torch.from_numpy(bad)), 8, D, num_chunks=1)
    with pytest.raises(AttentionArgumentError, match=r"num_qo_heads=7 is not a multiple"):
        att.plan_decode(_paged(prob), 7, D, num_chunks=1)
    with pytest.raises(AttentionArgumentError, match=r"has no batch_decode_paged_nhd_f32_d64.*rebuild"):
        att.plan_decode(_paged(prob, pages=torch.from_numpy(prob.paged.pages)), 8, D, num_chunks=1)


def test_run_refuses_host_tensors_and_mismatched_plans(att, rng):
    prob = random_problem(rng, [1, 1], [20, 7], 8, 2, D, page_size=16)
    kv = _paged(prob)
    plan = att.plan_decode(kv, 8, D, num_chunks=1)
    q = torch.from_numpy(prob.q).half()
    params = {"alibi_slopes": torch.ones(8)}
    with pytest.raises(AttentionArgumentError, match=r"q: must be a CUDA tensor"):
        att.decode(q, kv, plan=plan, params=params)
    with pytest.raises(AttentionArgumentError, match=r"plan: made for batch 2, 8 heads, head_dim 64"):
        att.decode(q[:1], kv, plan=plan, params=params)
    with pytest.raises(AttentionArgumentError, match=r"has no batch_decode_paged_nhd_bf16_d64"):
        att.decode(q.bfloat16(), PagedKV(kv.pages.bfloat16(), kv.indptr, kv.indices, kv.last_page_len), plan=plan,
                   params=params)


def test_prefill_checks(att, rng):
    prob = random_problem(rng, [3, 2], [5, 6], 8, 2, D)
    ragged = RaggedKV(torch.from_numpy(prob.ragged.k).half(), torch.from_numpy(prob.ragged.v).half(),
                      torch.from_numpy(prob.ragged.indptr))
    qo = torch.from_numpy(prob.qo_indptr)
    q = torch.from_numpy(prob.q).half()
    with pytest.raises(AttentionArgumentError, match=r"kv.indptr: has 3 entries, expected batch_size \+ 1 = 2"):
        att.plan_prefill(torch.tensor([0, 5], dtype=torch.int32), ragged, D)
    plan = att.plan_prefill(qo, ragged, D)
    assert (plan.batch_size, plan.total_q, plan.max_qo_len) == (2, 5, 3)
    assert att.plan_prefill(qo, ragged, D, max_qo_len=5).max_qo_len == 5  # a bound (CUDA graphs) sizes the grid
    for bad in (2, 6, 4.0, True):
        with pytest.raises(AttentionArgumentError, match=r"max_qo_len: .* from this batch's longest request \(3\) "
                                                         r"to its total query rows \(5\)"):
            att.plan_prefill(qo, ragged, D, max_qo_len=bad)
    with pytest.raises(AttentionArgumentError, match=r"q: must be a CUDA tensor"):
        att.prefill(q, ragged, qo, plan=plan, params={"alibi_slopes": torch.ones(8)})
    with pytest.raises(AttentionArgumentError, match=r"plan: made for 5 query rows, q has 4"):
        att.prefill(q[:4], ragged, qo, plan=plan, params={"alibi_slopes": torch.ones(8)})
    # a dtype no build serves is named with its tensor (found by the GPU fuzzer: a KeyError before)
    with pytest.raises(AttentionArgumentError, match=r"q: dtype float64 has no kernels"):
        att.prefill(q.double(), ragged, qo, plan=plan, params={"alibi_slopes": torch.ones(8)})
    paged = _paged(random_problem(rng, [3, 2], [5, 6], 8, 2, D, page_size=16))
    with pytest.raises(AttentionArgumentError, match=r"q: dtype float64 has no kernels"):
        att.prefill(q.double(), paged, qo, plan=att.plan_prefill(qo, paged, D))
    with pytest.raises(AttentionArgumentError, match=r"kv: dtype float64 has no kernels"):
        att.function("batch_decode_paged_nhd", "float16", D, kv_dtype="float64")



def test_a_kv_of_another_type_is_refused_by_name(att, rng):
    """A tensor or a (k, v) tuple in place of a view is refused before any field of it is read."""
    prob = random_problem(rng, [3, 2], [5, 6], 8, 2, D, page_size=16)
    paged = _paged(prob)
    k, v = torch.from_numpy(prob.ragged.k).half(), torch.from_numpy(prob.ragged.v).half()
    ragged = RaggedKV(k, v, torch.from_numpy(prob.ragged.indptr))
    qo = torch.from_numpy(prob.qo_indptr)
    q = torch.from_numpy(prob.q).half()
    plan = att.plan_prefill(qo, ragged, D)
    for wrong in (paged.pages, (k, v)):
        name = type(wrong).__name__
        with pytest.raises(AttentionArgumentError, match=rf"kv: expected PagedKV or RaggedKV, got {name}"):
            att.plan_prefill(qo, wrong, D)
        with pytest.raises(AttentionArgumentError, match=rf"kv: expected PagedKV or RaggedKV, got {name}"):
            att.prefill(q, wrong, qo, plan=plan)
        with pytest.raises(AttentionArgumentError, match=rf"kv: expected PagedKV, got {name}"):
            att.plan_decode(wrong, 8, D, num_chunks=1)
    with pytest.raises(AttentionArgumentError, match=r"kv: expected PagedKV, got RaggedKV"):
        att.decode(q[:2], ragged, plan=att.plan_decode(paged, 8, D, num_chunks=1))


def test_float_key_positions_bound_the_requests(att, rng):
    """ALiBi's hook takes key positions as floats in the prefill templates (approximate hook math): the plan
    refuses a request of 2^23 keys or more by name, and serves one just below."""
    assert att.manifest["float_position_limit"] == 2 ** 23
    prob = random_problem(rng, [1], [5], 8, 2, D, page_size=16)
    pages = torch.from_numpy(prob.paged.pages).half()
    qo = torch.tensor([0, 1], dtype=torch.int32)
    for n_pages, refused in ((2 ** 19, True), (2 ** 19 - 1, False)):  # 16-key pages: 2^23 keys, one page fewer
        kv = PagedKV(pages, torch.tensor([0, n_pages], dtype=torch.int32), torch.zeros(n_pages, dtype=torch.int32),
                     torch.tensor([16], dtype=torch.int32))
        if refused:
            with pytest.raises(AttentionArgumentError, match=r"kv: a request of 8388608 keys; .* hook_math='precise'"):
                att.plan_prefill(qo, kv, D)
        else:
            assert att.plan_prefill(qo, kv, D).batch_size == 1

def test_group_above_the_build_bound_is_named(att, rng):
    prob = random_problem(rng, [1], [5], 16, 1, D, page_size=16)
    kv = _paged(prob)
    plan = att.plan_decode(kv, 16, D, num_chunks=1)
    assert plan.num_chunks == 1 and tuple(plan.part_o.shape) == (1, 1, 1, D)  # no split: no partial states
    assert plan.launch == DecodeLaunch(plan.part_o, plan.part_lse, 1, DecodeBackend.AUTO)  # no device plan
    cuda_cores = att.plan_decode(kv, 16, D, num_chunks=1, tensor_cores=False)  # (tensor cores serve any group)
    with pytest.raises(AttentionArgumentError, match=r"group size 16 .* above this library's max_group_size=8, "
                                                     r"which bounds the CUDA-core template"):
        att.decode(torch.from_numpy(prob.q).half(), kv, plan=cuda_cores, params={"alibi_slopes": torch.ones(16)})


def test_prefill_plan_is_tied_to_its_qo_indptr(att, rng):
    prob = random_problem(rng, [3, 2], [5, 6], 8, 2, D)
    ragged = RaggedKV(torch.from_numpy(prob.ragged.k).half(), torch.from_numpy(prob.ragged.v).half(),
                      torch.from_numpy(prob.ragged.indptr))
    qo = torch.from_numpy(prob.qo_indptr)
    plan = att.plan_prefill(qo, ragged, D)
    other = torch.tensor([0, 1, 5], dtype=torch.int32)  # same total, a longer request
    with pytest.raises(AttentionArgumentError, match=r"plan: made from another qo_indptr"):
        att.prefill(torch.from_numpy(prob.q).half(), ragged, other, plan=plan, params={"alibi_slopes": torch.ones(8)})


def _decode_args(kv, query, **over):
    """The decode entry's arguments in its order (csrc/entry_decode.h), host tensors."""
    n, hq = query.shape[0], query.shape[1]
    part = torch.empty((1, 1, 1, D), dtype=torch.float32)
    args = dict(q=query, pages=kv.pages, indices=kv.indices, indptr=kv.indptr, last_page_len=kv.last_page_len,
                o=torch.empty_like(query), lse=torch.empty((n, hq), dtype=torch.float32), sm_scale=0.125)
    launch = DecodeLaunch(part, part[0, 0, 0, :1], 1, DecodeBackend.TENSOR_CORES)
    args.update(zip(("part_o", "part_lse", "num_chunks", "backend", "plan", "plan_ctas", "plan_merges",
                     "kv_heads_per_cta"),
                    launch.ffi_args()))
    args["alibi_slopes"] = torch.ones(hq)
    args.update(over)
    return list(args.values())


def test_entry_functions_name_themselves_in_argument_errors(att, rng):
    """The exported functions called directly (no Python checks in front), without a GPU: a wrong argument
    kind is refused by TVM-FFI against the typed signature, a wrong element type or a host tensor by the
    entry, each error naming the exported function."""
    prob = random_problem(rng, [1, 1], [20, 7], 8, 2, D, page_size=16)
    kv, q = _paged(prob), torch.from_numpy(prob.q).half()
    decode = att.function("batch_decode_paged_nhd", "float16", D)
    name = "batch_decode_paged_nhd_f16_d64"
    with pytest.raises(TypeError, match=rf"{name}: q: expected element type float16, got float32"):
        decode(*_decode_args(kv, q, q=q.float()))
    with pytest.raises(TypeError, match=rf"{name}: indptr: expected element type int32, got int64"):
        decode(*_decode_args(kv, q, indptr=kv.indptr.long()))
    with pytest.raises(TypeError, match=rf"Mismatched type on argument #10 when calling: `{name}\(.*Optional"):
        decode(*_decode_args(kv, q, num_chunks="two"))
    with pytest.raises(TypeError, match=rf"Mismatched type on argument #12 when calling: `{name}"):
        decode(*_decode_args(kv, q, plan=3))
    strided = torch.zeros(2 * kv.indptr.numel(), dtype=torch.int32)[::2]
    strided.copy_(kv.indptr)
    with pytest.raises(ValueError, match=rf"{name}: indptr: must be contiguous"):
        decode(*_decode_args(kv, q, indptr=strided))  # an index array is read at element offsets
    with pytest.raises(ValueError, match=rf"{name}: q: expected a CUDA tensor"):
        decode(*_decode_args(kv, q))  # the right kinds and types: the plan may be None
    with pytest.raises(TypeError, match=r"Expected 17 but got 16 arguments"):
        decode(*_decode_args(kv, q)[:-1])  # the variant's alibi_slopes is part of the signature

    ragged = RaggedKV(torch.from_numpy(prob.ragged.k).half(), torch.from_numpy(prob.ragged.v).half(),
                      torch.from_numpy(prob.ragged.indptr))
    prefill = att.function("batch_prefill_ragged", "float16", D)
    qo = torch.from_numpy(prob.qo_indptr)
    plan = att.plan_prefill(qo, ragged, D, wide_tiles=False)
    assert plan.ffi_args() == (plan.max_qo_len, PrefillTileRows.ROWS_64, PrefillTemplate.AUTO, None, None, 0, None, None)
    assert plan.lengths is None  # no sm_90a in this library: no work order for the Hopper template
    with pytest.raises(AttentionArgumentError, match=r"hook_pass: variant 'alibi' has no key or query transform"):
        att.plan_prefill(qo, ragged, D, hook_pass=True)
    with pytest.raises(AttentionArgumentError, match=r"hook_pass: expected None, True or False, got 'yes'"):
        att.plan_prefill(qo, ragged, D, hook_pass="yes")
    with pytest.raises(AttentionArgumentError, match=r"template: 'hopper' needs a library built for sm_90a"):
        att.plan_prefill(qo, ragged, D, template="hopper")
    with pytest.raises(AttentionArgumentError, match=r"template: 'fa3' is not a prefill template"):
        att.plan_prefill(qo, ragged, D, template="fa3")
    args = [q, ragged.k, ragged.v, ragged.indptr, qo, torch.empty_like(q), torch.empty((q.shape[0], 8)), 0.125,
            *plan.ffi_args(), torch.ones(8)]
    with pytest.raises(TypeError, match=r"batch_prefill_ragged_f16_d64: k: expected element type float16, got "
                                        r"float32"):
        prefill(*args[:1], ragged.k.float(), *args[2:])
    with pytest.raises(ValueError, match=r"batch_prefill_ragged_f16_d64: q: expected a CUDA tensor"):
        prefill(*args)


def test_one_call_runs_on_one_gpu():
    """Tensors of a call on two GPUs are refused by name (stand-ins: the check reads .device alone)."""
    from types import SimpleNamespace

    from attngen.runtime.cuda import _check_on_device

    def on(index):
        return SimpleNamespace(detach=None, device=torch.device("cuda", index))

    _check_on_device([("q", on(1)), ("kv.indptr", on(1))], torch.device("cuda", 1))
    with pytest.raises(AttentionArgumentError, match=r"params\['slopes'\]: on cuda:0, q on cuda:1: one call runs on one"):
        _check_on_device([("q", on(1)), ("params['slopes']", on(0))], torch.device("cuda", 1))
    with pytest.raises(AttentionArgumentError, match=r"kv.indptr: must be a CUDA tensor"):
        _check_on_device([("kv.indptr", torch.zeros(2))], torch.device("cuda", 1))
