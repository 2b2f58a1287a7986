"""Ahead of time: attngen's PagedKVCache kernels compiled into a TVM model library.

The model library is built (tvm.compile + export_library), loaded back as a plain shared
library, and the Relax VM creates the cache from it; that cache gives the same results as the
run-time-built one and the float64 reference through prefill, append, forks, batch decode and
pop-n, and through token-tree steps; a variant's tensor parameters become constants of the model.
"""
from dataclasses import replace

import numpy as np
import pytest
import tvm

from attngen.tvm import export_model_library, paged_kv_cache_module
from attngen.variants import builtin

from .test_tvm_kv_cache import (MHA_SCRIPT, SHAPE, ReferenceCache, Semantics, _alibi, _softcap, assert_close,
                                attngen_cache, kernel_cache, max_err, run_flow)  # noqa: F401


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


def test_model_library_binds_tensor_parameters(kernel_cache, tmp_path, rng):
    """ALiBi's slopes (a tensor parameter) as constants of the model library, bound to its slot functions by the
    model's own binding function: the same results as the run-time cache (which binds them per call from Python)
    and the float64 reference, and clearly not vanilla's. A second model with other slopes differs."""
    from tvm import relax

    variant = builtin("alibi")
    slopes = (2.0 ** -np.arange(1, SHAPE.num_qo_heads + 1)).astype("float32")
    mod = paged_kv_cache_module(SHAPE, variant, params={"alibi_slopes": slopes})
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(export_model_library(mod, tmp_path / "m.so"))), tvm.cpu())
    other = paged_kv_cache_module(SHAPE, variant, params={"alibi_slopes": slopes[::-1].copy()})
    vm2 = relax.VirtualMachine(tvm.runtime.load_module(str(export_model_library(other, tmp_path / "o.so"))),
                               tvm.cpu())
    caches = {"model_library": vm["create_kv_cache"](), "other": vm2["create_kv_cache"](),
              "runtime": attngen_cache(variant, kernel_cache, params={"alibi_slopes": slopes})}
    seed = int(rng.integers(1 << 31))
    outs = run_flow(caches, ReferenceCache(Semantics(logits=_alibi(slopes))), MHA_SCRIPT, np.random.default_rng(seed))
    assert_close(outs, "model_library", "runtime", 1e-6)
    assert_close(outs, "model_library", "reference", 2e-5)
    vanilla = run_flow({}, ReferenceCache(Semantics()), MHA_SCRIPT, np.random.default_rng(seed))["reference"]
    assert max_err(outs["model_library"], vanilla) > 0.05
    assert max_err(outs["model_library"], outs["other"]) > 0.05


def test_model_library_checks_tensor_parameters_when_emitted():
    with pytest.raises(ValueError, match="alibi_slopes"):
        paged_kv_cache_module(SHAPE, builtin("alibi"))  # no value given, no default
    with pytest.raises(ValueError, match="alibi_slopes"):
        paged_kv_cache_module(SHAPE, builtin("alibi"), params={"alibi_slopes": np.ones(3, "float32")})


def test_model_library_cache_serves_token_trees(tmp_path, rng):
    """The tree slots as PrimFuncs of a model library: tree steps, a tree extended before its commit (the paged
    tree slot, whose length_info is read through its DLTensor), commits, forks; against the float64 model."""
    from tvm import relax

    from .test_tvm_kv_cache_tree import TREE_SCRIPT, TreeReferenceCache, run_tree_flow

    path = export_model_library(paged_kv_cache_module(SHAPE), tmp_path / "model.so")
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(path)), tvm.cpu())
    outs = run_tree_flow({"model_library": vm["create_kv_cache"]()}, TreeReferenceCache(), TREE_SCRIPT, rng)
    assert_close(outs, "model_library", "reference", 2e-5)
