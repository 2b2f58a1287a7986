"""Checks of a row hook's body: bounded loops, row accesses inside the row, the whole output row written.

The rules, each refused with the hook, the line and the fix:

* Loops are ``for`` loops run in order (``range``, ``T.serial``, ``T.unroll``) with step 1 whose
  extent is an expression of the row length, constants and enclosing loop variables
  (``T.min(n, <such>)`` counts too), so every call ends after a number of steps known from the
  row length. ``while`` loops and parallel, vectorized or thread-bound loops are refused.
* Every index into the input or the output row is proven inside ``[0, d)`` from the loop ranges,
  the ``if`` conditions and ``T.if_then_else`` conditions in force (both operands of a
  ``T.Select`` are evaluated, so its condition guards nothing). Indices into tensor parameters
  are left to the run-time checks of the tensors' shapes.
* Every element of the output row is stored on every path through the hook
  (see :mod:`attngen.ir.row_coverage`), and none is read before it is surely stored (the
  output row starts out undefined); a read of an element stored by an earlier iteration of the
  same loop is not followed, so it is refused too.
"""
from __future__ import annotations

import tvm
import tvm.tirx as tir

from . import tir_utils as tu
from .errors import VariantError
from .row_coverage import (Dropped, Loop, WrittenRange, all_of, conjuncts, covers, first_gap, loop_union,
                           merge_branches)
from .row_prover import RowProver, is_integer_condition, row_length_facts

_RUN_IN_ORDER = (tir.ForKind.SERIAL, tir.ForKind.UNROLLED)
_LOOP_FIX = ("loop with 'for i in range(n)' or 'for i in T.unroll(n)', where n is an expression of the "
             "row length d, constants and enclosing loop variables (T.min(n, d) bounds any n)")


def check_row_hook(variant: str, hook: str, func: tir.PrimFunc) -> None:
    """Raise :class:`VariantError` unless ``func`` (a row hook) obeys the rules above."""
    _RowHookChecker(variant, hook, func).run()


