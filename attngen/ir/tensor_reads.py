"""What a variant's hooks read of each tensor parameter, and whether a call's tensors are long enough.

The other half of :class:`~attngen.ir.declarations.TensorParam`'s dim grammar: for every read of a tensor
parameter in a hook, the index along each dim and its range for a call's sizes (TVM's arithmetic
analyzer), so that the runtime can check every dim of every tensor before a kernel runs
(``runtime/params.py``), and a variant whose reads no call could bound is refused when it is made
(:func:`check_tensor_reads`, run by :mod:`.validate`).
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm
import tvm.sym
import tvm.tirx as tir

from . import tir_utils as tu
from .declarations import CALL_SIZES
from .errors import VariantError
from .hook_spec import HOOKS, POSITIONS, ROW_ARGS

# Standard hook arguments that run over a call size: batch < batch_size, qo_head < num_qo_heads, ...
INDEX_SIZES = {"batch": "batch_size", "qo_head": "num_qo_heads", "kv_head": "num_kv_heads"}
_PROBE = 1024  # every size, when deciding without a call whether a read can be bounded at all
# Positions have no bound a call passes; an index is unbounded when its range moves with theirs.
_POSITION_SPANS = (1 << 20, 1 << 21)
_SATURATED = 2**31 - 1


@dataclass(frozen=True)
class TensorRead:
    """One index a hook reads along one dim of a tensor parameter."""

    hook: str
    param: str
    dim: int
    index: object  # the PrimExpr, let bindings expanded
    where: str | None  # file:line of the hook
    size: str  # the hook buffer's size for the dim, as the hook names it (a Var's name or a number)
    data_indexed: bool  # computed from values read out of a tensor parameter
    needs: frozenset  # the call sizes its range depends on
    scalars: tuple[str, ...]  # the scalar parameters it depends on
    positions: tuple[str, ...] = ()  # the position arguments (qo_pos, kv_pos) it follows


@dataclass(frozen=True)
class ReadRange:
    """The range of one read's index for one call: [low, high], or None where attngen cannot bound it."""

    read: TensorRead
    low: int | None
    high: int | None
    missing: tuple[str, ...] = ()  # call sizes the read depends on that the call did not give


class _HookScope:
    """One hook's Vars that a call gives a range or a value to, and its reads of tensor parameters."""

    def __init__(self, hook: str, func):
        spec = HOOKS[hook]
        n_rows = len(ROW_ARGS) if spec.row else 0
        params = list(func.params)
        self.hook = hook
        self.std = {p.name: p for p in params[n_rows:spec.n_standard]}
        self.row_lengths = [r.shape[0] for r in params[:n_rows] if isinstance(r.shape[0], tvm.ir.Var)]
        self.tensors = {p.name: p for p in params[spec.n_standard:] if tir.is_buffer_var(p)}
        self.scalars = {p.name: p for p in params[spec.n_standard:] if not tir.is_buffer_var(p)}
        body = tu.expand_binds(func.body)
        self.loops = list(reversed(tu.collect(body, tir.For)))  # each loop before the loops inside it
        where = tu.source_line(func.body)
        by_buffer = {tu.handle(b): name for name, b in self.tensors.items()}
        reads: dict = {}  # one per (tensor, dim, index text): a load nested in an index is met twice
        for load in tu.collect(body, tvm.ir.TensorLoad):
            name = by_buffer.get(tu.handle(load.source))
            for i, index in enumerate(load.indices if name is not None else ()):
                size = self.tensors[name].shape[i]
                reads.setdefault((name, i, str(index)), TensorRead(
                    hook, name, i, index, where, size.name if isinstance(size, tvm.ir.Var) else str(size),
                    bool(tu.collect(index, tvm.ir.TensorLoad)), self._needs(index), self._scalars_in(index),
                    self._positions_in(index)))
        self.reads = list(reads.values())

    def _needs(self, index) -> frozenset:
        used = {tu.handle(v) for v in tu.used_vars(index)}
        for loop in self.loops:
            if tu.handle(loop.loop_var) in used:
                used |= {tu.handle(v) for v in tu.used_vars(loop.min) + tu.used_vars(loop.extent)}
        out = {INDEX_SIZES[n] for n, v in self.std.items() if n in INDEX_SIZES and tu.handle(v) in used}
        if any(tu.handle(v) in used for v in self.row_lengths):
            out.add("head_dim")
        return frozenset(out)

    @staticmethod
    def _names_in(index, named: dict) -> tuple[str, ...]:
        """The names of ``named``'s Vars that ``index`` uses."""
        used = {tu.handle(v) for v in tu.used_vars(index)}
        return tuple(n for n, v in named.items() if tu.handle(v) in used)

    def _positions_in(self, index) -> tuple[str, ...]:
        return self._names_in(index, {n: v for n, v in self.std.items() if n in POSITIONS})

    def _scalars_in(self, index) -> tuple[str, ...]:
        return self._names_in(index, self.scalars)

    def shape_vars(self) -> list[tuple[str, int, object]]:
        """(tensor, dim, the hook's size for it: a Var or an IntImm) for every dim of every tensor."""
        return [(name, i, n) for name, b in self.tensors.items() for i, n in enumerate(b.shape)]

    def analyzer(self, sizes: dict, dims: dict, scalars: dict, positions: int):
        """An analyzer knowing what a call fixes: sizes (an int, or a (lo, hi) range when probing, or None),
        the tensors' dims (ints, or a range), the scalar parameters' values (or a range) and positions."""
        an = tvm.sym.Analyzer()
        bound: set = set()

        def bind(var, value):
            if value is None or tu.handle(var) in bound:
                return
            bound.add(tu.handle(var))
            if isinstance(value, tuple):
                an.bind(var, tvm.ir.Range(value[0], value[1] + 1))
            elif "float" in str(var.ty):
                an.bind(var, tir.FloatImm(str(var.ty), float(value)))
            else:
                an.bind(var, tir.IntImm(str(var.ty), int(value)))

        for name, var in self.std.items():
            if name in INDEX_SIZES:
                size = sizes.get(INDEX_SIZES[name])
                bind(var, size if isinstance(size, tuple) or size is None else (0, max(size, 1) - 1))
            elif name in POSITIONS:
                bind(var, (0, positions - 1))
        for var in self.row_lengths:
            bind(var, sizes.get("head_dim"))
        for name, i, n in self.shape_vars():
            given = dims.get(name, ())
            if isinstance(n, tvm.ir.Var) and i < len(given):
                bind(n, given[i])
        for name, var in self.scalars.items():
            bind(var, scalars.get(name))
        for loop in self.loops:
            an.bind(loop.loop_var, tvm.ir.Range.from_min_extent(loop.min, loop.extent))
        return an


