"""docs/compatibility.md is generated from the code and walked row by row:
every vLLM flag, EngineArgs field and SamplingParams field is supported,
refused naming its feature, or ignored with a logged reason."""

from __future__ import annotations

import dataclasses
import logging
import pathlib

import pytest

from jaxinfer.compat.render import render
from jaxinfer.compat.request_fields import SAMPLING_FIELDS
from jaxinfer.compat.status import Ignored, Refused
from jaxinfer.compat.surface import (
    flag_status,
    serve_flag_status,
    split_engine_kwargs,
    vllm_surface,
)
from jaxinfer.config import EngineArgs
from jaxinfer.entrypoints.cli import build_parser
from jaxinfer.entrypoints.openai.cli_args import serve_engine_args
from jaxinfer.errors import UnsupportedFeatureError
from jaxinfer.sampling_params import SAMPLING_ALIASES, SamplingParams

DOC = pathlib.Path(__file__).parents[2] / "docs" / "compatibility.md"
OURS = {f.name for f in dataclasses.fields(EngineArgs)}


def test_doc_is_generated_from_the_code():
    assert DOC.read_text() == render(), (
        "docs/compatibility.md is stale: python -m jaxinfer.compat.render "
        "> docs/compatibility.md")


def refused_value(entry: Refused, strings_only: bool = False):
    """A value the entry does not accept (so it must be refused)."""
    candidates = ["bogus-value", "7"] + ([] if strings_only else
                                         [True, {"a": 1}, 7])
    return next(v for v in candidates if not entry.allows(v))


FLAGS = vllm_surface()["serve_flags"]


@pytest.mark.parametrize("flag", [f for f in FLAGS
                                  if serve_flag_status(f["dest"])],
                         ids=lambda f: f["flags"][0])
def test_each_unimplemented_vllm_flag_is_refused_or_ignored(flag, caplog):
    entry = serve_flag_status(flag["dest"])
    argv = ["serve", "m", flag["flags"][0]]
    if flag["takes_value"]:
        argv.append(refused_value(entry, True) if isinstance(entry, Refused)
                    else "7")
    ns = build_parser().parse_args(argv)
    if isinstance(entry, Refused):
        with pytest.raises(UnsupportedFeatureError) as e:
            serve_engine_args(ns)
        assert entry.feature.split(" (")[0].lower() in str(e.value).lower()
    else:
        with caplog.at_level(logging.WARNING, logger="jaxinfer.compat"):
            serve_engine_args(ns)
        assert entry.reason in caplog.text


@pytest.mark.parametrize("flag", [f for f in FLAGS
                                  if not serve_flag_status(f["dest"])],
                         ids=lambda f: f["flags"][0])
def test_each_supported_vllm_flag_reaches_its_setting(flag):
    """The flag lands in EngineArgs (engine flags) or in the serve settings,
    with the value given rather than the default."""
    parser = build_parser()
    action = next(a for a in parser._subparsers._group_actions[0]
                  .choices["serve"]._actions if a.dest == flag["dest"])
    default = parser.parse_args(["serve", "m"])
    if not flag["takes_value"]:
        value_argv = ([f"--no-{flag['flags'][0][2:]}"]
                      if getattr(default, action.dest) else [flag["flags"][0]])
    else:
        pick = (action.choices and [c for c in action.choices
                                    if c != action.default][0])
        raw = str(pick) if pick else {"int": "3", "float": "0.5"}.get(
            getattr(action.type, "__name__", ""), "xyz")
        value_argv = [flag["flags"][0], raw]
    ns = parser.parse_args(["serve", "m", *value_argv])
    assert getattr(ns, action.dest) != getattr(default, action.dest)
    if action.dest in OURS:
        try:
            args = serve_engine_args(ns)
        except ValueError:
            return  # a value the engine checks and refuses: still reached it
        assert getattr(args, action.dest) == getattr(ns, action.dest)


@pytest.mark.parametrize("name", [n for n in vllm_surface()["engine_args"]
                                  if not n.startswith("_") and n not in OURS])
def test_each_unimplemented_engine_arg_is_refused_or_ignored(name, caplog):
    entry = flag_status(name)
    if isinstance(entry, Refused):
        with pytest.raises(UnsupportedFeatureError, match=name):
            split_engine_kwargs({name: refused_value(entry)}, OURS)
    else:
        assert isinstance(entry, Ignored), name
        with caplog.at_level(logging.WARNING, logger="jaxinfer.compat"):
            assert split_engine_kwargs({name: True}, OURS) == {}
        assert entry.reason in caplog.text


@pytest.mark.parametrize("name", vllm_surface()["sampling_params"])
def test_each_sampling_field(name, caplog):
    entry = SAMPLING_FIELDS.get(name)
    if entry is None:  # supported: a field of ours
        assert name in {f.name for f in dataclasses.fields(SamplingParams)} \
            | set(SAMPLING_ALIASES)
    elif isinstance(entry, Refused):
        with pytest.raises(UnsupportedFeatureError, match=name):
            SamplingParams(**{name: refused_value(entry)})
    else:
        with caplog.at_level(logging.WARNING, logger="jaxinfer.compat"):
            SamplingParams(**{name: 3})
        assert entry.reason in caplog.text
