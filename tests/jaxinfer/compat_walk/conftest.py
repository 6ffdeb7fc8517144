"""The walk's shared engines, one of each kind for the session (both test
modules of this folder, which run on one xdist worker): the offline LLM,
the in-process OpenAI server, and the row surfaces over them.
All are the same tiny random-weight Llama and share one XLA compilation
cache, so each step shape compiles once."""

from __future__ import annotations

import pytest

from .surfaces import MODEL, ChatSurface, CompletionSurface, OfflineSurface

# Small everything; the server's engine is the same but schedules by
# priority (so that requests may set one).
BASE = dict(dtype="float32", max_model_len=128, num_gpu_blocks_override=64,
            max_num_seqs=4, max_num_batched_tokens=64, block_size=16)


# The server's chat template: ChatML, as the tiny tokenizer's own, plus a
# variable that chat_template_kwargs can set, and the tools' names.
CHAT_TEMPLATE = (
    "{% if greeting is defined %}{{ greeting }}\n{% endif %}"
    "{% for t in tools or [] %}{{ t['function']['name'] }}\n{% endfor %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="session")
def walk_model(tiny_model_factory, tmp_path_factory):
    """The tiny Llama, its tokenizer made to add a BOS (<|endoftext|>, id
    0) as many models' do, so that add_special_tokens shows."""
    import shutil

    from tokenizers import Tokenizer, processors
    path = tmp_path_factory.mktemp("walk-model") / "m"
    shutil.copytree(tiny_model_factory(), path)
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    tok.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", pair="<|endoftext|> $A $B",
        special_tokens=[("<|endoftext|>", 0)])
    tok.save(str(path / "tokenizer.json"))
    return str(path)


@pytest.fixture(scope="session")
def walk_cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("walk-xla"))


@pytest.fixture(scope="session")
def make_llm(walk_model, walk_cache_dir):
    """LLM(**BASE | overrides) on the tiny model."""
    from jaxinfer import LLM

    def make(**overrides):
        return LLM(**{"model": walk_model, **BASE,
                      "compilation_cache_dir": walk_cache_dir, **overrides})
    return make


@pytest.fixture(scope="session")
def llm(make_llm):
    return make_llm()


@pytest.fixture(scope="session")
def walk_server(walk_model, walk_cache_dir):
    """(ServerThread, AsyncLLMEngine) serving the tiny model as MODEL."""
    from tests.jaxinfer.entrypoints.conftest import start_server
    server, engine = start_server(walk_model, served_model_names=[MODEL],
                                  compilation_cache_dir=walk_cache_dir,
                                  chat_template=CHAT_TEMPLATE,
                                  scheduling_policy="priority", **BASE)
    yield server, engine
    server.stop()


@pytest.fixture(scope="session")
def server_url(walk_server):
    return walk_server[0].base_url


def _with_engine(surface, engine):
    surface.engine, surface.tokenizer = engine, engine.tokenizer
    return surface


@pytest.fixture(scope="session")
def offline_surface(llm):
    return _with_engine(OfflineSurface(llm), llm.llm_engine)


@pytest.fixture(scope="session")
def completion_surface(walk_server):
    return _with_engine(CompletionSurface(walk_server[0].base_url),
                        walk_server[1].engine)


@pytest.fixture(scope="session")
def chat_surface(walk_server):
    return _with_engine(ChatSurface(walk_server[0].base_url),
                        walk_server[1].engine)


# The surface a check's ``surface`` parameter gets, by table.
SURFACE_FIXTURES = {"sampling_params": "offline_surface",
                    "completion_request": "completion_surface",
                    "chat_completion_request": "chat_surface"}
