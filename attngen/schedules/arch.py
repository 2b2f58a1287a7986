"""ArchSpec: one frozen, validated description per GPU architecture that schedules read."""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from attngen.ir import ConfigError


@dataclass(frozen=True)
class ArchSpec:
    name: str  # "sm_80"
    sm: int  # 80
    gencode: str  # nvcc -gencode argument
    smem_per_block: int  # bytes of opt-in shared memory per block
    regs_per_thread: int
    mma: tuple[str, ...]  # tensor-core shapes the fa2 template can use
    dtypes: tuple[str, ...]  # input dtypes the templates support here
    has_cp_async: bool
    has_wgmma: bool
    has_tma: bool

    def __post_init__(self):
        if self.sm < 75:
            raise ConfigError(f"{self.name}: attngen targets sm_75 and newer")
        if self.has_wgmma and not self.name.endswith("a"):
            raise ConfigError(f"{self.name}: wgmma needs the arch-specific target (sm_90a)")

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


def _gencode(sm: str) -> str:
    return f"-gencode=arch=compute_{sm},code=sm_{sm}"


ARCHS: dict[str, ArchSpec] = {
    a.name: a
    for a in (
        # Turing: no bf16 tensor cores, no cp.async; m16n8k8 fp16 mma only.
        ArchSpec("sm_75", 75, _gencode("75"), 64 * 1024, 255, ("m16n8k8",), ("float16",),
                 False, False, False),
        ArchSpec("sm_80", 80, _gencode("80"), 163 * 1024, 255, ("m16n8k16",), ("float16", "bfloat16"),
                 True, False, False),
        ArchSpec("sm_86", 86, _gencode("86"), 99 * 1024, 255, ("m16n8k16",), ("float16", "bfloat16"),
                 True, False, False),
        ArchSpec("sm_89", 89, _gencode("89"), 99 * 1024, 255, ("m16n8k16",), ("float16", "bfloat16"),
                 True, False, False),
        ArchSpec("sm_90a", 90, _gencode("90a"), 227 * 1024, 255, ("m16n8k16", "wgmma"),
                 ("float16", "bfloat16"), True, True, True),
    )
}
ARCH_ALIASES = {"sm_90": "sm_90a"}


def arch_spec(name: str) -> ArchSpec:
    key = ARCH_ALIASES.get(name, name)
    if key not in ARCHS:
        raise ConfigError(f"unknown arch {name!r}; supported: {sorted(ARCHS)} (sm_90 means sm_90a)")
    return ARCHS[key]
