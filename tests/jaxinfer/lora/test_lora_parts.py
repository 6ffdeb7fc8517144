"""The LoRA parts on their own: the batched product against NumPy, the
device slot table, the host adapter store, the scheduler's max_loras rule,
and the vLLM-facing argument checks."""

from __future__ import annotations

import os
import random

import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.config import CacheConfig, EngineArgs, SchedulerConfig
from jaxinfer.core.scheduler import Scheduler
from jaxinfer.errors import InvalidConfigError, InvalidRequestError
from jaxinfer.lora.errors import LoRAError
from jaxinfer.lora.request import LoRARequest, per_prompt
from jaxinfer.lora.slots import SlotTable
from jaxinfer.models.lora import lora_product
from jaxinfer.request import Request, RequestStatus
from jaxinfer.sampling_params import SamplingParams

# -- the product ----------------------------------------------------------

@pytest.mark.parametrize("in_shape,out_shape", [((12,), (2, 5)), ((3, 4), (7,))])
@pytest.mark.parametrize("num_tokens", [3, 9])  # fewer / more tokens than slots
def test_lora_product_equals_numpy(in_shape, out_shape, num_tokens):
    rng = np.random.default_rng(0)
    slots, rank = 5, 4
    x = rng.normal(size=(num_tokens,) + in_shape).astype(np.float32)
    a = rng.normal(size=in_shape + (slots, rank)).astype(np.float32)
    b = rng.normal(size=(slots, rank) + out_shape).astype(np.float32)
    token_slots = rng.integers(0, slots + 1, num_tokens).astype(np.int32)
    token_slots[0] = 0  # the base model
    want = np.zeros((num_tokens,) + out_shape, np.float32)
    for t, s in enumerate(token_slots):
        if s:
            a_s = a[..., s - 1, :].reshape(-1, rank)  # [in, r]
            b_s = b[s - 1].reshape(rank, -1)  # [r, out]
            want[t] = (x[t].reshape(-1) @ a_s @ b_s).reshape(out_shape)
    for method in ("dense", "gather", None):
        got = lora_product(jnp.asarray(x), jnp.asarray(a), jnp.asarray(b),
                           jnp.asarray(token_slots), method)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    assert np.abs(want[1:]).max() > 1  # the non-zero rows were compared


# -- device slots ---------------------------------------------------------

def test_slot_table_keeps_resident_adapters_and_evicts_lru():
    table = SlotTable(2)
    slots, loads = table.assign(["a", "b"])
    assert slots == {"a": 1, "b": 2} and loads == [(1, "a"), (2, "b")]
    assert table.assign(["b"]) == ({"b": 2}, [])  # resident: no copy
    # "a" is now least recently used and not needed: "c" takes its slot.
    slots, loads = table.assign(["c", "b"])
    assert slots == {"c": 1, "b": 2} and loads == [(1, "c")]
    with pytest.raises(RuntimeError, match="max_loras"):
        table.assign(["a", "b", "c"])


# -- the host store -------------------------------------------------------

@pytest.fixture()
def store(base_path):
    from jaxinfer.lora.layout import SlotLayout
    from jaxinfer.lora.store import AdapterStore
    from jaxinfer.models import model_class, model_spec, resolve_model
    from jaxinfer.models.lora import lora_targets
    cfg = resolve_model(base_path).config
    targets = lora_targets(model_class(cfg.architecture)(cfg), cfg,
                           model_spec(cfg.architecture))
    return AdapterStore(SlotLayout(targets, 8), jnp.float32, capacity=1)


