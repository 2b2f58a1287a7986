"""The build cache key covers every input that affects a build's output: each test changes one input
and asserts that the key changes (the IR-keyed build key and the command line's source-keyed request key),
and that the key holds every attngen module a build runs."""
import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tvm.script import tirx as T

from attngen import ScalarParam, Variant
from attngen.codegen import nvcc, pipeline
from attngen.codegen.backends import cpu as cpu_backend
from attngen.codegen.backends import cuda as cuda_backend
from attngen.codegen.cache import BuildCache
from attngen.codegen.pipeline import BUILD_SOURCES, PACKAGE, build_source_files, cache_key, request_key
from attngen.schedules import BuildConfig

CUDA = BuildConfig("cuda", (128,), ("float16",), ("sm_80",))
CPU = BuildConfig("cpu", (64,), ("float32",))


def softcap_variant(cap: float = 30.0, *, name: str = "capped", default: float = 1.0,
                    state: str = "softmax") -> Variant:
    @T.prim_func
    def f(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32, kv_head: T.int32,
          gain: T.float32) -> T.float32:
        return T.float32(cap) * T.tanh(s / T.float32(cap)) * gain

    return Variant(name, logits_transform=f, params=[ScalarParam("gain", "float32", default)], state=state)


def test_equal_inputs_equal_keys():
    assert cache_key(softcap_variant(), CUDA) == cache_key(softcap_variant(), CUDA)
    assert cache_key(softcap_variant(), CPU) == cache_key(softcap_variant(), CPU)


@pytest.mark.parametrize("variant", [
    softcap_variant(31.0),  # one constant of the hook body
    softcap_variant(name="capped2"),
    softcap_variant(default=2.0),  # a parameter's default
    softcap_variant(state="sum"),
], ids=["hook constant", "name", "param default", "state algebra"])
def test_key_covers_the_variant(variant):
    assert cache_key(variant, CUDA) != cache_key(softcap_variant(), CUDA)


CONFIG_CHANGES = {
    "head_dims": (64,), "dtypes": ("bfloat16",), "archs": ("sm_90a",), "layouts": ("NHD",), "fast_math": True,
    "hook_math": "precise", "kernels": ("decode",), "max_group_size": 4, "tvm_constants": (("gain", 2.0),),
    "link": "lto", "tvm_window": 16, "tvm_rope": True, "defer_alternatives": False,
}


@pytest.mark.parametrize("field", sorted(CONFIG_CHANGES))
def test_key_covers_each_config_field(field):
    # a TVM-slot build's fields
    base = dataclasses.replace(CUDA, kernels=("tvm",)) if field in ("tvm_window", "tvm_rope") else CUDA
    if field == "defer_alternatives":  # a link-time build's field
        base = dataclasses.replace(CUDA, link="lto")
    # kv_dtypes=(): K/V follow the query dtypes (the only pairs built today)
    changed = dataclasses.replace(base, kv_dtypes=(), **{field: CONFIG_CHANGES[field]})
    assert cache_key(softcap_variant(), changed) != cache_key(softcap_variant(), base)


def test_every_config_field_is_in_the_key():
    """A field added to BuildConfig enters the key unless it is ``extra`` (which the build does not read);
    K/V dtypes are keyed apart from the query dtypes although only equal pairs are built today. ``link``,
    ``tvm_window`` and ``tvm_rope`` enter it when not their defaults (builds keep the keys they had before those
    fields), ``defer_alternatives`` in link-time builds."""
    keyed = json.loads(CUDA.key())
    later = {"link", "tvm_window", "tvm_rope", "defer_alternatives"}
    assert set(keyed) == {f.name for f in dataclasses.fields(BuildConfig)} - {"extra"} - later
    assert "link" in json.loads(dataclasses.replace(CUDA, link="lto").key())
    assert "tvm_window" in json.loads(dataclasses.replace(CUDA, kernels=("tvm",), tvm_window=0).key())
    assert "tvm_rope" in json.loads(dataclasses.replace(CUDA, kernels=("tvm",), tvm_rope=True).key())
    assert "defer_alternatives" in json.loads(dataclasses.replace(CUDA, link="lto").key())
    assert set(CONFIG_CHANGES) | {"target", "kv_dtypes"} == set(keyed) | later
    assert keyed["kv_dtypes"] == ["float16"]
    on_cpu = BuildConfig("cpu", (64,), ("float16",), ("sm_80",))
    assert cache_key(softcap_variant(), on_cpu) != cache_key(softcap_variant(), dataclasses.replace(on_cpu, target="cuda"))


@pytest.mark.parametrize("patch", ["nvcc", "host_cxx", "tvm", "tvm_ffi", "machine", *nvcc.COMPILER_ENV])
def test_key_covers_the_tools(patch, monkeypatch):
    v = softcap_variant()
    for name in nvcc.COMPILER_ENV:
        monkeypatch.delenv(name, raising=False)
    before = {cfg.target: cache_key(v, cfg) for cfg in (CUDA, CPU)}
    if patch in nvcc.COMPILER_ENV:  # nvcc's flags or host compiler, set from outside
        monkeypatch.setenv(patch, "-lineinfo" if patch.endswith("FLAGS") else "/usr/bin/g++-13")
        targets = ["cuda", "cpu"]
    elif patch == "nvcc":
        monkeypatch.setattr(nvcc, "nvcc_version", lambda: "Build cuda_99.9")
        targets = ["cuda"]
    elif patch == "host_cxx":
        for backend in (cpu_backend, cuda_backend):
            monkeypatch.setattr(backend, "host_cxx_version", lambda: "c++ (other) 99")
        targets = ["cuda", "cpu"]
    elif patch in ("tvm", "tvm_ffi"):
        real = pipeline.package_version
        dist = {"tvm": "apache-tvm", "tvm_ffi": "apache-tvm-ffi"}[patch]
        monkeypatch.setattr(pipeline, "package_version", lambda d: "99.0" if d == dist else real(d))
        targets = ["cuda", "cpu"]
    else:
        monkeypatch.setattr(platform, "machine", lambda: "aarch64")
        targets = ["cuda", "cpu"]
    for cfg in (CUDA, CPU):
        assert (cache_key(v, cfg) != before[cfg.target]) == (cfg.target in targets), cfg.target


