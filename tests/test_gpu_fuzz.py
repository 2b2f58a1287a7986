"""The GPU fuzzer (benchmarks/fuzz_gpu.py): on a GPU, the fuzzer's random variants and batches through every
CUDA template (both decode templates whole and split, the balanced plan with its merge, both mma.sync tile
widths, the Hopper template on compute capability 9.0), every call matching the float64 reference or refused
by name, then a few of the same calls under compute-sanitizer memcheck, racecheck and initcheck with zero
reports (racecheck, the slowest, over fewer batches); on
any machine, the harness's own oracle over the CPU backend."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .fuzz_engine import Recipe

FUZZ = Path(__file__).resolve().parents[1] / "benchmarks" / "fuzz_gpu.py"


def _fuzz_gpu_module():
    """benchmarks/fuzz_gpu.py as a module (a script beside the package, not in it)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fuzz_gpu", FUZZ)
    fg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fg)
    return fg


@pytest.fixture(scope="module")
def fuzz_env(build_cache):
    return dict(os.environ, ATTNGEN_CACHE_DIR=str(build_cache.root))


@pytest.mark.gpu
@pytest.mark.parametrize("part", range(4))
def test_fuzz_calls_match_the_reference_or_are_refused(fuzz_env, part):
    """One of four shards of one draw of 4 recipes x 24 batches (side by side on xdist's workers)."""
    p = subprocess.run([sys.executable, str(FUZZ), "--recipes", "4", "--cases", "24", "--seed", "7",
                        "--part", f"{part}/4"], env=fuzz_env, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-3000:]
    assert "fuzz_gpu done" in p.stdout


@pytest.mark.gpu
@pytest.mark.parametrize("part", range(2))
def test_fuzz_fp8_calls_match_the_reference_or_are_refused(fuzz_env, part):
    """fp8 caches (e4m3 and e5m2, random scales; tests/fuzz_fp8.py): one of two shards of 4 recipes x 16 batches."""
    p = subprocess.run([sys.executable, str(FUZZ), "--fp8", "--recipes", "4", "--cases", "16", "--seed", "8",
                        "--part", f"{part}/2"], env=fuzz_env, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-3000:]
    assert "fuzz_gpu done" in p.stdout


@pytest.mark.gpu
@pytest.mark.parametrize("tool,fp8", [("memcheck", False), ("racecheck", False), ("initcheck", False),
                                      ("memcheck", True), ("racecheck", True)])
def test_fuzz_calls_under_the_sanitizer(fuzz_env, tool, fp8):
    """The fuzzer's calls (float16, or fp8 caches: the direct key and value reads of the staged fp8 rows) under
    compute-sanitizer: no memory error, race or uninitialised read."""
    exe = shutil.which("compute-sanitizer")
    if exe is None:
        pytest.skip("compute-sanitizer is not installed on this GPU machine")
    cases = "3" if tool == "racecheck" else "6"
    args = [sys.executable, str(FUZZ), "--recipes", "2", "--cases", cases, "--seed", "11"] + (["--fp8"] if fp8 else [])
    subprocess.run(args, env=fuzz_env, capture_output=True, check=False)  # builds outside the sanitizer
    p = subprocess.run([exe, "--tool", tool, "--error-exitcode", "3", *args], env=fuzz_env, capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-3000:]
    clean = "ERROR SUMMARY: 0 errors" in p.stdout or "RACECHECK SUMMARY: 0 hazards" in p.stdout
    assert "fuzz_gpu done" in p.stdout and clean, p.stdout[-3000:]


