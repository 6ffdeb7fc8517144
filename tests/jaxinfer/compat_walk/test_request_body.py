"""No request field is dropped silently: every field of OpenAI's own
completion and chat bodies (read from the ``openai`` client's request
types) and every vLLM extra field is a row of the compatibility tables --
whose walk (test_row_walk.py) proves it honoured or refused -- or, for
OpenAI fields vLLM lacks too, is answered 400 naming it."""

from __future__ import annotations

import pytest
import requests

from jaxinfer.compat.render import table_rows

from .refusals import BODIES

openai_params = pytest.importorskip("openai.types.completion_create_params")
from openai.types.chat import completion_create_params as chat_params  # noqa: E402

OPENAI_FIELDS = {
    "completion_request": set(openai_params.CompletionCreateParamsBase.__annotations__),
    "chat_completion_request": set(chat_params.CompletionCreateParamsBase.__annotations__),
}


@pytest.mark.parametrize("table", sorted(OPENAI_FIELDS))
def test_the_openai_client_types_are_read(table):
    rows = {r.key for r in table_rows(table)}
    assert OPENAI_FIELDS[table] & rows  # the client's types were read


@pytest.mark.slow
@pytest.mark.parametrize("table", sorted(OPENAI_FIELDS))
def test_openai_fields_vllm_lacks_are_refused_by_name(server_url, table):
    path, base = BODIES[table]
    rows = {r.key for r in table_rows(table)}
    for name in sorted(OPENAI_FIELDS[table] - rows):
        r = requests.post(server_url + path, json={**base, name: "x"}, timeout=60)
        assert r.status_code == 400 and name in r.json()["error"]["message"], \
            (name, r.text)
