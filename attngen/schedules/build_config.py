"""BuildConfig: what one build instantiates (target, head dims, dtypes, archs), validated when made."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from attngen.ir import ConfigError

from .arch import arch_spec

CPU_DTYPES = ("float32", "float16")
HEAD_DIMS_CUDA = (64, 128, 256)
HEAD_DIMS_CPU = (32, 64, 80, 96, 128, 256)
LAYOUTS = ("NHD", "HND")
CUDA_KERNELS = ("decode", "prefill", "tvm")  # "tvm": TVM PagedKVCache ("tirx", fn) attention slots
GROUP_SIZES = (1, 2, 4, 8)
DTYPE_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


@dataclass(frozen=True)
class BuildConfig:
    target: str = "cpu"  # "cpu" (LLVM) | "cuda"
    head_dims: tuple[int, ...] = (128,)
    dtypes: tuple[str, ...] = ("float32",)
    archs: tuple[str, ...] = ()  # cuda only, e.g. ("sm_80", "sm_90a")
    layouts: tuple[str, ...] = LAYOUTS
    fast_math: bool = False  # cuda: nvcc --use_fast_math (approximate tanh/exp/div)
    kernels: tuple[str, ...] = ("decode", "prefill")  # cuda: templates to instantiate; () = hooks only
    max_group_size: int = 8  # cuda decode: largest num_qo_heads / num_kv_heads served
    tvm_constants: tuple = ()  # cuda "tvm" slots: ((param name, value), ...) compiled in (TVM passes no params)
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self):
        object.__setattr__(self, "head_dims", tuple(int(d) for d in self.head_dims))
        object.__setattr__(self, "dtypes", tuple(self.dtypes))
        object.__setattr__(self, "archs", tuple(arch_spec(a).name for a in self.archs))
        object.__setattr__(self, "layouts", tuple(x.upper() for x in self.layouts))
        object.__setattr__(self, "kernels", tuple(self.kernels))
        object.__setattr__(self, "tvm_constants", tuple(tuple(x) for x in self.tvm_constants))
        if self.target not in ("cpu", "cuda"):
            raise ConfigError(f"target {self.target!r} is not supported; use 'cpu' or 'cuda'")
        if not self.head_dims or not self.dtypes:
            raise ConfigError("a build needs at least one head_dim and one dtype")
        bad_layout = [x for x in self.layouts if x not in LAYOUTS]
        if bad_layout:
            raise ConfigError(f"paged layouts {bad_layout} are not supported; use {list(LAYOUTS)}")
        if self.target == "cpu":
            self._check(self.head_dims, HEAD_DIMS_CPU, "head_dim", "the CPU backend")
            self._check(self.dtypes, CPU_DTYPES, "dtype", "the CPU backend")
        else:
            if not self.archs:
                raise ConfigError("a cuda build needs at least one arch, e.g. archs=('sm_80',)")
            self._check(self.head_dims, HEAD_DIMS_CUDA, "head_dim", "the CUDA templates")
            self._check(self.kernels, CUDA_KERNELS, "kernel", "the CUDA templates")
            self._check((self.max_group_size,), GROUP_SIZES, "max_group_size", "the decode template")
            for a in self.archs:
                spec = arch_spec(a)
                bad = [d for d in self.dtypes if d not in spec.dtypes]
                if bad:
                    raise ConfigError(f"dtype {bad[0]} is not supported on {a}; {a} supports "
                                      f"{list(spec.dtypes)}" + (" (Turing has no bf16 tensor cores)"
                                                                if a == "sm_75" else ""))

    @staticmethod
    def _check(values, allowed, what, where):
        bad = [v for v in values if v not in allowed]
        if bad:
            raise ConfigError(f"{what} {bad[0]!r} is not supported by {where}; supported: {list(allowed)}")

    def key(self) -> str:
        d = asdict(self)
        d.pop("extra")
        return json.dumps(d, sort_keys=True)


def symbol(kind: str, dtype: str, head_dim: int) -> str:
    """Exported function name, e.g. ``batch_prefill_ragged_f16_d128``."""
    return f"{kind}_{DTYPE_SHORT[dtype]}_d{head_dim}"
