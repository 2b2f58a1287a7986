"""attngen's CUDA TVM slots for a variant with tensor parameters, on a machine without a GPU.

- the slot library of ``head_scaled()`` (tests/tvm_head_scale.py: two tensor parameters around a scalar) builds
  (nvcc, sm_90a): its Config hands set_params the trailing tensors and the compiled-in scalar in declaration order
  and checks each tensor's declared dims; its functions keep TVM's names and add the tensors after TVM's arguments;
- those functions refuse, before any CUDA call, a call without the tensors and tensors of the wrong element type,
  rank, layout, device or size (DLPack tensors that claim a CUDA device, tests/fake_cuda.py);
- create_paged_kv_cache(target="cuda") checks the values against the cache's sizes before it needs a GPU, the
  build never sees a tensor (its cache key cannot depend on one), and a model library binds them as its
  constants (sm_90a, compiled without a GPU);
- the float64 model the GPU test compares with matches attngen's CPU cache running the variant, and the scales
  bite. (test_gpu_tvm_kv_cache_tensor_params.py runs the CUDA cache on a GPU.)
"""
from dataclasses import replace

import numpy as np
import pytest

from attngen.codegen.cuda_tvm_slots import _declared_dim
from attngen.ir import ConfigError, TensorParam
from attngen.runtime.checks import AttentionArgumentError
from attngen.schedules import BuildConfig
from attngen.tvm import create_paged_kv_cache, paged_kv_cache_module

from .conftest import requires_nvcc
from .fake_cuda import fake_cuda
from .tvm_head_scale import SCRIPT, ScaledModel, head_factors, head_scaled
from .tvm_window_model import SHAPE, CacheModel, max_err, run_script

HQ, HKV, D = SHAPE.num_qo_heads, SHAPE.num_kv_heads, SHAPE.head_dim
HEAD_SCALE = np.linspace(0.5, 2.0, HQ).astype(np.float32)
KV_SCALE = np.array([1.5, 0.75], np.float32)
TEMPERATURE = 0.8  # compiled in (a scalar parameter)


def test_declared_dims_become_the_checks_of_each_call():
    dims = TensorParam("t", "float32", (4, "num_qo_heads", "batch_size", "n>=8", "m>=num_kv_heads", "n")).dims
    assert [_declared_dim(d) for d in dims] == [
        '{"4", 4, attngen::tvm_slot::CallSize::kNone, false}',
        '{"num_qo_heads", -1, attngen::tvm_slot::CallSize::kNumQoHeads, false}',
        '{"batch_size", -1, attngen::tvm_slot::CallSize::kBatchSize, false}',
        '{"n>=8", 8, attngen::tvm_slot::CallSize::kNone, true}',
        '{"m>=num_kv_heads", -1, attngen::tvm_slot::CallSize::kNumKvHeads, true}',
        '{"n", -1, attngen::tvm_slot::CallSize::kNone, false}']


def test_tensor_parameters_are_never_compiled_in():
    from attngen.codegen.cuda_tvm_slots import check_tvm_slot_variant
    from attngen.tvm.cuda import build_slot_library

    with pytest.raises(ConfigError, match=r"tvm_constants: \['head_scale'\] are tensor parameters of variant "
                                          "'head_scaled', which the slot functions take as trailing arguments"):
        check_tvm_slot_variant(head_scaled(), {"head_scale": 1.0})
    with pytest.raises(ValueError, match=r"params: \['head_scale'\] are not scalar parameters"):
        build_slot_library(head_scaled(), head_dim=D, dtype="float16", params={"head_scale": HEAD_SCALE},
                           arch="sm_90a")


@pytest.fixture(scope="module")
def library(build_cache):
    """The head_scaled() slot library's build (sm_90a, head_dim 64, float16, temperature compiled in): the build
    the model library of test_a_model_library_binds_tensor_parameters links (one compile for both)."""
    if requires_nvcc.args[0]:
        pytest.skip("nvcc is not on PATH")
    from attngen.tvm.cuda import build_slot_library

    return build_slot_library(head_scaled(), head_dim=D, dtype="float16", params={"temperature": TEMPERATURE},
                              arch="sm_90a", cache=build_cache)


