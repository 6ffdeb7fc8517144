"""Builds ``docs/compatibility.md`` from the code: the recorded vLLM names,
jaxinfer's own flags and fields (supported), and the ignore / refuse
tables. ``python -m jaxinfer.compat.render > docs/compatibility.md``;
tests/jaxinfer/test_compatibility_doc.py fails when the file drifts."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from pydantic import BaseModel

from .request_fields import SAMPLING_FIELDS, request_field_status
from .request_limits import render_limits
from .status import Ignored, Refused, Status
from .surface import VLLM_VERSION, flag_status, serve_flag_status, vllm_surface

SUPPORTED = "supported"


@dataclasses.dataclass(frozen=True)
class Row:
    name: str  # as a vLLM user writes it
    status: str  # "supported" | "ignored" | "refused"
    note: str  # help, reason, or the missing feature and what to do instead
    key: str = ""  # the plain name: a flag's dest, a field's name


class UnclassifiedError(RuntimeError):
    """A vLLM name with neither support in the code nor a table entry."""


def _row(name: str, entry: Status | None, supported_note: str | None,
         key: str) -> Row:
    if isinstance(entry, Ignored):
        return Row(name, "ignored", entry.reason, key)
    if isinstance(entry, Refused):
        offs = [a for a in entry.accepts if a not in (None, False, {}, [], "")]
        note = entry.feature + (f"; {entry.hint}" if entry.hint else "")
        if offs:
            note += "; accepted as " + " / ".join(f"`{a}`" for a in offs)
        return Row(name, "refused", note, key)
    if supported_note is None:
        raise UnclassifiedError(f"{name} is neither supported nor listed in "
                                "jaxinfer/compat/")
    return Row(name, SUPPORTED, supported_note, key)


def _serve_parser() -> argparse.ArgumentParser:
    from ..entrypoints.cli import build_parser
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices["serve"]
    raise RuntimeError("the jaxinfer parser has no subcommands")


def serve_flag_rows() -> list[Row]:
    actions = {a.dest: a for a in _serve_parser()._actions}
    rows = []
    for flag in vllm_surface()["serve_flags"]:
        status = serve_flag_status(flag["dest"])
        action = actions.get(flag["dest"])
        note = None
        if status is None and action is not None:
            note = " ".join((action.help or "").split()) or "as vLLM"
        rows.append(_row(" ".join(f"`{f}`" for f in flag["flags"]), status,
                         note, flag["dest"]))
    return rows


def engine_arg_rows() -> list[Row]:
    from ..config import EngineArgs
    ours = {f.name for f in dataclasses.fields(EngineArgs)}
    rows = []
    for name in vllm_surface()["engine_args"]:
        if name.startswith("_"):
            continue  # vLLM-internal
        rows.append(_row(f"`{name}`", None if name in ours else flag_status(name),
                         "as vLLM" if name in ours else None, name))
    return rows


def extension_rows() -> list[Row]:
    from ..config import EngineArgs
    theirs = set(vllm_surface()["engine_args"])
    return [Row(f"`{f.name}`", "jaxinfer only",
                " ".join(f.metadata["help"].split()), f.name)
            for f in dataclasses.fields(EngineArgs) if f.name not in theirs]


def sampling_rows() -> list[Row]:
    from ..sampling_params import SAMPLING_ALIASES, SamplingParams
    ours = {f.name for f in dataclasses.fields(SamplingParams)}

    def note(n: str) -> str | None:
        if n in SAMPLING_ALIASES:
            return f"as vLLM (taken as {SAMPLING_ALIASES[n]})"
        return "as vLLM" if n in ours else None
    return [_row(f"`{n}`", SAMPLING_FIELDS.get(n), note(n), n)
            for n in vllm_surface()["sampling_params"]]


def request_rows(kind: str) -> list[Row]:
    """kind: a key of the recorded surface (completion_request, ...)."""
    from ..entrypoints.openai import protocol as p
    models: dict[str, type[BaseModel]] = {
        "completion_request": p.CompletionRequest,
        "chat_completion_request": p.ChatCompletionRequest,
        "stream_options": p.StreamOptions,
        "tokenize_completion": p.TokenizeCompletionRequest,
        "tokenize_chat": p.TokenizeChatRequest,
        "detokenize": p.DetokenizeRequest}
    model = models[kind]
    prefix = "stream_options." if kind == "stream_options" else ""
    rows = []
    for name in vllm_surface()[kind]:
        entry = request_field_status(kind, name)
        rows.append(_row(f"`{prefix}{name}`", entry,
                         "as vLLM" if name in model.model_fields else None, name))
    return rows


def _table(rows: list[Row]) -> list[str]:
    lines = ["| name | status | notes |", "|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.name} | {r.status} | {r.note.replace('|', '/')} |")
    return lines + [""]


# Each table: its key (the surface's name in vllm_*.json, for request
# bodies), its title in the doc, and how its rows are built.
TABLES = {
    "serve_flags": ("`vllm serve` flags (`jaxinfer serve`)", serve_flag_rows),
    "engine_args": ("`EngineArgs` fields (`LLM(...)` keyword arguments)",
                    engine_arg_rows),
    "engine_args_jaxinfer": ("jaxinfer's own `EngineArgs` fields",
                             extension_rows),
    "sampling_params": ("`SamplingParams` fields", sampling_rows),
    "completion_request": ("`/v1/completions` body", None),
    "chat_completion_request": ("`/v1/chat/completions` body", None),
    "stream_options": ("`stream_options`", None),
    "tokenize_completion": ("`/tokenize` body (prompt)", None),
    "tokenize_chat": ("`/tokenize` body (messages)", None),
    "detokenize": ("`/detokenize` body", None),
}


def table_rows(key: str) -> list[Row]:
    """The rows of one table (a key of TABLES); tests walk these."""
    build = TABLES[key][1]
    return build() if build is not None else request_rows(key)


def sections() -> list[tuple[str, list[Row]]]:
    return [(title, table_rows(key)) for key, (title, _) in TABLES.items()]


def render() -> str:
    out = [
        "# Compatibility with vLLM",
        "",
        f"Generated by `python -m jaxinfer.compat.render` from the code, "
        f"against vLLM {VLLM_VERSION}'s",
        "surface (recorded in `jaxinfer/compat/vllm_*.json`); "
        "`tests/jaxinfer/test_compatibility_doc.py` fails",
        "when this file and the code disagree. Do not edit by hand.",
        "`tests/jaxinfer/compat_walk/` walks every row: each supported row "
        "has a behaviour check,",
        "each refused row must raise or answer 400 naming its feature, each "
        "ignored row must log",
        "its reason and change nothing.",
        "",
        "- **supported**: works as in vLLM (the note is jaxinfer's own help "
        "where it says more).",
        "- **ignored**: accepted with no effect, logged with the reason; "
        "only where ignoring changes nothing.",
        "- **refused**: an `UnsupportedFeatureError` (CLI: exit 2; server: "
        "400) naming the missing feature, unless the value given is vLLM's "
        "'off' value (or one listed as accepted).",
        "",
    ]
    for title, rows in sections():
        counts = {s: sum(r.status == s for r in rows)
                  for s in (SUPPORTED, "jaxinfer only", "ignored", "refused")}
        out += [f"## {title}", "",
                ", ".join(f"{v} {k}" for k, v in counts.items() if v) + ".", ""]
        out += _table(rows)
    out += render_limits()
    return "\n".join(out)


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