# the long GPU fuzz run's finds (benchmarks/results/fuzz_gpu_2026-12-01_long.json): (recipe, case seed, fault)
FUZZ_FINDS = [
    # a custom bit mask and a head-striped one over one KV head: the tile map's classifier took the head-reading
    # mask for a head-free one and skipped the tiles only query head 1 sees (a wrong answer on every template)
    (Recipe(("scale", "softcap"), ("custom", "stripe"), "none", "swap", "none", "sum"), 1818558866, "none"),
    # a float64 query: a KeyError in the function lookup instead of attngen's error naming q
    (Recipe(("scale", "softcap"), ("custom", "stripe"), "none", "swap", "none", "sum"), 1818558866, "q_float64"),
]


@pytest.mark.gpu
def test_the_gpu_fuzzers_finds_stay_fixed(build_cache):
    """Each find of the GPU fuzzer, through every template path that serves it: matches the reference (or is
    refused by name, for a spoilt call)."""
    import numpy as np
    import torch

    from attngen.runtime import CUDAAttention

    fg = _fuzz_gpu_module()
    hopper = torch.cuda.get_device_capability() == (9, 0)
    for recipe, seed, fault in FUZZ_FINDS:
        variant = fg.make_variant(recipe)
        att = CUDAAttention.build(variant, head_dims=(fg.HEAD_DIM,), dtypes=("float16",), layouts=("NHD", "HND"),
                                  cache=build_cache)
        case = fg.make_case(variant, seed, head_dim=fg.HEAD_DIM)
        call = fg.apply_fault(case, fault, np.random.default_rng(seed + 1))
        for label, how in fg.templates(case.kind, hopper):
            outcome, detail = fg.run_call(att, variant, case, call, how)
            expected = "ok" if fault == "none" else "refused:AttentionArgumentError"
            assert outcome == expected, (label, fault, detail)


def test_the_gpu_fuzzers_shards_partition_one_draw():
    """--part I/N: the shards of one draw are disjoint and together the whole draw, in its order; a bad part is
    refused before anything runs."""
    fg = _fuzz_gpu_module()
    whole = fg.shard(7, 6)
    assert [i for i, _ in whole] == list(range(6)) and len({r for _, r in whole}) == 6
    shards = [fg.shard(7, 6, part, 4) for part in range(4)]
    assert sorted(sum(shards, []), key=lambda ir: ir[0]) == whole
    assert [len(s) for s in shards] == [2, 2, 1, 1]
    assert fg.shard(8, 6) != whole  # another seed draws other recipes
    for bad in ("4/4", "-1/2", "a/b", "1/2/3"):
        with pytest.raises(SystemExit):
            fg.main(["--part", bad])


@pytest.mark.parametrize("fp8", [False, True], ids=["float16", "fp8"])
def test_the_gpu_fuzzers_loop_on_the_cpu_backend(build_cache, monkeypatch, capsys, fp8):
    """The GPU fuzzer's whole loop (its draws of recipes, batches, faults and layout forms, every call checked)
    with --cpu, as the GPU test shards run it: every valid call matches, every spoilt one is refused by name."""
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(build_cache.root))
    fg = _fuzz_gpu_module()
    args = ["--cpu", "--recipes", "2", "--cases", "10", "--fault-share", "0.7", "--form-share", "0.5"]
    assert fg.main(args + (["--fp8", "--seed", "8"] if fp8 else ["--seed", "7"])) == 0
    out = capsys.readouterr().out
    assert "fuzz_gpu done" in out and '"failure_count": 0' in out
    assert '"ok"' in out and '"refused:' in out  # both kinds of outcome reached


