"""Ahead of time: attngen's PagedKVCache kernels compiled into a TVM model library.

The model library is built (tvm.compile + export_library), loaded back as a plain shared
library, and the Relax VM creates the cache from it; that cache gives the same results as the
run-time-built one and the float64 reference through prefill, append, forks, batch decode and
pop-n, and through token-tree steps. A variant whose tensors cannot be compiled in is refused.
"""
from dataclasses import replace

import pytest
import tvm

from attngen.tvm import export_model_library, paged_kv_cache_module
from attngen.variants import builtin

from .test_tvm_kv_cache import (MHA_SCRIPT, SHAPE, ReferenceCache, Semantics, _softcap, assert_close,
                                attngen_cache, kernel_cache, run_flow)  # noqa: F401


@pytest.mark.parametrize("rope_mode", ["none", "inline"])
def test_model_library_cache_matches_runtime_cache_and_reference(kernel_cache, tmp_path, rope_mode, rng):
    from tvm import relax

    variant = builtin("logits_softcap")
    params = {"soft_cap": 1.5}
    mod = paged_kv_cache_module(replace(SHAPE, rope_mode=rope_mode), variant, params=params)
    names = [gv.name_hint for gv in mod.get_global_vars()]
    assert "create_kv_cache" in names and "attngen_decode" in names and "attngen_merge_state" in names
    path = export_model_library(mod, tmp_path / "model.so")
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(path)), tvm.cpu())
    caches = {"model_library": vm["create_kv_cache"](),
              "runtime": attngen_cache(variant, kernel_cache, rope_mode=rope_mode, params=params)}
    outs = run_flow(caches, ReferenceCache(Semantics(logits=_softcap(1.5), inline_rope=rope_mode == "inline")),
                    MHA_SCRIPT, rng)
    assert_close(outs, "model_library", "runtime", 1e-6)
    assert_close(outs, "model_library", "reference", 2e-5)


def test_model_library_refuses_tensor_parameters():
    with pytest.raises(ValueError, match=r"variant 'alibi': tensor parameters \['alibi_slopes'\] cannot be compiled"):
        paged_kv_cache_module(SHAPE, builtin("alibi"))


def test_model_library_cache_serves_token_trees(tmp_path, rng):
    """The tree slots as PrimFuncs of a model library: tree steps, a tree extended before its commit (the paged
    tree slot, whose length_info is read through its DLTensor), commits, forks; against the float64 model."""
    from tvm import relax

    from .test_tvm_kv_cache_tree import TREE_SCRIPT, TreeReferenceCache, run_tree_flow

    path = export_model_library(paged_kv_cache_module(SHAPE), tmp_path / "model.so")
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(path)), tvm.cpu())
    outs = run_tree_flow({"model_library": vm["create_kv_cache"]()}, TreeReferenceCache(), TREE_SCRIPT, rng)
    assert_close(outs, "model_library", "reference", 2e-5)
