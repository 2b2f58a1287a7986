"""BuildConfig: what one build instantiates (target, head dims, dtypes, archs, templates), validated when
made; and ``symbol``, the exported name of one function of a build."""
from __future__ import annotations

import json
import operator
from dataclasses import asdict, dataclass, field

from attngen.ir import ConfigError
from attngen.ir.errors import repeated

from .arch import arch_spec
from .dtypes import DTYPE_SHORT, FP8_DTYPES, DtypePair, is_fp8
from .registry import KERNELS, head_dims_of, selected
from .template_decode import GROUP_TILES

__all__ = ["BuildConfig", "DTYPE_SHORT", "symbol"]

CPU_DTYPES = ("float32", "float16", "bfloat16")  # bfloat16 through torch tensors (NumPy has no DLPack bf16)
HEAD_DIMS_CPU = (32, 64, 80, 96, 128, 256)
LAYOUTS = ("NHD", "HND")
HOOK_MATH_MODES = ("approx", "precise")  # BuildConfig.hook_math (codegen/hook_math.py)
TARGETS = ("cpu", "cuda")
LINKS = ("whole", "lto", "check")  # BuildConfig.link
# cuda kernels that read fp8 K/V (csrc/entry_decode_fp8.h, csrc/entry_prefill_fp8.h). Every arch attngen targets
# serves them: cuda_fp8.h converts fp8 in hardware from sm_89 and in integer instructions before, and the
# tensor-core decode and both prefill templates (mma.sync, and Hopper on sm_90a) widen them into 16-bit tiles
# of the query dtype, so the arch's query dtypes (ArchSpec.dtypes) decide. The TVM slots read K/V in the query
# dtype.
FP8_CUDA_KERNELS = ("decode", "prefill")
# the tuple fields, each with an example of its form for the messages that refuse a malformed one
SEQUENCE_FIELDS = {"head_dims": "(128,)", "dtypes": "('float16',)", "kv_dtypes": "('float8_e4m3fn',)",
                   "archs": "('sm_80',)", "layouts": "('NHD',)", "kernels": "('decode',)",
                   "tvm_constants": "(('soft_cap', 30.0),)"}


