"""Greedy tokens of the embedded model and the tiny models, against tokens
recorded once.

A change to the model code (specs, RoPE tables, MLP and linear layers)
must not change a single greedy token: the recorded file
``golden_tokens.json`` was written by this module's ``__main__`` and is
never rewritten to make a test pass. The prompts and engine settings are
test_hf_parity's (chunked prefill mixed with decodes in one batch).

Regenerate (only when a change is meant to alter outputs, and say so):
    PYTHONPATH=. python -m tests.models.test_golden_tokens
"""

from __future__ import annotations

import json
import pathlib

import pytest

from tests.models.test_hf_parity import CASES, ENGINE, PROMPTS

GOLDEN = pathlib.Path(__file__).with_name("golden_tokens.json")
MAX_TOKENS = 24
# The tiny models whose tokens are recorded: every architecture and every
# rope scaling of test_hf_parity.
TINY_CASES = list(CASES)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("hf_embedded")]


def _greedy(model: str, cache_dir: str) -> list[list[int]]:
    from tests.runners import JaxInferRunner
    runner = JaxInferRunner(model, compilation_cache_dir=cache_dir, **ENGINE)
    return [ids for ids, _ in runner.generate_greedy(PROMPTS, MAX_TOKENS)]


def _recorded() -> dict:
    return json.loads(GOLDEN.read_text())


@pytest.fixture(scope="module")
def xla_cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("xla-cache-golden"))


def test_recording_covers_the_cases():
    recorded = _recorded()
    assert recorded["max_tokens"] == MAX_TOKENS
    assert recorded["prompts"] == PROMPTS
    assert set(recorded["tokens"]) == {"embedded", *TINY_CASES}


def test_embedded_greedy_tokens_unchanged(xla_cache):
    tokens = _greedy("smollm2-135m-instruct", xla_cache)
    assert tokens == _recorded()["tokens"]["embedded"]


@pytest.mark.parametrize("case", TINY_CASES)
def test_tiny_greedy_tokens_unchanged(case, tiny_model_factory, xla_cache):
    arch, rope, overrides = CASES[case]
    tokens = _greedy(tiny_model_factory(arch, rope, **overrides), xla_cache)
    assert tokens == _recorded()["tokens"][case]


def _record() -> None:  # pragma: no cover - run by hand, see the docstring
    import tempfile

    from tests.tiny_models import make_tiny_model
    out: dict = {"max_tokens": MAX_TOKENS, "prompts": PROMPTS, "tokens": {}}
    with tempfile.TemporaryDirectory() as tmp:
        cache = f"{tmp}/xla"
        out["tokens"]["embedded"] = _greedy("smollm2-135m-instruct", cache)
        for case in TINY_CASES:
            arch, rope, overrides = CASES[case]
            path = make_tiny_model(f"{tmp}/{case}", arch, rope, **overrides)
            out["tokens"][case] = _greedy(path, cache)
    GOLDEN.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    _record()
