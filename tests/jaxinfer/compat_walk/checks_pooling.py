"""Checks of the pooling rows: vLLM's runner / task / convert names make
the engine a pooling one (embeddings served, generation refused), and the
serve flags land in EngineArgs."""

from __future__ import annotations

import pytest

from jaxinfer.errors import InvalidRequestError

from .registry import row_check

POOLING_VALUES = {"runner": "pooling", "task": "embed", "convert": "embed"}


@row_check("engine_args", "runner", "task", "convert")
def pooling_names_select_the_pooling_runner(rows, make_llm):
    generating = make_llm()
    with pytest.raises(InvalidRequestError, match="runner='pooling'"):
        generating.embed([5, 6, 7], use_tqdm=False)
    for row in rows:
        llm = make_llm(**{row: POOLING_VALUES[row]})
        out = llm.embed({"prompt_token_ids": [5, 6, 7]}, use_tqdm=False)[0]
        assert len(out.outputs.embedding) == llm.llm_engine.model_config.hidden_size
        with pytest.raises(InvalidRequestError, match="cannot generate"):
            llm.generate([5, 6, 7], use_tqdm=False)


@row_check("serve_flags", "runner", "task", "convert")
def pooling_flags_reach_engine_args(rows):
    from jaxinfer.entrypoints.cli import build_parser
    from jaxinfer.entrypoints.openai.cli_args import serve_engine_args
    for row in rows:
        flag = "--" + row.replace("_", "-")
        args = serve_engine_args(build_parser().parse_args(
            ["serve", "m", flag, POOLING_VALUES[row]]))
        assert getattr(args, row) == POOLING_VALUES[row]
        assert args.runner_kind() == "pooling"
