"""Llama- and Gemma-2-shaped models (tvm.relax.frontend.nn, random weights) compiled for LLVM into model
libraries whose KV cache is attngen's, run by the Relax VM through prefill, decode, a fork and a speculative
token-tree step: logits against the same models on TVM's own kernels and against a float64 forward."""
import runpy
from pathlib import Path

EXAMPLE = Path(__file__).parent.parent / "examples" / "tvm_model_e2e.py"


def test_models_on_attngen_cache_match_tvm_kernels_and_float64(build_cache):
    results = runpy.run_path(str(EXAMPLE))["main"](decode_steps=3, cache=build_cache)
    assert set(results) == {"llama vs float64", "llama vs TVM's kernels", "gemma2 vs float64",
                            "gemma2 vs TVM's kernels"}
    assert all(r["out_err"] < 1e-4 for r in results.values()), results