def test_the_slot_library_takes_the_tensors_after_tvms_arguments(library):
    source = (library.directory / "attention_d64_f16_tvm.cu").read_text()
    for config in ("TirxSlotsConfig_f16_d64", "FlashInferSlotsConfig_f16_d64"):
        block = source[source.index(f"struct {config}"):]
        assert "using TensorArgs = attngen::ArgList<tvm::ffi::TensorView, tvm::ffi::TensorView>;" in block
        assert f"attngen_gen::Hooks_d64::set_params(entry, hp, t0, {TEMPERATURE.hex()}, t1);" in block
        assert ('check_slot_tensor(entry, "kv_scale", t1, call, {{"num_kv_heads", -1, '
                "attngen::tvm_slot::CallSize::kNumKvHeads, false}});") in block
    vanilla = BuildConfig("cuda", (D,), ("float16",), ("sm_90a",), ("HND",), kernels=("tvm",))
    from attngen.codegen.cuda_library import exported_functions

    assert library.manifest["functions"] == exported_functions(vanilla)  # TVM's names, as for any variant


def _functions(library):
    from attngen.tvm.loading import load_library

    return load_library(library.library)


def _prefill_args():
    """The "tirx" paged prefill's TVM arguments (3 query rows, one request) as fake CUDA tensors."""
    i32 = lambda *shape: fake_cuda(shape, "int32")  # noqa: E731
    return (fake_cuda((3, HQ, D), "float16"), i32(2), fake_cuda((2, 2, HKV, 16, D), "float16"), i32(2), i32(1),
            i32(1), i32(1), i32(3), fake_cuda((3, HQ, D), "float16"), fake_cuda((3, HQ)), 1, 0, 1.0, 1e4, 0.125)


def test_slot_functions_refuse_bad_tensor_parameters_before_any_cuda_call(library):
    import tvm

    prefill = _functions(library)["tvm_prefill_paged_f16_d64"]
    good_kv = fake_cuda((HKV,))
    with pytest.raises(TypeError, match="Mismatched number of arguments"):
        prefill(*_prefill_args())  # without the variant's tensors
    for tensors, why in [
        ((tvm.runtime.tensor(HEAD_SCALE), good_kv), "head_scale: expected a CUDA tensor"),
        ((fake_cuda((HQ,), "float16"), good_kv), "head_scale: expected element type float32, got float16"),
        ((fake_cuda((HQ, 1)), good_kv), "head_scale: expected 1 dims, got 2"),
        ((fake_cuda((HQ,), strides=(2,)), good_kv), "head_scale: must be contiguous"),
        ((fake_cuda((HQ,), device_id=1), good_kv), "tensor parameter 'head_scale' is on cuda:1, the call's tensors "
                                                   "on cuda:0; give create_paged_kv_cache the parameter on the "
                                                   "cache's GPU"),
        ((fake_cuda((4,)), good_kv), "tensor parameter 'head_scale': dim 0 .num_qo_heads. is 4, must be the call's "
                                     "num_qo_heads 8; give create_paged_kv_cache a tensor of the declared shape"),
        ((fake_cuda((HQ,)), fake_cuda((HQ,))), "tensor parameter 'kv_scale': dim 0 .num_kv_heads. is 8, must be the "
                                               "call's num_kv_heads 2"),
    ]:
        with pytest.raises(Exception, match=f"tvm_prefill_paged_f16_d64: {why}"):
            prefill(*_prefill_args(), *tensors)


def test_every_slot_kind_checks_the_tensors(library):
    """The decode and the "flashinfer" run functions bind them too (the plans take none)."""
    functions = _functions(library)
    short = (fake_cuda((4,)), fake_cuda((HKV,)))
    args = _prefill_args()
    decode = (args[0], *args[2:10], 0, 1.0, 1e4, 0.125)
    with pytest.raises(Exception, match="tvm_decode_f16_d64: tensor parameter 'head_scale': dim 0"):
        functions["tvm_decode_f16_d64"](*decode, *short)
    i32 = lambda *shape: fake_cuda(shape, "int32")  # noqa: E731
    pages = fake_cuda((2, HKV, 16, D), "float16")
    workspace = (fake_cuda((1024,)), i32(1024))
    with pytest.raises(Exception, match="tvm_fi_prefill_paged_run_f16_d64: tensor parameter 'head_scale': dim 0"):
        functions["tvm_fi_prefill_paged_run_f16_d64"](
            *workspace, [3], args[0], pages, pages, i32(2), i32(2), i32(1), i32(1), args[8], args[9], 1, 1, -1,
            False, 0.125, 1.0, 1e-4, *short)


