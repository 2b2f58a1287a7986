"""Starting attngen is cheap: ``attngen --help``, ``attngen list`` and a repeated ``attngen build`` import
neither TVM nor tvm-ffi (which imports torch), and a built library loads with tvm-ffi alone.

Each command runs in a fresh interpreter (as a user runs it) that reports which heavy modules it imported;
the assertions are on those modules, not on times.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
EXAMPLE = ROOT / "examples" / "logits_softcap.py"
HEAVY = ("tvm", "tvm_ffi", "torch", "z3")
CPU_BUILD = ["--head-dim", "32", "--layout", "NHD"]

# runs attngen.cli.main(ARGS), then prints which of HEAVY it imported as the last line
RUNNER = """
import json, sys
from attngen.cli import main
try:
    rc = main(json.loads(sys.argv[1]))
except SystemExit as e:
    rc = e.code
sys.stdout.flush()
print("\\nIMPORTED " + json.dumps(sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules)))
sys.exit(rc or 0)
"""


def _env(cache_dir: Path) -> dict:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path, ATTNGEN_CACHE_DIR=str(cache_dir))
    env.pop("ATTNGEN_DUMP", None)
    return env


def run_cli(args: list[str], cache_dir: Path) -> tuple[str, list[str]]:
    """(what the command printed, the heavy modules it imported); fails the test if the command failed."""
    p = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(args), json.dumps(HEAVY)], env=_env(cache_dir),
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    text, _, imported = p.stdout.rpartition("\nIMPORTED ")
    return text, json.loads(imported)


@pytest.fixture(scope="module")
def built_example(tmp_path_factory):
    """A cache holding the CPU build of examples/logits_softcap.py, and what the first build printed."""
    cache = tmp_path_factory.mktemp("fast-start-cache")
    text, _ = run_cli(["build", str(EXAMPLE), *CPU_BUILD], cache)
    assert "compiled in" in text
    return cache, text


def _entry(text: str) -> str:
    return next(line for line in text.splitlines() if " -> " in line).rsplit(" -> ", 1)[1]


@pytest.mark.parametrize("args", [["--help"], ["build", "--help"], ["inspect", "--help"]], ids=" ".join)
def test_help_imports_no_tvm(args, tmp_path):
    text, imported = run_cli(args, tmp_path)
    assert "usage: attngen" in text
    assert imported == []


def test_list_from_the_cache_imports_no_tvm(tmp_path):
    first, _ = run_cli(["list"], tmp_path)  # fills the cache: makes every built-in (TVM)
    again, imported = run_cli(["list"], tmp_path)
    assert imported == []
    assert again == first and "sliding_window_causal    causal_window" in again


def test_repeated_build_imports_no_tvm(built_example):
    cache, first = built_example
    text, imported = run_cli(["build", str(EXAMPLE), *CPU_BUILD], cache)
    assert imported == []
    assert "building variant 'softcap_causal' for cpu" in text and "cache hit in" in text
    assert _entry(text) == _entry(first)
    assert "function batch_prefill_ragged_f32_d32" in text and "libsoftcap_causal_cpu.so" in text
    # another config of the same file is another build
    text, _ = run_cli(["build", str(EXAMPLE), "--head-dim", "64", "--layout", "NHD"], cache)
    assert "compiled in" in text and _entry(text) != _entry(first)


def test_built_library_loads_with_tvm_ffi_alone(built_example):
    cache, first = built_example
    lib = Path(_entry(first)) / "libsoftcap_causal_cpu.so"
    code = ("import sys, tvm_ffi\n"
            f"mod = tvm_ffi.load_module({str(lib)!r})\n"
            "assert callable(mod['batch_prefill_ragged_f32_d32'])\n"
            "print(sorted(m for m in ('tvm', 'attngen') if m in sys.modules))\n")
    p = subprocess.run([sys.executable, "-c", code], env=_env(cache), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["[]"]


VARIANT_FILE = '''
import sys
from pathlib import Path

from tvm.script import tirx as T

from attngen import Variant

sys.path.insert(0, str(Path(__file__).parent))
from cap_value import CAP  # noqa: E402  (the user's own module: a build of this file depends on it)


@T.prim_func
def softcap(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
            kv_head: T.int32) -> T.float32:
    return T.float32(CAP) * T.tanh(s / T.float32(CAP))


variant = Variant("capped", logits_transform=softcap)
'''


def test_edits_to_the_file_or_its_modules_are_seen(tmp_path):
    """The source key holds the variant file's text; the modules it imports are watched by content: an
    edit to either is never served the earlier build."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "cap_value.py").write_text("CAP = 30.0\n")
    variant = src / "capped.py"
    variant.write_text(VARIANT_FILE)
    cache = tmp_path / "cache"
    build = ["build", str(variant), *CPU_BUILD]
    first, _ = run_cli(build, cache)
    assert "compiled in" in first
    text, imported = run_cli(build, cache)
    assert "cache hit" in text and imported == []
    (src / "cap_value.py").write_text("CAP = 31.0\n")  # the helper's constant: another variant
    text, imported = run_cli(build, cache)
    assert "compiled in" in text and _entry(text) != _entry(first) and "tvm" in imported
    (src / "cap_value.py").write_text("CAP = 30.0\n")
    variant.write_text(VARIANT_FILE + "# a comment: the same IR\n")  # the file's text: the full key decides
    text, imported = run_cli(build, cache)
    assert "cache hit" in text and _entry(text) == _entry(first) and "tvm" in imported
    text, imported = run_cli(build, cache)
    assert "cache hit" in text and imported == []


def test_dump_runs_the_stages_on_a_hit(built_example, tmp_path):
    cache, first = built_example
    text, imported = run_cli(["build", str(EXAMPLE), *CPU_BUILD, "--dump", str(tmp_path)], cache)
    assert "cache hit" in text and "tvm" in imported
    assert (tmp_path / "softcap_causal" / "03_lower_hooks.txt").is_file()


def test_public_names_resolve():
    import attngen
    import attngen.ir

    for name in attngen.__all__:
        assert getattr(attngen, name) is not None, name
    for name in attngen.ir.__all__:
        assert getattr(attngen.ir, name) is not None, name
    assert attngen.Variant is attngen.ir.Variant
    assert attngen.ir.variant.Variant is attngen.Variant  # submodules as attributes, as before
    assert set(attngen.__all__) <= set(dir(attngen))
    with pytest.raises(AttributeError):
        attngen.no_such_name
    with pytest.raises(AttributeError):
        attngen.ir.no_such_name
    namespace = {}
    exec("from attngen import *", namespace)
    assert namespace["ScalarParam"] is attngen.ir.ScalarParam
