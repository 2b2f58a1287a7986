"""The attngen command line: build (cpu and cuda), inspect, list, errors, --dump."""
from pathlib import Path

import numpy as np
import pytest

from attngen.cli import main

from .conftest import requires_nvcc

ROOT = Path(__file__).parent.parent


def test_build_example_for_cpu_and_load_it(tmp_path, capsys):
    rc = main(["build", str(ROOT / "examples/logits_softcap.py"), "--head-dim", "32", "--layout", "NHD",
               "--cache-dir", str(tmp_path / "c"), "--out", str(tmp_path / "out"), "--dump", str(tmp_path / "d")])
    text = capsys.readouterr().out
    assert rc == 0
    assert "building variant 'softcap_causal' for cpu" in text and "compiled in" in text
    assert "function batch_prefill_ragged_f32_d32" in text
    lib = tmp_path / "out" / "libsoftcap_causal_cpu.so"
    assert lib.is_file()
    dumped = sorted(p.name for p in (tmp_path / "d" / "softcap_causal").iterdir())
    assert dumped == ["00_validate.txt", "01_analyze.txt", "02_schedule.txt", "03_lower_hooks.txt",
                      "04_instantiate.txt", "05_compile.txt"]
    # loadable with tvm_ffi alone, and it computes attention
    from attngen.loader import pick_variant
    from attngen.runtime import CPUAttention, RaggedKV

    att = CPUAttention(pick_variant(str(ROOT / "examples/logits_softcap.py")), lib)
    q = np.ones((2, 2, 32), np.float32)
    out, lse = att.prefill(q, RaggedKV(q.copy(), q.copy(), np.array([0, 2], np.int32)), np.array([0, 2], np.int32))
    assert np.allclose(out, 1.0)
    # second build: cache hit
    assert main(["build", str(ROOT / "examples/logits_softcap.py"), "--head-dim", "32", "--layout", "NHD",
                 "--cache-dir", str(tmp_path / "c"), "--dump", str(tmp_path / "d2")]) == 0
    assert "cache hit" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "d2" / "softcap_causal").iterdir()) == dumped


