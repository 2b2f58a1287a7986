"""The suites' order: longest work first; on a GPU machine, a library's second user after every first user.

Without a GPU (the CPU suite, CI) whole test modules move, longest first by ``EXPECTED_MODULE_S`` (seconds per
module of a whole run on two cores), each module's items together and in their collected order, and each module
runs on one pytest-xdist worker (tests/conftest.py's scheduler, :func:`cpu_scope`): module-scoped fixtures (some
build in a fresh cache) set up once, modules that build the same libraries (``SHARED_BUILD_GROUPS``) run on one
worker in turn, so no worker waits on a build lock while another compiles, and the run does not end on one long
module while the other worker idles.

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
# seconds of a function's longest case (setup and call; tests/test_gpu_*.py, tests/test_fp8_*.py, ...), from the
# whole-suite run at 8d8607c on an H100 (benchmarks/results/gpu_tests_2026-12-06_8d8607c_h100_times.txt,
# ATTNGEN_TEST_TIMES, -n 16 on its 16 cores, each worker's thread pools at its share; cases of 11 s or more)
EXPECTED_S = {
    "tests/test_gpu_fp8_views.py::test_gpu_cascade_over_an_fp8_cache_equals_one_over_its_values": 137,
    "tests/test_gpu_fuzz.py::test_fuzz_fp8_calls_match_the_reference_or_are_refused": 137,
    "tests/test_gpu_tvm_kv_cache.py::test_example_gemma2_model_on_cuda": 127,
    "tests/test_fp8_cuda_prefill.py::test_fp8_prefill_matches_the_reference_on_dequantised_values": 111,
    "tests/test_gpu_sanitizer.py::test_sanitizer_clean": 111,
    "tests/test_gpu_views.py::test_causal_cascade_on_gpu": 105,
    "tests/test_gpu_views.py::test_causal_bsr_on_gpu": 105,
    "tests/test_gpu_tvm_kv_cache.py::test_cuda_cache_follows_random_scripts": 102,
    "tests/test_gpu_fp8_views.py::test_gpu_block_sparse_over_an_fp8_cache_equals_one_over_its_values": 90,
    "tests/test_fp8_cuda_build.py::test_cuda_attention_decodes_fp8_caches": 89,
    "tests/test_gpu_fuzz.py::test_fuzz_calls_under_the_sanitizer": 89,
    "tests/test_lto_build.py::test_linked_and_whole_fp8_libraries_agree_on_the_gpu": 67,
    "tests/test_gpu_decode_kv_pairs.py::test_kv_head_pairs_match_the_reference_and_the_one_head_launch": 65,
    "tests/test_gpu_fuzz.py::test_fuzz_calls_match_the_reference_or_are_refused": 62,
    "tests/test_gpu_fp8_decode_variants.py::test_fp8_tensor_core_decode_with_hooks_and_groups": 50,
    "tests/test_gpu_tvm_kv_cache_rope.py::test_inline_rope_caches_match_reference_and_cpu_cache": 49,
    "tests/test_gpu_tvm_kv_cache_windows.py::test_sliding_window_layers_match_reference_and_tvm": 48,
    "tests/test_gpu_tvm_kv_cache.py::test_example_model_on_cuda": 46,
    "tests/test_gpu_kv_pool.py::test_prefill_reads_strided_pools_in_place": 44,
    "tests/test_gpu_tvm_kv_cache_windows.py::test_sequence_windows_with_sinks_match_reference_and_tvm": 43,
    "tests/test_gpu_strided_inputs.py::test_paged_prefill_and_decode_read_strided_queries": 39,
    "tests/test_gpu_kv_pool.py::test_the_entry_functions_refuse_unreadable_pools_themselves": 38,
    "tests/test_gpu_tvm_kv_cache_trees.py::test_tree_scripts_match_tvms_own_tree_kernels": 37,
    "tests/test_gpu_hook_pass.py::test_hook_pass_matches_reference_and_the_per_tile_hooks": 36,
    "tests/test_gpu_fuzz.py::test_the_gpu_fuzzers_finds_stay_fixed": 36,
    "tests/test_fp8_cuda_prefill.py::test_fp8_prefill_refuses_missing_scales_and_serves_either_template": 35,
    "tests/test_lto_build.py::test_linked_and_whole_libraries_agree_on_the_gpu": 35,
    "tests/test_gpu_tvm_kv_cache_tensor_params.py::test_cuda_model_library_binds_tensor_parameters": 35,
    "tests/test_gpu_tile_map.py::test_mapped_prefill_with_a_logits_hook": 35,
    "tests/test_gpu_prefill.py::test_prefill_cuda_graph_replays_100_random_batches": 34,
    "tests/test_gpu_prefill.py::test_long_rows_on_both_hopper_tilings": 32,
    "tests/test_gpu_prefill.py::test_tail_split_matches_the_reference": 31,
    "tests/test_gpu_tvm_kv_cache.py::test_example_decode_loop_on_cuda": 30,
    "tests/test_gpu_prefill.py::test_prefill_matches_reference": 29,
    "tests/test_gpu_tile_map.py::test_device_lists_match_the_reference": 29,
    "tests/test_gpu_decode.py::test_decode_matches_reference": 28,
    "tests/test_gpu_tile_map.py::test_a_head_reading_mask_is_classified_per_query_head": 28,
    "tests/test_gpu_hook_math.py::test_softcap_prefill_matches_the_reference_in_both_modes": 27,
    "tests/test_gpu_tile_map.py::test_mapped_prefill_matches_the_reference": 27,
    "tests/test_gpu_views.py::test_headwise_bsr_on_gpu": 26,
    "tests/test_gpu_prefill.py::test_example_variants": 25,
    "tests/test_gpu_tile_map.py::test_a_plan_derives_a_new_map_for_a_new_scalar_mask_parameter": 24,
    "tests/test_gpu_prefill.py::test_affine_logits_hook_with_scales_of_either_sign": 19,
    "tests/test_gpu_tile_map.py::test_mapped_prefill_with_a_head_reading_mask": 19,
    "tests/test_gpu_tile_map.py::test_linked_build_walks_the_map": 19,
    "tests/test_fp8_cuda_build.py::test_cuda_fp8_decode_refuses_missing_and_misplaced_scales": 18,
    "tests/test_gpu_tvm_kv_cache_tensor_params.py::test_cuda_cache_with_tensor_parameters_matches_reference": 16,
    "tests/test_gpu_tvm_kv_cache.py::test_cuda_cache_matches_tvm_kernels_and_reference": 15,
    "tests/test_gpu_tile_map.py::test_classifier_matches_the_reference": 13,
    "tests/test_gpu_tvm_kv_cache.py::test_cuda_model_library_cache_matches_tvm_kernels_and_reference": 11,
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


# seconds per test module of a whole CPU run (tests/*.py, -n 2 on two cores, 2026-12-05 at d3606c7, pytest
# --durations=0 summed per file, then the fp8 decode build counted in tests/test_fp8_cuda_build.py, which now makes it,
# and tests/test_lto_build.py less the template and launch objects two of its tests no longer build twice; modules
# under 5 s count 0 and keep their collected order at the end)
EXPECTED_MODULE_S = {
    "tests/test_cuda_codegen.py": 278, "tests/test_lto_build.py": 75, "tests/test_fp8_cuda_build.py": 52,
    "tests/test_fp8_cuda_prefill.py": 49, "tests/test_fp8_kv.py": 38, "tests/test_tvm_kv_cache.py": 36,
    "tests/test_tvm_kv_cache_cuda_rope.py": 31, "tests/test_cpu_backend.py": 29, "tests/test_cuda_api_checks.py": 29,
    "tests/test_fast_start.py": 29, "tests/test_tvm_kv_cache_cuda_trees.py": 27, "tests/test_cli.py": 27,
    "tests/test_tvm_kv_cache_aot_cuda.py": 26, "tests/test_cache_safety.py": 25,
    "tests/test_tvm_kv_cache_aot.py": 25, "tests/test_tvm_model_e2e.py": 24,
    "tests/test_tvm_kv_cache_cuda_tensor_params.py": 23, "tests/test_examples.py": 18, "tests/test_cache.py": 15,
    "tests/test_cache_key.py": 12, "tests/test_tvm_kv_cache_tree.py": 11, "tests/test_fuzz_cpu.py": 11,
    "tests/test_tvm_kv_cache_cuda_windows.py": 11, "tests/test_planner.py": 7, "tests/test_bad_input.py": 6,
}


# modules that build the same libraries, run as one scope (one worker, in turn): apart, two workers would compile
# a shared library at once, one of them idle on the cache lock (the sm_90a slot libraries of head_dim 64: vanilla
# with and without a window, with RoPE)
SHARED_BUILD_GROUPS = {f"tests/{m}.py": "tvm_slots_sm90a" for m in (
    "test_tvm_kv_cache_cuda_rope", "test_tvm_kv_cache_cuda_trees", "test_tvm_kv_cache_cuda_windows",
    "test_tvm_kv_cache_aot_cuda")}


def cpu_scope(nodeid: str) -> str:
    """The CPU suite's unit of distribution of ``nodeid``: its module, or the module's group of shared builds."""
    module = nodeid.split("::")[0]
    return SHARED_BUILD_GROUPS.get(module, module)


def scope_seconds(scope: str) -> float:
    """Expected seconds of a scope: its modules' ``EXPECTED_MODULE_S`` summed."""
    modules = [m for m, g in SHARED_BUILD_GROUPS.items() if g == scope] or [scope]
    return sum(EXPECTED_MODULE_S.get(m, 0) for m in modules)


def order_cpu_suite(items: list) -> None:
    """Reorder ``items`` in place: whole scopes (:func:`cpu_scope`), longest first (:func:`scope_seconds`); ties
    keep the order of their first items, and the items within a scope their collected order."""
    first = {}
    for i, item in enumerate(items):
        first.setdefault(cpu_scope(item.nodeid), i)

    def key(pair):
        i, item = pair
        scope = cpu_scope(item.nodeid)
        return -scope_seconds(scope), first[scope], i

    items[:] = [item for _, item in sorted(enumerate(items), key=key)]
