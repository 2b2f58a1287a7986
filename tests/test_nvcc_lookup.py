"""Where attngen looks for nvcc: ATTNGEN_NVCC, PATH, CUDA_HOME / CUDA_PATH, /usr/local/cuda, an nvidia-cuda-nvcc
wheel on ``sys.path`` (codegen/nvcc.py ``find_nvcc``)."""
import stat
import sys

import pytest

from attngen.codegen import nvcc


def fake_nvcc(path):
    path.parent.mkdir(parents=True)
    path.write_text("#!/bin/sh\necho fake\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.fixture
def no_nvcc_around(monkeypatch, tmp_path):
    """No nvcc by ATTNGEN_NVCC, PATH or CUDA_HOME; find_nvcc's memo cleared before and after."""
    for name in ("ATTNGEN_NVCC", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.setattr(nvcc, "DEFAULT_CUDA_HOME", str(tmp_path / "no-cuda-here"))
    nvcc.find_nvcc.cache_clear()
    yield
    nvcc.find_nvcc.cache_clear()


@pytest.mark.parametrize("wheel_dir", nvcc.WHEEL_NVCC_DIRS)
def test_nvcc_of_an_nvidia_wheel_on_sys_path_is_found(wheel_dir, no_nvcc_around, monkeypatch, tmp_path):
    site = tmp_path / "site-packages"
    want = fake_nvcc(site / wheel_dir / "nvcc")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "elsewhere"), str(site)] + sys.path)
    assert want in nvcc.wheel_nvcc_candidates()
    assert nvcc.find_nvcc() == want


@pytest.fixture
def a_wheel_nvcc(no_nvcc_around, monkeypatch, tmp_path):
    """An nvidia-cuda-nvcc wheel's nvcc in a site-packages directory on sys.path, nothing else found."""
    site = tmp_path / "site-packages"
    monkeypatch.setattr(sys, "path", [str(site)] + sys.path)
    return fake_nvcc(site / nvcc.WHEEL_NVCC_DIRS[0] / "nvcc")


def test_a_toolkit_in_the_default_place_comes_before_a_wheel(a_wheel_nvcc, monkeypatch, tmp_path):
    toolkit = fake_nvcc(tmp_path / "toolkit" / "bin" / "nvcc")
    monkeypatch.setattr(nvcc, "DEFAULT_CUDA_HOME", str(tmp_path / "toolkit"))
    assert nvcc.find_nvcc() == toolkit


def test_attngen_nvcc_and_cuda_home_come_before_a_wheel(a_wheel_nvcc, monkeypatch, tmp_path):
    home = fake_nvcc(tmp_path / "cuda" / "bin" / "nvcc")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    assert nvcc.find_nvcc() == home
    nvcc.find_nvcc.cache_clear()
    chosen = fake_nvcc(tmp_path / "mine" / "nvcc")
    monkeypatch.setenv("ATTNGEN_NVCC", chosen)
    assert nvcc.find_nvcc() == chosen


def test_a_wheel_directory_without_an_executable_nvcc_is_passed_over(no_nvcc_around, monkeypatch, tmp_path):
    site = tmp_path / "site-packages"
    (site / nvcc.WHEEL_NVCC_DIRS[0]).mkdir(parents=True)
    (site / nvcc.WHEEL_NVCC_DIRS[0] / "nvcc").write_text("not executable")
    monkeypatch.setattr(sys, "path", [str(site)])
    assert nvcc.find_nvcc() is None
