"""GPU: compute-sanitizer memcheck over one configuration of each decode code path."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


def test_decode_memcheck_clean(tmp_path):
    exe = shutil.which("compute-sanitizer")
    if exe is None:
        pytest.skip("compute-sanitizer is not installed on this GPU machine")
    env = dict(os.environ, ATTNGEN_CACHE_DIR=str(tmp_path))
    subprocess.run([sys.executable, str(Path(__file__).with_name("gpu_memcheck_case.py"))], env=env, check=True)
    p = subprocess.run([exe, "--tool", "memcheck", "--error-exitcode", "3", sys.executable,
                        str(Path(__file__).with_name("gpu_memcheck_case.py"))], env=env, capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    assert "ERROR SUMMARY: 0 errors" in p.stdout
