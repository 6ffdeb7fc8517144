"""Which check proves each supported row of docs/compatibility.md.

The walk (``test_row_walk.py``) reads every row of every table from
``jaxinfer.compat.render.table_rows`` -- the code that generates the doc --
and fails when a supported row has no check here, or a check names a row
that is not supported. Ignored and refused rows need no entry: the walk
drives each of them generically (refused: an UnsupportedFeatureError or a
400 naming the feature; ignored: the reason logged and nothing changed).

Adding a check for a row a branch makes supported (``--enable-lora``, say)
takes a few lines in one of the ``checks_*.py`` modules (or a new one,
imported by ``test_row_walk.py``)::

    @row_check("serve_flags", "enable_lora")
    @row_check("engine_args", "enable_lora", "max_loras")
    def lora_adapters_change_the_output(make_llm):
        base = make_llm()
        lora = make_llm(enable_lora=True, max_loras=1)
        ...  # assert what the feature does, so a no-op fails

- Keys are the table's key (``render.TABLES``: ``serve_flags``,
  ``engine_args``, ``engine_args_jaxinfer``, ``sampling_params``,
  ``completion_request``, ``chat_completion_request``, ``stream_options``,
  ``tokenize_completion``, ``tokenize_chat``, ``detokenize``) and the row's
  plain name (a flag's argparse dest, a field's name).
- A check's parameters are pytest fixtures, looked up by name
  (``conftest.py`` in this folder has the shared tiny engine, server and
  CLI server); the parameter ``surface`` is the table's own way in: an
  offline ``LLM`` for ``sampling_params``, ``/v1/completions`` or
  ``/v1/chat/completions`` for the request tables (``surfaces.py``), so one
  check proves a sampling field on all three.
- A check must fail if the feature were a no-op: compare against a run
  without it, or assert the effect itself (a cap reached and never
  exceeded, a refusal naming the limit). One function may cover many rows;
  it runs once per table it is registered for.
- A serve flag that only sets an EngineArgs field may use
  ``reaches_engine_args``: it checks that the flag lands in EngineArgs, and
  the walk then requires a check of that EngineArgs row too.
"""

from __future__ import annotations

from collections.abc import Callable

# (table key, row key) -> the check proving that row.
CHECKS: dict[tuple[str, str], Callable] = {}


def row_check(table: str, *rows: str):
    """Registers the decorated function as the check of ``rows`` of
    ``table``; stack decorators for several tables."""
    def register(fn: Callable) -> Callable:
        for row in rows:
            if (table, row) in CHECKS:
                raise ValueError(f"{table}:{row} already has a check "
                                 f"({CHECKS[(table, row)].__name__})")
            CHECKS[(table, row)] = fn
        return fn
    return register


def checks_by_function() -> list[tuple[str, Callable, list[str]]]:
    """(table, check, its rows), one entry per check and table: the walk
    runs each once."""
    grouped: dict[tuple[str, Callable], list[str]] = {}
    for (table, row), fn in CHECKS.items():
        grouped.setdefault((table, fn), []).append(row)
    return [(table, fn, rows) for (table, fn), rows in grouped.items()]
