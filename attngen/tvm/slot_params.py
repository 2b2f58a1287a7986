"""A variant's parameters in a cache's attention slots, for both devices.

TVM's slot calls carry no variant parameters. Scalar parameters are compiled into the slot kernels;
tensor parameters are bound to every call of a cache created at run time, appended to TVM's arguments
in declaration order (``bind_trailing``); a model library's cache binds them as constants of the model
(bind_params.py). ``split_params`` resolves
the values against the cache's sizes (attngen.runtime.params: dtypes, ranks, declared dims, every
read the hooks make) before anything is built.
"""
from __future__ import annotations

from attngen.ir import TensorParam
from attngen.runtime.params import resolve_params

from .shape import CacheShape


def split_params(variant, params: dict | None, shape: CacheShape) -> tuple[dict, list]:
    """(scalar values by name, tensor values in declaration order as given), checked for a cache of ``shape``
    (the batch size of its largest call: ``max_batch``)."""
    values = resolve_params(variant, params, num_qo_heads=shape.num_qo_heads, batch_size=shape.max_batch,
                            num_kv_heads=shape.num_kv_heads, head_dim=shape.head_dim)
    scalars, tensors = {}, []
    for decl, value in zip(variant.params, values):
        if isinstance(decl, TensorParam):
            tensors.append(value)
        else:
            scalars[decl.name] = value
    return scalars, tensors


def bind_trailing(fn, tensors: list):
    """``fn`` with the variant's tensor parameters appended to TVM's arguments on every call."""
    import tvm

    def call(*args):
        return fn(*args, *tensors)

    return tvm.runtime.convert(call)


def given_scalars(scalars: dict, params: dict | None) -> dict:
    """The scalar values ``params`` names (``split_params``' scalars less the defaults, which a build compiles in
    itself, so that they stay out of its cache key)."""
    return {name: v for name, v in scalars.items() if name in (params or {})}
