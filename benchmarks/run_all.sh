#!/usr/bin/env bash
# GPU tests and benchmarks in one go on a CUDA machine; logs and results under $1 (default benchmarks/results).
#   bash benchmarks/run_all.sh <out-dir> <commit> [test-files] [benches] [seconds-per-test-file]
# Each test file runs in its own pytest call under its own time limit, with one line per test
# (PASSED / FAILED / SKIPPED), so a run stopped by a limit still says which tests passed.
set -u
out=${1:-benchmarks/results}; commit=${2:-unknown}; tests=${3:-}
benches=${4:-decode,prefill,cascade,planner,cost_model,tvm_kv_cache}; per_file=${5:-420}
mkdir -p "$out"
export ATTNGEN_CACHE_DIR=${ATTNGEN_CACHE_DIR:-/tmp/agcache}
for f in $tests; do
  log="$out/gpu_tests_$(basename "$f" .py).log"
  echo "# pytest -m gpu $f, commit $commit, $(date -u +%FT%TZ)" > "$log"
  timeout "$per_file" python -m pytest -m gpu -v -n "${ATTNGEN_TEST_WORKERS:-12}" -p no:cacheprovider "$f" 2>&1 \
    | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|error" >> "$log"
  rc=${PIPESTATUS[0]}
  stopped=""; [ "$rc" = 124 ] && stopped=", stopped by the time limit"
  echo "$f: $(grep -c PASSED "$log") passed, $(grep -c -E 'FAILED|ERROR ' "$log") failed$stopped" | tee -a "$log"
done
for b in ${benches//,/ }; do
  (cd benchmarks && PYTHONPATH="..${PYTHONPATH:+:$PYTHONPATH}" python "bench_$b.py" --out "../$out" --commit "$commit") > "$out/bench_$b.log" 2>&1
  tail -12 "$out/bench_$b.log"
done
