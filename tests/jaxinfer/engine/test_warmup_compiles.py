"""After warm-up, 200 random requests (greedy, sampled, with
and without top-k / top-p / min-p) compile nothing."""

from __future__ import annotations

import logging
import random

import pytest

from jaxinfer import SamplingParams
from tests.compile_events import compile_events

pytestmark = pytest.mark.slow


def test_no_compilation_after_warmup(make_llm, caplog):
    with caplog.at_level(logging.INFO, logger="jaxinfer.worker.warmup"):
        llm = make_llm(warmup=True, max_num_seqs=4, num_gpu_blocks_override=12,
                       preemption_mode="swap", swap_space=0.01)
    engine = llm.llm_engine
    assert engine.warmup_programs > 0
    assert any("warm-up compiled" in r.getMessage() for r in caplog.records)
    # Every bucket has its program: no step waits for the one in flight to
    # be read first (LLMEngine.step's deferred dispatch).
    programs = engine.runner.programs
    shapes = programs.buckets.all_shapes()
    assert all(("forward", dims) in {k[:2] for k in programs.built}
               for dims in shapes), "warm-up keys are not the buckets' dims"
    deferred = []
    real_builds = programs.will_build
    programs.will_build = lambda out: deferred.append(
        real_builds(out)) or deferred[-1]

    with compile_events() as events:
        rng = random.Random(0)
        added = finished = 0
        while finished < 200:
            while added < 200 and rng.random() < 0.4:
                prompt = [rng.randrange(3, 49152)
                          for _ in range(rng.randrange(1, 100))]
                temperature = rng.choice([0.0, 0.8])
                filters = {} if temperature == 0 else rng.choice(
                    [{}, {"top_p": 0.9}, {"top_k": 20}, {"min_p": 0.05},
                     {"top_k": 5, "top_p": 0.8, "min_p": 0.1}])
                sp = SamplingParams(max_tokens=rng.randrange(1, 16),
                                    temperature=temperature,
                                    seed=rng.randrange(1000), **filters)
                engine.add_request(None, {"prompt_token_ids": prompt}, sp)
                added += 1
            finished += sum(o.finished for o in engine.step())
    stats = engine.get_stats()
    assert deferred and not any(deferred)
    assert stats.num_preemptions > 0, "the test should exercise preemption"
    assert events == [], f"{len(events)} compilations after warm-up"


def test_warmup_defaults_to_on_for_gpus_only():
    from jaxinfer.config import EngineArgs
    assert EngineArgs().resolved_warmup("gpu")
    assert not EngineArgs().resolved_warmup("cpu")
    assert not EngineArgs().resolved_warmup("gpu", pooling=True)
    assert not EngineArgs(warmup=False).resolved_warmup("gpu")
    assert EngineArgs(warmup=True).resolved_warmup("cpu")


def test_build_all_counts_programs_on_a_progress_bar(capsys):
    import jax
    import jax.numpy as jnp

    from jaxinfer.worker.warmup import build_all
    todo = {("double", n): (jax.jit(lambda x: 2 * x), (), (jnp.zeros(n),))
            for n in (3, 5)}
    built: dict = {}
    assert build_all(todo, built, progress=True) == (2, 0)
    assert set(built) == set(todo)
    err = capsys.readouterr().err
    assert "Compiling step programs" in err and "2/2" in err
