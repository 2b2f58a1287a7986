"""GPU: compute-sanitizer over one configuration of each template (gpu_memcheck_case.py): memcheck finds no
out-of-bounds or misaligned access, racecheck no shared-memory hazard (the split-KV merge path included),
initcheck no read of uninitialised global memory."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .gpu_memcheck_case import VARIANTS

pytestmark = pytest.mark.gpu
CASE = Path(__file__).with_name("gpu_memcheck_case.py")


@pytest.fixture(scope="module")
def built(build_cache):
    exe = shutil.which("compute-sanitizer")
    if exe is None:
        pytest.skip("compute-sanitizer is not installed on this GPU machine")
    # the session's build cache: the workers running the three tools build the case's libraries once
    env = dict(os.environ, ATTNGEN_CACHE_DIR=str(build_cache.root))
    # each variant's libraries in a process of its own, side by side; then the case once outside the sanitizer
    builds = [subprocess.Popen([sys.executable, str(CASE), "--build", name], env=env) for name in VARIANTS]
    assert [p.wait() for p in builds] == [0] * len(builds)
    subprocess.run([sys.executable, str(CASE)], env=env, check=True)
    return exe, env


@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "initcheck"])
def test_sanitizer_clean(built, tool):
    exe, env = built
    p = subprocess.run([exe, "--tool", tool, "--error-exitcode", "3", sys.executable, str(CASE)], env=env,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    assert "sanitizer case done" in p.stdout
    assert "ERROR SUMMARY: 0 errors" in p.stdout or "RACECHECK SUMMARY: 0 hazards" in p.stdout, p.stdout[-2000:]
