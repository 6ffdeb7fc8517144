"""Saved step programs (`worker/executable_cache.py`): a second start of the
same engine loads every warm-up program instead of compiling it and gives
the same tokens; a damaged entry is compiled again and rewritten; a
different engine never reads another's programs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

# One engine start in a fresh process (CPU keeps the cache off by default:
# JAXINFER_EXECUTABLE_CACHE=1 turns it on), then a seeded generate.
START = r"""
import json, sys
from jaxinfer import LLM, SamplingParams
from jaxinfer.engine.step_timeline import CompileClock
CompileClock.install()
path, cache, seqs = sys.argv[1], sys.argv[2], int(sys.argv[3])
llm = LLM(path, compilation_cache_dir=cache, warmup=True, max_model_len=32,
          num_gpu_blocks_override=16, max_num_seqs=seqs,
          max_num_batched_tokens=16, dtype="float32")
engine = llm.llm_engine
before = CompileClock.read()[1]
outs = llm.generate([{"prompt_token_ids": [5, 6, 7]},
                     {"prompt_token_ids": [9] * 12}],
                    SamplingParams(max_tokens=6, temperature=0.8, seed=1,
                                   ignore_eos=True), use_tqdm=False)
print(json.dumps(dict(programs=engine.warmup_programs,
                      loaded=engine.runner.programs.num_loaded,
                      compiles=CompileClock.read()[1] - before,
                      tokens=[o.outputs[0].token_ids for o in outs])))
"""


def _start(script, model, cache, seqs=2) -> dict:
    env = dict(os.environ, JAXINFER_EXECUTABLE_CACHE="1", JAX_PLATFORMS="cpu")
    p = subprocess.run([sys.executable, str(script), model, str(cache), str(seqs)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _entries(cache) -> list[str]:
    root = os.path.join(cache, "executables")
    return sorted(os.path.join(d, f) for d, _, files in os.walk(root)
                  for f in files if f.endswith(".exe"))


def test_second_start_loads_every_program(tiny_model_factory, tmp_path):
    script = tmp_path / "start.py"
    script.write_text(START)
    model, cache = tiny_model_factory(), tmp_path / "xla"
    first = _start(script, model, cache)
    assert first["loaded"] == 0 and first["compiles"] == 0
    entries = _entries(cache)
    steps = len(entries)
    assert steps > 1 and first["programs"] >= steps  # (and copy programs)

    second = _start(script, model, cache)
    assert second["loaded"] == steps and second["compiles"] == 0
    assert second["tokens"] == first["tokens"]

    # A damaged entry: dropped, compiled again and rewritten; the rest load.
    with open(entries[0], "r+b") as f:
        f.truncate(100)
    third = _start(script, model, cache)
    assert third["loaded"] == steps - 1
    assert third["tokens"] == first["tokens"]
    assert _entries(cache) == entries and os.path.getsize(entries[0]) > 100

    # Another engine (a different bucket set): its own fingerprint, nothing
    # of the first one's read.
    other = _start(script, model, cache, seqs=4)
    assert other["loaded"] == 0
    assert len({os.path.dirname(e) for e in _entries(cache)}) == 2


def test_off_without_a_compilation_cache_and_on_cpu_by_default(monkeypatch):
    from jaxinfer.worker import executable_cache as ec

    class Runner:  # runner_fingerprint is not reached when off
        pass
    monkeypatch.delenv("JAXINFER_EXECUTABLE_CACHE", raising=False)
    assert ec.executable_cache_for(Runner(), None) is None
    assert ec.executable_cache_for(Runner(), "") is None
    assert ec.executable_cache_for(Runner(), "/tmp/x") is None  # CPU: off
    monkeypatch.setenv("JAXINFER_EXECUTABLE_CACHE", "0")
    assert ec.executable_cache_for(Runner(), "/tmp/x", enabled=None) is None
    monkeypatch.setenv("JAXINFER_EXECUTABLE_CACHE", "yes")
    with pytest.raises(ValueError, match="JAXINFER_EXECUTABLE_CACHE must be"):
        ec.executable_cache_for(Runner(), "/tmp/x")


def test_an_entry_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """save() writes through a temporary file and a rename: a failed write
    leaves no entry (and no temporary file) behind."""
    import jax
    import jax.numpy as jnp

    from jaxinfer.worker.executable_cache import ExecutableCache
    compiled = jax.jit(lambda x: x * 2).lower(jnp.ones(3)).compile()
    cache = ExecutableCache(str(tmp_path), "f" * 32)

    def fail(src, dst):
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", fail)
    cache.save(("k",), compiled)
    assert os.listdir(cache.directory) == []
    monkeypatch.undo()
    cache.save(("k",), compiled)
    assert [f.endswith(".exe") for f in os.listdir(cache.directory)] == [True]


def test_only_the_newest_fingerprints_stay_on_disk(tmp_path):
    """A new fingerprint's first save deletes the oldest folders past
    KEEP_FINGERPRINTS, so upgrades and model changes do not fill the disk."""
    import jax
    import jax.numpy as jnp

    from jaxinfer.worker.executable_cache import KEEP_FINGERPRINTS, ExecutableCache
    compiled = jax.jit(lambda x: x + 1).lower(jnp.ones(2)).compile()
    names = [f"{i:032x}" for i in range(KEEP_FINGERPRINTS + 2)]
    for age, name in enumerate(names):
        ExecutableCache(str(tmp_path), name).save(("k",), compiled)
        os.utime(tmp_path / name, (1000 + age, 1000 + age))
    assert sorted(os.listdir(tmp_path)) == names[-KEEP_FINGERPRINTS:]
    # The folder written now stays, however old its clock says it is.
    newest = "f" * 32
    ExecutableCache(str(tmp_path), newest).save(("k",), compiled)
    os.utime(tmp_path / newest, (1, 1))
    kept = sorted(os.listdir(tmp_path))
    assert newest in kept and len(kept) == KEEP_FINGERPRINTS


def test_the_compilation_cache_is_capped(tmp_path):
    import jax

    from jaxinfer.worker import warmup
    before = (jax.config.jax_compilation_cache_dir,
              jax.config.jax_compilation_cache_max_size)
    try:
        jax.config.update("jax_compilation_cache_dir", None)
        jax.config.update("jax_compilation_cache_max_size", -1)
        assert warmup.enable_compilation_cache(str(tmp_path)) == str(tmp_path)
        assert (jax.config.jax_compilation_cache_max_size
                == warmup.COMPILATION_CACHE_MAX_BYTES)
        # A size the user set through JAX stays.
        jax.config.update("jax_compilation_cache_dir", None)
        jax.config.update("jax_compilation_cache_max_size", 123)
        warmup.enable_compilation_cache(str(tmp_path))
        assert jax.config.jax_compilation_cache_max_size == 123
    finally:
        jax.config.update("jax_compilation_cache_dir", before[0])
        jax.config.update("jax_compilation_cache_max_size", before[1])
