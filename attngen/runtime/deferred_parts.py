"""Parts of a link-time library linked on first use (codegen/lto.py ``deferred_part``): on sm_90a the
CUDA-core decode and the mma.sync prefill kernels, which the automatic choice never takes, are linked when a
plan first asks for them (``plan_decode(tensor_cores=False)``, ``plan_prefill(template="mma_sync")``) and
handed to the library through its ``attngen_register_linked_cubin``, once per library file and arch in the
process."""
from __future__ import annotations

import threading
from pathlib import Path

_lock = threading.Lock()
_registered: set[tuple[str, int]] = set()  # (library path, device arch) handed over in this process


def device_sm(device) -> int:
    """``device``'s compute capability as major * 10 + minor."""
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return major * 10 + minor


def link_deferred_parts(module, sm: int) -> int:
    """Link the deferred parts of ``module`` (a BuiltModule of a link-time build) for a device of arch ``sm`` and
    register them with the library; returns how many cubins it registered (0: none deferred, or done before)."""
    entries = module.manifest.get("deferred") or []
    if not entries:
        return 0
    slot = (str(Path(module.library).resolve()), sm)
    with _lock:
        if slot in _registered:
            return 0
        from attngen.codegen.lto import link_deferred

        register = module._mod["attngen_register_linked_cubin"]
        parts = link_deferred(Path(module.library).parent, module.manifest, sm)
        for cubin, arch_sm, table in parts:
            register(cubin, arch_sm, [x for key, mangled in sorted(table.items()) for x in (key, mangled)])
        _registered.add(slot)
        return len(parts)