class TensorReads:
    """Every index the variant's hooks read along every dim of its tensor parameters, the range of each
    for a call, and the hooks' own assumptions about the tensors' shapes."""

    def __init__(self, variant):
        self.variant = variant
        self._scopes = [_HookScope(hook, func) for hook, func in variant.hooks.items()]
        self.reads = tuple(r for s in self._scopes for r in s.reads)

    def ranges(self, sizes: dict, dims: dict, scalars: dict, positions: int | None = None) -> list[ReadRange]:
        """Each read's range for a call of ``sizes`` (CALL_SIZES name -> int, None when the call does not
        say), tensors of ``dims`` (name -> shape) and scalar values ``scalars`` (name -> value). A read
        that depends on a size of 0 never happens and is left out. ``positions``: the call's query and key
        positions lie in [0, positions) (its longest KV length), which bounds the reads that follow them;
        None: positions unknown, those reads have no range."""
        out = []
        spans = _POSITION_SPANS if positions is None else (max(int(positions), 1),)
        for scope in self._scopes:
            analyzers = [scope.analyzer(sizes, dims, scalars, span) for span in spans]
            for read in scope.reads:
                if any(sizes.get(n) == 0 for n in read.needs):
                    continue
                missing = tuple(sorted(n for n in read.needs if sizes.get(n) is None))
                low, high = _range(read.index, analyzers)
                out.append(ReadRange(read, low, high, missing))
        return out

    def unbounded(self) -> list[TensorRead]:
        """Reads whose range no call can bound (they follow positions or other unbounded values)."""
        probe = {n: (0, _PROBE - 1) for n in CALL_SIZES}
        out = []
        for scope in self._scopes:
            dims = {name: tuple((1, _PROBE) for _ in b.shape) for name, b in scope.tensors.items()}
            scalars = {name: (-_PROBE, _PROBE) for name, v in scope.scalars.items() if "int" in str(v.ty)}
            analyzers = [scope.analyzer(probe, dims, scalars, span) for span in _POSITION_SPANS]
            out += [r for r in scope.reads if _range(r.index, analyzers)[0] is None]
        return out

    def shape_mismatches(self, dims: dict) -> list[str]:
        """What disagrees between the tensors' shapes ``dims`` (name -> shape) and the hooks' buffers: a
        fixed size, or one size Var naming dims of different lengths."""
        out = []
        for scope in self._scopes:
            seen: dict = {}
            for name, i, n in scope.shape_vars():
                if name not in dims or i >= len(dims[name]):
                    continue
                got = dims[name][i]
                if isinstance(n, tir.IntImm) and got != n.value:
                    out.append(f"hook '{scope.hook}' declares {name} dim {i} as {n.value}, the tensor has {got}")
                elif isinstance(n, tvm.ir.Var):
                    first = seen.setdefault(tu.handle(n), (name, i, got))
                    if first[2] != got:
                        out.append(f"hook '{scope.hook}' sizes {first[0]} dim {first[1]} and {name} dim {i} "
                                   f"with the same '{n.name}', but they are {first[2]} and {got}")
        return out


