"""attngen's CUDA slots with TVM's sliding windows, on a machine without a GPU.

- which build a cache's sliding-window slots get (``slot_window``: the layer window of "mha_sliding"
  layers, 0 for per-sequence windows, none for a cache without windows), and what is refused when the
  cache is made (per-sequence windows turn TVM's RoPE inline, which the "flashinfer" convention cannot serve);
- the slot library built for a layer window (nvcc, sm_90a): its sliding-window functions compiled
  with the window and the windowed kernel instances, a library without windows free of them, and
  the functions' refusals, which run before any CUDA call (the library loads without a driver);
- a model library whose layers include a "mha_sliding" one, compiled for sm_90a with attngen's cache;
- the float64 model of TVM's cache that the GPU tests compare with (tests/tvm_window_model.py), on
  their scripts: it matches attngen's CPU cache (whose windows were checked against TVM's CPU kernels)
  and its windows bite.
(test_gpu_tvm_kv_cache_windows.py runs the CUDA slots on a GPU.)
"""
from dataclasses import replace

import numpy as np
import pytest

from attngen.ir import ConfigError
from attngen.schedules import BuildConfig
from attngen.tvm import CacheShape, create_paged_kv_cache, paged_kv_cache_module
from attngen.tvm.cuda import slot_window
from attngen.variants import builtin

from .conftest import requires_nvcc
from .tvm_window_model import FORK_SCRIPT, LAYER_SCRIPT, LAYERS, PER_SEQUENCE, SEQUENCE_SCRIPT, CacheModel, max_err, \
    run_script

SHAPE = CacheShape(num_layers=2, num_qo_heads=8, num_kv_heads=2, head_dim=64, dtype="float16", page_size=16,
                   max_batch=8, max_total_tokens=2048, prefill_chunk=512)
# the window of examples/tvm_model_e2e.py's cuda_model(): these libraries are the build that model links
# (test_a_model_with_a_sliding_window_layer_compiles_for_cuda), apart from the GPU tests' window
WINDOW = 20
SLIDING = replace(SHAPE, attn_kinds=("mha_sliding", "mha"), sliding_window=WINDOW)


def test_each_cache_gets_the_sliding_window_build_it_needs():
    assert slot_window(SHAPE) is None  # TVM never calls the sliding-window slots: they refuse a call
    assert slot_window(SLIDING) == WINDOW
    assert slot_window(replace(SHAPE, support_sliding_window=True)) == 0  # sinks, no position window


def test_build_config_takes_a_window_for_tvm_slot_builds_only():
    assert BuildConfig("cuda", (64,), ("float16",), ("sm_90a",), kernels=("tvm",), tvm_window=16).tvm_window == 16
    for bad in ({"kernels": ("tvm",), "tvm_window": -1}, {"tvm_window": 0}, {"kernels": ("tvm",), "tvm_window": "16"},
                {"kernels": ("tvm",), "tvm_window": 16.5}):
        with pytest.raises(ConfigError, match="tvm_window"):
            BuildConfig("cuda", (64,), ("float16",), ("sm_90a",), **bad)


def test_per_sequence_windows_with_rope_are_refused_by_name_in_the_flashinfer_convention():
    """TVM turns any RoPE mode into inline RoPE for a cache with per-sequence windows; the "flashinfer" run functions
    get no positions to rotate at, so that cache is refused there when it is made (run time and ahead of time); the
    "tirx" slots serve it (test_tvm_kv_cache_cuda_rope.py)."""
    shape = replace(SHAPE, support_sliding_window=True, rope_mode="normal")
    with pytest.raises(ValueError, match="support_sliding_window=True makes it inline.*convention='tirx'"):
        create_paged_kv_cache(shape, target="cuda", convention="flashinfer")
    with pytest.raises(ValueError, match="support_sliding_window=True makes it inline"):
        paged_kv_cache_module(shape, target="cuda", arch="sm_90a", convention="flashinfer")


@pytest.fixture(scope="module")
def libraries(build_cache):
    """window -> the vanilla slot library's build (sm_90a, head_dim 64, float16), without windows and for WINDOW."""
    if requires_nvcc.args[0]:
        pytest.skip("nvcc is not on PATH")
    from attngen.tvm.cuda import build_slot_library

    return {w: build_slot_library(builtin("vanilla"), head_dim=64, dtype="float16", params=None, arch="sm_90a",
                                  window=w, cache=build_cache) for w in (None, WINDOW)}


def test_the_windowed_build_holds_windowed_kernels_and_only_it(libraries):
    sliding = ["tvm_decode_sliding_window_f16_d64", "tvm_prefill_paged_sliding_window_f16_d64"]
    for window, built in libraries.items():
        assert set(sliding) <= set(built.manifest["functions"])
        source = (built.directory / "attention_d64_f16_tvm.cu").read_text()
        assert f"static constexpr int kSlidingWindow = {-1 if window is None else window};" in source
        windowed_kernels = b"TvmWindowed" in (built.directory / "attention_d64_f16_tvm.o").read_bytes()
        assert windowed_kernels == (window is not None)


def _host(a):
    import tvm

    return tvm.runtime.tensor(np.ascontiguousarray(a))


