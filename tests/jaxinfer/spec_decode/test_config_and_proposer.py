"""`speculative_config` parsing (vLLM's keys; every other key or method
refused by name), the n-gram proposer against a plain Python lookup, the
combinations refused at start or per request, and the spec_decode
metrics."""

from __future__ import annotations

import random

import pytest

from jaxinfer import SamplingParams
from jaxinfer.config import EngineArgs
from jaxinfer.errors import InvalidConfigError, UnsupportedFeatureError
from jaxinfer.spec_decode.config import SpeculativeConfig, parse_speculative_config
from jaxinfer.spec_decode.ngram import propose_ngram


def test_vllm_keys_are_read():
    cfg = parse_speculative_config(
        '{"method": "ngram", "num_speculative_tokens": 4, '
        '"prompt_lookup_max": 3, "prompt_lookup_min": 2}')
    assert cfg == SpeculativeConfig("ngram", 4, 2, 3)
    # vLLM's older spelling: the method in "model".
    assert parse_speculative_config(
        {"model": "[ngram]", "num_speculative_tokens": 2,
         "prompt_lookup_max": 4}) == SpeculativeConfig("ngram", 2, 4, 4)
    assert parse_speculative_config(None) is None
    # A model other than "ngram" is a draft model (vLLM's rule), and a
    # draft tensor-parallel size of 1 is the one served.
    assert parse_speculative_config(
        {"model": "some/draft", "num_speculative_tokens": 3,
         "draft_tensor_parallel_size": 1}) == SpeculativeConfig(
             "draft_model", 3, model="some/draft")


@pytest.mark.parametrize("cfg,error,names", [
    ({"method": "eagle", "num_speculative_tokens": 2}, InvalidConfigError,
     "needs 'model'"),
    ({"method": "eagle3", "num_speculative_tokens": 2}, InvalidConfigError,
     "needs 'model'"),
    ({"method": "medusa", "model": "m", "num_speculative_tokens": 2},
     UnsupportedFeatureError, "'medusa' speculative method"),
    ({"method": "draft_model", "num_speculative_tokens": 2}, InvalidConfigError,
     "needs 'model'"),
    ({"method": "draft_model", "model": "d", "num_speculative_tokens": 2,
      "prompt_lookup_max": 3}, InvalidConfigError, "prompt_lookup_max"),
    ({"method": "draft_model", "model": "d", "num_speculative_tokens": 2,
      "quantization": "fp8"}, UnsupportedFeatureError, "quantization"),
    ({"method": "ngram", "model": "some/draft", "num_speculative_tokens": 2},
     InvalidConfigError, "draft_model"),
    ({"method": "lookahead", "num_speculative_tokens": 2}, InvalidConfigError,
     "lookahead"),
    ({"method": "ngram", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 2},
     UnsupportedFeatureError, "draft_tensor_parallel_size"),
    ({"method": "ngram", "num_speculative_tokens": 2, "colour": 1},
     InvalidConfigError, "colour"),
    ({"method": "ngram"}, InvalidConfigError, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 0}, InvalidConfigError,
     "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4,
      "prompt_lookup_max": 2}, InvalidConfigError, "prompt_lookup_max"),
    ("not json", InvalidConfigError, "JSON"),
])
def test_bad_configs_are_refused_by_name(cfg, error, names):
    with pytest.raises(error, match=names):
        parse_speculative_config(cfg)


def test_engine_args_refuse_multi_step_windows_with_speculation():
    with pytest.raises(InvalidConfigError, match="num_scheduler_steps"):
        EngineArgs(speculative_config={"method": "ngram",
                                       "num_speculative_tokens": 2},
                   num_scheduler_steps=4)


def _lookup(seq, limit, n_min, n_max):
    """The proposer's rule, one sequence at a time, in plain Python."""
    for n in range(n_max, n_min - 1, -1):
        if len(seq) <= n:
            continue
        suffix = seq[-n:]
        for start in range(len(seq) - n - 1, -1, -1):
            if seq[start:start + n] == suffix:
                return seq[start + n:start + n + limit]
    return []


@pytest.mark.parametrize("n_min,n_max,vocab", [
    (1, 3, 6), (2, 5, 3), (5, 5, 2), (3, 7, 2), (1, 1, 50)])
def test_ngram_proposals_match_a_plain_lookup(n_min, n_max, vocab):
    rng = random.Random(n_min * 10 + n_max)
    seqs = [[rng.randrange(vocab) for _ in range(rng.randrange(1, 60))]
            for _ in range(200)]
    limits = [rng.randrange(0, 5) for _ in seqs]
    got = propose_ngram(seqs, limits, n_min, n_max)
    want = [_lookup(s, k, n_min, n_max) if k else []
            for s, k in zip(seqs, limits)]
    assert got == want
    assert sum(map(len, got)) > 100  # the test proposes something