def _range(index, analyzers) -> tuple[int | None, int | None]:
    """[low, high] of ``index`` under each analyzer (positions spanning differently); (None, None) when
    the bounds move with the positions or saturate."""
    found = set()
    for an in analyzers:
        b = an.const_int_bound(index)
        if max(abs(b.min_value), abs(b.max_value)) >= _SATURATED:
            return None, None
        found.add((int(b.min_value), int(b.max_value)))
    return found.pop() if len(found) == 1 else (None, None)


def check_tensor_reads(variant, reads: TensorReads | None = None) -> None:
    """Refuse a variant whose hooks read a tensor parameter along a plain symbolic dim by an index no
    call can bound (the rule in :class:`TensorParam`)."""
    reads = reads or TensorReads(variant)
    for read in reads.unbounded():
        decl = variant.param(read.param)
        dim = decl.dims[read.dim]
        if dim.sized or read.data_indexed:
            continue
        raise VariantError(
            variant.name, read.hook,
            f"reads tensor parameter '{read.param}' along dim {read.dim} ('{dim.text}') at an index attngen "
            f"cannot bound ({read.index}), so no call can check that the tensor is long enough",
            f"clamp the index into the buffer (T.min(T.max(index, 0), {read.size} - 1)), or declare the dim as a "
            f"number, a call size ({', '.join(CALL_SIZES)}) or '{dim.symbol}>=B' with B above every index the "
            "hook reads", read.where)


def check_hook_shapes(variant, reads: TensorReads | None = None) -> None:
    """Refuse hooks whose tensor buffers fix a size that no tensor could have: one that differs from the
    declaration's number or is below its 'name>=B' bound, one that another hook fixes differently, or one
    size Var standing for dims the declaration fixes to different numbers. (A size given as a call size
    is checked at every call, ``runtime/params.py``.)"""
    fixed: dict = {}  # (tensor, dim) -> (hook, size) of the first hook fixing it
    for scope in (reads or TensorReads(variant))._scopes:
        by_var: dict = {}  # a size Var's handle -> (tensor, dim, declared number) of its first dim
        for name, i, n in scope.shape_vars():
            decl = variant.param(name).dims[i]
            if isinstance(n, tir.IntImm):
                _check_fixed_size(variant, scope, name, i, n.value, decl, fixed)
            elif isinstance(n, tvm.ir.Var) and decl.fixed is not None:
                first = by_var.setdefault(tu.handle(n), (name, i, decl.fixed))
                if first[2] != decl.fixed:
                    raise _shape_error(variant, scope, f"sizes {first[0]} dim {first[1]} and {name} dim {i} with "
                                       f"the same '{n.name}', but they are declared {first[2]} and {decl.fixed}",
                                       "give the buffers separate size Vars (T.int32() each)")


def _check_fixed_size(variant, scope, name: str, i: int, size: int, decl, fixed: dict) -> None:
    """One size a hook's buffer fixes, against the declaration and the hooks before it."""
    if decl.fixed is not None and decl.fixed != size:
        raise _shape_error(variant, scope, f"declares tensor parameter '{name}' dim {i} as {size}, but its "
                           f"TensorParam declares {decl.fixed}", "make the hook's buffer and TensorParam.shape agree")
    if isinstance(decl.at_least, int) and size < decl.at_least:
        raise _shape_error(variant, scope, f"declares tensor parameter '{name}' dim {i} as {size}, but its "
                           f"TensorParam declares it at least {decl.at_least} ('{decl.text}')",
                           "make the hook's buffer and TensorParam.shape agree")
    hook, first = fixed.setdefault((name, i), (scope.hook, size))
    if first != size:
        raise _shape_error(variant, scope, f"declares tensor parameter '{name}' dim {i} as {size}, but hook "
                           f"'{hook}' declares it as {first}", "give the dim one size in every hook")


def _shape_error(variant, scope, problem: str, fix: str) -> VariantError:
    return VariantError(variant.name, scope.hook, problem, fix, tu.source_line(variant.hooks[scope.hook].body))
