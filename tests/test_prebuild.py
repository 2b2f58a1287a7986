"""`attngen prebuild` fills a cache ahead of time; a read-only copy named by ATTNGEN_PREBUILT_DIRS (or a
BuildCache's ``prebuilt``) serves later builds without building or writing there."""
import os
import stat
import subprocess
import sys

import numpy as np
import pytest

from attngen.build import build
from attngen.codegen.cache import BuildCache
from attngen.runtime import CPUAttention, RaggedKV, reference_attention
from attngen.schedules import BuildConfig
from attngen.testing import random_problem
from attngen.variants import builtin

CFG = BuildConfig("cpu", (32,), ("float32",), layouts=("NHD",))
CPU_ARGS = ("--target", "cpu", "--head-dim", "32", "--dtype", "float32", "--layout", "NHD")  # (CFG's options)


def _read_only(root):
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), stat.S_IRUSR | stat.S_IRGRP)
        os.chmod(dirpath, stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP)


def _writable(root):
    for dirpath, dirnames, filenames in os.walk(root):
        os.chmod(dirpath, stat.S_IRWXU)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), stat.S_IRUSR | stat.S_IWUSR)


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """(a cache `attngen prebuild` filled with vanilla and causal for CPU_ARGS, its output): one per module."""
    root = tmp_path_factory.mktemp("shipped")
    p = subprocess.run([sys.executable, "-m", "attngen.cli", "prebuild", "--variants", "vanilla,causal",
                        *CPU_ARGS, "--cache-dir", str(root)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return root, p.stdout


def test_prebuilt_cache_serves_read_only(shipped, tmp_path):
    (shipped, out), local = shipped, tmp_path / "local"
    assert "2 variants" in out and "ATTNGEN_PREBUILT_DIRS" in out
    _read_only(shipped)
    try:
        cache = BuildCache(local, prebuilt=(shipped,))
        res = build(builtin("causal"), CFG, cache=cache)
        assert res.cache_hit and cache.builds == 0
        assert res.directory.is_relative_to(shipped) and not any(local.rglob("*.so"))
        # the shipped library runs from its read-only place
        att = CPUAttention(builtin("causal"), res.library, res.manifest)
        rng = np.random.default_rng(0)
        prob = random_problem(rng, [5, 3], [9, 3], 4, 2, 32, page_size=4)
        out, _ = att.prefill(prob.q, RaggedKV(prob.ragged.k, prob.ragged.v, prob.ragged.indptr), prob.qo_indptr)
        ref, _ = reference_attention(builtin("causal"), prob.q, prob.keys, prob.values, prob.qo_indptr,
                                     1 / np.sqrt(32))
        np.testing.assert_allclose(out, ref, atol=1e-5)
        # a variant the shipped cache lacks is built into the writable cache
        res = build(builtin("logits_softcap"), CFG, cache=cache)
        assert not res.cache_hit and res.directory.is_relative_to(local)
    finally:
        _writable(shipped)


def test_prebuilt_dirs_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNGEN_PREBUILT_DIRS", os.pathsep.join([str(tmp_path / "a"), str(tmp_path / "b")]))
    assert BuildCache(tmp_path / "c").prebuilt == (tmp_path / "a", tmp_path / "b")
    assert BuildCache(tmp_path / "c", prebuilt=()).prebuilt == ()


def test_prebuild_refuses_unknown_variants(tmp_path):
    p = subprocess.run([sys.executable, "-m", "attngen.cli", "prebuild", "--variants", "vanila", "--cache-dir",
                        str(tmp_path)], capture_output=True, text=True)
    assert p.returncode != 0 and "not built-in variants" in p.stderr


NO_COMPILER = """
import sys
import numpy as np
from attngen.build import build, support_library
from attngen.codegen.cache import BuildCache, ToolsMissingError
from attngen.codegen.host_library import host_cxx_version
from attngen.runtime import CPUAttention, RaggedKV, reference_attention
from attngen.schedules import BuildConfig
from attngen.testing import random_problem
from attngen.variants import builtin

assert host_cxx_version() == "none"
cache = BuildCache(sys.argv[2], prebuilt=(sys.argv[1],))
res = build(builtin("causal"), BuildConfig("cpu", (32,), ("float32",), layouts=("NHD",)), cache=cache)
assert res.cache_hit and cache.builds == 0 and res.directory.is_relative_to(sys.argv[1])
att = CPUAttention(builtin("causal"), res.library, res.manifest)
prob = random_problem(np.random.default_rng(0), [5, 3], [9, 3], 4, 2, 32, page_size=4)
out, _ = att.prefill(prob.q, RaggedKV(prob.ragged.k, prob.ragged.v, prob.ragged.indptr), prob.qo_indptr)
ref, _ = reference_attention(builtin("causal"), prob.q, prob.keys, prob.values, prob.qo_indptr, 1 / np.sqrt(32))
assert np.abs(out - ref).max() < 1e-5
assert support_library("planner", cache=cache).is_relative_to(sys.argv[1])
try:
    build(builtin("logits_softcap"), BuildConfig("cpu", (32,), ("float32",), layouts=("NHD",)), cache=cache)
except ToolsMissingError as e:
    print("refused:", e)
"""


def test_a_prebuilt_cache_serves_a_machine_without_a_compiler(shipped, tmp_path):
    """Where no C++ compiler is installed (PATH without one, CXX unset), the libraries and the planner a cache
    built elsewhere holds are served through their stand-in entries (keyed without the tools); a library it lacks
    is refused naming the missing compiler and the fix."""
    shipped, out = shipped
    assert "support library planner" in out
    _read_only(shipped)
    try:
        env = {k: v for k, v in os.environ.items() if k not in ("CXX", "ATTNGEN_PREBUILT_DIRS")}
        env["PATH"] = str(tmp_path / "no-compiler-here")
        p = subprocess.run([sys.executable, "-c", NO_COMPILER, str(shipped), str(tmp_path / "local")],
                           capture_output=True, text=True, env=env, timeout=600)
        assert p.returncode == 0, p.stderr
        assert "refused: the cpu library of logits_softcap: host C++ compiler not installed" in p.stdout
        assert "ATTNGEN_PREBUILT_DIRS=DIR" in p.stdout
    finally:
        _writable(shipped)


def test_a_cxx_naming_no_program_counts_as_no_compiler(monkeypatch, tmp_path):
    """CXX set to a path where no program is: the host compiler's version is ABSENT (a build then takes the
    stand-in of a cache built elsewhere), not an error out of every build."""
    from attngen.codegen import host_library

    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    host_library.host_cxx.cache_clear()
    try:
        assert host_library.host_cxx_version() == "none"
    finally:
        monkeypatch.undo()
        host_library.host_cxx.cache_clear()
