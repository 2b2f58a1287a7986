"""The facts a row hook may rely on, and the prover the row-hook checks ask.

A row has ``head_dim`` elements, and every head dim a build accepts is a positive multiple of
:data:`ROW_LENGTH_MULTIPLE` (the schedules' head-dim tables are held to it by a test), so a hook
may split its row in halves or quarters. Proofs run on TVM's arithmetic analyzer, which falls
back to Z3 at ``ProofStrength.SYMBOLIC_BOUND`` where the rewrite rules cannot decide a claim.
Z3 runs under a resource limit rather than a time limit: it counts solver steps, so a hook is
accepted or refused the same way on a loaded machine as on an idle one. (Without the limit set,
Z3's default budget can fail a claim once and prove it when asked again.)
"""
from __future__ import annotations

import tvm
import tvm.sym
import tvm.tirx as tir
from tvm.ir import Range

from . import tir_utils as tu

ROW_LENGTH_MULTIPLE = 16
_Z3_RLIMIT = 2_000_000  # solver steps per claim; each claim about the built-in and test hooks takes under 2,000
_STRENGTH = tvm.sym.ProofStrength.SYMBOLIC_BOUND


def row_length_facts(length) -> tvm.ir.Expr:
    """What holds of a row length: a positive multiple of ROW_LENGTH_MULTIPLE."""
    if isinstance(length, tir.IntImm):
        return tir.IntImm("bool", 1)
    return tir.And(length >= ROW_LENGTH_MULTIPLE, tir.floormod(length, ROW_LENGTH_MULTIPLE) == 0)


class RowProver:
    """Decides claims about row indices under the loop ranges and branch conditions in force."""

    def __init__(self):
        self.analyzer = tvm.sym.Analyzer()
        if self.analyzer.is_z3_enabled:
            self.analyzer.set_z3_rlimit(_Z3_RLIMIT)

    def assume(self, cond):
        """A context in which ``cond`` holds (a branch condition, the row-length facts)."""
        return self.analyzer.constraint_scope(cond)

    def bind_range(self, var, lo, extent) -> None:
        """``var`` takes values in ``[lo, lo + extent)`` (a loop variable)."""
        self.analyzer.bind(var, Range.from_min_extent(lo, extent), allow_override=True)

    def prove(self, claim) -> bool:
        return bool(self.analyzer.can_prove(claim, _STRENGTH))

    def simplify(self, expr):
        """The analyzer's simplification, then each min/max whose order the prover decides resolved
        (the rewrite rules alone leave 'T.min(d, d // 2 - 1)' as it is)."""
        expr = self.analyzer.simplify(expr)

        def pick(node, smaller: bool):
            if self.prove(node.a <= node.b):
                return node.a if smaller else node.b
            if self.prove(node.b <= node.a):
                return node.b if smaller else node.a
            return node

        expr = tu.map_nodes(expr, tir.Min, lambda m: pick(m, True))
        expr = tu.map_nodes(expr, tir.Max, lambda m: pick(m, False))
        return self.analyzer.simplify(expr)


def uses_var(expr, var) -> bool:
    """Whether ``expr`` reads ``var`` anywhere (buffer loads' indices included)."""
    return any(v.same_as(var) for v in tu.used_vars(expr))


def is_integer_condition(cond) -> bool:
    """Whether ``cond`` computes on integers only.

    Such a condition reads only what a hook cannot change (scalars, tensor parameters, loop and let
    variables; the rows hold floats) and its negation is exact. A comparison of floats is neither:
    the output row changes as the hook runs, and a NaN makes both ``a > b`` and ``a <= b`` false,
    which the prover, reasoning over reals, would not see.
    """
    nodes = [cond] + tu.collect(cond, tvm.ir.Expr)
    return not any("float" in str(n.ty) for n in nodes if not (isinstance(n, tvm.ir.Var) and tir.is_buffer_var(n)))
