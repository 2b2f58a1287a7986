"""Parts of a link-time library linked on first use (codegen/lto.py ``deferred_part``): on sm_90a the
CUDA-core decode and the mma.sync prefill kernels, which the automatic choice never takes, are compiled and
linked when a plan first asks for them (``plan_decode(tensor_cores=False)``: the "decode" record,
``plan_prefill(template="mma_sync")``: the "prefill" record) and handed to the library through its
``attngen_register_linked_cubin``, once per library file, record and arch in the process."""
from __future__ import annotations

import threading
from pathlib import Path

_lock = threading.Lock()
_registered: set[tuple[str, str, int]] = set()  # (library path, record, device arch) handed over in this process


def link_deferred_parts(module, device, record: str) -> int:
    """Link the deferred parts of template ``record`` of ``module`` (a BuiltModule) for ``device`` (a torch
    device; nothing for a CPU one) and register them with the library; returns how many cubins it registered
    (0: none deferred, a CPU device, or done before)."""
    entries = [e for e in module.manifest.get("deferred") or [] if e["record"] == record]
    if not entries or getattr(device, "type", "cpu") != "cuda":
        return 0
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    sm = major * 10 + minor
    slot = (str(Path(module.library).resolve()), record, sm)
    with _lock:
        if slot in _registered:
            return 0
        from attngen.codegen.lto import link_deferred

        register = module._mod["attngen_register_linked_cubin"]
        parts = link_deferred(Path(module.library).parent, module.manifest, sm, records=(record,))
        _registered.add(slot)  # (a registration that fails below is not retried: its error names the cause)
        for cubin, arch_sm, table in parts:
            register(cubin, arch_sm, [x for key, mangled in sorted(table.items()) for x in (key, mangled)])
        return len(parts)