def test_create_checks_the_values_before_it_needs_a_gpu():
    variant = head_scaled()
    for params, why in [({"head_scale": HEAD_SCALE[:4], "kv_scale": KV_SCALE},
                         r"params\['head_scale'\]: dim 0 \(num_qo_heads\) is 4, expected 8"),
                        ({"head_scale": HEAD_SCALE}, r"params\['kv_scale'\]: variant 'head_scaled' needs it"),
                        ({"head_scale": HEAD_SCALE.astype(np.float16), "kv_scale": KV_SCALE},
                         r"params\['head_scale'\]: expected dtype float32")]:
        with pytest.raises(AttentionArgumentError, match=why):
            create_paged_kv_cache(SHAPE, variant, params=params, target="cuda")


@requires_nvcc
def test_a_model_library_binds_tensor_parameters(build_cache, tmp_path):
    """A model library for sm_90a (no GPU needed) holds the tensors as constants of its cache-creating function,
    bound to the "tirx" slots by the model's own binding function (part of attngen's object, exported under the
    cache's prefix); missing or mis-sized values are refused when the module is built."""
    import subprocess

    from attngen.tvm import export_model_library

    mod = paged_kv_cache_module(SHAPE, head_scaled(), target="cuda", arch="sm_90a", cache=build_cache,
                                params={"head_scale": HEAD_SCALE, "kv_scale": KV_SCALE, "temperature": TEMPERATURE})
    assert len(mod.attrs["external_mods"]) == 1  # attngen's object, the binding inside
    script = mod["create_kv_cache"].script()
    assert script.count("attngen_bind_tensor_params") == 7  # the seven "tirx" slots
    path = export_model_library(mod, tmp_path / "model.so", target="cuda", arch="sm_90a")
    out = subprocess.run(["nm", "--defined-only", "-D", str(path)], capture_output=True, text=True, check=True).stdout
    syms = {p[2]: p[1] for p in (line.split() for line in out.splitlines()) if len(p) == 3}
    for name in ("attngen_bind_tensor_params", "attngen_tvm_decode_f16_d64", "attngen_tvm_prefill_paged_f16_d64"):
        assert syms.get(f"__tvm_ffi_{name}") == "T", name
    with pytest.raises(ValueError, match="head_scale"):
        paged_kv_cache_module(SHAPE, head_scaled(), target="cuda", arch="sm_90a", params={"kv_scale": KV_SCALE})
    with pytest.raises(ValueError, match="kv_scale"):
        paged_kv_cache_module(SHAPE, head_scaled(), target="cuda", arch="sm_90a",
                              params={"head_scale": HEAD_SCALE, "kv_scale": np.ones(5, np.float32)})


def test_the_gpu_tests_model_matches_attngens_cpu_cache_and_the_scales_bite(build_cache, rng):
    shape = replace(SHAPE, dtype="float32")
    seed = int(rng.integers(1 << 31))
    cpu = create_paged_kv_cache(shape, head_scaled(), cache=build_cache,
                                params={"head_scale": HEAD_SCALE, "kv_scale": KV_SCALE, "temperature": TEMPERATURE})
    model = ScaledModel(shape, head_factors(HEAD_SCALE, KV_SCALE, TEMPERATURE))
    outs = run_script({"attngen cpu": cpu}, model, SCRIPT, np.random.default_rng(seed), device="cpu")
    assert max_err(outs, "attngen cpu", "reference") < 2e-5
    plain = run_script({}, CacheModel(shape), SCRIPT, np.random.default_rng(seed), device="cpu")
    assert max_err({"scaled": outs["reference"], "plain": plain["reference"]}, "scaled", "plain") > 0.05
