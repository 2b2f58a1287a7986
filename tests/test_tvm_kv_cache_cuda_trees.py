"""attngen's CUDA token-tree slots (speculative decoding), on a machine without a GPU.

- the CUDA cache's two tree slots are the library's tree functions, in both slot conventions and in a model
  library (no refusing host functions any more);
- the slot library (nvcc, sm_90a) holds tree kernel instances (``TvmTree`` traits), and with a layer window
  also the windowed tree instances of "mha_sliding" layers; no kernel its calls cannot reach on sm_90a (the
  CUDA-core decode, the mma.sync prefill of the other slots);
- the tree functions' refusals, which run before any CUDA call (the library loads without a driver): inline
  RoPE, malformed tree arrays, length_info [3, B] in a library without a layer window;
- the random token-tree scripts that the GPU tests run (tests/tvm_tree_model.py), on attngen's CPU cache
  against TVM's CPU kernels: they drive TVM's runtime through both tree slots.
(test_gpu_tvm_kv_cache_trees.py runs the CUDA tree slots on a GPU.)
"""
import re

import numpy as np
import pytest

from attngen.tvm import TREE_ROLES, CacheShape
from attngen.tvm.cuda import SLOT_FUNCTION_KINDS, attention_entries, slot_roles
from attngen.variants import builtin

from .conftest import requires_nvcc
from .test_tvm_kv_cache import SHAPE as CPU_SHAPE
from .test_tvm_kv_cache import assert_close, make_cache, tvm_kernels  # noqa: F401
from .test_tvm_kv_cache_cuda_windows import WINDOW, libraries  # noqa: F401  (the builds: none and WINDOW)
from .tvm_tree_model import random_parents, run_tree_script, tree_script

SHAPE = CacheShape(num_layers=2, num_qo_heads=8, num_kv_heads=2, head_dim=64, dtype="float16", page_size=16,
                   max_batch=8, max_total_tokens=2048, prefill_chunk=512)
RAGGED, PAGED = "tvm_prefill_ragged_tree_f16_d64", "tvm_prefill_paged_tree_f16_d64"


@pytest.mark.parametrize("convention", ["tirx", "flashinfer"])
def test_tree_slots_hold_the_librarys_tree_functions(convention):
    roles = slot_roles(lambda kind: kind)
    entries = attention_entries(roles, convention)
    assert {role: entries[role] for role in TREE_ROLES} == {
        "prefill_tree_mask_paged": ("tirx", "tvm_prefill_paged_tree"),
        "prefill_tree_mask": ("tirx", "tvm_prefill_ragged_tree")}
    assert SLOT_FUNCTION_KINDS["prefill_tree_mask"] == "tvm_prefill_ragged_tree"


def test_the_library_holds_tree_kernels_and_windowed_ones_only_with_a_window(libraries):
    for window, built in libraries.items():
        assert {RAGGED, PAGED} <= set(built.manifest["functions"])
        blob = (built.directory / "attention_d64_f16_tvm.o").read_bytes()
        assert b"TvmTree" in blob
        assert (b"TvmTreeINS_11TvmWindowed" in blob) == (window is not None)
        # an sm_90a-only build: every device it runs on holds a tensor-core decode tile and runs the Hopper
        # prefill, so no CUDA-core decode kernel is compiled in, and the mma.sync prefill for the tree
        # instances alone (csrc/prefill_dispatch.h launch_prefill_auto, decode_tc_fits_every_device)
        assert b"_ZN7attngen16decode_tc_kernelI" in blob and b"_ZN7attngen13decode_kernelI" not in blob
        assert b"_ZN7attngen21hopper_prefill_kernelI" in blob
        mma_sync = set(re.findall(rb"_ZN7attngen14prefill_kernelI[A-Za-z0-9_]+", blob))
        assert mma_sync and all(m.startswith(b"_ZN7attngen14prefill_kernelINS_7TvmTree") for m in mma_sync)


def _host(a):
    import tvm

    return tvm.runtime.tensor(np.ascontiguousarray(a))


def _i32(*v):
    return _host(np.array(v, np.int32))


