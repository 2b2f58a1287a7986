"""GPU: TVM's PagedKVCache on CUDA with attngen's slots running a variant with tensor parameters.

``head_scaled()`` (tests/tvm_head_scale.py: logits times head_scale[qo_head] * kv_scale[kv_head] / temperature)
through create_paged_kv_cache(target="cuda") in both slot conventions: prefill, decode (keys split and merged) and a
fork against the float64 model of the cache; head_scale given as a torch CUDA tensor (shared with the cache, so
changing it in place changes the next calls' outputs: no stale copy), kv_scale as a NumPy array (copied to the GPU
once), temperature compiled in; and the same variant in a model library, its tensors constants of the model.
The slot functions called directly refuse a tensor sized for other heads.
(test_tvm_kv_cache_cuda_tensor_params.py builds the library and checks the model without a GPU.)
"""
from __future__ import annotations

import copy

import numpy as np
import pytest

from .tvm_head_scale import SCRIPT, SCRIPT_AFTER, ScaledModel, head_factors, head_scaled
from .tvm_window_model import SHAPE, CacheModel, max_err, run_script

pytestmark = pytest.mark.gpu

HQ, HKV, D = SHAPE.num_qo_heads, SHAPE.num_kv_heads, SHAPE.head_dim
KV_SCALE = np.array([1.5, 0.75], np.float32)
TEMPERATURE = 0.8


def _differ(a: list, b: list) -> float:
    return max_err({"a": a, "b": b}, "a", "b")


@pytest.mark.parametrize("convention", ["tirx", "flashinfer"])
def test_cuda_cache_with_tensor_parameters_matches_reference(build_cache, rng, convention):
    import torch

    from attngen.tvm import create_paged_kv_cache

    head_scale = torch.linspace(0.5, 2.0, HQ, dtype=torch.float32, device="cuda")
    cache = create_paged_kv_cache(SHAPE, head_scaled(), target="cuda", convention=convention, cache=build_cache,
                                  params={"head_scale": head_scale, "kv_scale": KV_SCALE, "temperature": TEMPERATURE})
    model = ScaledModel(SHAPE, head_factors(head_scale.cpu().numpy(), KV_SCALE, TEMPERATURE))
    seed = int(rng.integers(1 << 31))
    outs = run_script({"attngen": cache}, model, SCRIPT, np.random.default_rng(seed))
    assert max_err(outs, "attngen", "reference") < 2e-2
    plain = run_script({}, CacheModel(SHAPE), SCRIPT, np.random.default_rng(seed))
    assert _differ(outs["attngen"], plain["reference"]) > 0.05  # the scales bite

    # the cache reads the caller's tensor at every call: an in-place change reaches the next step
    stale = copy.deepcopy(model)
    head_scale.copy_(torch.linspace(2.5, 0.25, HQ, device="cuda"))
    torch.cuda.synchronize()
    model.factors = head_factors(head_scale.cpu().numpy(), KV_SCALE, TEMPERATURE)
    seed = int(rng.integers(1 << 31))
    after = run_script({"attngen": cache}, model, SCRIPT_AFTER, np.random.default_rng(seed))
    assert max_err(after, "attngen", "reference") < 2e-2
    old = run_script({}, stale, SCRIPT_AFTER, np.random.default_rng(seed))
    assert _differ(after["attngen"], old["reference"]) > 0.05


def test_cuda_model_library_binds_tensor_parameters(build_cache, rng, tmp_path):
    """Ahead of time: the tensors as constants of a model library (copied to the GPU at the first call by the
    model's binding function), the cache created by the Relax VM from that library alone; against the float64
    model."""
    import torch
    import tvm
    from tvm import relax

    from attngen.runtime.cuda import current_arch
    from attngen.tvm import export_model_library, paged_kv_cache_module

    head_scale = np.linspace(0.5, 2.0, HQ).astype(np.float32)
    arch = current_arch()
    mod = paged_kv_cache_module(SHAPE, head_scaled(), target="cuda", arch=arch, cache=build_cache,
                                params={"head_scale": head_scale, "kv_scale": KV_SCALE, "temperature": TEMPERATURE})
    path = export_model_library(mod, tmp_path / "model.so", target="cuda", arch=arch)
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(path)), tvm.cuda())
    model = ScaledModel(SHAPE, head_factors(head_scale, KV_SCALE, TEMPERATURE))
    seed = int(rng.integers(1 << 31))
    outs = run_script({"attngen": vm["create_kv_cache"]()}, model, SCRIPT, np.random.default_rng(seed))
    torch.cuda.synchronize()
    assert max_err(outs, "attngen", "reference") < 2e-2
    plain = run_script({}, CacheModel(SHAPE), SCRIPT, np.random.default_rng(seed))
    assert _differ(outs["attngen"], plain["reference"]) > 0.05  # the scales bite


