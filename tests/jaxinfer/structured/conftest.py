"""The embedded model, shared by the structured-output engine tests."""

from __future__ import annotations

import pytest

EMBEDDED = "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def xla_cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("xla-cache"))


@pytest.fixture(scope="module")
def embedded_llm(xla_cache):
    from jaxinfer import LLM
    return LLM(EMBEDDED, max_model_len=512, max_num_seqs=16,
               max_num_batched_tokens=256, compilation_cache_dir=xla_cache)


def ask(llm, prompts, params):
    """Chat completions of ``prompts`` (one user turn each): (text,
    finish_reason) per prompt, in order."""
    outs = llm.chat([[{"role": "user", "content": p}] for p in prompts],
                    params, use_tqdm=False)
    return [(o.outputs[0].text, o.outputs[0].finish_reason) for o in outs]
