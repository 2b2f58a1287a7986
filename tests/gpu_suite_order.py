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
# seconds per case (the first-template half of a pair; tests/test_gpu_*.py, tests/test_fp8_*.py), from the
# whole-suite run at 8907803 (benchmarks/results/gpu_tests_2026-12-03_8907803_all.log, -n 16; setup phases
# counted with the case that ran them); test_gpu_hook_pass.py's is a guess (not in that run)
EXPECTED_S = {
    "tests/test_gpu_tvm_kv_cache.py::test_example_model_on_cuda": 89,
    "tests/test_gpu_tvm_kv_cache.py::test_example_gemma2_model_on_cuda": 80,
    "tests/test_fp8_cuda_prefill.py::test_fp8_prefill_matches_the_reference_on_dequantised_values": 77,
    "tests/test_gpu_tvm_kv_cache_rope.py::test_inline_rope_caches_match_reference_and_cpu_cache": 74,
    "tests/test_gpu_views.py::test_headwise_bsr_on_gpu": 73,
    "tests/test_gpu_views.py::test_bsr_on_gpu": 69,
    "tests/test_gpu_tvm_kv_cache_trees.py::test_tree_scripts_match_tvms_own_tree_kernels": 68,
    "tests/test_fp8_cuda_build.py::test_cuda_attention_decodes_fp8_caches": 68,
    "tests/test_lto_build.py::test_linked_and_whole_fp8_libraries_agree_on_the_gpu": 65,
    "tests/test_lto_build.py::test_linked_and_whole_libraries_agree_on_the_gpu": 64,
    "tests/test_gpu_fuzz.py::test_fuzz_calls_under_the_sanitizer": 62,
    "tests/test_gpu_fuzz.py::test_the_gpu_fuzzers_finds_stay_fixed": 57,
    "tests/test_gpu_fuzz.py::test_fuzz_calls_match_the_reference_or_are_refused": 55,
    "tests/test_gpu_fp8_decode_variants.py::test_fp8_tensor_core_decode_with_hooks_and_groups": 50,
    "tests/test_gpu_tvm_kv_cache_windows.py::test_sequence_windows_with_sinks_match_reference_and_tvm": 49,
    "tests/test_fp8_cuda_prefill.py::test_fp8_prefill_refuses_missing_scales_and_serves_either_template": 46,
    "tests/test_gpu_views.py::test_cascade_on_gpu": 44,
    "tests/test_gpu_tvm_kv_cache.py::test_example_decode_loop_on_cuda": 44,
    "tests/test_fp8_cuda_decode.py::test_fp8_decode_matches_the_reference": 42,
    "tests/test_gpu_prefill.py::test_example_variants": 39,
    "tests/test_gpu_sanitizer.py::test_sanitizer_clean": 38,
    "tests/test_gpu_tvm_kv_cache_windows.py::test_sliding_window_layers_match_reference_and_tvm": 37,
    "tests/test_gpu_decode.py::test_decode_refuses_group_above_build_bound": 31,
    "tests/test_gpu_hook_pass.py::test_hook_pass_matches_reference_and_the_per_tile_hooks": 30,
    "tests/test_gpu_decode.py::test_decode_rejects_bad_page_index": 29,
    "tests/test_gpu_prefill.py::test_prefill_matches_reference": 29,
    "tests/test_gpu_decode.py::test_decode_balanced_plan_skewed_and_superseded": 27,
    "tests/test_fp8_cuda_build.py::test_cuda_fp8_decode_refuses_missing_and_misplaced_scales": 27,
    "tests/test_gpu_tvm_kv_cache_trees.py::test_tree_scripts_match_the_cpu_cache": 25,
    "tests/test_gpu_tvm_kv_cache_windows.py::test_sliding_window_prefill_matches_reference": 24,
    "tests/test_gpu_tvm_kv_cache_trees.py::test_ragged_tree_slot_matches_reference": 24,
    "tests/test_gpu_tvm_kv_cache.py::test_cuda_model_library_cache_matches_tvm_kernels_and_reference": 24,
    "tests/test_gpu_decode.py::test_decode_matches_reference": 24,
    "tests/test_gpu_decode.py::test_decode_merge_choice_of_an_all_split_batch": 23,
    "tests/test_gpu_tvm_kv_cache_trees.py::test_paged_tree_slot_matches_reference": 21,
    "tests/test_gpu_tvm_kv_cache.py::test_cuda_cache_matches_tvm_kernels_and_reference": 20,
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
