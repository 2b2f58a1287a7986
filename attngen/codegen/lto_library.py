"""The library of a link-time build (``BuildConfig.link="lto"``), put together from the pieces
:mod:`.lto` makes: the template objects (one per core), the host glue (launch objects and exports, compiled
beside them and beside the cubins' links, waited for by the library's final link alone), the variant's hook
objects, one cubin per template object and arch (nvJitLink, in parallel), the embedded-cubin object and the
shared library. Deferred parts are named in the manifest and linked on first use (:func:`.lto.link_deferred`).
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import tvm_ffi.libinfo

from attngen.schedules.registry import selected

from . import nvcc, nvjitlink
from .cache import BuildCache
from .cuda_variant import abi_traits_source, linked_params_source
from .host_library import host_cxx
from .linked_cubin import cubin_kernels, kernel_table, link_object_source
from .lto import (LAUNCHERS, build_macros, check_params_fit, compile_hooks, count, deferred_part, exports_object,
                  hook_unit, launch_object, lto_gencode, part_serves, sm_number, template_key, template_object)


def build_linked_library(ctx, cache: BuildCache | None = None) -> dict:
    """The link-time build of ``ctx`` (the CUDA backend's compile stage with link="lto"): the manifest's
    entries, with the seconds each step took and which cached objects were reused."""
    cache = cache or ctx.cache or BuildCache()
    variant, cfg = ctx.variant, ctx.config
    lowered = ctx.artifacts["lower_hooks"]
    timings, reused = {}, {"templates": [], "launch": []}
    t = time.perf_counter()
    first = cfg.archs[0]
    check_params_fit(variant, lowered[(first, cfg.head_dims[0])])
    abi = {d: abi_traits_source(variant, lowered[(first, d)], d) for d in cfg.head_dims}
    # per arch in part order: the template object, or for a deferred part (compiled and linked on first use,
    # link_deferred) what its template object is made of. The template objects, the launch objects and the
    # exports are independent compiles (each cached under its own key): they run side by side
    cores = nvcc.build_cores()
    objects = {a: [] for a in cfg.archs}
    templates = []  # (arch, slot in objects[arch], record, head dim, pair, part)
    for a in cfg.archs:
        for record in selected(cfg.kernels):
            for d in cfg.head_dims:
                for pair in cfg.dtype_pairs:
                    for part in LAUNCHERS[record.name].parts_of(build_macros(cfg), pair == cfg.dtype_pairs[0]):
                        if not part_serves(variant, record.name, part):
                            continue
                        if deferred_part(cfg, a, record.name, part):
                            objects[a].append({"record": record.name, "record_part": part, "head_dim": d,
                                               "dtypes": [pair.q, pair.kv],
                                               "template": template_key(record.name, a, d, pair, cfg, abi[d], part)})
                            continue
                        templates.append((a, len(objects[a]), record.name, d, pair, part))
                        objects[a].append(None)

    def timed(fn, *args):
        t0 = time.perf_counter()
        path, hit = fn(*args)
        return path, hit, time.perf_counter() - t0

    def template(job):
        a, _, record, d, pair, part = job
        return timed(template_object, record, a, d, pair, cfg, abi[d], cache, part)

    params = {d: linked_params_source(variant, lowered[(first, d)], d) for d in cfg.head_dims}
    # the host glue (the launch objects, host C++ over the entry templates: the longest compile; the exports) is
    # needed by the library's final link alone: it compiles beside the template objects and the cubins' links
    glue_pool = ThreadPoolExecutor(len(cfg.head_dims) + 1)
    try:
        launch_jobs = [glue_pool.submit(timed, launch_object, cfg, d, abi[d], cache) for d in cfg.head_dims]
        exports_job = glue_pool.submit(timed, exports_object, variant, cfg, params, cache)
        with ThreadPoolExecutor(max(1, cores - 1)) as pool:  # a core left to the glue
            built_templates = list(pool.map(template, templates))
        for (a, slot, *_), (path, hit, _) in zip(templates, built_templates):
            objects[a][slot] = path
            reused["templates"].append(hit)
            count("template", hit)
        timings["templates"] = time.perf_counter() - t
        return _link_library(ctx, abi, objects, reused, timings, launch_jobs, exports_job, cores)
    finally:
        glue_pool.shutdown(wait=True, cancel_futures=True)


def _link_library(ctx, abi: dict, objects: dict, reused: dict, timings: dict, launch_jobs: list,
                  exports_job, cores: int) -> dict:
    """The rest of :func:`build_linked_library` once the template objects are there: the hook objects, the
    cubins' links, then (with the host glue compiled beside them) the library's."""
    variant, cfg, out = ctx.variant, ctx.config, ctx.out_dir
    lowered = ctx.artifacts["lower_hooks"]

    t = time.perf_counter()
    hook_objects = {a: compile_hooks(out, cfg, a, hook_unit(variant, cfg, a, lowered)) for a in cfg.archs}
    timings["hooks"] = time.perf_counter() - t

    t = time.perf_counter()
    # one cubin per template object and arch, the links run in parallel (each is one nvJitLink program:
    # the hooks inline into its kernels); the kernel table names each kernel's cubin by its part. Deferred
    # parts are linked on first use (link_deferred), from the hook object and the template object
    jobs = [(a, part, obj) for a in cfg.archs for part, obj in enumerate(objects[a]) if isinstance(obj, Path)]
    deferred = [{"arch": a, "part": part, "hooks": hook_objects[a].name, **obj}
                for a in cfg.archs for part, obj in enumerate(objects[a]) if isinstance(obj, dict)]
    for d in cfg.head_dims:  # the hook signature the deferred template objects are compiled against
        if deferred:
            (out / f"deferred_abi_d{d}.cuh").write_text(abi[d])

    workers = max(1, min(len(jobs), cores))

    def link(job):  # the cores left over by the parallel links split each one's code generation
        a, part, obj = job
        return nvjitlink.link_cubin([hook_objects[a], obj], lto_gencode(a)[1], cfg.fast_math,
                                    threads=cores)

    with ThreadPoolExecutor(workers) as pool:
        linked = list(pool.map(link, jobs))
    cubins, by_arch = [], {a: {} for a in cfg.archs}
    for (a, part, _), data in zip(jobs, linked):
        cubin = out / f"linked_{a}_{part}.cubin"
        cubin.write_bytes(data)
        cubins.append((cubin, sm_number(lto_gencode(a)[1]), part))
        for key, mangled in kernel_table(cubin_kernels(data)).items():
            by_arch[a].setdefault(key, (mangled, part))  # a kernel two templates share: the first part's
    # every arch holds the same kernels in the parts it links up front (a part deferred on one arch is in
    # the table from the archs that link it)
    linked = {a: {part for b, part, _ in jobs if b == a} for a in cfg.archs}
    table = {}
    for a in cfg.archs:
        for key, (mangled, part) in by_arch[a].items():
            table.setdefault(key, (mangled, part))
    for a in cfg.archs:
        mine = {k: p for k, (_, p) in by_arch[a].items()}
        expected = {k: p for k, (_, p) in table.items() if p in linked[a]}
        if mine != expected:
            raise RuntimeError(f"the cubins of {cfg.archs} hold different kernels: {sorted(mine)} vs {sorted(expected)}")
    timings["link_cubin"] = time.perf_counter() - t

    t = time.perf_counter()
    link_src = out / "linked_cubins.c"
    link_src.write_text(link_object_source(cubins, table))
    cxx = host_cxx()[0]
    nvcc.run_tool([cxx, "-x", "c", "-c", "-fPIC", str(link_src), "-o", str(out / "linked_cubins.o")],
                  "the embedded cubins' object")
    glue, waited = [], time.perf_counter()
    for job in launch_jobs:
        path, hit, seconds = job.result()
        glue.append(path)
        reused["launch"].append(hit)
        count("launch", hit)
        timings["launch"] = max(timings.get("launch", 0.0), seconds)
    path, hit, timings["exports"] = exports_job.result()
    glue.append(path)
    reused["exports"] = hit
    count("exports", hit)
    timings["glue_wait"] = time.perf_counter() - waited  # how long the library's link waited for the glue
    lib = out / f"lib{variant.name}_cuda.so"
    ffi_lib = Path(tvm_ffi.libinfo.find_libtvm_ffi())
    nvcc.run_tool([cxx, "-shared", "-o", str(lib), *map(str, glue), str(out / "linked_cubins.o"),
                   str(nvcc.cudart_static()), "-ldl", "-lpthread", "-lrt", f"-L{ffi_lib.parent}", "-ltvm_ffi",
                   f"-Wl,-rpath,{ffi_lib.parent}"],
                  "the link of the library")
    timings["link_library"] = time.perf_counter() - t
    return {"library": lib.name, "link": "lto", "objects": [o.name for o in hook_objects.values()],
            "cubins": [c.name for c, _, _ in cubins], "deferred": deferred,
            "lto_seconds": {k: round(v, 3) for k, v in timings.items()},
            "lto_reused": reused,
            "kernels": sorted(table)}