def test_store_lru_keeps_adapters_in_flight(store, adapters):
    a, b = (LoRARequest(n, i + 1, adapters[n])
            for i, n in enumerate(["all-r8", "mlp-patterns"]))
    first = store.load(a)
    assert store.load(a) is first and store.num_loads == 1  # cached
    store.acquire("req-1", first)
    store.load(b)  # over capacity, but a is held by a request
    assert store.ids() == {1, 2}
    store.release(["req-1"])
    assert store.ids() == {2}  # a evicted (least recently used), b kept
    # The same id for another folder: refused while held, fine after.
    held = store.load(b)
    store.acquire("req-2", held)
    with pytest.raises(LoRAError, match="lora_int_id 2 belongs to"):
        store.load(LoRARequest("other", 2, adapters["all-r8"]))
    store.release(["req-2"])
    other = store.load(LoRARequest("other", 2, adapters["all-r8"]))
    assert other.request.lora_name == "other"
    # remove_lora: a held adapter stays until its request ends.
    store.acquire("req-3", other)
    assert store.remove(2) and store.get(2) is other
    store.release(["req-3"])
    assert store.get(2) is None and not store.remove(2)


def test_store_reads_a_changed_folder_again(store, adapters, tmp_path):
    import shutil
    path = str(tmp_path / "copy")
    shutil.copytree(adapters["all-r8"], path)
    req = LoRARequest("x", 1, path)
    old = store.load(req)
    weights = os.path.join(path, "adapter_model.safetensors")
    stat = os.stat(weights)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    new = store.load(req)
    assert new is not old and new.key != old.key  # new pages, new slot
    np.testing.assert_array_equal(new.flat, old.flat)


# -- the scheduler's max_loras rule ------------------------------------------

def _request(rid: str, lora_id: int | None) -> Request:
    lora = (LoRARequest(f"l{lora_id}", lora_id, "/unused")
            if lora_id is not None else None)
    return Request(rid, [1, 2, 3], SamplingParams(max_tokens=2), lora_request=lora)


def test_scheduler_runs_at_most_max_loras_adapters():
    sched = Scheduler(SchedulerConfig(max_model_len=64, max_num_seqs=8,
                                      max_num_batched_tokens=64),
                      CacheConfig(block_size=16, num_gpu_blocks_override=32),
                      num_blocks=32, max_loras=1)
    for rid, lora in [("a1", 1), ("b", 2), ("base", None), ("a2", 1)]:
        sched.add_request(_request(rid, lora))
    out = sched.schedule()
    # b would be a second adapter: passed over, keeping its place.
    assert [s.request_id for s in out.scheduled] == ["a1", "base", "a2"]
    assert [r.request_id for r in sched.waiting] == ["b"]
    assert [n.lora_request.lora_int_id if n.lora_request else None
            for n in out.new_requests] == [1, None, 1]
    sched.finish_requests(["a1", "a2"], RequestStatus.FINISHED_ABORTED)
    out = sched.schedule()
    assert "b" in [s.request_id for s in out.scheduled]


def test_max_loras_holds_and_nobody_starves_under_random_traffic():
    rng = random.Random(0)
    sched = Scheduler(SchedulerConfig(max_model_len=64, max_num_seqs=4,
                                      max_num_batched_tokens=16),
                      CacheConfig(block_size=16), num_blocks=12, max_loras=2)
    added, finished = 0, set()
    for _ in range(2000):
        if added < 60 and rng.random() < 0.5:
            lora = rng.choice([None, 1, 2, 3, 4])
            req = _request(f"r{added}", lora)
            req.prompt_token_ids = [rng.randrange(3, 99)
                                    for _ in range(rng.randrange(1, 30))]
            req.max_tokens = rng.randrange(1, 8)
            sched.add_request(req)
            added += 1
        out = sched.schedule()
        running = {r.lora_request.lora_int_id for r in sched.running
                   if r.lora_request is not None}
        assert len(running) <= 2, running
        for r in sched.update_from_output(out, {s.request_id: 5 for s in
                                                out.scheduled if s.sample}):
            if r.is_finished:
                finished.add(r.request_id)
        if added == 60 and not sched.has_unfinished_requests():
            break
    assert len(finished) == 60  # every request ran, whatever its adapter


# -- arguments --------------------------------------------------------------