@dataclass(frozen=True)
class BuildConfig:
    target: str = "cpu"  # "cpu" (LLVM) | "cuda"
    head_dims: tuple[int, ...] = (128,)
    dtypes: tuple[str, ...] = ("float32",)  # query / output dtypes
    archs: tuple[str, ...] = ()  # cuda only, e.g. ("sm_80", "sm_90a")
    layouts: tuple[str, ...] = LAYOUTS
    fast_math: bool = False  # cuda: nvcc --use_fast_math over everything (templates included)
    # cuda: the hooks' float math, "approx" (hardware approximations: tanh.approx, __expf, __fdividef, ...)
    # or "precise" (the CUDA math library); codegen/hook_math.py lists each approximation and its error
    hook_math: str = "approx"
    kernels: tuple[str, ...] = ("decode", "prefill")  # cuda: templates to instantiate (registry.KERNELS); () = hooks only
    max_group_size: int = 8  # cuda decode: largest num_qo_heads / num_kv_heads served
    tvm_constants: tuple = ()  # cuda "tvm" slots: ((param name, value), ...) compiled in (TVM passes no params)
    # cuda "tvm" slots: what their sliding-window functions serve, compiled in (TVM's calls do not carry it).
    # None: nothing (they refuse a call; no windowed kernels are built); 0: per-sequence windows with attention
    # sinks; W > 0: also the window of "mha_sliding" layers, W positions (the query included)
    tvm_window: int | None = None
    # cuda "tvm" slots: also TVM's inline RoPE (rotary_mode 1) in the prefill, decode and sliding-window functions
    # (RoPE kernel instances, csrc/tvm_rope.cuh); False: those refuse rotary_mode 1 and no RoPE kernel is built
    tvm_rope: bool = False
    # K/V dtype of each query dtype, position by position; () = the query dtype. Besides equal pairs, fp8 K/V
    # caches (FP8_DTYPES, dequantised with k_scale / v_scale): on the CPU target for any query dtype and
    # kernel, on cuda for the decode and prefill templates (FP8_CUDA_KERNELS), whole-program and linked builds
    kv_dtypes: tuple[str, ...] = ()
    # cuda: "whole" compiles templates and hooks as one program per variant; "lto" links the variant's
    # hooks into template objects compiled once per hook signature and cached (codegen/lto.py); "check"
    # compiles the whole-program sources' device code to a cubin per arch and links no library (every
    # template instance, hook, register and shared-memory limit checked, in about half the time)
    link: str = "whole"
    # link="lto": the template parts the runtime picks on an arch only when a plan asks for them (sm_90a: the
    # CUDA-core decode, tensor_cores=False; the mma.sync prefill, template="mma_sync") are linked on first
    # use instead of with the library (codegen/lto.py deferred_parts); False links every part up front
    defer_alternatives: bool = True
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self):
        self._normalize()
        self._check_flags()
        if self.target not in TARGETS:
            raise ConfigError(f"target {self.target!r} is not supported; use 'cpu' or 'cuda'")
        if self.hook_math not in HOOK_MATH_MODES:
            raise ConfigError(f"hook_math {self.hook_math!r} is not supported; use one of {list(HOOK_MATH_MODES)}")
        if self.link not in LINKS:
            raise ConfigError(f"link {self.link!r} is not supported; use one of {list(LINKS)}")
        if self.link != "whole" and self.target != "cuda":
            raise ConfigError(f"link={self.link!r} is for cuda builds")
        if self.tvm_window is not None and (self.tvm_window < 0 or "tvm" not in self.kernels):
            raise ConfigError(f"tvm_window {self.tvm_window!r}: a window of 0 (per-sequence windows) or more "
                              "positions, for builds with kernels=('tvm',)")
        if self.tvm_rope and "tvm" not in self.kernels:
            raise ConfigError("tvm_rope: inline RoPE is built into the TVM slots only (kernels=('tvm',))")
        if not self.head_dims or not self.dtypes:
            raise ConfigError("a build needs at least one head_dim and one dtype")
        bad_layout = [x for x in self.layouts if x not in LAYOUTS]
        if bad_layout:
            raise ConfigError(f"paged layouts {bad_layout} are not supported; use {list(LAYOUTS)}")
        self._check_kv_dtypes()
        if self.target == "cpu":
            self._check_cpu_layouts()
            self._check(self.head_dims, HEAD_DIMS_CPU, "head_dim", "the CPU backend")
            self._check(self.dtypes, CPU_DTYPES, "dtype", "the CPU backend")
        else:
            if not self.archs:
                raise ConfigError("a cuda build needs at least one arch, e.g. archs=('sm_80',)")
            self._check(self.kernels, KERNELS, "kernel", "the CUDA templates")
            self._check_exports()
            self._check(self.head_dims, head_dims_of(self.kernels), "head_dim", "the CUDA templates")
            self._check((self.max_group_size,), GROUP_TILES, "max_group_size", "the decode template")
            for a in self.archs:
                spec = arch_spec(a)
                bad = [d for d in self.dtypes if d not in spec.dtypes]
                if bad:
                    raise ConfigError(f"dtype {bad[0]} is not supported on {a}; {a} supports "
                                      f"{list(spec.dtypes)}" + (" (Turing has no bf16 tensor cores)"
                                                                if a == "sm_75" else ""))

    def _normalize(self) -> None:
        """The fields in canonical form: tuples without repeats (an arch by its name, sm_90 as sm_90a; a layout
        in capitals; a query dtype together with its K/V dtype), whole-number head dims and window; a field of
        the wrong form is refused by name."""
        for name, example in SEQUENCE_FIELDS.items():
            value = getattr(self, name)
            if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
                raise ConfigError(f"{name}={value!r} is not a tuple; give a tuple of values, e.g. {name}={example}")
        head_dims = tuple(_whole("head_dims", d) for d in self.head_dims)
        layouts = tuple(x.upper() if isinstance(x, str) else x for x in self.layouts)
        object.__setattr__(self, "head_dims", _unique(head_dims))
        object.__setattr__(self, "archs", _unique(arch_spec(a).name for a in self.archs))
        object.__setattr__(self, "layouts", _unique(layouts))
        object.__setattr__(self, "kernels", _unique(self.kernels))
        object.__setattr__(self, "tvm_constants", _constant_pairs(self.tvm_constants))
        dtypes, kv_dtypes = tuple(self.dtypes), tuple(self.kv_dtypes) or tuple(self.dtypes)
        if len(kv_dtypes) == len(dtypes):  # (else _check_kv_dtypes says what is wrong)
            pairs = _unique(zip(dtypes, kv_dtypes))
            dtypes, kv_dtypes = tuple(q for q, _ in pairs), tuple(kv for _, kv in pairs)
        object.__setattr__(self, "dtypes", dtypes)
        object.__setattr__(self, "kv_dtypes", kv_dtypes)
        if self.tvm_window is not None:
            object.__setattr__(self, "tvm_window", _whole("tvm_window", self.tvm_window))

    def _check_flags(self) -> None:
        """The on / off options are booleans (a string such as 'no' would read as on)."""
        for name in ("fast_math", "tvm_rope", "defer_alternatives"):
            value = getattr(self, name)
            if not isinstance(value, bool) and value not in (0, 1):
                raise ConfigError(f"{name}={value!r} is not a boolean; give True or False")

    def _check_cpu_layouts(self) -> None:
        """A cpu build makes decode functions, which read a paged KV cache: it needs a layout."""
        if not self.layouts:
            raise ConfigError("layouts=(): the CPU backend's decode functions read a paged KV cache; give "
                              "layouts=('NHD',), ('HND',) or both (--layout NHD,HND)")

    def _check_exports(self) -> None:
        """Every selected cuda template exports a function for the layouts asked for (decode exports only
        paged functions, one per layout)."""
        for record in selected(self.kernels):
            if not record.kinds(self.layouts):
                raise ConfigError(f"layouts={self.layouts}: kernel '{record.name}' exports one function per paged "
                                  "layout and so would export nothing; give layouts=('NHD',), ('HND',) or both "
                                  f"(--layout NHD,HND), or drop '{record.name}' from kernels")

    def _check_kv_dtypes(self) -> None:
        if len(self.kv_dtypes) != len(self.dtypes):
            raise ConfigError(f"kv_dtypes {list(self.kv_dtypes)}: give one K/V dtype per query dtype "
                              f"{list(self.dtypes)}, or none for K/V in the query dtype")
        fp8_queries = [q for q in self.dtypes if is_fp8(q)]
        if fp8_queries:
            raise ConfigError(f"dtype {fp8_queries[0]} is a K/V cache storage format, not a query/output dtype; "
                              f"keep the query dtype in dtypes and give {fp8_queries[0]} in kv_dtypes")
        for q, kv in zip(self.dtypes, self.kv_dtypes):
            if kv == q:
                continue
            if not is_fp8(kv):
                raise ConfigError(f"kv_dtypes: K/V dtype {kv} with query dtype {q} is not supported; the "
                                  f"{self.target} kernels read K/V in the query dtype (kv_dtypes=() or equal "
                                  f"to dtypes) or in fp8 {list(FP8_DTYPES)} (cpu; cuda decode and prefill)")
            if self.target == "cuda":
                self._check_cuda_fp8(kv)

    def _check_cuda_fp8(self, kv: str) -> None:
        """fp8 K/V on cuda: the decode and prefill templates (whole-program, check and linked builds alike:
        codegen/lto.py instantiates its template objects over the cache's type)."""
        other = [k for k in self.kernels if k not in FP8_CUDA_KERNELS]
        if other:
            keep = tuple(k for k in self.kernels if k in FP8_CUDA_KERNELS) or FP8_CUDA_KERNELS
            raise ConfigError(
                f"kv_dtypes: fp8 K/V ({kv}) on cuda are read by the decode and prefill templates only: kernels "
                f"{list(self.kernels)} include {other}, which read K/V in the query dtype on cuda. Build the fp8 "
                f"cache's cuda kernels with kernels={keep} (--kernels {','.join(keep)})")

    @property
    def dtype_pairs(self) -> tuple[DtypePair, ...]:
        """The (query/output, K/V) dtype pairs the build instantiates, in ``dtypes`` order."""
        return tuple(DtypePair(q, kv) for q, kv in zip(self.dtypes, self.kv_dtypes))

    @staticmethod
    def _check(values, allowed, what, where):
        bad = [v for v in values if v not in allowed]
        if bad:
            raise ConfigError(f"{what} {bad[0]!r} is not supported by {where}; supported: {list(allowed)}")

    def key(self) -> str:
        d = asdict(self)
        d.pop("extra")
        if d["link"] != "lto":  # only link-time builds defer parts
            d.pop("defer_alternatives")
        if d["link"] == "whole":  # the default leaves the keys of whole-program builds as they were
            d.pop("link")
        if d["tvm_window"] is None:  # so does a build without sliding-window TVM slots
            d.pop("tvm_window")
        if not d["tvm_rope"]:  # and one without RoPE kernels
            d.pop("tvm_rope")
        return json.dumps(d, sort_keys=True)