@pytest.mark.slow
def test_structured_output_requests_are_refused(make_llm):
    from jaxinfer.sampling_params import StructuredOutputsParams
    llm = make_llm(speculative_config={"method": "ngram",
                                       "num_speculative_tokens": 2})
    with pytest.raises(UnsupportedFeatureError, match="structured output"):
        llm.generate("hi", SamplingParams(
            structured_outputs=StructuredOutputsParams(choice=["a", "b"])))


@pytest.mark.slow
def test_spec_decode_metrics_under_vllm_names(make_llm):
    from jaxinfer.metrics import EngineMetrics
    llm = make_llm(speculative_config={"method": "ngram",
                                       "num_speculative_tokens": 3,
                                       "prompt_lookup_min": 1})
    llm.generate({"prompt_token_ids": [7, 8, 9] * 6},
                 SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                 use_tqdm=False)
    stats = llm.llm_engine.get_stats()
    spec = stats.spec_decode
    assert spec.num_drafts > 0 and spec.num_draft_tokens >= spec.num_drafts
    metrics = EngineMetrics("m")
    metrics.record_engine_stats(stats)
    text = metrics.render().decode()

    def value(name, extra=""):
        line = next(x for x in text.splitlines()
                    if x.startswith(name + "{") and extra in x)
        return float(line.rsplit(" ", 1)[1])
    assert value("vllm:spec_decode_num_drafts_total") == spec.num_drafts
    assert value("vllm:spec_decode_num_draft_tokens_total") == spec.num_draft_tokens
    assert value("vllm:spec_decode_num_accepted_tokens_total") == \
        spec.num_accepted_tokens
    if spec.accepted_per_pos[0]:
        assert value("vllm:spec_decode_num_accepted_tokens_per_pos_total",
                     'position="0"') == spec.accepted_per_pos[0]


@pytest.mark.slow
def test_warm_up_builds_every_program_a_speculative_step_runs(make_llm):
    """k is fixed at start: the verifying sampler and the k + 1 scored rows
    per sequence are in the known set, warm-up builds them, and steps run
    nothing else."""
    # Small limits: few buckets to build.
    llm = make_llm(warmup=True, max_num_seqs=4, max_num_batched_tokens=16,
                   max_model_len=64, speculative_config={
                       "method": "ngram", "num_speculative_tokens": 2,
                       "prompt_lookup_min": 1})
    programs = llm.llm_engine.runner.programs
    llm.generate([{"prompt_token_ids": [7, 8, 9] * 6},
                  {"prompt_token_ids": list(range(40, 90))}],
                 [SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
                  SamplingParams(temperature=0.8, top_p=0.9, max_tokens=10,
                                 logprobs=1)], use_tqdm=False)
    assert programs.num_outside == 0
    assert programs.keys_run <= set(programs.built)
    assert any(key.kind == "verify" for key in programs.keys_run)


@pytest.mark.slow
def test_a_draft_with_another_vocabulary_is_refused_at_start(
        make_llm, tiny_model_factory):
    other = tiny_model_factory(vocab_size=512)
    with pytest.raises(InvalidConfigError, match="vocabulary of 512"):
        make_llm(speculative_config={"method": "draft_model", "model": other,
                                     "num_speculative_tokens": 2})


@pytest.mark.slow
@pytest.mark.parametrize("method", ["draft_model", "eagle", "eagle3"])
def test_draft_model_metrics_count_its_drafts(make_llm, spec_case, method):
    target, config = spec_case(method)
    llm = make_llm(target, speculative_config=config)
    llm.generate([{"prompt_token_ids": list(range(40, 60))}] * 2,
                 SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                 use_tqdm=False)
    spec = llm.llm_engine.get_stats().spec_decode
    # Every step after the first drafts for both rows until max_tokens.
    assert spec.num_drafts >= 2 * 3
    assert 0 < spec.num_accepted_tokens < spec.num_draft_tokens


@pytest.mark.slow
@pytest.mark.parametrize("method", ["draft_model", "eagle", "eagle3"])
def test_warm_up_builds_the_draft_models_programs(make_llm, spec_case,
                                                  method):
    """The draft's (or EAGLE head's) pass over each bucket, its proposal
    per decode-only bucket and the layout correction of steps laid out
    ahead are built at warm-up: serving drafted steps builds none."""
    target, config = spec_case(method, k=2)
    # Small limits: few buckets to build.
    llm = make_llm(target, warmup=True, max_num_seqs=4,
                   max_num_batched_tokens=16, max_model_len=64,
                   speculative_config=config)
    runner = llm.llm_engine.runner
    draft = runner.draft
    shapes = runner.programs.buckets.all_shapes()

    def built():
        return (draft._mirror._cache_size(), draft._propose._cache_size(),
                runner._shift_layout._cache_size())
    before = built()
    assert before == (len(shapes), sum(b.decode_only for b in shapes),
                      len(shapes))
    llm.generate([{"prompt_token_ids": [7, 8, 9] * 6},
                  {"prompt_token_ids": list(range(40, 90))}],
                 SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
                 use_tqdm=False)
    assert llm.llm_engine.get_stats().spec_decode.num_drafts > 0
    assert built() == before
    assert runner.programs.num_outside == 0
