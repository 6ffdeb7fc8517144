"""Counts the primitives of the engine's decode program, every nested jaxpr
inlined (a layer applied through one jitted function counts once per
call), for a 2-layer model of the llama3-8b shape: a 256-row decode step at
1,000 tokens, sampling at temperature 1, reference attention. CPU, about a
minute; the same count on two commits says whether the step program itself
gained work:

    PYTHONPATH=$PWD python benchmarks/step_primitives.py

Runs on this commit's runner API (the step as forward and sampler programs,
counted together), on the fused step before it (``runner.step_args``, as at
ec0f032) and on the one before the SchedulerOutput contract
(``dispatch(out, requests)``, as at a920951). Prints JSON.
"""

from __future__ import annotations

import collections
import inspect
import json
import os
import tempfile

import jax
import jax.numpy as jnp
from jax.extend import core as jcore

from jaxinfer.config import CacheConfig, SchedulerConfig
from jaxinfer.core.scheduler_output import ScheduledRequest, SchedulerOutput
from jaxinfer.models import resolve_model
from jaxinfer.sampling_params import SamplingParams
from jaxinfer.worker import model_runner as mr

S, L, PAGES = 256, 1000, 64


def count(jaxpr, c: collections.Counter) -> None:
    for e in jaxpr.eqns:
        subs = [x.jaxpr if isinstance(x, jcore.ClosedJaxpr) else x
                for v in e.params.values()
                for x in (v if isinstance(v, (list, tuple)) else [v])
                if isinstance(x, (jcore.ClosedJaxpr, jcore.Jaxpr))]
        for s in subs:
            count(s, c)
        if not subs:
            c[e.primitive.name] += 1


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    cfg = json.load(open(os.path.join(here, "models", "llama3-8b", "config.json")))
    cfg["num_hidden_layers"] = 2
    path = tempfile.mkdtemp(prefix="llama3-8b-2layers-")
    json.dump(cfg, open(os.path.join(path, "config.json"), "w"))
    sc = SchedulerConfig(max_model_len=2048, max_num_seqs=S,
                         max_num_batched_tokens=2048)
    cc = CacheConfig(block_size=16, swap_space=0,
                     num_gpu_blocks_override=PAGES * S + 1)
    runner = mr.ModelRunner(resolve_model(path, "dummy"), jnp.bfloat16, sc, cc,
                            attention_backend="reference", load_format="dummy")
    seen = {}
    owner = runner.programs if hasattr(runner, "device_state") else runner
    name = "run" if owner is not runner else "run_step"
    run_step = getattr(owner, name)

    def spy(*args):
        seen["args"] = args
        return run_step(*args)
    setattr(owner, name, spy)
    sp = SamplingParams(temperature=1.0)
    tables = [list(range(1 + s * PAGES, 1 + (s + 1) * PAGES)) for s in range(S)]
    rows = [ScheduledRequest(f"r{s}", [5], L, tables[s], True) for s in range(S)]
    if len(inspect.signature(runner.dispatch).parameters) == 1:
        from jaxinfer.core.scheduler_output import NewRequestData
        new = [NewRequestData(f"r{s}", [5] * L, L, sp) for s in range(S)]
        runner.dispatch(SchedulerOutput(rows, S, [], [], [], [], new))
    else:  # before the SchedulerOutput contract
        from jaxinfer.request import Request
        reqs = {f"r{s}": Request(f"r{s}", [5] * L, sp) for s in range(S)}
        blanks = [[]] * (len(inspect.signature(SchedulerOutput).parameters) - 2)
        runner.dispatch(SchedulerOutput(rows, S, *blanks[:5]), reqs)
    args = seen["args"]
    if owner is not runner:  # StepPrograms.run(state, inputs, penalties)
        import functools

        from jaxinfer.worker import step_functions
        state, inputs, penalties = (list(args) + [None])[:3]
        dyn = (state.params, state.kv_pages, penalties, state.constants,
               state.prev_tokens, inputs.packed, inputs.logits_indices,
               inputs.sampling, inputs.prompt_lp_targets, inputs.encoder,
               inputs.lora_pool)
        whole = functools.partial(step_functions.step, runner.model)
        jaxpr = jax.make_jaxpr(whole, static_argnums=(0, 1))(
            inputs.num_logprobs, inputs.bucket, *dyn)
    elif hasattr(runner, "forward_args"):  # the step as two programs: both
        import functools

        from jaxinfer.worker import step_programs
        num_lp, dims, state, packed, logits_idx, smd, targets, *rest = args
        mm, pool = (rest + [None, None])[:2]
        dyn = (runner.params, runner.kv_pages, state, runner.constants,
               runner.prev_tokens, packed, logits_idx, smd, targets, mm, pool)
        whole = functools.partial(step_programs.step, runner.model)
        jaxpr = jax.make_jaxpr(whole, static_argnums=(0, 1))(num_lp, dims, *dyn)
    else:
        dyn = runner.step_args(*args[2:])
        jaxpr = jax.make_jaxpr(runner._step, static_argnums=(0, 1))(
            args[0], args[1], *dyn)
    c: collections.Counter = collections.Counter()
    count(jaxpr.jaxpr, c)
    print(json.dumps({"total": sum(c.values()), **dict(sorted(c.items()))}))


if __name__ == "__main__":
    main()
