"""Resolve a variant's extra parameters for one call: defaults, dtypes, ranges, sizes, call order.

The order is the variant's declaration order, the order in which the CUDA entry functions take them
(the traits' ``ExtraArgs``, codegen/cuda_variant.py): scalars as Python ints / floats, tensors as given.
Scalars are range-checked against their dtype; every dim of every tensor against its declaration and
against every index the hooks read along it (the rule in :class:`attngen.ir.TensorParam`), before any
kernel runs: a short tensor is an error here, never a read past its end.
"""
from __future__ import annotations

import weakref
from collections.abc import Callable

import numpy as np

from attngen.ir import ScalarParam, TensorParam
from attngen.ir.declarations import CALL_SIZES, scalar_value
from attngen.ir.int_arithmetic import checked_parameters, parameter_problem
from attngen.ir.tensor_reads import TensorReads

from .checks import AttentionArgumentError, check_tensor

_MEMO_SIZE = 1024  # per variant: read ranges of recent call shapes (a serving loop cycles through batch sizes)


class _VariantReads:
    """A variant's tensor reads (checked when the Variant was made: ``ir/validate.py``) and the reads'
    ranges for recent call shapes."""

    def __init__(self, variant):
        self.reads = TensorReads(variant)
        self.unbounded = {id(r) for r in self.reads.unbounded()}
        # reads that follow qo_pos from the call's sizes alone (check_query_positions)
        self.query_position_reads = [r for r in self.reads.unbounded() if "qo_pos" in r.positions
                                     and not r.data_indexed]
        # what the ranges depend on, so that calls differing elsewhere (say, in batch size for a table read
        # by head) share one entry
        self.sizes = sorted({n for r in self.reads.reads for n in r.needs})
        self.scalars = sorted({p.name for p in variant.scalar_params})
        self.memo: dict = {}

    def ranges(self, sizes: dict, dims: dict, scalars: dict, positions: int | None = None):
        # positions matter only to reads that follow them: other variants share one entry across lengths
        positions = positions if self.unbounded else None
        key = (tuple(sizes[n] for n in self.sizes), tuple(sorted(dims.items())),
               tuple(scalars.get(n) for n in self.scalars), positions)
        if key not in self.memo:
            if len(self.memo) >= _MEMO_SIZE:
                self.memo.clear()
            self.memo[key] = (self.reads.shape_mismatches(dims), self.reads.ranges(sizes, dims, scalars, positions))
        return self.memo[key]


_READS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _variant_reads(variant) -> _VariantReads:
    if variant not in _READS:
        _READS[variant] = _VariantReads(variant)
    return _READS[variant]


def resolve_params(variant, given: dict | None, *, num_qo_heads: int, batch_size: int,
                   num_kv_heads: int | None = None, head_dim: int | None = None,
                   total_q: int | None = None, positions: int | Callable[[], int | None] | None = None) -> list:
    """Values in declaration order; scalars range-checked, tensors checked for dtype, rank, layout and
    every dim. The sizes are the call's (``CALL_SIZES``); one left None cannot be checked against, so a
    parameter depending on it is refused rather than passed unchecked. ``positions``: the call's query and
    key positions lie below it (the batch's longest KV length, where the caller knows it on the host; or a
    function giving it, called only for a variant with such reads), so that a read that follows them (a
    document id per position) is checked too; None: such reads rely on their dim's declaration
    (``'max_len>=B'``) alone."""
    given = dict(given or {})
    unknown = sorted(set(given) - {p.name for p in variant.params})
    if unknown:
        raise AttentionArgumentError(
            f"params: {unknown} are not parameters of variant '{variant.name}' "
            f"(it declares {[p.name for p in variant.params] or 'none'})")
    sizes = {"batch_size": batch_size, "num_qo_heads": num_qo_heads, "num_kv_heads": num_kv_heads,
             "head_dim": head_dim, "total_q": total_q}
    out, dims, scalars = [], {}, {}
    for p in variant.params:
        if p.name not in given:
            if isinstance(p, ScalarParam) and p.default is not None:
                value, _ = scalar_value(p.dtype, p.default)  # checked when the parameter was declared
                out.append(value)
                scalars[p.name] = value
                continue
            raise AttentionArgumentError(f"params['{p.name}']: variant '{variant.name}' needs it "
                                         f"({p.doc or p.dtype})")
        val = given[p.name]
        if isinstance(p, TensorParam):
            check_tensor(val, f"params['{p.name}']", len(p.shape), p.dtype)
            dims[p.name] = tuple(int(n) for n in val.shape)
            _check_declared_dims(p, dims[p.name], sizes)
            out.append(val)
        else:
            value, problem = scalar_value(p.dtype, val)
            if problem:
                raise AttentionArgumentError(f"params['{p.name}']: {problem} (variant '{variant.name}' declares "
                                             f"it {p.dtype})")
            out.append(value)
            scalars[p.name] = value
    if scalars:
        _check_int_arithmetic(variant, scalars)
    if variant.tensor_params:
        if callable(positions):
            positions = positions() if _variant_reads(variant).unbounded else None
        _check_reads(variant, sizes, dims, scalars, positions if positions else None)
    return out


