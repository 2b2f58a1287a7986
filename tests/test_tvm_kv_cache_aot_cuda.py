"""Ahead of time on CUDA, without a GPU: attngen's TVM slot functions become one object file that a TVM
model library links statically.

The object exports only the prefixed TVM-FFI functions (the CUDA runtime and every helper are
local), the model library built for sm_90a by tvm.compile + export exports them, carries the
kernels as fatbins and needs no libcudart; configurations the CUDA slots cannot serve are refused
when the module is built. (test_gpu_tvm_kv_cache.py runs such a library on the GPU.)
"""
import subprocess
from dataclasses import replace

import pytest

from attngen.tvm import CacheShape, export_model_library, paged_kv_cache_module
from attngen.variants import builtin

from .conftest import requires_nvcc

SHAPE = CacheShape(num_layers=2, num_qo_heads=8, num_kv_heads=2, head_dim=64, dtype="float16", page_size=16,
                   max_batch=8, max_total_tokens=2048, prefill_chunk=512)
CUDA = dict(target="cuda", arch="sm_90a")


def _symbols(path, dynamic=False) -> dict[str, str]:
    """name -> nm type letter of the defined symbols."""
    out = subprocess.run(["nm", "--defined-only", *(["-D"] if dynamic else []), str(path)], capture_output=True,
                         text=True, check=True).stdout
    return {p[2]: p[1] for p in (line.split() for line in out.splitlines()) if len(p) == 3}


@requires_nvcc
def test_slot_object_exports_only_prefixed_functions(build_cache):
    from attngen.tvm.cuda import slot_object

    # (the variant and shape of the model-library tests below: one CUDA build serves all three)
    obj, roles = slot_object(builtin("vanilla"), head_dim=64, dtype="float16", arch="sm_90a",
                             name_prefix="layer0", cache=build_cache)
    syms = _symbols(obj)
    exported = sorted(n for n, t in syms.items() if t.isupper() and n.startswith("__tvm_ffi_"))
    names = [roles[r] for r in ("prefill_ragged", "prefill", "decode", "prefill_sliding_window",
                                "decode_sliding_window", "prefill_tree_mask", "prefill_tree_mask_paged", "merge")]
    names += [x for r in ("fi_prefill_ragged", "fi_prefill", "fi_decode") for x in roles[r]]
    assert exported == sorted({f"__tvm_ffi_{n}" for n in names})
    assert all(n.startswith("layer0_") for n in names)
    cudart = [n for n in syms if n.startswith("cudaLaunchKernel") or n == "cudaMalloc"]
    assert cudart and all(syms[n].islower() for n in cudart)  # the static CUDA runtime is inside, and local


@requires_nvcc
@pytest.mark.parametrize("convention,static_libstdcxx", [("tirx", True), ("flashinfer", False)])
def test_model_library_links_attngen_statically(build_cache, tmp_path, monkeypatch, convention, static_libstdcxx):
    if static_libstdcxx:  # a toolchain that links the (non-PIC) libstdc++.a unless told otherwise
        wrapper = tmp_path / "gxx-static"
        wrapper.write_text('#!/bin/sh\nexec g++ -static-libstdc++ "$@"\n')
        wrapper.chmod(0o755)
        monkeypatch.setenv("CXX", str(wrapper))
    mod = paged_kv_cache_module(SHAPE, builtin("vanilla"), convention=convention, cache=build_cache, **CUDA)
    assert len(mod.attrs["external_mods"]) == 1
    path = export_model_library(mod, tmp_path / "model.so", **CUDA)
    syms = _symbols(path, dynamic=True)
    wanted = ["attngen_tvm_fi_decode_run_f16_d64", "attngen_tvm_fi_decode_plan_f16_d64"] if convention == "flashinfer" \
        else ["attngen_tvm_decode_f16_d64", "attngen_tvm_prefill_paged_f16_d64"]
    trees = ["attngen_tvm_prefill_ragged_tree_f16_d64", "attngen_tvm_prefill_paged_tree_f16_d64"]  # both conventions
    for name in wanted + trees + ["attngen_merge_state_inplace_f16", "attngen_tvm_transpose_append"]:
        assert syms.get(f"__tvm_ffi_{name}") == "T", name
    assert not any(n.startswith("cuda") for n in syms)  # the CUDA runtime stays private to attngen's object
    ldd = subprocess.run(["ldd", str(path)], capture_output=True, text=True).stdout
    assert "libcudart" not in ldd
    assert "libstdc++.so" in ldd  # the shared C++ runtime, never the archive
    blob = path.read_bytes()
    assert blob.count(bytes.fromhex("50ed55ba")) >= 2  # fatbins: attngen's kernels and TVM's own


@requires_nvcc
def test_a_whole_model_compiles_for_cuda_with_attngens_cache(build_cache, tmp_path):
    """examples/tvm_model_e2e.py's Llama-shaped model in float16 (nn.Module, fused qkv, the cache's RoPE) with
    attngen's CUDA cache, compiled for sm_90a into one model library on a machine without a GPU
    (test_gpu_tvm_kv_cache.py runs it, beside the same model on TVM's own CUDA kernels)."""
    import runpy
    from pathlib import Path

    example = runpy.run_path(str(Path(__file__).parent.parent / "examples" / "tvm_model_e2e.py"))
    cfg = example["llama"](64)
    mod, names = example["build_model"](cfg, "attngen", build_cache, "cuda", "sm_90a")
    assert names[0] == "embed.weight" and len(names) == 3 + 7 * cfg.num_layers
    assert len(mod.attrs["external_mods"]) == 1  # attngen's object, linked statically
    path = export_model_library(mod, tmp_path / "llama.so", **CUDA)
    syms = _symbols(path, dynamic=True)
    for name in ("attngen_tvm_decode_f16_d64", "attngen_tvm_prefill_paged_f16_d64", "attngen_merge_state_inplace_f16"):
        assert syms.get(f"__tvm_ffi_{name}") == "T", name
    assert "libcudart" not in subprocess.run(["ldd", str(path)], capture_output=True, text=True).stdout


def test_model_library_refuses_what_the_cuda_slots_cannot_serve():
    with pytest.raises(ValueError, match="rope_mode 'inline'.*convention='tirx'"):
        paged_kv_cache_module(replace(SHAPE, rope_mode="inline"), convention="flashinfer", **CUDA)
    with pytest.raises(ValueError, match="support_sliding_window=True makes it inline"):
        paged_kv_cache_module(replace(SHAPE, support_sliding_window=True, rope_mode="normal"), convention="flashinfer",
                              **CUDA)
    with pytest.raises(ValueError, match="convention 'fa3'"):
        paged_kv_cache_module(SHAPE, convention="fa3", **CUDA)
    with pytest.raises(ValueError, match="arch: a CUDA model library is built for a named GPU arch"):
        paged_kv_cache_module(SHAPE, target="cuda")
    with pytest.raises(Exception, match=r"variant 'alibi', hook 'logits_transform': reads \['kv_pos', 'qo_pos'\]"):
        paged_kv_cache_module(SHAPE, builtin("alibi"), **CUDA)  # refused before anything is compiled
    with pytest.raises(ValueError, match=r"params: \['window'\] are not parameters of variant 'vanilla'"):
        paged_kv_cache_module(SHAPE, params={"window": 3}, **CUDA)
    with pytest.raises(ValueError, match="name_prefix"):
        from attngen.codegen.cuda_object import build_slot_object

        build_slot_object([], [], gencodes=[], prefix="not an identifier")
