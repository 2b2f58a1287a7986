"""The GPU suite's order: longest work first, and a library's second user after every first user.

The GPU suite runs on pytest-xdist workers that each build with one core (``ATTNGEN_BUILD_CORES``), so its
wall time is the packing of a few long builds among many short tests. Two rules order the collected items:

- A case parametrized over the prefill ``template`` shares its library with the case of the other template.
  Every first-template case runs before any second-template case: the second one, run late, finds the
  library built and only launches kernels (side by side, one of the two waited on the build cache's lock
  for the whole build, its worker idle).
- Within each half, longest first (LPT): ``EXPECTED_S`` holds the seconds a case of each slow test function
  took in the last whole-suite run (one core per build, fresh cache); every other case counts
  ``DEFAULT_S``. The long builds start at once and the short cases fill the end, where a long one left for
  last would run alone.

``ATTNGEN_TEST_TIMES=<file>`` makes each worker append a line per finished test (seconds, node id) as it
finishes, which a run cut short still leaves behind.
"""
from __future__ import annotations

DEFAULT_S = 10.0
# seconds per case (the first-template half of a pair; tests/test_gpu_*.py, tests/test_fp8_*.py), from
# benchmarks/results/gpu_tests_2026-12-02_967e1e5_all.log
EXPECTED_S = {
    "tests/test_gpu_fuzz.py::test_fuzz_calls_under_the_sanitizer": 70,
    "tests/test_gpu_tvm_kv_cache.py::test_example_gemma2_model_on_cuda": 70,
    "tests/test_fp8_cuda_decode.py::test_fp8_decode_matches_the_reference": 60,
    "tests/test_gpu_sanitizer.py::test_sanitizer_clean": 60,
    "tests/test_fp8_cuda_prefill.py::test_fp8_prefill_matches_the_reference_on_dequantised_values": 55,
    "tests/test_gpu_tvm_kv_cache.py::test_example_model_on_cuda": 48,
    "tests/test_gpu_fuzz.py::test_fuzz_calls_match_the_reference_or_are_refused": 42,
    "tests/test_gpu_fp8_decode_variants.py::test_fp8_tensor_core_decode_with_hooks_and_groups": 34,
    "tests/test_gpu_tvm_kv_cache.py::test_example_decode_loop_on_cuda": 31,
    "tests/test_fp8_cuda_build.py::test_cuda_attention_decodes_fp8_caches": 28,
    "tests/test_lto_build.py::test_linked_and_whole_fp8_libraries_agree_on_the_gpu": 27,
    "tests/test_gpu_prefill.py::test_prefill_matches_reference": 25,
    "tests/test_gpu_prefill.py::test_example_variants": 24,
    "tests/test_gpu_fuzz.py::test_the_gpu_fuzzers_finds_stay_fixed": 23,
    "tests/test_gpu_tvm_kv_cache_rope.py::test_inline_rope_caches_match_reference_and_cpu_cache": 22,
}


def expected_seconds(nodeid: str) -> float:
    return EXPECTED_S.get(nodeid.split("[")[0], DEFAULT_S)


def order_gpu_suite(items: list) -> None:
    """Reorder ``items`` (pytest items: ``nodeid``, ``callspec``) in place by the two rules above; ties keep
    their collected order."""
    ranks = {}  # per test function, its templates in the order they first appear
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "template" in callspec.params:
            order = ranks.setdefault(item.nodeid.split("[")[0], {})
            order.setdefault(callspec.params["template"], len(order))

    def key(pair):
        i, item = pair
        fn = item.nodeid.split("[")[0]
        rank = ranks[fn][item.callspec.params["template"]] if fn in ranks else 0
        return min(rank, 1), -expected_seconds(item.nodeid), i

    items[:] = [item for _, item in sorted(enumerate(items), key=key)]