def test_the_gpu_fuzzers_oracle_on_the_cpu_backend(build_cache):
    """The GPU fuzzer's conversion, refusal rules and float16 comparison, run on the CPU backend (float16 in):
    valid calls match, spoilt ones are refused by name (keeps the GPU-only harness honest in CI)."""
    import numpy as np

    from attngen.runtime import CPUAttention

    fg = _fuzz_gpu_module()
    recipe = Recipe(("alibi", "softcap"), ("causal", "custom"), "affine", "scale", "head_bias")
    variant = fg.make_variant(recipe)
    att = fg.PlanlessCPU(CPUAttention.build(variant, head_dims=(fg.HEAD_DIM,), dtypes=("float16",), cache=build_cache))
    spoilt = [f for f in fg.GPU_FAULTS if f not in fg.CUDA_ONLY_REFUSALS]  # (the CPU backend packs those pools)
    outcomes, forms = [], set()
    for i in range(24):
        case = fg.make_case(variant, 100 + i, head_dim=fg.HEAD_DIM)
        for fault in ("none", spoilt[i % len(spoilt)], fg.GPU_FORMS[i % len(fg.GPU_FORMS)]):
            call = fg.apply_fault(case, fault, np.random.default_rng(i))
            if call is None:
                continue
            how = {"bounded": True} if case.kind != "decode" and i % 2 else {}  # the bound's computation too
            outcome, detail = fg.run_call(att, variant, case, call, how, device="cpu")
            valid = fault == "none" or fault in fg.GPU_FORMS
            assert outcome == "ok" if valid else outcome.startswith("refused"), (fault, outcome, detail)
            outcomes.append(outcome)
            forms |= {fault} & set(fg.GPU_FORMS)
    assert outcomes.count("ok") >= 10 and any(o.startswith("refused") for o in outcomes)
    assert forms == set(fg.GPU_FORMS), forms  # every form reached a call


def test_the_gpu_fuzzers_fp8_calls_on_the_cpu_backend(build_cache):
    """The GPU fuzzer's fp8 path (fp8 arrays as torch fp8 tensors, scales with the call, the dequantised
    reference) on the CPU backend, every fp8 fault and layout: valid calls match, spoilt ones are refused by name;
    each layout, as the GPU fuzzer moves it, passes the CUDA functions' own layout checks at the fp8 dtype (the
    CPU backend packs any layout, so it could not tell)."""
    import numpy as np

    from attngen.runtime import CPUAttention, PagedKV
    from attngen.runtime.checks import check_tensor

    from .fuzz_fp8 import FP8_FAULTS, apply_fp8_fault, make_fp8_case

    fg = _fuzz_gpu_module()
    recipe = Recipe(("alibi", "softcap"), ("causal",), "affine", "scale", "head_bias")
    variant = fg.make_variant(recipe)
    outcomes, checked = [], set()
    for kv_dtype in ("float8_e4m3fn", "float8_e5m2"):
        att = fg.PlanlessCPU(CPUAttention.build(variant, head_dims=(fg.HEAD_DIM,), dtypes=("float16",),
                                              kv_dtypes=(kv_dtype,), cache=build_cache))
        for i, fault in enumerate(FP8_FAULTS):
            ran = 0
            for seed in range(100 * i, 100 * i + 40):  # the first three batches the fault applies to
                case = make_fp8_case(variant, seed, kv_dtype, fg.HEAD_DIM)
                call = apply_fp8_fault(case, fault, np.random.default_rng(seed))
                if call is None:
                    continue
                if ran == 3:
                    break
                ran += 1
                outcome, detail = fg.run_call(att, variant, case, call, {}, device="cpu")
                valid = fault == "none" or fault in fg.GPU_FORMS
                assert outcome == "ok" if valid else outcome.startswith("refused"), (fault, outcome, detail)
                outcomes.append(outcome)
                if fault in fg.GPU_FORMS:
                    kv = fg.to_device(call.kv, "cpu")
                    if isinstance(kv, PagedKV):
                        check_tensor(kv.pages, "kv.pages", 5, kv_dtype, strided="pages")
                    else:
                        check_tensor(kv.k, "kv.k", 3, kv_dtype, strided="rows")
                        check_tensor(fg.to_device(call.q, "cpu"), "q", 3, "float16", strided="tokens")
                    checked.add(fault)
    assert outcomes.count("ok") >= 12 and any(o.startswith("refused") for o in outcomes)
    assert checked == set(fg.GPU_FORMS), checked
