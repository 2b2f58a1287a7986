"""attngen's CUDA slots with TVM's inline RoPE (RopeMode INLINE, rotary_mode 1), on a machine without a GPU.

- which caches get a library with RoPE kernels (``CacheShape.inline_rope``: RopeMode INLINE, or any RoPE with
  per-sequence windows), ``BuildConfig.tvm_rope``'s checks, and the "flashinfer" convention's refusal (TVM
  passes its run functions no positions);
- the slot library built for inline RoPE and a layer window (nvcc, sm_90a): ``kInlineRope`` compiled in, the
  RoPE kernel instances (``TvmRope``) in its object and in no other library's, and the refusals, which run
  before any CUDA call (the library loads without a driver): rotary_mode 1 in a library without RoPE kernels,
  rotary_mode 2, and inline RoPE in the token-tree functions (as TVM's cache refuses it);
- the float64 model the GPU tests compare with (tests/tvm_window_model.py, with RoPE): it matches attngen's
  CPU cache, which serves inline RoPE (checked against TVM's CPU kernels), and its RoPE bites.
(test_gpu_tvm_kv_cache_rope.py runs the CUDA slots on a GPU.)
"""
from dataclasses import replace

import numpy as np
import pytest

from attngen.ir import ConfigError
from attngen.schedules import BuildConfig
from attngen.tvm import create_paged_kv_cache
from attngen.tvm.cuda import check_cuda_shape
from attngen.variants import builtin

from .conftest import requires_nvcc
from .tvm_window_model import LAYER_SCRIPT, LAYERS, PER_SEQUENCE, SEQUENCE_SCRIPT, SHAPE, CacheModel, max_err, \
    run_script

ROPE = dict(rope_mode="inline", rope_scale=0.75, rope_theta=5e3)  # not TVM's defaults: the call's values count
WINDOW = 20  # as test_tvm_kv_cache_cuda_windows.py's: its windowed library is this test's rope=False build


def test_inline_rope_caches_are_served_in_the_tirx_convention_only():
    for shape in (replace(SHAPE, rope_mode="inline"), replace(PER_SEQUENCE, rope_mode="normal"),
                  replace(LAYERS, rope_mode="inline")):
        assert shape.inline_rope
        check_cuda_shape(shape, "tirx")
        with pytest.raises(ValueError, match="no token positions.*use convention='tirx'"):
            check_cuda_shape(shape, "flashinfer")
    check_cuda_shape(replace(SHAPE, rope_mode="normal"), "flashinfer")  # RoPE before the cache: no slot applies it


def test_build_config_takes_rope_for_tvm_slot_builds_only():
    tvm_build = dict(target="cuda", head_dims=(64,), dtypes=("float16",), archs=("sm_90a",), kernels=("tvm",))
    assert BuildConfig(**tvm_build, tvm_rope=True).tvm_rope
    assert "tvm_rope" not in BuildConfig(**tvm_build).key()  # builds without RoPE keep their cache keys
    with pytest.raises(ConfigError, match="tvm_rope"):
        BuildConfig("cuda", (64,), ("float16",), ("sm_90a",), tvm_rope=True)


@pytest.fixture(scope="module")
def libraries(build_cache):
    """rope -> the vanilla slot library's build (sm_90a, head_dim 64, float16, a layer window), with and without
    RoPE kernels."""
    if requires_nvcc.args[0]:
        pytest.skip("nvcc is not on PATH")
    from attngen.tvm.cuda import build_slot_library

    return {rope: build_slot_library(builtin("vanilla"), head_dim=64, dtype="float16", params=None, arch="sm_90a",
                                     window=WINDOW, rope=rope, cache=build_cache) for rope in (False, True)}


def test_the_rope_build_holds_rope_kernels_and_only_it(libraries):
    for rope, built in libraries.items():
        source = (built.directory / "attention_d64_f16_tvm.cu").read_text()
        assert f"static constexpr bool kInlineRope = {'true' if rope else 'false'};" in source
        obj = (built.directory / "attention_d64_f16_tvm.o").read_bytes()
        assert (b"TvmRope" in obj) == rope


def _host(a):
    import tvm

    return tvm.runtime.tensor(np.ascontiguousarray(a))


def _paged_args(rotary_mode, length_info=(3,)):
    """The paged prefill's arguments (host tensors: every refusal comes before a CUDA call)."""
    q = np.zeros((3, 8, 64), np.float16)
    pages = np.zeros((2, 2, 2, 16, 64), np.float16)
    i32 = lambda *v: _host(np.array(v, np.int32))  # noqa: E731
    return (_host(q), i32(0, 3), _host(pages), i32(0, 1), i32(1), _host(np.array(length_info, np.int32)), i32(0),
            i32(0, 1, 2), _host(q), _host(np.zeros((3, 8), np.float32)), 1, rotary_mode, 1.0, 1e4, 0.125)


def test_rope_functions_refuse_what_they_do_not_serve(libraries):
    from attngen.tvm.loading import load_library

    plain, rope = (load_library(libraries[r].library) for r in (False, True))
    with pytest.raises(Exception, match="tvm_prefill_paged_f16_d64: rotary_mode 1 .inline RoPE. is not served by this "
                                        "library: it was built without RoPE kernels"):
        plain["tvm_prefill_paged_f16_d64"](*_paged_args(1))
    with pytest.raises(Exception, match="tvm_prefill_paged_f16_d64: rotary_mode 2 is not TVM's"):
        rope["tvm_prefill_paged_f16_d64"](*_paged_args(2))
    args = _paged_args(1)
    decode_args = (args[0], *args[2:10], 1, 1.0, 1e4, 0.125)
    with pytest.raises(Exception, match="tvm_decode_sliding_window_f16_d64: rotary_mode 1 .inline RoPE. is not served"):
        plain["tvm_decode_sliding_window_f16_d64"](*decode_args)
    tree = (_host(np.array([0, 3], np.int32)), _host(np.zeros((3, 2), np.int32)))
    paged_tree_args = (*args[:10], 1, 1.0, 1e4, 0.125, *tree)  # (no causal flag)
    with pytest.raises(Exception, match="tvm_prefill_paged_tree_f16_d64: rotary_mode 1 .inline RoPE. is not served by "
                                        "attngen's token-tree slots .TVM's cache refuses"):
        rope["tvm_prefill_paged_tree_f16_d64"](*paged_tree_args)


SCRIPTS = {"plain": (SHAPE, LAYER_SCRIPT), "layers": (LAYERS, LAYER_SCRIPT),
           "sequences": (replace(PER_SEQUENCE, rope_mode="normal"), SEQUENCE_SCRIPT)}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_the_gpu_tests_rope_model_matches_attngens_cpu_cache_and_rope_bites(build_cache, rng, name):
    shape, script = SCRIPTS[name]
    shape = replace(shape, dtype="float32", **(ROPE | {"rope_mode": shape.rope_mode or "inline"}))
    assert shape.inline_rope
    seed = int(rng.integers(1 << 31))
    cpu = create_paged_kv_cache(shape, cache=build_cache)
    outs = run_script({"attngen cpu": cpu}, CacheModel(shape), script, np.random.default_rng(seed), device="cpu")
    assert max_err(outs, "attngen cpu", "reference") < 2e-5
    plain = run_script({}, CacheModel(replace(shape, rope_mode="none")), script, np.random.default_rng(seed),
                       device="cpu")
    assert max_err({"rope": outs["reference"], "none": plain["reference"]}, "rope", "none") > 0.05
