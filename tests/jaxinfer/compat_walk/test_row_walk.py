"""Walks every row of every table of docs/compatibility.md, read from the
code that generates it (``jaxinfer.compat.render.table_rows``):

- a supported row runs the behaviour check registered for it
  (``registry.py`` says how to add one); a supported row without a check
  fails the walk, so flipping a row to supported needs its check;
- a refused row raises UnsupportedFeatureError / answers 400 naming the
  missing feature (``refusals.py``);
- an ignored row logs its reason and changes nothing (``refusals.py``).
"""

from __future__ import annotations

import inspect

import pytest

from jaxinfer.compat.render import SUPPORTED, TABLES, table_rows

from . import (  # noqa: F401 (they register)
    checks_engine,
    checks_lora,
    checks_multimodal,
    checks_parallel,
    checks_pooling,
    checks_quantization,
    checks_sampling,
    checks_serve,
    checks_server,
    checks_structured,
    checks_tools,
)
from .checks_lora import walk_adapters  # noqa: F401 (a fixture of its checks)
from .checks_multimodal import image_llm  # noqa: F401 (a fixture of its checks)
from .checks_serve import cli_server  # noqa: F401 (a fixture of its checks)
from .conftest import SURFACE_FIXTURES
from .refusals import DRIVERS
from .registry import CHECKS, checks_by_function

# One xdist worker runs the walk: its engines and servers are built once.
pytestmark = pytest.mark.xdist_group("compat_walk")

SUPPORTED_STATUSES = (SUPPORTED, "jaxinfer only")


def supported_rows() -> set[tuple[str, str]]:
    return {(table, row.key) for table in TABLES for row in table_rows(table)
            if row.status in SUPPORTED_STATUSES}


def test_every_supported_row_has_a_check():
    missing = sorted(supported_rows() - set(CHECKS))
    assert not missing, (
        "supported rows without a behaviour check (register one with "
        f"@row_check, see tests/jaxinfer/compat_walk/registry.py): {missing}")


def test_every_check_is_of_a_supported_row():
    stale = sorted(set(CHECKS) - supported_rows())
    assert not stale, f"checks of rows that are not supported: {stale}"


def test_serve_flags_of_engine_fields_have_the_fields_check_too():
    for (_table, row), fn in CHECKS.items():
        if fn is checks_serve.reaches_engine_args:
            assert (("engine_args", row) in CHECKS
                    or ("engine_args_jaxinfer", row) in CHECKS), row


def _run(request, table, check, rows):
    kwargs = {}
    for name in inspect.signature(check).parameters:
        if name == "surface":
            kwargs[name] = request.getfixturevalue(SURFACE_FIXTURES[table])
        elif name == "rows":
            kwargs[name] = rows
        else:
            kwargs[name] = request.getfixturevalue(name)
    check(**kwargs)


@pytest.mark.slow
@pytest.mark.parametrize(
    "table, check, rows", checks_by_function(),
    ids=[f"{t}:{fn.__name__}" for t, fn, _ in checks_by_function()])
def test_supported_row_behaves(request, table, check, rows):
    _run(request, table, check, rows)


def _entry(table, key):
    from jaxinfer.compat.request_fields import SAMPLING_FIELDS, request_field_status
    from jaxinfer.compat.surface import flag_status, serve_flag_status
    if table == "serve_flags":
        return serve_flag_status(key)
    if table == "engine_args":
        return flag_status(key)
    if table == "sampling_params":
        return SAMPLING_FIELDS[key]
    return request_field_status(table, key)


UNSUPPORTED = [(table, row.key, row.status) for table in TABLES
               for row in table_rows(table)
               if row.status not in SUPPORTED_STATUSES]
ON_THE_SERVER = {"completion_request", "chat_completion_request", "tokenize_chat"}


def test_every_unsupported_row_has_a_driver():
    assert {t for t, _, _ in UNSUPPORTED} <= set(DRIVERS)


@pytest.mark.parametrize(
    "table, key, status",
    [pytest.param(*u, marks=[pytest.mark.slow] if u[0] in ON_THE_SERVER else [])
     for u in UNSUPPORTED], ids=[f"{t}:{k}:{s}" for t, k, s in UNSUPPORTED])
def test_unsupported_row_is_refused_or_ignored(request, caplog, table, key, status):
    entry = _entry(table, key)
    assert type(entry).__name__.lower() == status  # Refused / Ignored
    DRIVERS[table](key, entry, caplog, request)
