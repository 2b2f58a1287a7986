"""The build cache: a hit for an unchanged variant, a new build for a changed hook, concurrency safety."""
import multiprocessing as mp

from tvm.script import tirx as T

from attngen import ScalarParam, Variant
from attngen.codegen.cache import BuildCache
from attngen.codegen.pipeline import cache_key, run_pipeline
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
