"""The build cache: a hit for an unchanged variant, a new build for a changed hook, concurrency safety."""
import multiprocessing as mp
import shutil

import pytest
from tvm.script import tirx as T

from attngen import ScalarParam, Variant
from attngen.codegen.cache import BuildCache
from attngen.codegen.pipeline import BUILD_SOURCES, PACKAGE, build_source_files, cache_key, run_pipeline
from attngen.schedules import BuildConfig

CFG = BuildConfig("cpu", (32,), ("float32",), layouts=("NHD",))


def _softcap_variant(scale: float) -> Variant:
    @T.prim_func
    def f(s: T.float32, batch: T.int32, qo_pos: T.int32, kv_pos: T.int32, qo_head: T.int32,
          kv_head: T.int32, cap: T.float32) -> T.float32:
        return cap * T.tanh(s / cap) * T.float32(scale)

    return Variant("cache_probe", logits_transform=f, params=[ScalarParam("cap", "float32", 5.0)])


def test_same_variant_twice_compiles_once(tmp_path):
    cache = BuildCache(tmp_path)
    a = run_pipeline(_softcap_variant(1.0), CFG, cache=cache)
    b = run_pipeline(_softcap_variant(1.0), CFG, cache=cache)  # an equal variant, rebuilt from source
    assert not a.cache_hit and b.cache_hit and cache.builds == 1
    assert a.directory == b.directory and a.library.is_file()
    fresh = BuildCache(tmp_path)  # a new process sees the disk tier
    c = run_pipeline(_softcap_variant(1.0), CFG, cache=fresh)
    assert c.cache_hit and fresh.builds == 0


def test_changed_hook_or_config_builds_again(tmp_path):
    cache = BuildCache(tmp_path)
    a = run_pipeline(_softcap_variant(1.0), CFG, cache=cache)
    b = run_pipeline(_softcap_variant(2.0), CFG, cache=cache)
    c = run_pipeline(_softcap_variant(1.0), BuildConfig("cpu", (64,), ("float32",), layouts=("NHD",)), cache=cache)
    assert not b.cache_hit and not c.cache_hit and cache.builds == 3
    assert len({a.directory, b.directory, c.directory}) == 3


def test_key_covers_fast_math_flag():
    v = _softcap_variant(1.0)
    k1 = cache_key(v, BuildConfig("cuda", (128,), ("float16",), ("sm_80",)))
    k2 = cache_key(v, BuildConfig("cuda", (128,), ("float16",), ("sm_80",), fast_math=True))
    assert k1 != k2


def test_key_covers_every_source_of_a_build(tmp_path):
    """The variant IR and its analyses (attngen/ir), the schedules, the code generators, the C++ templates
    and the build entry are hashed: changing the mask analysis must not serve a library built before."""
    hashed = {p.relative_to(PACKAGE).as_posix() for p in build_source_files()}
    for f in ("ir/analysis.py", "ir/mask_class.py", "schedules/template_prefill.py", "codegen/pipeline.py",
              "csrc/prefill.cuh", "csrc/tile_checks.h", "build.py"):
        assert f in hashed, f
    copy = tmp_path / "attngen"
    copy.mkdir()
    for name in BUILD_SOURCES:
        src = PACKAGE / name
        if src.is_file():
            shutil.copy2(src, copy / name)
        else:
            shutil.copytree(src, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
    v = _softcap_variant(1.0)
    before = cache_key(v, CFG, package=copy)
    assert before == cache_key(v, CFG, package=copy)
    with open(copy / "ir" / "mask_class.py", "a") as f:
        f.write("\n# a change to the mask analysis\n")
    after_ir = cache_key(v, CFG, package=copy)
    assert after_ir != before
    with open(copy / "build.py", "a") as f:
        f.write("\n")
    assert cache_key(v, CFG, package=copy) != after_ir


def _build_in_process(root, queue):
    cache = BuildCache(root)
    res = run_pipeline(_softcap_variant(3.0), CFG, cache=cache)
    queue.put((res.cache_hit, cache.builds, str(res.directory)))


def test_concurrent_builds_compile_once(tmp_path):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_build_in_process, args=(str(tmp_path), queue)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert sorted(r[1] for r in results) == [0, 1]  # exactly one process compiled
    assert len({r[2] for r in results}) == 1


def test_a_stand_in_names_a_built_entry_and_follows_a_rebuild_after_a_prune(tmp_path):
    """Builds with their tools write a stand-in (keyed without the tools) naming their entry; a lookup without
    the tools is served the named entry, and refused, naming the missing tool, where there is none. Where the
    named entry was removed (a pruned cache), the next build with the tools names its own."""
    import shutil

    from attngen.codegen.cache import BuildCache, ToolsMissingError

    def build(text):
        return lambda out: (out / "lib.txt").write_text(text)

    cache = BuildCache(tmp_path / "c", prebuilt=())
    with_tools, without = {"nvcc": "12.8"}, {"nvcc": "none"}
    with pytest.raises(ToolsMissingError, match="nvcc not installed.*ATTNGEN_PREBUILT_DIRS"):
        cache.get_or_build_with_tools("k1", build("one"), stand_in="s", tools=without, what="lib")
    first, hit = cache.get_or_build_with_tools("k1", build("one"), stand_in="s", tools=with_tools, what="lib")
    assert not hit and cache.builds == 1  # (the stand-in is not counted as a build)
    served, hit = BuildCache(tmp_path / "c", prebuilt=()).get_or_build_with_tools(
        "k-none", build("never"), stand_in="s", tools=without, what="lib")
    assert hit and served == first and (served / "lib.txt").read_text() == "one"
    # another toolchain's build keeps the stand-in on the first while that entry lives
    second, _ = cache.get_or_build_with_tools("k2", build("two"), stand_in="s", tools={"nvcc": "13.0"}, what="lib")
    fresh = BuildCache(tmp_path / "c", prebuilt=())
    assert fresh.get_or_build_with_tools("k-none", build("never"), stand_in="s", tools=without, what="lib")[0] == first
    shutil.rmtree(first)  # (pruned)
    again = BuildCache(tmp_path / "c", prebuilt=())
    assert again.get_or_build_with_tools("k2", build("two"), stand_in="s", tools={"nvcc": "13.0"},
                                         what="lib") == (second, True)
    served, _ = BuildCache(tmp_path / "c", prebuilt=()).get_or_build_with_tools(
        "k-none", build("never"), stand_in="s", tools=without, what="lib")
    assert served == second and (served / "lib.txt").read_text() == "two"