def _package_copy(tmp_path) -> Path:
    copy = tmp_path / "attngen"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return copy


def test_key_covers_each_build_source_file(tmp_path):
    """An edit to any one file of the build's sources (the IR and analyses, schedules, code generators,
    every csrc header and source, the build entry) changes the key."""
    copy = _package_copy(tmp_path)
    files = build_source_files(copy)
    assert {p.relative_to(copy) for p in (copy / "csrc").iterdir()} <= {p.relative_to(copy) for p in files}
    v = softcap_variant()
    base = cache_key(v, CUDA, package=copy)
    for path in files:
        text = path.read_bytes()
        path.write_bytes(text + b"\n")
        assert cache_key(v, CUDA, package=copy) != base, path.relative_to(copy)
        path.write_bytes(text)
    assert cache_key(v, CUDA, package=copy) == base


# lists the attngen modules a CPU build and a hooks-only CUDA build import
BUILD_MODULES = """
import json, sys
from attngen.build import build
from attngen.codegen.cache import BuildCache
from attngen.schedules import BuildConfig
from attngen.variants import builtin
cache = BuildCache(sys.argv[1])
build(builtin("logits_softcap"), BuildConfig("cpu", (32,), ("float32",), layouts=("NHD",)), cache=cache)
if sys.argv[2] == "cuda":
    build(builtin("rope"), BuildConfig("cuda", (64,), ("float16",), ("sm_80",), kernels=()), cache=cache)
print(json.dumps(sorted(m.__file__ for n, m in sys.modules.items()
                        if n.split(".")[0] == "attngen" and getattr(m, "__file__", None))))
"""


def test_key_holds_every_module_a_build_runs(tmp_path):
    """Every attngen module that a build imports is one of the hashed build sources, but the package's
    export list (its version is keyed) and the built-in variants (keyed by their IR text)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(PACKAGE.parent), os.environ.get("PYTHONPATH"))
                                                      if p))
    target = "cuda" if nvcc.find_nvcc() else "cpu"
    p = subprocess.run([sys.executable, "-c", BUILD_MODULES, str(tmp_path), target], env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    imported = {Path(f).resolve().relative_to(PACKAGE.resolve()) for f in json.loads(p.stdout)}
    hashed = {p.resolve().relative_to(PACKAGE.resolve()) for p in build_source_files()}
    unkeyed = {f for f in imported - hashed if f.as_posix() != "__init__.py" and f.parts[0] != "variants"}
    assert not unkeyed
    assert set(BUILD_SOURCES) >= {"ir", "schedules", "codegen", "csrc", "build.py"}


SOURCE = {"file": "/x/capped.py", "sha256": "0" * 64, "variant": None}


@pytest.mark.parametrize("change", ["file text", "file path", "variant choice", "builtin", "config", "python",
                                    "package file"])
def test_request_key_covers_source_config_environment_and_package(change, tmp_path, monkeypatch):
    copy = _package_copy(tmp_path)
    base = request_key(SOURCE, CUDA, package=copy)
    assert request_key(dict(SOURCE), CUDA, package=copy) == base
    source, cfg = dict(SOURCE), CUDA
    if change == "file text":
        source["sha256"] = "1" * 64
    elif change == "file path":
        source["file"] = "/y/capped.py"
    elif change == "variant choice":
        source["variant"] = "capped"
    elif change == "builtin":
        source = {"builtin": "causal", "variant": None}
    elif change == "config":
        cfg = dataclasses.replace(CUDA, hook_math="precise")
    elif change == "python":
        real = pipeline.python_environment
        monkeypatch.setattr(pipeline, "python_environment", lambda: {**real(), "distributions": "other"})
    else:  # a module the build itself never runs (the loader, a built-in): it can change the Variant made
        (copy / "loader.py").write_text((copy / "loader.py").read_text() + "\n")
    assert request_key(source, cfg, package=copy) != base


def test_record_is_void_when_a_file_it_depends_on_changes(tmp_path):
    cache = BuildCache(tmp_path / "cache")
    dep = tmp_path / "helper.py"
    dep.write_text("CAP = 30.0\n")
    cache.write_record("ab" * 32, {"entry": "x"}, depends_on=[dep])
    assert cache.read_record("ab" * 32) == {"entry": "x"}
    dep.write_text("CAP = 31.0\n")
    assert cache.read_record("ab" * 32) is None
    dep.write_text("CAP = 30.0\n")
    assert cache.read_record("ab" * 32) == {"entry": "x"}
    dep.unlink()
    assert cache.read_record("ab" * 32) is None
    assert cache.read_record("cd" * 32) is None