@requires_nvcc
def test_build_cuda_objects(tmp_path, capsys):
    rc = main(["build", "rope", "--target", "cuda", "--arch", "sm_80,sm_90a", "--head-dim", "128",
               "--kernels", "none", "--cache-dir", str(tmp_path)])
    text = capsys.readouterr().out
    assert rc == 0 and "object hooks_sm_80.o" in text and "object hooks_sm_90a.o" in text
    assert main(["build", "causal", "--target", "cuda", "--arch", "sm_90a", "--head-dim", "64", "--dtype",
                 "bfloat16", "--layout", "HND", "--max-group-size", "4", "--cache-dir", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "function batch_decode_paged_hnd_bf16_d64" in text and "libcausal_cuda.so" in text
    assert "function batch_prefill_ragged_bf16_d64" in text
    assert "object hooks_" not in text  # a build with kernels compiles the hooks into them, no hook objects


def test_inspect_shows_hooks_analysis_and_cuda(capsys):
    assert main(["inspect", str(ROOT / "examples/rope_sliding_window.py"), "--head-dim", "64"]) == 0
    text = capsys.readouterr().out
    assert "### query_transform" in text and "### logits_mask" in text
    assert "mask: causal_window" in text and "qo_pos - kv_pos <= window_left" in text
    assert "ATTNGEN_HOOK void attngen_rope_sliding_window_d64_query_transform(" in text
    assert "## key and query transform in prefill: the row-hook pass" in text and "spans 64 or more packed" in text


def test_inspect_shows_the_logits_hooks_row_terms(capsys):
    assert main(["inspect", "logits_softcap"]) == 0
    text = capsys.readouterr().out
    assert "rt[0] = scale * (T.float32(1.0) / soft_cap)" in text and "rt[1] = soft_cap * post" in text
    assert "per score, s the raw q.k: T.tanh(s * rt[0]) * rt[1]" in text
    assert "row-hook pass" not in text  # no key or query transform
    assert "affine" not in text  # tanh: not affine in the score
    assert main(["inspect", "alibi"]) == 0
    assert "affine (rt[0] * s + rt[1] * kv_pos_f + rt[2])" in capsys.readouterr().out


def test_inspect_shows_the_hopper_tiles_a_variant_runs(capsys):
    """sm_90a: 176-key tiles (192 at head_dim 64) where no mask hook or key transform checks a score, else 128."""
    assert main(["inspect", "logits_softcap", "--arch", "sm_90a"]) == 0
    text = capsys.readouterr().out
    assert "## Hopper prefill tiles (sm_90a, 16-bit caches): 128 packed query rows x 176 keys, 2 K/V stages, 1 query " \
           "buffer\n  wide:" in text
    assert main(["inspect", "causal", "--arch", "sm_90a"]) == 0
    assert "128 packed query rows x 128 keys, 2 K/V stages, 2 query buffers\n\n" in capsys.readouterr().out
    assert main(["inspect", "vanilla", "--arch", "sm_90a", "--head-dim", "64"]) == 0
    assert "x 192 keys, 3 K/V stages, 2 query buffers" in capsys.readouterr().out
    assert main(["inspect", "vanilla"]) == 0  # (sm_80: no Hopper template)
    assert "Hopper prefill tiles" not in capsys.readouterr().out


def test_list(capsys):
    assert main(["list"]) == 0
    text = capsys.readouterr().out
    for name in ["vanilla", "causal", "sliding_window", "logits_softcap", "alibi", "custom_mask", "rope",
                 "attention_sink", "sigmoid"]:
        assert name in text


def test_the_shipped_listing_is_current_and_a_stale_one_is_not_printed(tmp_path, monkeypatch, capsys):
    """``attngen list`` prints the package's table without importing TVM while its key holds; the table must
    equal the one the analyses compute (else: ``python -m attngen.builtin_listing``)."""
    import json

    from attngen import builtin_listing

    assert builtin_listing.shipped_rows() == builtin_listing.compute_rows(), \
        "variants/listing.json is stale: run python -m attngen.builtin_listing"
    stale = tmp_path / "listing.json"
    stale.write_text(json.dumps({"key": "an older key", "rows": [["not_a_builtin", "none", "stale"]]}))
    monkeypatch.setattr(builtin_listing, "LISTING", stale)
    assert builtin_listing.shipped_rows() is None
    assert main(["list"]) == 0
    text = capsys.readouterr().out
    assert "not_a_builtin" not in text and "vanilla" in text


def test_errors_are_reported_not_raised(tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text("from tvm.script import tirx as T\nfrom attngen import Variant\n"
                   "@T.prim_func\ndef m(batch: T.int32, qo_pos: T.int32) -> T.bool:\n    return qo_pos >= 0\n"
                   "variant = Variant('bad', logits_mask=m)\n")
    assert main(["inspect", str(bad)]) == 2
    assert "variant 'bad', hook 'logits_mask'" in capsys.readouterr().err
    assert main(["build", "causal", "--target", "cuda", "--arch", "sm_75", "--dtype", "bfloat16"]) == 2
    assert "not supported on sm_75" in capsys.readouterr().err
    assert main(["build", "causal", "--dtype", "bfloat16", "--kv-dtype", "float16", "--target", "cuda",
                 "--arch", "sm_90a"]) == 2
    assert "kv_dtypes: K/V dtype float16 with query dtype bfloat16 is not supported" in capsys.readouterr().err
    assert main(["build", "no_such_variant"]) == 2
    assert "neither a .py file nor a built-in" in capsys.readouterr().err


def test_help_explains_options(capsys):
    with pytest.raises(SystemExit):
        main(["build", "--help"])
    text = capsys.readouterr().out
    for opt in ["--target", "--arch", "--head-dim", "--dtype", "--kv-dtype", "--layout", "--fast-math", "--out",
                "--cache-dir", "--dump", "--kernels", "--max-group-size"]:
        assert opt in text
    assert "decode, prefill, tvm" in text  # the templates a build may name, from the registry


def test_build_commands_import_tvm_without_torch():
    """The build and inspect commands keep TVM from importing torch while it initialises (its DLPack interop,
    half of `import tvm`'s time); torch stays importable and working afterwards."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from attngen.cli import _skip_torch_in_tvm_import\n"
            "_skip_torch_in_tvm_import()\n"
            "import tvm\n"
            "from tvm.script import tirx\n"
            "assert 'torch' not in sys.modules, 'TVM imported torch'\n"
            "import torch\n"
            "print(float(torch.arange(4.0).sum()))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "6.0"


def test_build_options_reach_the_build_config():
    """Every option of `attngen build` / `prebuild` lands in the BuildConfig it builds with (the linked build,
    its alternatives linked up front, the hook math, fast math, K/V dtypes, kernels, layouts, group size)."""
    from attngen.cli import _config, parser

    for command in ("build", "prebuild"):
        args = parser().parse_args(
            [command, *(["vanilla"] if command == "build" else []), "--target", "cuda", "--arch", "sm_80,sm_90a",
             "--head-dim", "64,128", "--dtype", "float16,bfloat16", "--kv-dtype", "float8_e4m3fn,bfloat16",
             "--layout", "HND", "--kernels", "decode,prefill", "--max-group-size", "4", "--fast-math",
             "--hook-math", "precise", "--link", "lto", "--link-alternatives"])
        cfg = _config(args)
        assert (cfg.target, cfg.archs, cfg.head_dims) == ("cuda", ("sm_80", "sm_90a"), (64, 128)), command
        assert (cfg.dtypes, cfg.kv_dtypes) == (("float16", "bfloat16"), ("float8_e4m3fn", "bfloat16"))
        assert (cfg.layouts, cfg.kernels, cfg.max_group_size) == (("HND",), ("decode", "prefill"), 4)
        assert (cfg.fast_math, cfg.hook_math, cfg.link, cfg.defer_alternatives) == (True, "precise", "lto", False)
    defaults = _config(parser().parse_args(["build", "vanilla", "--target", "cuda", "--arch", "sm_90a"]))
    assert (defaults.link, defaults.hook_math, defaults.defer_alternatives) == ("whole", "approx", True)
    with pytest.raises(SystemExit):  # (argparse refuses a link mode it does not know)
        parser().parse_args(["build", "vanilla", "--link", "thin"])
