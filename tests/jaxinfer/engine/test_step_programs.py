"""`StepPrograms` (worker/step_programs.py): the programs an engine may
build are known before any is built, by named keys, and warm-up builds
exactly those."""

from __future__ import annotations

from jaxinfer.worker.program_keys import (
    COUNT,
    FORWARD,
    PROMPT_LOGPROBS,
    SAMPLE,
    AuxKey,
    ForwardKey,
    SampleKey,
)


def test_the_wanted_programs_are_known_before_building(make_llm):
    runner = make_llm(max_num_seqs=4).llm_engine.runner
    programs = runner.programs
    assert programs.built == {}  # no warm-up: nothing built yet
    wanted = programs.wanted(runner.device_state())
    shapes = programs.buckets.all_shapes()
    forward = [k for k in wanted if k.kind == FORWARD]
    assert all(isinstance(k, ForwardKey) for k in forward)
    # Each bucket once, and each prefill bucket again with prompt-logprob
    # rows.
    assert sorted(k.bucket for k in forward) == sorted(
        shapes + [b for b in shapes if not b.decode_only])
    samplers = [k for k in wanted if k.kind == SAMPLE]
    assert all(isinstance(k, SampleKey) for k in samplers)
    # The plain tier returns no top logprobs; the full tier the most a
    # request may ask for.
    assert {k.num_logprobs for k in samplers} == {None, programs.max_logprobs}
    aux = [k for k in wanted if isinstance(k, AuxKey)]
    assert {k.kind for k in aux} == {PROMPT_LOGPROBS, COUNT}
    assert len(wanted) == len(forward) + len(samplers) + len(aux)
    # Warm-up builds that very set, and nothing is left to build.
    compiled, loaded, _ = programs.warm_up(runner.device_state(), None)
    assert set(programs.built) == set(wanted)
    assert compiled + loaded == len(wanted)
    assert programs.wanted(runner.device_state()).keys() == programs.built.keys()