def _prefill_args(length_info, rotary_mode=0):
    """The sliding-window paged prefill's arguments (host tensors: every refusal comes before a CUDA call)."""
    q = np.zeros((3, 8, 64), np.float16)
    pages = np.zeros((2, 2, 2, 16, 64), np.float16)
    i32 = lambda *v: _host(np.array(v, np.int32))  # noqa: E731
    return (_host(q), i32(0, 3), _host(pages), i32(0, 1), i32(1), _host(length_info), i32(0), i32(0, 1, 2),
            _host(q), _host(np.zeros((3, 8), np.float32)), 1, rotary_mode, 1.0, 1e4, 0.125)


def test_sliding_window_functions_refuse_what_they_do_not_serve(libraries):
    from attngen.tvm.loading import load_library

    plain, windowed = (load_library(libraries[w].library) for w in (None, WINDOW))
    three_rows = np.array([[3], [0], [0]], np.int32)
    with pytest.raises(Exception, match="tvm_prefill_paged_sliding_window_f16_d64: this library was built without "
                                        "sliding-window kernels"):
        plain["tvm_prefill_paged_sliding_window_f16_d64"](*_prefill_args(three_rows))
    with pytest.raises(Exception, match=r"length_info must be a contiguous int32 \[3, batch\]"):
        windowed["tvm_prefill_paged_sliding_window_f16_d64"](*_prefill_args(np.array([3], np.int32)))
    with pytest.raises(Exception, match="rotary_mode 1 .inline RoPE. is not served"):
        windowed["tvm_prefill_paged_sliding_window_f16_d64"](*_prefill_args(three_rows, rotary_mode=1))
    args = _prefill_args(np.array([3], np.int32))
    decode_args = (args[0], *args[2:10], 0, 1.0, 1e4, 0.125)  # no qo_indptr, no causal flag
    with pytest.raises(Exception, match=r"tvm_decode_sliding_window_f16_d64: length_info must be"):
        windowed["tvm_decode_sliding_window_f16_d64"](*decode_args)


@requires_nvcc
def test_a_model_with_a_sliding_window_layer_compiles_for_cuda(build_cache, tmp_path):
    """examples/tvm_model_e2e.py's CUDA model (the Llama shape with a "mha_sliding" first layer) with attngen's
    cache, compiled for sm_90a into one model library that exports the sliding-window slots."""
    import runpy
    import subprocess
    from pathlib import Path

    from attngen.tvm import export_model_library

    example = runpy.run_path(str(Path(__file__).parent.parent / "examples" / "tvm_model_e2e.py"))
    cfg = example["cuda_model"]()
    assert cfg.attn_kinds[0] == "mha_sliding" and "mha" in cfg.attn_kinds
    assert cfg.sliding_window == WINDOW  # the libraries fixture's windowed build serves the model
    mod, _ = example["build_model"](cfg, "attngen", build_cache, "cuda", "sm_90a")
    path = export_model_library(mod, tmp_path / "model.so", target="cuda", arch="sm_90a")
    out = subprocess.run(["nm", "--defined-only", "-D", str(path)], capture_output=True, text=True, check=True).stdout
    for name in ("attngen_tvm_prefill_paged_sliding_window_f16_d64", "attngen_tvm_decode_sliding_window_f16_d64"):
        assert f"__tvm_ffi_{name}" in out, name


def test_tvm_baseline_has_sliding_window_kernels_for_windowed_shapes():
    """The TVM CUDA baseline (for comparisons) fills the sliding-window slots with TVM's own sliding kernels where
    the shape has windows, and with its paged ones where TVM never calls them."""
    from attngen.tvm.baseline import tvm_cuda_kernels
    from attngen.tvm.helper_kernels import device_target

    target = device_target("cuda", "sm_90a")
    assert {"prefill_sliding_window", "decode_sliding_window"} <= set(tvm_cuda_kernels(SLIDING, target))
    assert "prefill_sliding_window" not in tvm_cuda_kernels(SHAPE, target)


SCRIPTS = {"layers": (LAYERS, LAYER_SCRIPT), "fork": (LAYERS, FORK_SCRIPT),
           "sequences": (PER_SEQUENCE, SEQUENCE_SCRIPT)}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_the_gpu_tests_model_matches_attngens_cpu_cache_and_its_windows_bite(build_cache, rng, name):
    shape, script = SCRIPTS[name]
    shape = replace(shape, dtype="float32")
    seed = int(rng.integers(1 << 31))
    cpu = create_paged_kv_cache(shape, cache=build_cache)
    outs = run_script({"attngen cpu": cpu}, CacheModel(shape), script, np.random.default_rng(seed), device="cpu")
    assert max_err(outs, "attngen cpu", "reference") < 2e-5
    # the same steps without windows (the same random inputs): layer 0 ("mha_sliding", or every layer under
    # per-sequence windows) differs
    unwindowed = replace(shape, attn_kinds=("mha",) * shape.num_layers, support_sliding_window=False)
    full = run_script({}, CacheModel(unwindowed), [step for step in script if step[0] != "window"],
                      np.random.default_rng(seed), device="cpu")
    layer0 = slice(0, None, shape.num_layers)
    assert max_err({"windowed": outs["reference"][layer0], "full": full["reference"][layer0]}, "windowed", "full") > 0.05
