"""benchmarks/bench_tvm_model.py's launch-shape reader, on a synthetic profiler trace (the GPU run reports the
attention kernels' grids from the real one)."""
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench_tvm_model import ATTENTION, launch_shapes  # noqa: E402


def kernel(name, grid, block=(128, 1, 1), smem=103296, regs=128, cat="kernel"):
    return {"cat": cat, "name": name, "args": {"grid": list(grid), "block": list(block), "shared memory": smem,
                                               "registers per thread": regs}}


def test_launch_shapes_lists_each_attention_kernels_distinct_grids_in_order():
    decode = "void attngen::decode_tc_kernel<Hooks_d128, __half, 128, 2, __half>(DecodeProblem)"
    trace = {"traceEvents": [
        kernel(decode, (256, 1, 1)),
        kernel("fused_matmul_add_kernel", (64, 32, 1)),  # not attention
        kernel(decode, (256, 1, 1)),  # the same shape again: listed once
        kernel(decode, (512, 1, 1)),  # a split launch: its own shape
        kernel("merge_decode_kernel", (32, 8, 1), block=(64, 1, 1), smem=0, regs=40),
        kernel(decode, (999, 1, 1), cat="cuda_runtime"),  # the launch call, not the kernel
        {"cat": "kernel", "name": "tvm_tir_decode_kernel", "args": {}},  # fields missing
    ]}
    shapes = launch_shapes(trace, ATTENTION)
    assert list(shapes) == [decode, "merge_decode_kernel", "tvm_tir_decode_kernel"]
    assert shapes[decode] == ["grid 256x1x1, block 128x1x1, smem 103296 B, 128 regs",
                              "grid 512x1x1, block 128x1x1, smem 103296 B, 128 regs"]
    assert shapes["merge_decode_kernel"] == ["grid 32x8x1, block 64x1x1, smem 0 B, 40 regs"]
    assert shapes["tvm_tir_decode_kernel"] == ["grid ?, block ?, smem ? B, ? regs"]
    assert launch_shapes(trace, re.compile("nothing")) == {}
    assert launch_shapes({}, ATTENTION) == {}