def test_slot_functions_refuse_a_tensor_sized_for_other_heads(build_cache, rng):
    import torch

    from attngen.tvm.cuda import cuda_slot_functions

    slots = cuda_slot_functions(head_scaled(), head_dim=D, dtype="float16", params={"temperature": TEMPERATURE},
                                cache=build_cache)
    cuda = lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda()  # noqa: E731
    q = cuda(rng.standard_normal((2, HQ, D)).astype(np.float16))
    pages = cuda(rng.standard_normal((2, 2, HKV, 16, D)).astype(np.float16))
    i32 = lambda *v: cuda(np.array(v, np.int32))  # noqa: E731
    o = torch.full(q.shape, float("nan"), dtype=torch.float16, device="cuda")
    lse = torch.full(q.shape[:2], float("nan"), device="cuda")
    args = (q, pages, i32(0, 1, 2), i32(0, 1), i32(3, 5), i32(0, 0), i32(2, 4), o, lse, 0, 1.0, 1e4, D ** -0.5)
    kv_scale = cuda(KV_SCALE)
    with pytest.raises(Exception, match="tvm_decode_f16_d64: tensor parameter 'head_scale': dim 0 .num_qo_heads. is "
                                        "4, must be the call's num_qo_heads 8"):
        slots["decode"](*args, cuda(np.ones(4, np.float32)), kv_scale)
    slots["decode"](*args, cuda(np.ones(HQ, np.float32)), kv_scale)  # the right sizes: runs
    torch.cuda.synchronize()
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()


def test_tirx_decode_split_inside_a_cuda_graph(build_cache, rng):
    """The "tirx" decode splits a few long requests over the device (no key lengths on the host: even chunks) with
    its partial states in a scratch buffer; captured into a CUDA graph (PyTorch's, as TVM's decode graphs capture
    it), the scratch is the graph's own stream-ordered allocation, since cudaMalloc may not run while a stream is
    captured: the replay gives the bits of the call outside the graph, for other keys refilled in place."""
    import torch

    from attngen.tvm.cuda import cuda_slot_functions

    slots = cuda_slot_functions(head_scaled(), head_dim=D, dtype="float16", params={"temperature": TEMPERATURE},
                                cache=build_cache)
    cuda = lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda()  # noqa: E731
    batch, pages_each = 2, 40  # 640 keys a request over 2 KV heads: several chunks each
    q = cuda(rng.standard_normal((batch, HQ, D)).astype(np.float16))
    pages = cuda(rng.standard_normal((batch * pages_each, 2, HKV, 16, D)).astype(np.float16))
    i32 = lambda a: cuda(np.asarray(a, np.int32))  # noqa: E731
    indptr, indices = i32([0, pages_each, 2 * pages_each]), i32(rng.permutation(batch * pages_each))
    last, zeros = i32([16, 9]), i32([0] * batch)
    o = torch.full(q.shape, float("nan"), dtype=torch.float16, device="cuda")
    lse = torch.full(q.shape[:2], float("nan"), device="cuda")
    extras = (cuda(np.linspace(0.5, 1.5, HQ).astype(np.float32)), cuda(KV_SCALE))

    def call():
        slots["decode"](q, pages, indptr, indices, last, zeros, zeros, o, lse, 0, 1.0, 1e4, D ** -0.5, *extras)

    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        call()  # captured first: the per-device scratch need not exist yet
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(2):
        pages.normal_()
        graph.replay()
        torch.cuda.synchronize()
        got_o, got_lse = o.clone(), lse.clone()
        o.fill_(float("nan"))
        call()
        torch.cuda.synchronize()
        assert torch.isfinite(got_o).all() and torch.equal(got_o, o) and torch.equal(got_lse, lse)
