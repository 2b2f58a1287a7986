"""ArchSpec: one frozen, validated description per GPU architecture that schedules read.

The template records (``templates.py``) state what they need from an arch (``ArchNeeds``: tensor-core
shapes, cp.async, wgmma, TMA) and are checked against these fields; a build refuses an arch whose
per-block shared memory cannot hold a template's smallest tile, and dtypes the arch has no tensor cores for.
"""
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
    mma: tuple[str, ...]  # tensor-core instruction shapes (mma.sync m16n8k*, wgmma)
    dtypes: tuple[str, ...]  # input dtypes the tensor-core templates support here
    has_cp_async: bool  # asynchronous global -> shared copies (sm_80+)
    has_wgmma: bool  # warpgroup MMA (sm_90a)
    has_tma: bool  # the tensor memory accelerator (sm_90+)

    def __post_init__(self):
        if self.sm < 75:
            raise ConfigError(f"{self.name}: attngen targets sm_75 and newer")
        if self.has_wgmma and not self.name.endswith("a"):
            raise ConfigError(f"{self.name}: wgmma needs the arch-specific target (sm_90a)")
        if self.has_wgmma != ("wgmma" in self.mma):
            raise ConfigError(f"{self.name}: has_wgmma and the 'wgmma' mma shape must agree")

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


def _gencode(sm: str) -> str:
    return f"-gencode=arch=compute_{sm},code=sm_{sm}"


_HALF_AND_BF16 = ("float16", "bfloat16")
ARCHS: dict[str, ArchSpec] = {
    a.name: a
    for a in (
        # Turing: no bf16 tensor cores, no cp.async; m16n8k8 fp16 mma only.
        ArchSpec("sm_75", 75, _gencode("75"), smem_per_block=64 * 1024, mma=("m16n8k8",), dtypes=("float16",),
                 has_cp_async=False, has_wgmma=False, has_tma=False),
        ArchSpec("sm_80", 80, _gencode("80"), smem_per_block=163 * 1024, mma=("m16n8k16",), dtypes=_HALF_AND_BF16,
                 has_cp_async=True, has_wgmma=False, has_tma=False),
        ArchSpec("sm_86", 86, _gencode("86"), smem_per_block=99 * 1024, mma=("m16n8k16",), dtypes=_HALF_AND_BF16,
                 has_cp_async=True, has_wgmma=False, has_tma=False),
        ArchSpec("sm_89", 89, _gencode("89"), smem_per_block=99 * 1024, mma=("m16n8k16",), dtypes=_HALF_AND_BF16,
                 has_cp_async=True, has_wgmma=False, has_tma=False),
        ArchSpec("sm_90a", 90, _gencode("90a"), smem_per_block=227 * 1024, mma=("m16n8k16", "wgmma"),
                 dtypes=_HALF_AND_BF16, has_cp_async=True, has_wgmma=True, has_tma=True),
    )
}
ARCH_ALIASES = {"sm_90": "sm_90a"}


def arch_spec(name: str) -> ArchSpec:
    key = ARCH_ALIASES.get(name, name)
    if key not in ARCHS:
        raise ConfigError(f"unknown arch {name!r}; supported: {sorted(ARCHS)} (sm_90 means sm_90a)")
    return ARCHS[key]


def cuda_dtypes() -> tuple[str, ...]:
    """Every input dtype some arch's templates support, in a stable order."""
    return tuple(dict.fromkeys(d for a in ARCHS.values() for d in a.dtypes))


def smem_optin_floor(archs) -> int:
    """The least opt-in shared memory per block of every GPU that runs a build for ``archs`` (bytes; 0 when
    unknown). An arch-specific target (sm_90a) runs on its own compute capability only, whose shared memory
    is known; a portable one (sm_80) also runs on later minor versions with less (sm_86, sm_89), so it sets
    no floor. The templates skip the smaller tile configurations that a device above the floor never picks
    (csrc/device_info.cuh ``kSmemOptinFloor``)."""
    return min((a.smem_per_block if a.name.endswith("a") else 0) for a in map(arch_spec, archs))


def smem_floor_define(archs) -> str:
    """The line defining ATTNGEN_SMEM_OPTIN_FLOOR for a build's sources ("" when there is no floor, so that
    such sources stay as they were)."""
    floor = smem_optin_floor(archs)
    return f"#define ATTNGEN_SMEM_OPTIN_FLOOR {floor}" if floor else ""