def test_lora_request_checks_its_fields():
    with pytest.raises(InvalidRequestError, match="lora_int_id must be"):
        LoRARequest("a", 0, "/p")
    with pytest.raises(InvalidRequestError, match="lora_path"):
        LoRARequest("a", 1)
    with pytest.warns(DeprecationWarning):
        assert LoRARequest("a", 1, lora_local_path="/p").lora_path == "/p"
    # vLLM's equality: by name.
    assert LoRARequest("a", 1, "/p") == LoRARequest("a", 2, "/q")
    assert per_prompt(None, 2) == [None, None]
    with pytest.raises(InvalidRequestError, match="2 lora_requests for 3"):
        per_prompt([None, None], 3)


def test_engine_args_lora_fields():
    with pytest.raises(InvalidConfigError, match="enable_lora"):
        EngineArgs(max_loras=4)
    with pytest.raises(InvalidConfigError, match="max_cpu_loras"):
        EngineArgs(enable_lora=True, max_loras=4, max_cpu_loras=2)
    with pytest.raises(InvalidConfigError, match="max_lora_rank"):
        EngineArgs(enable_lora=True, max_lora_rank=0)
    cfg = EngineArgs(enable_lora=True, max_loras=3).lora_config()
    assert (cfg.max_loras, cfg.max_lora_rank, cfg.cpu_capacity) == (3, 16, 3)
    assert EngineArgs().lora_config() is None


def test_lora_modules_flag_forms():
    from jaxinfer.entrypoints.openai.serving_models import LoRAModulePath, parse_lora_modules
    assert parse_lora_modules(
        ["a=/x", '{"name": "b", "path": "/y", "base_model_name": "m"}']) == [
        LoRAModulePath("a", "/x"), LoRAModulePath("b", "/y", "m")]
    for bad, match in [("a", "name=path"), ('{"name": "b"}', "'path'"),
                       ("{bad", "JSON")]:
        with pytest.raises(ValueError, match=match):
            parse_lora_modules([bad])
    with pytest.raises(ValueError, match="more than once"):
        parse_lora_modules(["a=/x", "a=/y"])


def test_shrinks_of_one_input_share_one_barrier():
    """Projections that read one input (q/k/v, gate/up) give their shrinks
    that input through one optimization barrier, and another input gets its
    own: XLA's dot-merger then joins the shrinks with each other but never
    with the base projections (whose weights it concatenated at run time in
    every step, docs/performance.md "LoRA"). The outputs are unchanged."""
    import jax
    from flax import linen as nn

    from jaxinfer.models.layers import Linear
    from jaxinfer.models.lora import COLLECTION, LORA_A, LORA_B, lora_collection, lora_product

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            lin = lambda name, n: Linear((8,), (n,), ("embed", "mlp"), False,
                                         jnp.float32, name=name)
            q, k = lin("q", 8)(x), lin("k", 4)(x)  # one input
            return lin("o", 8)(q * 2.0).sum() + k.sum()  # another

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(3, 8)), jnp.float32)
    slots = jnp.asarray([1, 0, 2], jnp.int32)
    params = Block().init(jax.random.key(0), x)["params"]
    pool = {name: {LORA_A: jnp.asarray(rng.normal(size=(8, 2, 4)), jnp.float32),
                   LORA_B: jnp.asarray(rng.normal(size=(2, 4, n)), jnp.float32)}
            for name, n in (("q", 8), ("k", 4), ("o", 8))}

    def run(params, pool, x):
        return Block().apply({"params": params,
                              COLLECTION: lora_collection(pool, slots)}, x)
    jaxpr = str(jax.make_jaxpr(run)(params, pool, x))
    assert jaxpr.count("optimization_barrier") == 2, jaxpr
    kern = lambda n: nn.unbox(params[n]["kernel"])
    delta = lambda v, n: lora_product(v, pool[n][LORA_A], pool[n][LORA_B], slots)
    q = x @ kern("q") + delta(x, "q")
    k = x @ kern("k") + delta(x, "k")
    want = ((2 * q) @ kern("o") + delta(2 * q, "o")).sum() + k.sum()
    np.testing.assert_allclose(np.asarray(jax.jit(run)(params, pool, x)),
                               np.asarray(want), rtol=1e-5)
