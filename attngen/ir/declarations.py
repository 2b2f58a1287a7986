"""What a variant declares besides its hooks: its extra parameters and its state algebra.

These are the vocabulary the checks (:mod:`.validate`), the analyses (:mod:`.analysis`), the
:class:`~attngen.ir.variant.Variant` and the runtime's parameter check (``runtime/params.py``)
share. A parameter checks its own declaration when it is made (a scalar's default against its
dtype's range, a tensor's dims against the grammar in :class:`TensorParam`). The other half of that
grammar, what the hooks read of each tensor parameter and the range of every index for a call's sizes,
is :class:`TensorReads`.
"""
from __future__ import annotations

import enum
import math
import numbers
import operator
import re
from dataclasses import dataclass

import tvm
import tvm.sym
import tvm.tirx as tir

from . import tir_utils as tu
from .errors import VariantError
from .hook_spec import HOOKS, POSITIONS, ROW_ARGS


class StateAlgebra(str, enum.Enum):
    """How partial attention states combine."""

    SOFTMAX = "softmax"  # (O, lse): normalised output plus base-2 log-sum-exp, merged by lse
    SUM = "sum"  # unnormalised weighted sum (e.g. sigmoid attention), merged by addition


# Value ranges of the scalar dtypes. Integers are passed as C integers of the dtype, so a value outside
# wraps; floats outside the finite range turn into inf.
INT_RANGES = {"int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1), "uint8": (0, 255)}
FLOAT_MAX = {"float32": 3.4028234663852886e38, "float16": 65504.0, "bfloat16": 3.3895313892515355e38}


def scalar_value(dtype: str, value) -> tuple[int | float | None, str | None]:
    """(``value`` as the Python int / float passed for a scalar of ``dtype``, None) or (None, the problem).
    Integers must be whole numbers inside the dtype's range; floats must not overflow the dtype."""
    if isinstance(value, (str, bytes)):  # float("128") would pass; a quoted number is a mistake
        kind = "a whole number" if dtype in INT_RANGES else "a number"
        return None, f"expected {kind} for {dtype}, got {type(value).__name__} {value!r}"
    if dtype in INT_RANGES:
        try:
            v = operator.index(value)
        except TypeError:
            try:
                f = float(value)
            except (TypeError, ValueError):
                return None, f"expected a whole number for {dtype}, got {type(value).__name__} {value!r}"
            if not f.is_integer():
                return None, f"{value!r} is not a whole number, and {dtype} holds whole numbers only"
            v = int(f)
        lo, hi = INT_RANGES[dtype]
        if not lo <= v <= hi:
            return None, f"{v} is outside {dtype}'s range [{lo}, {hi}]"
        return int(v), None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None, f"expected a number for {dtype}, got {type(value).__name__} {value!r}"
    top = FLOAT_MAX.get(dtype)
    if top is not None and math.isfinite(f) and abs(f) > top:
        return None, f"{f!r} overflows {dtype} (largest finite value {top:g}) and would become inf"
    return f, None


@dataclass(frozen=True)
class ScalarParam:
    """A runtime scalar passed to every hook that declares a parameter of this name.

    Integer dtypes take whole numbers inside the dtype's range, float dtypes finite values inside
    theirs (or inf / nan given as such); the default is checked when the parameter is made, every
    value given at a call when the call is made.
    """

    name: str
    dtype: str = "float32"
    default: float | int | None = None
    doc: str = ""

    def __post_init__(self):
        if self.default is not None and (self.dtype in INT_RANGES or self.dtype in FLOAT_MAX):
            _, problem = scalar_value(self.dtype, self.default)
            if problem:
                raise ValueError(f"ScalarParam '{self.name}': default {problem}. Fix: give a default that "
                                 f"fits {self.dtype}, or declare a wider dtype")


# Sizes every call knows, by the name a tensor parameter's dim uses for them.
CALL_SIZES = {
    "batch_size": "requests in the call",
    "num_qo_heads": "query heads (q.shape[1])",
    "num_kv_heads": "K/V heads of the cache",
    "head_dim": "elements of one head's row",
    "total_q": "query rows of the call (q.shape[0]; batch_size for decode)",
}
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class TensorDim:
    """One parsed entry of :attr:`TensorParam.shape`: ``fixed``, ``call_size`` or ``symbol`` (this one
    possibly with ``at_least``)."""

    text: str  # as declared
    fixed: int | None = None  # a number: the dim must be exactly this
    call_size: str | None = None  # a name in CALL_SIZES: the dim must equal the call's size
    symbol: str | None = None  # any other name: the size is the caller's, bounded by what the hooks read
    at_least: int | str | None = None  # a symbol's declared bound ('name>=B'): the dim must be >= B

    @property
    def sized(self) -> bool:
        """Whether the declaration itself says how large the dim is (so reads attngen cannot bound
        are the declaration's promise)."""
        return self.symbol is None or self.at_least is not None


def parse_dim(entry) -> TensorDim:
    """A :class:`TensorDim` from one shape entry; ValueError (with the grammar) when it follows none."""
    if isinstance(entry, numbers.Integral) and not isinstance(entry, bool):
        if entry < 1:
            raise ValueError(f"dim {entry} must be at least 1")
        return TensorDim(str(entry), fixed=int(entry))
    if isinstance(entry, str):
        name, sep, bound = (x.strip() for x in entry.partition(">="))
        if _IDENT.match(name) and not sep:
            return TensorDim(entry, call_size=name) if name in CALL_SIZES else TensorDim(entry, symbol=name)
        if _IDENT.match(name) and name not in CALL_SIZES and (bound.isdigit() or bound in CALL_SIZES):
            return TensorDim(entry, symbol=name, at_least=int(bound) if bound.isdigit() else bound)
    raise ValueError(f"dim {entry!r} is not a number, a name, or 'name>=B' (B a number or one of "
                     f"{sorted(CALL_SIZES)})")


@dataclass(frozen=True)
class TensorParam:
    """A runtime tensor (e.g. ALiBi slopes) readable by hooks: C-contiguous, of ``dtype``, of the rank
    of ``shape``, which the hooks' buffers share.

    Each entry of ``shape`` declares one dim as one of:

    * a number ``N`` -- the dim must be exactly ``N``;
    * a size the call knows (:data:`CALL_SIZES`: ``batch_size``, ``num_qo_heads``, ``num_kv_heads``,
      ``head_dim``, ``total_q``) -- the dim must equal that size;
    * ``"name>=B"`` (``B`` a number or a call size) -- the dim must be at least ``B``;
    * any other name -- a symbolic dim: any length the hooks' reads fit in.

    At every call (``runtime/params.py``, before any kernel runs), for every dim of every tensor:

    1. the dim satisfies its declaration;
    2. every index a hook reads along it that attngen can bound lies in ``[0, dim)``. An index is
       bounded when its range follows from the call: from ``batch`` / ``qo_head`` / ``kv_head`` (below
       ``batch_size`` / ``num_qo_heads`` / ``num_kv_heads``), the row index (below ``head_dim``),
       scalar parameters' values, the tensors' own sizes and constants -- a clamp such as
       ``T.min(qo_pos, n - 1)`` bounds anything;
    3. the hooks' buffers agree with the tensor: a size a hook's buffer fixes (``(n, 4)``) equals the
       tensor's, and dims a hook sizes with one Var are equally long.

    An index no call bounds (it follows ``qo_pos`` / ``kv_pos`` or another unbounded value) is allowed
    along a dim whose size the declaration gives (a number, a call size, ``"name>=B"``: the hooks are
    taken at their word that they read below it), and refused along a plain symbolic dim
    (:func:`check_tensor_reads`, which names the fixes). An index computed from values read out of a
    tensor parameter (a packed mask's offsets) is bounded by that data: attngen checks the tensors the
    values come from, their filler (e.g. ``pack_custom_mask``) keeps the reads inside. A call size
    the entry point does not know makes a dim or read depending on it an error, never a skipped check.
    """

    name: str
    dtype: str
    shape: tuple[int | str, ...] = ("n",)
    doc: str = ""

    def __post_init__(self):
        if isinstance(self.shape, (str, int)) or not hasattr(self.shape, "__iter__"):
            raise ValueError(f"TensorParam '{self.name}': shape {self.shape!r} must be a tuple of dims, "
                             f"e.g. ('{self.shape}',)")
        object.__setattr__(self, "shape", tuple(self.shape))
        if not self.shape:
            raise ValueError(f"TensorParam '{self.name}': a tensor has at least one dim; declare a single "
                             "value as ScalarParam")
        try:
            self.dims
        except ValueError as e:
            raise ValueError(f"TensorParam '{self.name}': {e}") from None

    @property
    def dims(self) -> tuple[TensorDim, ...]:
        return tuple(parse_dim(d) for d in self.shape)


Param = ScalarParam | TensorParam

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
                    bool(tu.collect(index, tvm.ir.TensorLoad)), self._needs(index), self._scalars_in(index)))
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

    def _scalars_in(self, index) -> tuple[str, ...]:
        used = {tu.handle(v) for v in tu.used_vars(index)}
        return tuple(n for n, v in self.scalars.items() if tu.handle(v) in used)

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

    def ranges(self, sizes: dict, dims: dict, scalars: dict) -> list[ReadRange]:
        """Each read's range for a call of ``sizes`` (CALL_SIZES name -> int, None when the call does not
        say), tensors of ``dims`` (name -> shape) and scalar values ``scalars`` (name -> value). A read
        that depends on a size of 0 never happens and is left out."""
        out = []
        for scope in self._scopes:
            analyzers = [scope.analyzer(sizes, dims, scalars, span) for span in _POSITION_SPANS]
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