class _RowHookChecker:
    def __init__(self, variant: str, hook: str, func: tir.PrimFunc):
        self.variant, self.hook, self.func = variant, hook, func
        self.in_row, self.out_row = func.params[0], func.params[1]
        self.prover = RowProver()
        self.lets: dict[int, object] = {}  # let (and unified row-length) vars -> their values
        self.loops: list[Loop] = []
        self.in_select = 0  # >0 while walking the operands of a T.Select
        self.dropped: list[Dropped] = []
        self.before: list[WrittenRange] = []  # output-row ranges surely stored before the current statement

    def error(self, problem: str, fix: str, node) -> VariantError:
        return VariantError(self.variant, self.hook, problem, fix, tu.source_line(node))

    def run(self) -> None:
        length = self._unify_row_lengths()
        with self.prover.assume(row_length_facts(length)):
            written = self.stmt(self.func.body)
            if not covers(written, 0, length, self.prover):
                raise self._unwritten_error(written, length)

    def _unify_row_lengths(self):
        """Both rows are head_dim long: one length stands for both in every claim."""
        nx, ny = self.in_row.shape[0], self.out_row.shape[0]
        if isinstance(nx, tir.IntImm) and isinstance(ny, tir.IntImm):
            if nx.value != ny.value:
                raise self.error(f"the rows have fixed lengths {nx.value} and {ny.value}; both rows have "
                                 "head_dim elements", "declare both rows with the same length "
                                 "(d = T.int32(); T.match_buffer(h, (d,), 'float32'))", self.func.body)
            return nx
        if isinstance(ny, tvm.ir.Var) and not ny.same_as(nx):
            self.lets[tu.handle(ny)] = nx
            return nx
        if isinstance(nx, tvm.ir.Var) and isinstance(ny, tir.IntImm):
            self.lets[tu.handle(nx)] = ny
        return ny

    def subst(self, expr):
        return tu.substitute(expr, self.lets) if self.lets else expr

    # statements: each returns the output-row ranges it surely writes

    def stmt(self, s) -> list[WrittenRange]:
        if isinstance(s, tir.SeqStmt):
            outer, written = len(self.before), []
            for x in s.seq:
                done = self.stmt(x)
                written += done
                self.before += done
            del self.before[outer:]  # the caller adds what the whole sequence writes
            return written
        if isinstance(s, tir.For):
            return self._for(s)
        if isinstance(s, tir.While):
            raise self.error("has a 'while' loop, whose number of iterations cannot be bounded "
                             "(a call that never returns hangs the kernel)", _LOOP_FIX, s)
        if isinstance(s, tir.IfThenElse):
            return self._if(s)
        if isinstance(s, tir.BufferStore):
            return self._store(s)
        if isinstance(s, tir.Bind):
            self.expr(s.value)
            self.lets[tu.handle(s.var)] = self.subst(s.value)
            return []
        if isinstance(s, tir.LetStmt):
            self.expr(s.value)
            self.lets[tu.handle(s.var)] = self.subst(s.value)
            return self.stmt(s.body)
        if isinstance(s, tir.Return):
            raise self.error("returns early; a row hook runs to its end and writes its whole output row",
                             "drop the 'return' and guard statements with 'if' instead", s)
        if isinstance(s, tir.AttrStmt):
            return self.stmt(s.body)
        if isinstance(s, tir.Evaluate):
            self.expr(s.value)
            return []
        for load in tu.collect(s, tvm.ir.TensorLoad):  # anything else: its row accesses are still checked
            self._check_access(load.source, load.indices, load, "reads")
        for store in tu.collect(s, tir.BufferStore):
            self._check_access(store.buffer, store.indices, store, "stores")
        return []

    def _for(self, s: tir.For) -> list[WrittenRange]:
        var = s.loop_var
        if s.kind not in _RUN_IN_ORDER:
            kind = tir.ForKind(int(s.kind)).name.lower()
            raise self.error(f"loop '{var.name}' is {kind}; a hook runs its loops in order within one thread",
                             "use 'range(...)' or 'T.unroll(...)'", s)
        self.expr(s.min)
        self.expr(s.extent)
        lo, extent = self.prover.simplify(self.subst(s.min)), self.prover.simplify(self.subst(s.extent))
        if not self._bounded(extent):
            raise self.error(f"loop '{var.name}' runs {s.extent} times, which is not bounded by the row length "
                             "or a constant", _LOOP_FIX, s)
        if s.step is not None and not (isinstance(s.step, tir.IntImm) and s.step.value == 1):
            # the reference interpreter runs every integer of the range, so a step would change the result
            raise self.error(f"loop '{var.name}' has step {s.step}; hook loops take every value of their range",
                             f"loop over range(n) and scale the index instead, e.g. 'for i in range(d // 2): "
                             f"{self.out_row.name}[2 * i] = ...'", s)
        loop = Loop(var, lo, extent)
        self.prover.bind_range(var, lo, extent)
        self.loops.append(loop)
        # the body runs only in a loop of one iteration or more (the prover leaves the variable of an
        # empty range unconstrained)
        with self.prover.assume(extent >= 1):
            body = self.stmt(s.body)
        self.loops.pop()
        if _may_exit_early(s.body):  # a 'break' may skip any store after the first iteration's start
            self.dropped += [Dropped(r.origin, f"sits in loop '{var.name}', which may exit early") for r in body]
            body = []
        # outside the body's assumptions: whether the loop runs at all is part of what it writes
        return loop_union(body, loop, self.prover, self.dropped)

    def _bounded(self, extent) -> bool:
        """An expression of the row lengths, constants and enclosing loop variables (or a min with one)."""
        if isinstance(extent, tir.Min):
            return self._bounded(extent.a) or self._bounded(extent.b)
        if tu.collect(extent, tvm.ir.TensorLoad):
            return False
        known = [self.in_row.shape[0], self.out_row.shape[0]] + [lp.var for lp in self.loops]
        return all(any(v.same_as(k) for k in known) for v in tu.used_vars(extent))

    def _if(self, s: tir.IfThenElse) -> list[WrittenRange]:
        self.expr(s.condition)
        cond, not_cond, exact = self._branch_facts(s.condition)
        with self.prover.assume(cond):
            then = self.stmt(s.then_case)
        with self.prover.assume(not_cond):
            other = self.stmt(s.else_case) if s.else_case is not None else []
        if not exact:
            self.dropped += [Dropped(r.origin, f"runs only when '{s.condition}', a condition on float values")
                             for r in then + other]
        return merge_branches(then, other, cond, not_cond, self.prover, exact)

    def _branch_facts(self, condition) -> tuple:
        """``(taken, not_taken, exact)``: what holds in the taken and in the other branch of
        ``condition`` (lets expanded), and whether those are the condition and its exact negation.
        That is so for an integer condition; of any other only its integer conjuncts are kept."""
        cond = self.subst(_strip_likely(condition))
        if is_integer_condition(cond):
            return cond, self.prover.simplify(tir.Not(cond)), True
        return all_of([c for c in conjuncts(cond) if is_integer_condition(c)]), all_of([]), False

    def _store(self, s: tir.BufferStore) -> list[WrittenRange]:
        for i in s.indices:
            self.expr(i)
        self.expr(s.value)
        self._check_access(s.buffer, s.indices, s, "stores")
        idx = self.subst(s.indices[0])
        if isinstance(idx, tir.Ramp):
            if not (isinstance(idx.stride, tir.IntImm) and idx.stride.value == 1):
                self.dropped.append(Dropped(s, "stores a strided vector"))
                return []
            return [WrittenRange(idx.base, idx.base + idx.lanes, (), s)]
        return [WrittenRange(idx, idx + 1, (), s)]

    # expressions: every row access is checked under the conditions that guard it

    def expr(self, e) -> None:
        if isinstance(e, (tvm.ir.Var, tir.IntImm, tir.FloatImm)) or not isinstance(e, tvm.ir.Expr):
            return
        if isinstance(e, tvm.ir.TensorLoad):
            for i in e.indices:
                self.expr(i)
            self._check_access(e.source, e.indices, e, "reads")
        elif isinstance(e, tvm.ir.Call) and getattr(e.op, "name", "").endswith("if_then_else"):
            cond, then, other = e.args
            self.expr(cond)
            taken, not_taken, _ = self._branch_facts(cond)
            with self.prover.assume(taken):
                self.expr(then)
            with self.prover.assume(not_taken):
                self.expr(other)
        elif isinstance(e, tvm.ir.Call):
            for a in e.args:
                self.expr(a)
        elif isinstance(e, tir.Select):
            self.in_select += 1
            for part in (e.condition, e.true_value, e.false_value):
                self.expr(part)
            self.in_select -= 1
        elif isinstance(e, tir.Let):
            self.expr(e.value)
            self.lets[tu.handle(e.var)] = self.subst(e.value)
            self.expr(e.body)
        else:
            children = [getattr(e, f) for f in ("a", "b", "value", "base", "stride") if hasattr(e, f)]
            if children:
                for c in children:
                    self.expr(c)
            else:  # a node kind not listed: check its row reads with no condition assumed
                for load in tu.collect(e, tvm.ir.TensorLoad):
                    self._check_access(load.source, load.indices, load, "reads")

    def _check_access(self, buf, indices, node, verb: str) -> None:
        if not (buf.same_as(self.in_row) or buf.same_as(self.out_row)):
            return  # tensor parameters: their shapes are checked when the call runs
        index = indices[0]
        idx = self.subst(index)
        ends = [idx.base, idx.base + idx.stride * (idx.lanes - 1)] if isinstance(idx, tir.Ramp) else [idx]
        length = self.subst(buf.shape[0])
        if all(self.prover.prove(e >= 0) and self.prover.prove(e < length) for e in ends):
            if verb == "reads" and buf.same_as(self.out_row):
                self._check_stored_before(index, idx, ends, node)
            return
        ranges = ", ".join(f"{lp.var.name} in [{lp.lo}, {self.prover.simplify(lp.lo + lp.extent)})"
                           for lp in self.loops)
        select = (" T.Select evaluates both of its operands, so its condition does not guard them; "
                  "T.if_then_else evaluates only the chosen one." if self.in_select else "")
        shown = f"{buf.name}[{index}]" + (f" (= {buf.name}[{idx}])" if str(idx) != str(index) else "")
        raise self.error(
            f"{verb} {shown}, which may fall outside the row [0, {buf.shape[0]})"
            + (f" ({ranges})" if ranges else ""),
            f"keep every row index within [0, {buf.shape[0]}): narrow the loop, guard the access with 'if' or "
            f"T.if_then_else(cond, a, b), or wrap the index as '(...) % {buf.shape[0]}'.{select}", node)

    def _check_stored_before(self, index, idx, ends, node) -> None:
        if covers(self.before, ends[0], ends[-1] + 1, self.prover):
            return
        y, x = self.out_row.name, self.in_row.name
        shown = f"{y}[{index}]" + (f" (= {y}[{idx}])" if str(idx) != str(index) else "")
        raise self.error(f"reads {shown} before the hook has surely stored it (the output row starts out "
                         "undefined; a store in an earlier iteration of the same loop is not counted)",
                         f"store the element first (e.g. '{y}[0] = T.float32(0)' before accumulating into it), "
                         f"or read the input row '{x}'", node)

    def _unwritten_error(self, written: list[WrittenRange], length) -> VariantError:
        lo, hi = first_gap(written, length, self.prover)
        y = self.out_row.name
        problem = f"may leave elements [{lo}, {hi}) of the output row '{y}' unwritten"
        conditional = [r for r in written if not self.prover.prove(all_of(r.guards))]
        if conditional:
            r = conditional[0]
            problem += (f"; the store at {tu.source_line(r.origin) or 'an unknown line'} runs only when "
                        f"'{all_of(r.guards)}'")
        if self.dropped:
            problem += "; " + self.dropped[0].describe()
        fix = (f"store every element of '{y}' on every path, e.g. 'for i in range(d): {y}[i] = ...'; "
               "give an 'if' that stores an 'else' that stores the same elements")
        return self.error(problem, fix, self.func.body)


def _may_exit_early(body) -> bool:
    """Whether a loop body may leave an iteration before its end ('break' / 'continue')."""
    calls = [getattr(c.op, "name", "") for c in tu.collect(body, tvm.ir.Call)]
    return bool(tu.collect(body, tir.Break) or tu.collect(body, tir.Continue)
                or any(n.endswith(("break_loop", "continue_loop")) for n in calls))


def _strip_likely(cond):
    if isinstance(cond, tvm.ir.Call) and getattr(cond.op, "name", "").endswith("likely"):
        return cond.args[0]
    return cond

