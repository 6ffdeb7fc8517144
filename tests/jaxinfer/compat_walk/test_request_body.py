"""No request field is dropped silently: every field of OpenAI's own
completion and chat bodies (read from the ``openai`` client's request
types) and every vLLM extra field is a row of the compatibility tables --
whose walk (test_row_walk.py) proves it honoured or refused -- or, for
OpenAI fields vLLM lacks too, is answered 400 naming it. Fields jaxinfer's
bodies take beyond vLLM's have a behaviour check here."""

from __future__ import annotations

import pytest
import requests

from jaxinfer.compat.render import table_rows

from . import checks_sampling
from .refusals import BODIES

openai_params = pytest.importorskip("openai.types.completion_create_params")
from openai.types.chat import completion_create_params as chat_params  # noqa: E402 - after the importorskip

# One xdist worker runs the walk: its engines and servers are built once.
pytestmark = pytest.mark.xdist_group("compat_walk")
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


# Fields our request models take that vLLM's body lacks -> their check.
EXTRAS = {("completion_request", "bad_words"):
          checks_sampling.bad_words_are_never_generated}
SURFACES = {"completion_request": "completion_surface",
            "chat_completion_request": "chat_surface"}


def test_our_extra_fields_are_listed():
    from jaxinfer.compat.surface import vllm_surface
    from jaxinfer.entrypoints.openai import protocol as p
    models = {"completion_request": p.CompletionRequest,
              "chat_completion_request": p.ChatCompletionRequest,
              "tokenize_completion": p.TokenizeCompletionRequest,
              "tokenize_chat": p.TokenizeChatRequest,
              "detokenize": p.DetokenizeRequest, "stream_options": p.StreamOptions}
    extras = {(k, f) for k, m in models.items()
              for f in set(m.model_fields) - set(vllm_surface()[k])}
    assert extras == set(EXTRAS)


@pytest.mark.slow
@pytest.mark.parametrize("table, field", sorted(EXTRAS))
def test_our_extra_fields_behave(request, table, field):
    EXTRAS[(table, field)](request.getfixturevalue(SURFACES[table]))