def _whole(name: str, value) -> int:
    """``value`` as an int, refusing what is not a whole number (64.5, "64") rather than truncating it."""
    try:
        return operator.index(value)
    except TypeError:
        raise ConfigError(f"{name}: {value!r} is not a whole number; give an integer") from None


def _unique(values) -> tuple:
    """``values`` in order, each once."""
    return tuple(dict.fromkeys(values))


def _constant_pairs(constants) -> tuple:
    """``tvm_constants`` as ((name, value), ...), each name once."""
    pairs = []
    for entry in constants:
        if isinstance(entry, (str, bytes)) or not hasattr(entry, "__len__") or len(entry) != 2 \
                or not isinstance(entry[0], str):
            raise ConfigError(f"tvm_constants: {entry!r} is not a (name, value) pair; give e.g. "
                              "tvm_constants=(('soft_cap', 30.0),)")
        pairs.append(tuple(entry))
    twice = repeated(n for n, _ in pairs)
    if twice:
        raise ConfigError(f"tvm_constants: {twice} given more than once; give each parameter one value")
    return tuple(pairs)


def symbol(kind: str, dtype: str, head_dim: int, kv_dtype: str | None = None) -> str:
    """Exported function name: ``<kind>_<dtype>_d<D>`` (``batch_prefill_ragged_f16_d128``) when K/V are in the
    query dtype (``kv_dtype`` None or equal), else ``<kind>_<dtype>_kv<kv dtype>_d<D>``
    (``batch_decode_paged_nhd_bf16_kvf16_d128``)."""
    return f"{kind}_{DtypePair(dtype, kv_dtype or dtype).short}_d{head_dim}"


def merge_symbol(kind: str, dtype: str) -> str:
    """Exported name of a state-merge function (CPU and CUDA merge libraries): ``merge_state_inplace_bf16``."""
    return f"{kind}_{DTYPE_SHORT[dtype]}"
