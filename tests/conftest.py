"""Shared fixtures: one build cache per test session (shared by a run's pytest-xdist workers, or kept across
sessions), seeded RNGs, the gpu marker's skip rule.

Random inputs are fresh on every run: the run draws a seed (or takes ``ATTNGEN_TEST_SEED``), which the header
and every failure report print, and each test's ``rng`` is seeded by it and the test's id, so
``ATTNGEN_TEST_SEED=<seed> pytest <test id>`` draws a failing test's inputs again."""
from __future__ import annotations

import os
import random
import shutil
import zlib


def _share_the_cores() -> None:
    """A pytest-xdist worker's builds (nvcc's threads, parallel links: ``ATTNGEN_BUILD_CORES``) and math libraries
    (OpenMP / OpenBLAS / MKL under NumPy and PyTorch, TVM's CPU thread pool) get the worker's share of the cores,
    set before any of them loads: left to themselves each worker's pools start one thread per core, and n workers
    put n x cores threads on the machine's cores."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        share = str(max(1, (os.cpu_count() or 1) // workers))
        for var in ("ATTNGEN_BUILD_CORES", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "TVM_NUM_THREADS"):
            os.environ.setdefault(var, share)


_share_the_cores()

import numpy as np  # noqa: E402  (after the thread counts)
import pytest  # noqa: E402

from attngen.codegen.cache import BuildCache  # noqa: E402

from .suite_order import cpu_scope, order_cpu_suite, order_gpu_suite  # noqa: E402


def _shallow_tvmscript_stacks() -> None:
    """TVMScript's decorators (``@T.prim_func``, ``@I.ir_module``) take ``inspect.stack()`` of their caller, which
    reads the source line and code position of every frame: costly under pytest's deep stacks (68 s of the CPU
    suite's CPU in one profile, docs/testing.md). The parser uses the frames' objects (their locals) and the code
    line of the third frame (whether the decorator sits in a class) alone, so here their stacks hold every frame,
    with the source lines and positions of the first three only. Nothing the parser reads differs. In pytest-xdist
    workers only (their test modules import TVM at collection anyway; the controller never imports it here)."""
    import inspect
    import sys
    import types

    def stack(context: int = 1) -> list:
        frames, frame = [], sys._getframe(1)
        while frame is not None:
            if len(frames) < 3:
                info = inspect.getframeinfo(frame, context)
                frames.append(inspect.FrameInfo(frame, *info[:5], positions=info.positions))
            else:
                frames.append(inspect.FrameInfo(frame, frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name,
                                                None, None, positions=None))
            frame = frame.f_back
        return frames

    shallow = types.ModuleType("inspect")
    shallow.__dict__.update(inspect.__dict__)
    shallow.stack = stack
    from tvm.script.parser.ir import entry as ir_entry
    from tvm.tirx.script.parser import entry as tir_entry

    for module in (ir_entry, tir_entry):
        if module.inspect is inspect:
            module.inspect = shallow


def _has_gpu() -> tuple[bool, str]:
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, "no CUDA GPU on this machine (run `pytest -m gpu` on a GPU machine)"
    return True, ""


def pytest_collection_modifyitems(config, items):
    ok, why = _has_gpu()
    if ok:
        order_gpu_suite(items)
        return
    order_cpu_suite(items)
    skip = pytest.mark.skip(reason=why)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(optionalhook=True)  # (a pytest-xdist hook: no error where the plugin is not loaded)
def pytest_xdist_make_scheduler(config, log):
    """The CPU suite's workers take whole scopes (tests/suite_order.py ``cpu_scope``: a module, or modules that
    build the same libraries) in the collected order, which ``order_cpu_suite`` made longest first; the GPU suite
    keeps pytest-xdist's own scheduler (one test at a time, in ``order_gpu_suite``'s order)."""
    if config.getvalue("dist") != "load" or _has_gpu()[0]:
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ScopeScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return cpu_scope(nodeid)

    config.option.loadscopereorder = False  # (by default it puts the scopes of most tests first)
    return ScopeScheduling(config, log)


@pytest.fixture(scope="session")
def build_cache(tmp_path_factory) -> BuildCache:
    """The session's build cache: every test that builds a library passes it, so equal builds (equal
    variant IR, config, sources and tools) happen once per session. ``ATTNGEN_TEST_CACHE_DIR`` names a
    cache kept across sessions instead: a later session compiles only what changed."""
    kept = os.environ.get("ATTNGEN_TEST_CACHE_DIR")
    if kept:
        return BuildCache(kept)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # pytest-xdist: the workers of one run share a cache (entries are sealed by an atomic rename, so a
        # library two workers build at once is kept once), under the run's common base directory
        return BuildCache(tmp_path_factory.getbasetemp().parent / "attngen-cache")
    return BuildCache(tmp_path_factory.mktemp("attngen-cache"))


SEED_VARIABLE = "ATTNGEN_TEST_SEED"


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _shallow_tvmscript_stacks()
    # set before pytest-xdist starts its workers, which inherit the environment: one seed for the whole run
    os.environ.setdefault(SEED_VARIABLE, str(random.SystemRandom().randrange(2**32)))


def pytest_runtest_logreport(report):
    """``ATTNGEN_TEST_TIMES=<file>``: one line per finished test phase that took time (seconds, phase, node id),
    appended as it finishes, so a run cut short still says where its time went."""
    path = os.environ.get("ATTNGEN_TEST_TIMES")
    # under pytest-xdist the controller receives each worker's report again (with the worker as ``node``):
    # the workers write, the controller does not
    if path and getattr(report, "node", None) is None and report.duration >= 0.5:
        with open(path, "a") as f:
            f.write(f"{report.duration:.2f} {report.when} {report.nodeid}\n")


def run_seed() -> int:
    return int(os.environ[SEED_VARIABLE])


def pytest_report_header(config):
    return f"random inputs: {SEED_VARIABLE}={run_seed()} (set it to draw this run's inputs again)"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        report.sections.append(("random inputs", f"{SEED_VARIABLE}={run_seed()} pytest '{item.nodeid}'"))


@pytest.fixture
def rng(request) -> np.random.Generator:
    """Fresh per run, reproducible from the run's seed and the test's id."""
    return np.random.default_rng([run_seed(), zlib.crc32(request.node.nodeid.encode())])


requires_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
