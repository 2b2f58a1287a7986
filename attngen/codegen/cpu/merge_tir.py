"""Attention-state merging as TIR programs for the CPU backend (base-2 LSE, the empty-state rule).

``merge_state_inplace``: (v, s) <- merge((v, s), (v_other, s_other)).
``merge_states``: K states per row -> one. ``merge_states_sum``: unnormalised states add.
An empty state (s = -inf) passes the other through; two empty states give (0, -inf); a NaN lse (a
poisoned row, see ``attngen.runtime.reference``) makes the merged row NaN, O and lse.
"""
from __future__ import annotations

import functools
from pathlib import Path

import tvm
from tvm.script import tirx as T
from tvm.target import Target

from attngen.codegen.cache import BuildCache, content_key, hash_files
from attngen.schedules.build_config import merge_symbol

NEG_INF = tvm.tirx.const(float("-inf"), "float32")


def exp_base(m):
    """The base of a merge's exponents: the largest lse, or 0 when every state is empty, so that an empty
    state weighs exp2(-inf) = 0 and never exp2(-inf + inf) = NaN, while a NaN lse, whether the max keeps or
    drops it, still gives the weight exp2(NaN) = NaN and the merged row is NaN."""
    return T.if_then_else(m == NEG_INF, T.float32(0), m)


CPU_MERGE_DTYPES = ("float32", "float16")


def merge_functions(dtype: str) -> dict:
    """symbol -> the CPU merge PrimFunc of ``dtype``."""
    if dtype not in CPU_MERGE_DTYPES:
        raise ValueError(f"dtype {dtype!r}: the CPU merge functions serve {list(CPU_MERGE_DTYPES)}")
    return dict(_merge_functions(dtype))


@functools.lru_cache(maxsize=None)
def _merge_functions(dtype: str) -> tuple:
    """Parsed once per dtype and process (TVMScript parses the source on every call; TIR is immutable)."""

    # fmt: off
    @T.prim_func
    def merge_state_inplace(v_ptr: T.handle,  # [n, H, D]
                            s_ptr: T.handle,  # [n, H] float32
                            vo_ptr: T.handle,  # [n, H, D]
                            so_ptr: T.handle):  # [n, H] float32
        n = T.int32()
        h = T.int32()
        d = T.int32()
        V = T.match_buffer(v_ptr, (n, h, d), dtype)
        S = T.match_buffer(s_ptr, (n, h), "float32")
        VO = T.match_buffer(vo_ptr, (n, h, d), dtype)
        SO = T.match_buffer(so_ptr, (n, h), "float32")
        for ij in T.parallel(n * h):
            i: T.let = T.truncdiv(ij, h)
            j: T.let = T.truncmod(ij, h)
            m: T.let = T.max(S[i, j], SO[i, j])
            base: T.let = exp_base(m)
            wa: T.let = T.exp2(S[i, j] - base)
            wb: T.let = T.exp2(SO[i, j] - base)
            tot: T.let = wa + wb
            for k in range(d):
                V[i, j, k] = T.Cast(dtype, T.if_then_else(tot == T.float32(0), T.float32(0),
                                                          (T.Cast("float32", V[i, j, k]) * wa
                                                           + T.Cast("float32", VO[i, j, k]) * wb) / tot))
            S[i, j] = T.if_then_else(tot == T.float32(0), NEG_INF, m + T.log2(tot))

    @T.prim_func
    def merge_states(v_ptr: T.handle,  # [n, K, H, D]
                     s_ptr: T.handle,  # [n, K, H] float32
                     vm_ptr: T.handle,  # [n, H, D]
                     sm_ptr: T.handle):  # [n, H] float32
        n = T.int32()
        kk = T.int32()
        h = T.int32()
        d = T.int32()
        V = T.match_buffer(v_ptr, (n, kk, h, d), dtype)
        S = T.match_buffer(s_ptr, (n, kk, h), "float32")
        VM = T.match_buffer(vm_ptr, (n, h, d), dtype)
        SM = T.match_buffer(sm_ptr, (n, h), "float32")
        for ij in T.parallel(n * h):
            i: T.let = T.truncdiv(ij, h)
            j: T.let = T.truncmod(ij, h)
            m: T.float32 = NEG_INF
            for c in range(kk):
                m = T.max(m, S[i, c, j])
            base: T.let = exp_base(m)
            tot: T.float32 = T.float32(0)
            for c in range(kk):
                tot = tot + T.exp2(S[i, c, j] - base)
            for k in range(d):
                acc: T.float32 = T.float32(0)
                for c in range(kk):
                    acc = acc + T.exp2(S[i, c, j] - base) * T.Cast("float32", V[i, c, j, k])
                VM[i, j, k] = T.Cast(dtype, T.if_then_else(tot == T.float32(0), T.float32(0), acc / tot))
            SM[i, j] = T.if_then_else(tot == T.float32(0), NEG_INF, m + T.log2(tot))

    @T.prim_func
    def merge_states_sum(v_ptr: T.handle,  # [n, K, H, D]
                         vm_ptr: T.handle):  # [n, H, D]
        n = T.int32()
        kk = T.int32()
        h = T.int32()
        d = T.int32()
        V = T.match_buffer(v_ptr, (n, kk, h, d), dtype)
        VM = T.match_buffer(vm_ptr, (n, h, d), dtype)
        for ij in T.parallel(n * h):
            i: T.let = T.truncdiv(ij, h)
            j: T.let = T.truncmod(ij, h)
            for k in range(d):
                acc: T.float32 = T.float32(0)
                for c in range(kk):
                    acc = acc + T.Cast("float32", V[i, c, j, k])
                VM[i, j, k] = T.Cast(dtype, acc)
    # fmt: on

    return ((merge_symbol("merge_state_inplace", dtype), merge_state_inplace),
            (merge_symbol("merge_states", dtype), merge_states),
            (merge_symbol("merge_states_sum", dtype), merge_states_sum))


def build_merge_library(cache: BuildCache | None = None) -> Path:
    cache = cache or BuildCache()
    key = content_key({"merge_tir": hash_files([Path(__file__)]), "tvm": tvm.__version__})

    def build(out: Path) -> None:
        funcs = {}
        for dt in ("float32", "float16"):
            for name, f in merge_functions(dt).items():
                funcs[tvm.ir.GlobalVar(name)] = f.with_attr("global_symbol", name)
        target = Target({"kind": "llvm"})
        with target, tvm.transform.PassContext(config={"tirx.disable_cse_tir": True}):
            tvm.tirx.build(tvm.IRModule(funcs), target=target).export_library(str(out / "libattngen_merge_cpu.so"))

    directory, _ = cache.get_or_build(key, build)
    return directory / "libattngen_merge_cpu.so"
