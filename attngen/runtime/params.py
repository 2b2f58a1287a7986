"""Resolve a variant's extra parameters for one call: defaults, dtypes, sizes, call order.

The order is the variant's declaration order, the order in which the CUDA entry functions take them
(the traits' ``ExtraArgs``, codegen/cuda_variant.py): scalars as Python ints / floats, tensors as given.
"""
from __future__ import annotations

from attngen.ir import ScalarParam, TensorParam

from .checks import AttentionArgumentError, check_tensor


def resolve_params(variant, given: dict | None, *, num_qo_heads: int, batch_size: int) -> list:
    """Values in declaration order; tensors checked for dtype, rank and named sizes."""
    given = dict(given or {})
    unknown = sorted(set(given) - {p.name for p in variant.params})
    if unknown:
        raise AttentionArgumentError(
            f"params: {unknown} are not parameters of variant '{variant.name}' "
            f"(it declares {[p.name for p in variant.params] or 'none'})")
    sizes = {"num_qo_heads": num_qo_heads, "batch_size": batch_size}
    out = []
    for p in variant.params:
        if p.name not in given:
            if isinstance(p, ScalarParam) and p.default is not None:
                out.append(p.default)
                continue
            raise AttentionArgumentError(f"params['{p.name}']: variant '{variant.name}' needs it "
                                         f"({p.doc or p.dtype})")
        val = given[p.name]
        if isinstance(p, TensorParam):
            check_tensor(val, f"params['{p.name}']", len(p.shape), p.dtype)
            for i, dim in enumerate(p.shape):
                if dim in sizes and int(val.shape[i]) != sizes[dim]:
                    raise AttentionArgumentError(
                        f"params['{p.name}']: dim {i} ({dim}) is {val.shape[i]}, expected {sizes[dim]}")
            out.append(val)
        else:
            out.append(int(val) if "int" in p.dtype else float(val))
    return out
