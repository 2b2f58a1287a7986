"""What a variant declares besides its hooks: its extra parameters and its state algebra.

These are the vocabulary the checks (:mod:`.validate`), the analyses (:mod:`.analysis`), the
:class:`~attngen.ir.variant.Variant` and the runtime's parameter check (``runtime/params.py``)
share. A parameter checks its own declaration when it is made (a scalar's default against its
dtype's range, a tensor's dims against the grammar in :class:`TensorParam`). The other half of that
grammar, what the hooks read of each tensor parameter and the range of every index for a call's sizes,
is :class:`attngen.ir.tensor_reads.TensorReads`.
"""
from __future__ import annotations

import difflib
import enum
import math
import numbers
import operator
import re
from dataclasses import dataclass




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
    except OverflowError:  # an int past float64's range
        return None, f"the integer given overflows {dtype} and would become inf"
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


def _check_near_call_size(name: str) -> None:
    """A name one slip away from a call size (``num_qo_head``, ``head_dims``) is a misspelling: taken as it
    is, it would declare a free symbolic dim, and the dim would not be checked against the call."""
    if name in CALL_SIZES:
        return
    close = difflib.get_close_matches(name, CALL_SIZES, n=1, cutoff=0.9)
    if close:
        raise ValueError(f"dim {name!r} is not a call size; did you mean {close[0]!r}? (a name that is not one of "
                         f"{list(CALL_SIZES)} declares a free symbolic dim: rename it, e.g. 'n', if that is meant)")


def parse_dim(entry) -> TensorDim:
    """A :class:`TensorDim` from one shape entry; ValueError (with the grammar) when it follows none."""
    if isinstance(entry, numbers.Integral) and not isinstance(entry, bool):
        if entry < 1:
            raise ValueError(f"dim {entry} must be at least 1")
        return TensorDim(str(entry), fixed=int(entry))
    if isinstance(entry, str):
        name, sep, bound = (x.strip() for x in entry.partition(">="))
        for part in (name, bound) if sep and not bound.isdigit() else (name,):
            _check_near_call_size(part)
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
