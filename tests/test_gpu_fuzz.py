"""GPU: the fuzzer's random variants and batches through every CUDA template (benchmarks/fuzz_gpu.py: both
decode templates whole and split, the balanced plan with its merge, both mma.sync tile widths, the Hopper
template on compute capability 9.0): every call matches the float64 reference or is refused by name; then a
few of the same calls under compute-sanitizer memcheck and initcheck, with zero reports."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
FUZZ = Path(__file__).resolve().parents[1] / "benchmarks" / "fuzz_gpu.py"


@pytest.fixture(scope="module")
def fuzz_env(build_cache):
    return dict(os.environ, ATTNGEN_CACHE_DIR=str(build_cache.root))


def test_fuzz_calls_match_the_reference_or_are_refused(fuzz_env):
    p = subprocess.run([sys.executable, str(FUZZ), "--recipes", "4", "--cases", "24", "--seed", "7"],
                       env=fuzz_env, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-3000:]
    assert "fuzz_gpu done" in p.stdout


@pytest.mark.parametrize("tool", ["memcheck", "initcheck"])
def test_fuzz_calls_under_the_sanitizer(fuzz_env, tool):
    exe = shutil.which("compute-sanitizer")
    if exe is None:
        pytest.skip("compute-sanitizer is not installed on this GPU machine")
    args = [sys.executable, str(FUZZ), "--recipes", "2", "--cases", "6", "--seed", "11"]
    subprocess.run(args, env=fuzz_env, capture_output=True, check=False)  # builds outside the sanitizer
    p = subprocess.run([exe, "--tool", tool, "--error-exitcode", "3", *args], env=fuzz_env, capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-3000:]
    assert "fuzz_gpu done" in p.stdout and "ERROR SUMMARY: 0 errors" in p.stdout, p.stdout[-3000:]
