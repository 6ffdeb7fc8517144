"""vLLM's public surface (the release in ``vllm_<version>.json``) and what
jaxinfer does with each name: supported (read from the code), ignored or
refused (the tables in ``engine_flags.py`` and ``request_fields.py``).

The CLI and ``LLM(...)`` call in here so that a vLLM flag or argument that
jaxinfer lacks is never an argparse error or a silent no-op: it is accepted
with a logged reason, or refused with ``UnsupportedFeatureError``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
from typing import Any

from .engine_flags import ENGINE_FLAGS, SERVE_FLAGS, SERVE_IMPLEMENTS
from .status import Ignored, Refused

VLLM_VERSION = "0.11.0"
_DATA = os.path.join(os.path.dirname(__file__),
                     f"vllm_{VLLM_VERSION.replace('.', '_')}.json")


@functools.cache
def vllm_surface() -> dict:
    """The recorded names: serve_flags, engine_args, sampling_params, and
    the request models' fields."""
    with open(_DATA) as f:
        return json.load(f)


def flag_status(dest: str) -> Ignored | Refused | None:
    """The entry for a vLLM flag / EngineArgs field jaxinfer does not
    implement; None for one it does."""
    return ENGINE_FLAGS.get(dest) or SERVE_FLAGS.get(dest)


def serve_flag_status(dest: str) -> Ignored | Refused | None:
    """As ``flag_status``, for a flag of `jaxinfer serve`: the few engine
    arguments that only the server implements are supported there."""
    return None if dest in SERVE_IMPLEMENTS else flag_status(dest)


def add_vllm_flags(parser: argparse.ArgumentParser) -> None:
    """Adds every `vllm serve` flag the parser lacks, in a group of its own,
    so that a vLLM launch command parses; ``check_vllm_flags`` then refuses
    or ignores what was given."""
    group = parser.add_argument_group(
        f"vLLM {VLLM_VERSION} flags jaxinfer does not implement",
        "refused with an error naming the missing feature, unless given "
        "their 'off' value; the few marked 'ignored' are accepted because "
        "they change nothing here")
    taken = parser._option_string_actions
    for flag in vllm_surface()["serve_flags"]:
        names = [n for n in flag["flags"] if n not in taken]
        if not names or flag["flags"][0] in taken:
            continue  # jaxinfer implements it
        status = flag_status(flag["dest"])
        if status is None:
            raise RuntimeError(f"vLLM flag {flag['flags'][0]} has no "
                               "compatibility entry (jaxinfer/compat/)")
        help_ = (f"ignored: {status.reason}" if isinstance(status, Ignored)
                 else f"not supported ({status.feature})")
        if flag["takes_value"]:
            group.add_argument(*names, dest=flag["dest"], default=None,
                               metavar="VALUE", help=help_)
        elif any(n.startswith("--no-") for n in names):
            group.add_argument(*[n for n in names if not n.startswith("--no-")],
                               dest=flag["dest"], default=None,
                               action=argparse.BooleanOptionalAction, help=help_)
        else:
            group.add_argument(*names, dest=flag["dest"], default=None,
                               action="store_const", const=True, help=help_)


def check_vllm_flags(ns: argparse.Namespace) -> None:
    """Raises UnsupportedFeatureError for the first refused flag given;
    logs each ignored one."""
    for flag in vllm_surface()["serve_flags"]:
        status = serve_flag_status(flag["dest"])
        value = getattr(ns, flag["dest"], None)
        if status is not None and value is not None:
            status.check(flag["flags"][0], value)


def split_engine_kwargs(kwargs: dict[str, Any], known: set[str]) -> dict[str, Any]:
    """``LLM(**kwargs)``: keeps jaxinfer's own arguments; a vLLM argument
    jaxinfer lacks is refused (UnsupportedFeatureError) or ignored (logged);
    any other name is a TypeError naming it."""
    vllm_names = set(vllm_surface()["engine_args"])
    unknown, listed = [], []
    for name, value in kwargs.items():
        if name in known:
            continue
        status = flag_status(name) if name in vllm_names else None
        if status is None:
            unknown.append(name)
        else:
            listed.append((name, value, status))
    if unknown:
        raise TypeError(f"unknown engine arguments: {', '.join(sorted(unknown))}")
    for name, value, status in listed:
        status.check(name, value)
    return {k: v for k, v in kwargs.items() if k in known}


def engine_arg_names() -> set[str]:
    from ..config import EngineArgs
    return {f.name for f in dataclasses.fields(EngineArgs)}
