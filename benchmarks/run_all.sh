#!/usr/bin/env bash
# GPU tests and benchmarks in one go on a CUDA machine; logs and results under $1 (default benchmarks/results).
#   bash benchmarks/run_all.sh <out-dir> <commit> [tests-expr] [benches]
set -u
out=${1:-benchmarks/results}; commit=${2:-unknown}; tests=${3:-}; benches=${4:-decode,prefill,cascade,planner,cost_model,tvm_kv_cache}
mkdir -p "$out"
export ATTNGEN_CACHE_DIR=${ATTNGEN_CACHE_DIR:-/tmp/agcache}
if [ -n "$tests" ]; then
  python -m pytest -m gpu -q -n 8 -p no:cacheprovider $tests 2>&1 | tail -40 > "$out/gpu_tests.log"
  tail -3 "$out/gpu_tests.log"
fi
for b in ${benches//,/ }; do
  (cd benchmarks && python "bench_$b.py" --out "../$out" --commit "$commit") > "$out/bench_$b.log" 2>&1
  tail -12 "$out/bench_$b.log"
done
