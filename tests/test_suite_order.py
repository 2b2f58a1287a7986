"""The suites' order (tests/suite_order.py): every first-template case of a test function parametrized
over the prefill template before any second-template case, each half longest first, ties in collected order;
without a GPU, whole modules longest first."""
from types import SimpleNamespace

from .suite_order import DEFAULT_S, EXPECTED_MODULE_S, EXPECTED_S, SHARED_BUILD_GROUPS, cpu_scope, expected_seconds, \
    order_cpu_suite, order_gpu_suite, scope_seconds

SLOW = "tests/test_gpu_fuzz.py::test_fuzz_calls_under_the_sanitizer"


def case(nodeid: str, **params):
    return SimpleNamespace(nodeid=nodeid, callspec=SimpleNamespace(params=params) if params else None)


def test_expected_seconds_by_function():
    assert expected_seconds(SLOW + "[memcheck]") == EXPECTED_S[SLOW] > DEFAULT_S
    assert expected_seconds("tests/test_x.py::test_y[1]") == DEFAULT_S


def test_second_templates_last_and_each_half_longest_first():
    items = [case("a.py::t_first"),
             case("a.py::t_pair[x-mma_sync]", name="x", template="mma_sync"),
             case("a.py::t_pair[x-hopper]", name="x", template="hopper"),
             case("a.py::t_pair[y-mma_sync]", name="y", template="mma_sync"),
             case("a.py::t_pair[y-hopper]", name="y", template="hopper"),
             case(SLOW + "[memcheck]", kind="memcheck"),
             case("b.py::t_pair[z-hopper]", name="z", template="hopper"),
             case("b.py::t_pair[z-mma_sync]", name="z", template="mma_sync"),
             case("b.py::t_last")]
    order_gpu_suite(items)
    assert [i.nodeid for i in items] == [
        SLOW + "[memcheck]", "a.py::t_first", "a.py::t_pair[x-mma_sync]", "a.py::t_pair[y-mma_sync]",
        "b.py::t_pair[z-hopper]", "b.py::t_last",
        "a.py::t_pair[x-hopper]", "a.py::t_pair[y-hopper]", "b.py::t_pair[z-mma_sync]"]


def test_a_workers_thread_pools_take_its_share_of_the_cores():
    """tests/conftest.py: under pytest-xdist each worker's OpenMP / BLAS / TVM pools start with its share of the
    cores (here 1: more workers than cores), not one thread per core each; a variable the user set is kept."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    env["PYTEST_XDIST_WORKER_COUNT"] = str(2 * (os.cpu_count() or 1))
    env["TVM_NUM_THREADS"] = "3"
    code = ("import os, tests.conftest, torch; "
            "print(torch.get_num_threads(), *(os.environ[v] for v in ('OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', "
            "'TVM_NUM_THREADS', 'MKL_NUM_THREADS')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "1", "1", "3", "1"], out.stdout + out.stderr


def test_cpu_order_moves_whole_modules_longest_first():
    heavy, light = "tests/test_cuda_codegen.py", "tests/test_cli.py"
    assert EXPECTED_MODULE_S[heavy] > EXPECTED_MODULE_S[light]
    items = [case("tests/test_unknown.py::t_a"), case(light + "::t_1"), case(heavy + "::t_1[x]"),
             case(light + "::t_2"), case(heavy + "::t_2"), case("tests/test_unknown.py::t_b")]
    order_cpu_suite(items)
    assert [i.nodeid for i in items] == [heavy + "::t_1[x]", heavy + "::t_2", light + "::t_1", light + "::t_2",
                                         "tests/test_unknown.py::t_a", "tests/test_unknown.py::t_b"]


def test_cpu_scopes_are_modules_or_groups_of_modules_sharing_builds():
    """The CPU suite's workers take whole scopes: a module, or the modules of a SHARED_BUILD_GROUPS group, whose
    expected seconds add up and order the group among the modules."""
    group = {m for m, g in SHARED_BUILD_GROUPS.items() if g == "tvm_slots_sm90a"}
    assert len(group) >= 2 and {cpu_scope(m + "::t[x]") for m in group} == {"tvm_slots_sm90a"}
    assert cpu_scope("tests/test_cli.py::t_1[a::b]") == "tests/test_cli.py"
    assert scope_seconds("tvm_slots_sm90a") == sum(EXPECTED_MODULE_S.get(m, 0) for m in group)
    member, light = sorted(group)[0], "tests/test_cli.py"
    assert scope_seconds("tvm_slots_sm90a") > EXPECTED_MODULE_S[light] > 0
    items = [case(light + "::t_1"), case(member + "::t_1"), case("tests/test_unknown.py::t_a"),
             case(light + "::t_2"), case(member + "::t_2")]
    order_cpu_suite(items)
    assert [i.nodeid for i in items] == [member + "::t_1", member + "::t_2", light + "::t_1", light + "::t_2",
                                         "tests/test_unknown.py::t_a"]