def _paged_args(length_info, tree_indptr=(0, 3), order=((0, 3), (1, 2), (2, 3)), rotary_mode=0):
    """The paged tree slot's arguments (host tensors: every refusal comes before a CUDA call)."""
    q = np.zeros((3, 8, 64), np.float16)
    pages = np.zeros((2, 2, 2, 16, 64), np.float16)
    return (_host(q), _i32(0, 3), _host(pages), _i32(0, 1), _i32(1), _host(length_info), _i32(0), _i32(0, 1, 2),
            _host(q), _host(np.zeros((3, 8), np.float32)), rotary_mode, 1.0, 1e4, 0.125, _i32(*tree_indptr),
            _host(np.array(order, np.int32)))


def _ragged_args(tree_indptr=(0, 3), order=((0, 3), (1, 2), (2, 3)), rotary_mode=0):
    q = _host(np.zeros((3, 8, 64), np.float16))
    kv = _host(np.zeros((3, 2, 64), np.float16))
    return (q, _i32(0, 3), kv, kv, _i32(0, 3), _i32(0, 1, 1), _i32(*tree_indptr), _host(np.array(order, np.int32)),
            q, _host(np.zeros((3, 8), np.float32)), rotary_mode, 1.0, 1e4, 0.125)


def test_tree_functions_refuse_what_they_do_not_serve(libraries):
    from attngen.tvm.loading import load_library

    plain, windowed = (load_library(libraries[w].library) for w in (None, WINDOW))
    last = np.array([3], np.int32)
    three_rows = np.array([[3], [0], [0]], np.int32)
    with pytest.raises(Exception, match=f"{PAGED}: length_info \\[3, batch\\] .an 'mha_sliding' layer. needs tree "
                                        "kernels with the layer window; build the library with BuildConfig.tvm_window"):
        plain[PAGED](*_paged_args(three_rows))
    for lib in (plain, windowed):
        with pytest.raises(Exception, match=f"{PAGED}: rotary_mode 1 .inline RoPE. is not served"):
            lib[PAGED](*_paged_args(last, rotary_mode=1))
        with pytest.raises(Exception, match=f"{RAGGED}: rotary_mode 1 .inline RoPE. is not served"):
            lib[RAGGED](*_ragged_args(rotary_mode=1))
        with pytest.raises(Exception, match=r"tree_mn_indptr must be a contiguous int32 \[batch \+ 1\]"):
            lib[RAGGED](*_ragged_args(tree_indptr=(0, 1, 3)))
        with pytest.raises(Exception, match=r"tree_order must be a contiguous int32 \[tree nodes, 2\]"):
            lib[PAGED](*_paged_args(last, order=(0, 1, 2)))  # (an odd flat form)
        with pytest.raises(Exception, match="tree_mn_indptr and tree_order must be CUDA tensors"):
            lib[RAGGED](*_ragged_args())


@requires_nvcc
def test_model_library_module_puts_the_tree_functions_in_the_tree_slots(build_cache):
    """Ahead of time (sm_90a): the create call's tree slots name attngen's exported tree functions."""
    from attngen.tvm import paged_kv_cache_module

    text = paged_kv_cache_module(SHAPE, builtin("vanilla"), target="cuda", arch="sm_90a", cache=build_cache).script()
    for name in (RAGGED, PAGED):
        assert f'"attngen_{name}"' in text, name
    assert "refuse" not in text


def test_random_parents_branch():
    rng = np.random.default_rng(0)
    for n in range(2, 14):
        parents = random_parents(rng, n)
        assert parents[0] == -1 and all(-1 <= p < i for i, p in enumerate(parents))
        assert any(p != i - 1 for i, p in enumerate(parents))  # never a chain
    more = random_parents(rng, 5, first=7, before=7)
    assert all(-1 <= p < 7 + i for i, p in enumerate(more))


def test_the_gpu_tests_tree_scripts_run_on_the_cpu_cache_and_match_tvms_kernels(tvm_kernels, build_cache, rng):
    """The GPU tests' random scripts (here at the CPU tests' shape): attngen's CPU cache and TVM's CPU kernels
    agree through both tree slots, so the scripts are valid ones for TVM's runtime."""
    import tvm

    from attngen.tvm import create_paged_kv_cache

    caches = {"attngen": (create_paged_kv_cache(CPU_SHAPE, cache=build_cache), tvm.cpu(), "float32"),
              "tvm": (make_cache(tvm_kernels, tvm_kernels["merge"]), tvm.cpu(), "float32")}
    script = tree_script(rng)
    outs = run_tree_script(caches, CPU_SHAPE, script, rng)
    assert_close(outs, "attngen", "tvm", 1e-5)
