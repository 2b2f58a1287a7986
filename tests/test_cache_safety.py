"""Build-cache safety: concurrent builds of the same and of different variants, a build killed mid-way,
corrupt or unsealed entries. Nothing half-written is ever served; the next build repairs the entry.

The process tests run tests/cache_safety_worker.py in subprocesses on the CPU backend against one cache
directory, SIGKILL one of them while it compiles, then build and run again.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attngen.codegen.cache import SEAL, BuildCache, entry_is_sealed

ROOT = Path(__file__).resolve().parents[1]


def _build_into(directory: Path, text: str = "artifact") -> None:
    (directory / "lib.so").write_text(text)
    (directory / "sub").mkdir()
    (directory / "sub" / "manifest.json").write_text("{}")


def test_entry_is_sealed_and_served(tmp_path):
    cache = BuildCache(tmp_path)
    path, hit = cache.get_or_build("ab" * 32, _build_into)
    assert not hit and entry_is_sealed(path) and (path / SEAL).is_file()
    path2, hit2 = BuildCache(tmp_path).get_or_build("ab" * 32, lambda d: pytest.fail("rebuilt a sealed entry"))
    assert hit2 and path2 == path


@pytest.mark.parametrize("damage", ["truncate", "flip_byte", "drop_seal", "extra_file", "missing_file",
                                    "garbled_seal"])
def test_damaged_entry_is_rebuilt_not_served(tmp_path, damage):
    key = "cd" * 32
    path, _ = BuildCache(tmp_path).get_or_build(key, _build_into)
    lib = path / "lib.so"
    if damage == "truncate":
        lib.write_text("art")
    elif damage == "flip_byte":
        lib.write_text("brtifact")
    elif damage == "drop_seal":  # e.g. an entry written before entries were sealed
        (path / SEAL).unlink()
    elif damage == "extra_file":
        (path / "stray.o").write_text("x")
    elif damage == "missing_file":
        (path / "sub" / "manifest.json").unlink()
    else:
        (path / SEAL).write_text("{not json")
    cache = BuildCache(tmp_path)
    path2, hit = cache.get_or_build(key, lambda d: _build_into(d, "artifact"))
    assert not hit and cache.builds == 1 and path2 == path
    assert (path / "lib.so").read_text() == "artifact" and entry_is_sealed(path)


def test_failed_build_leaves_nothing(tmp_path):
    key = "ef" * 32

    def broken(d):
        (d / "lib.so").write_text("half")
        raise RuntimeError("compiler crashed")

    with pytest.raises(RuntimeError):
        BuildCache(tmp_path).get_or_build(key, broken)
    assert [p.name for p in (tmp_path / key[:2]).iterdir()] == [f"{key}.lock"]


def test_dead_builds_temporary_directory_is_removed(tmp_path):
    key = "0a" * 32
    leftover = tmp_path / key[:2] / f".{key}-99999-xyz"
    leftover.mkdir(parents=True)
    (leftover / "lib.so").write_text("half")
    path, hit = BuildCache(tmp_path).get_or_build(key, _build_into)
    assert not hit and not leftover.exists() and entry_is_sealed(path)


def _worker(name: str, cache_dir: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, str(ROOT / "tests" / "cache_safety_worker.py"), name, str(cache_dir)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def _temporaries(cache_dir: Path) -> list[Path]:
    return [p for p in cache_dir.glob("*/.*") if p.is_dir()]


def test_concurrent_builds_and_a_killed_build(tmp_path):
    cache_dir = tmp_path / "cache"
    # 1. a build killed by SIGKILL while it compiles (its temporary directory exists, it holds the lock)
    victim = _worker("alibi", cache_dir)
    deadline = time.monotonic() + 300
    while not _temporaries(cache_dir):
        assert victim.poll() is None, "the build finished before it could be killed"
        assert time.monotonic() < deadline, "no build started"
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert _temporaries(cache_dir), "the killed build's temporary directory should be left over"
    # 2. three processes at once: two build the killed variant, one another variant. The same key built twice
    # at once runs the compiler once: the winner of the lock repairs the killed build's entry, the loser
    # serves it; the other variant builds beside them
    procs = [_worker("alibi", cache_dir), _worker("alibi", cache_dir), _worker("causal", cache_dir)]
    results = [_result(p) for p in procs]
    assert all(r["err"] < 1e-4 for r in results), results
    assert results[0]["builds"] + results[1]["builds"] == 1 and results[2]["builds"] == 1, results
    assert not _temporaries(cache_dir), "a temporary directory was left behind"
    entries = [p for p in cache_dir.glob("*/*") if p.is_dir() and not p.name.startswith(".")]
    assert entries and all(entry_is_sealed(p) for p in entries)
    # 4. a later process serves everything from the cache and runs correctly
    again = [_result(_worker(n, cache_dir)) for n in ("alibi", "causal")]
    assert all(r["builds"] == 0 and r["err"] < 1e-4 for r in again), again
