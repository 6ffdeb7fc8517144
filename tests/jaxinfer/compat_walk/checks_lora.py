"""Behaviour checks of the LoRA rows on the walk's tiny model
with PEFT adapters of it. The end-to-end proofs (HF + PEFT token parity,
the server's --lora-modules and run-time loading) are in tests/jaxinfer/lora
and test_lora_server.py; here each row is shown to do what it names."""

from __future__ import annotations

import pytest

from jaxinfer import LoRARequest, SamplingParams

from .registry import row_check

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
PROMPT = {"prompt_token_ids": [5, 60, 7, 33, 80, 21]}


@pytest.fixture(scope="session")
def walk_adapters(walk_model, tmp_path_factory):
    from tests.lora_adapters import ALL_LINEAR, make_peft_adapter
    root = tmp_path_factory.mktemp("walk-lora")
    return {name: make_peft_adapter(walk_model, str(root / name), seed=seed,
                                    r=r, target_modules=ALL_LINEAR)
            for name, seed, r in (("a", 1, 8), ("b", 2, 8), ("wide", 3, 16))}


def _tokens(llm, lora=None) -> list[int]:
    return list(llm.generate([PROMPT], GREEDY, use_tqdm=False,
                             lora_request=lora)[0].outputs[0].token_ids)


@row_check("engine_args", "enable_lora", "max_loras", "max_lora_rank",
           "max_cpu_loras")
def adapters_change_the_output_within_their_limits(make_llm, walk_adapters):
    from jaxinfer.lora.errors import LoRANotEnabledError, LoRARankError
    base = make_llm()
    a = LoRARequest("a", 1, walk_adapters["a"])
    with pytest.raises(LoRANotEnabledError):  # enable_lora off: refused
        _tokens(base, a)
    llm = make_llm(enable_lora=True, max_loras=1, max_lora_rank=8,
                   max_cpu_loras=1)
    plain = _tokens(base)
    assert _tokens(llm) == plain  # no adapter: the base model
    with_a = _tokens(llm, a)
    assert with_a != plain  # enable_lora: the adapter changes the output
    b = LoRARequest("b", 2, walk_adapters["b"])
    with_b = _tokens(llm, b)
    assert with_b not in (plain, with_a)
    # max_cpu_loras=1: serving b pushed a out of host memory.
    assert llm.llm_engine.list_loras() == {2}
    # max_loras=1: one device slot for adapters (slot 0, no adapter, is
    # not stored).
    pool = llm.llm_engine.runner.lora.pool
    assert pool.num_slots == 1, pool.num_slots
    # Both at once still give each one's own tokens (one slot, taken in turn).
    both = llm.generate([PROMPT, PROMPT], GREEDY, use_tqdm=False,
                        lora_request=[a, b])
    assert [list(o.outputs[0].token_ids) for o in both] == [with_a, with_b]
    with pytest.raises(LoRARankError, match="max_lora_rank"):  # rank 16 > 8
        _tokens(llm, LoRARequest("wide", 3, walk_adapters["wide"]))


@row_check("serve_flags", "enable_lora", "max_loras", "max_lora_rank",
           "max_cpu_loras", "lora_modules")
def lora_serve_flags_reach_the_engine(rows, walk_adapters):
    from jaxinfer.entrypoints.cli import build_parser
    from jaxinfer.entrypoints.openai.cli_args import serve_engine_args
    from jaxinfer.entrypoints.openai.serving_models import parse_lora_modules
    ns = build_parser().parse_args(
        ["serve", "m", "--enable-lora", "--max-loras", "3", "--max-lora-rank",
         "32", "--max-cpu-loras", "4", "--lora-modules",
         f"a={walk_adapters['a']}", f"b={walk_adapters['b']}"])
    args = serve_engine_args(ns)
    assert (args.enable_lora, args.max_loras, args.max_lora_rank,
            args.max_cpu_loras) == (True, 3, 32, 4)
    mods = parse_lora_modules(ns.lora_modules)
    assert [(m.name, m.path) for m in mods] == [
        ("a", walk_adapters["a"]), ("b", walk_adapters["b"])]
    with pytest.raises(ValueError, match="enable-lora"):  # modules need it
        serve_engine_args(build_parser().parse_args(
            ["serve", "m", "--lora-modules", f"a={walk_adapters['a']}"]))
