"""Specialising a checked hook for one build: its row buffers bound to the build's head dim.

Both code generators (the CPU inliner and the CUDA lowering) start from this form.
"""
from __future__ import annotations

import tvm.tirx as tir

from . import tir_utils as tu
from .errors import ConfigError
from .hook_spec import ROW_ARGS


def specialize_rows(func: tir.PrimFunc, hook: str, head_dim: int, variant: str) -> tir.PrimFunc:
    """Bind the row buffers' symbolic length to ``head_dim``; reject a different fixed length."""
    values = {}
    for row in func.params[:len(ROW_ARGS)]:
        n = row.shape[0]
        if isinstance(n, tir.IntImm):
            if n.value != head_dim:
                raise ConfigError(f"variant '{variant}', hook '{hook}': rows are fixed to {n.value} "
                                  f"elements but head_dim={head_dim} was requested; declare the row "
                                  "length symbolic (d = T.int32()) or build for that head_dim")
        else:
            values[tu.handle(n)] = head_dim
    return tu.specialize_shape_vars(func, values)