def check_query_positions(variant, qo_lens, kv_lens: Callable, *, decode: bool = False) -> None:
    """Refuse a request with more queries than keys where a hook reads a tensor parameter along ``qo_pos``: its
    first queries sit at negative positions (``kv_len - qo_len + i``; a decode query of a request without keys at
    -1), and the read would fall before the tensor's row. qo_lens: [B] queries per request; kv_lens: a function
    giving [B] keys per request (called only for such a variant)."""
    if not variant.tensor_params:
        return
    reads = _variant_reads(variant).query_position_reads
    if not reads:
        return
    qo, kv = np.asarray(qo_lens), np.asarray(kv_lens())
    over = np.nonzero(qo > kv)[0]
    if len(over):
        b, r = int(over[0]), reads[0]
        n = int(qo[b])
        where, fix = (("kv", "give every request at least one key") if decode else
                      ("qo_indptr", "pass at most as many queries as keys per request"))
        raise AttentionArgumentError(
            f"{where}: request {b} has {n} quer{'y' if n == 1 else 'ies'} and {int(kv[b])} keys, so its first "
            f"queries sit at negative positions (kv_len - qo_len + i), and hook '{r.hook}'"
            + (f" ({r.where})" if r.where else "") + f" reads params['{r.param}'] at {r.index}, before the "
            f"tensor's row: {fix}")


_INT_PROBLEMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # variant -> (parameters checked, memo)


def _check_int_arithmetic(variant, scalars: dict) -> None:
    """Refuse scalar parameter values that make a hook's int32 arithmetic wrap, divide by 0 or overflow a cast to
    an integer (ir/int_arithmetic.py); the parameters that could are found once per variant, and the answers
    remembered for their recent values."""
    entry = _INT_PROBLEMS.get(variant)
    if entry is None:
        entry = _INT_PROBLEMS[variant] = (checked_parameters(variant), {})
    names, memo = entry
    if not names:
        return
    key = tuple(scalars[n] for n in names)
    if key not in memo:
        if len(memo) >= _MEMO_SIZE:
            memo.clear()
        memo[key] = parameter_problem(variant, {n: scalars[n] for n in names})
    if memo[key]:
        name, why, wanted = memo[key]
        raise AttentionArgumentError(f"params['{name}']: {why} (variant '{variant.name}'): pass {wanted}")


def _check_declared_dims(p: TensorParam, shape: tuple[int, ...], sizes: dict) -> None:
    for i, (dim, got) in enumerate(zip(p.dims, shape)):
        where = f"params['{p.name}']: dim {i} ({dim.text})"
        want = dim.fixed if dim.fixed is not None else dim.call_size or dim.at_least
        if want is None:
            continue
        if isinstance(want, str):
            if sizes[want] is None:
                raise AttentionArgumentError(f"{where}: this entry point does not know {want} "
                                             f"({CALL_SIZES[want]}), so the dim cannot be checked")
            want = sizes[want]
        if dim.at_least is not None and got < want:
            raise AttentionArgumentError(f"{where} is {got}, must be at least {want}: shape {shape}")
        if dim.at_least is None and got != want:
            raise AttentionArgumentError(f"{where} is {got}, expected {want}: shape {shape}")


def _check_reads(variant, sizes: dict, dims: dict, scalars: dict, positions: int | None) -> None:
    reads = _variant_reads(variant)
    mismatches, ranges = reads.ranges(sizes, dims, scalars, positions)
    if mismatches:
        raise AttentionArgumentError(f"params: {mismatches[0]} (variant '{variant.name}')")
    for r in ranges:
        read = r.read
        follows_positions = id(read) in reads.unbounded
        if follows_positions and (positions is None or read.data_indexed or len(read.positions) != 1 or r.missing
                                  or r.low is None):
            # data-indexed, or following positions the call does not know, or a relation of two positions (the
            # mask may bound qo_pos - kv_pos more than their ranges do): the declaration sized the dim
            continue
        at = f"hook '{read.hook}'" + (f" ({read.where})" if read.where else "")
        if r.missing:
            raise AttentionArgumentError(
                f"params['{read.param}']: {at} reads it at {read.index}, whose range depends on "
                f"{list(r.missing)}, which this entry point does not know; the tensor cannot be checked")
        if r.low is None:
            raise AttentionArgumentError(
                f"params['{read.param}']: {at} reads it at {read.index}, which these sizes and parameter values "
                f"({sizes}, {scalars}) push past the int32 range")
        length = dims[read.param][read.dim]
        # (a read that follows one position: its top is reached, every key and the last query being visited;
        # its bottom may not be, where the mask's bounds skip the first keys)
        if (r.low < 0 and not follows_positions) or r.high >= length:
            ranges_text = ", ".join([f"{n}={sizes[n]}" for n in sorted(read.needs)]
                                    + [f"{n}={scalars[n]}" for n in read.scalars]
                                    + ([f"positions below {positions}, the batch's longest KV length"]
                                       if follows_positions else []))
            below = r.low < 0 and not follows_positions
            bad = r.low if below else r.high
            need = "indices from 0" if below else f"at least {r.high + 1} entries"
            raise AttentionArgumentError(
                f"params['{read.param}']: dim {read.dim} has {length} entries, but {at} reads index {read.index} "
                f"= {bad}{f' (with {ranges_text})' if ranges_text else ''}: it needs {need} along that dim, "
                f"shape {dims[read.param]}")
