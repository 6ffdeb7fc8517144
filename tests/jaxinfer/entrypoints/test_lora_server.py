"""A server with LoRA, through the official `openai` client:
two adapters from --lora-modules and one loaded at run time are listed in
/v1/models and served, each by its name in `model`, concurrently with the
base model and token for token as HF transformers + PEFT; a bad adapter
is refused (400 / 404) and the server keeps serving; an unloaded adapter
answers 404 afterwards. Without VLLM_ALLOW_RUNTIME_LORA_UPDATING the
load/unload routes do not exist (as in vLLM)."""

from __future__ import annotations

import concurrent.futures

import openai
import pytest

from tests.lora_adapters import hf_peft_runner, make_adapters, make_peft_adapter

from .conftest import ServerThread, openai_client, pages_all_free

pytestmark = pytest.mark.slow

PROMPTS = [[101, 102, 103, 104, 105, 106], [7, 8, 9] * 7]
MAX_TOKENS = 10
ENGINE = dict(dtype="float32", max_model_len=128, num_gpu_blocks_override=128,
              max_num_seqs=8, max_num_batched_tokens=32, enable_lora=True,
              max_loras=2, max_lora_rank=8)


@pytest.fixture(scope="module")
def adapters(tiny_model_factory, tmp_path_factory):
    return make_adapters(tiny_model_factory(),
                         str(tmp_path_factory.mktemp("server-adapters")))


@pytest.fixture(scope="module")
def lora_server(tiny_model_factory, adapters):
    from jaxinfer.config import EngineArgs
    from jaxinfer.engine.async_engine import AsyncLLMEngine
    from jaxinfer.entrypoints.openai.api_server import build_app
    from jaxinfer.entrypoints.openai.serving_models import LoRAModulePath
    engine = AsyncLLMEngine.from_engine_args(
        EngineArgs(model=tiny_model_factory(), **ENGINE))
    names = list(adapters)
    with pytest.MonkeyPatch.context() as mp:  # read when the app is built
        mp.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
        app = build_app(engine, ["tiny"], lora_modules=[
            LoRAModulePath(names[0], adapters[names[0]]),
            LoRAModulePath(names[1], adapters[names[1]], "tiny")])
    server = ServerThread(app)
    yield server, engine
    server.stop()


@pytest.fixture(scope="module")
def client(lora_server):
    return openai_client(lora_server[0])


def _load(client, name, path):
    return client.post("/load_lora_adapter", cast_to=str,
                       body={"lora_name": name, "lora_path": path})


def _complete(client, model, prompt):
    resp = client.completions.create(model=model, prompt=prompt,
                                     max_tokens=MAX_TOKENS, temperature=0,
                                     extra_body={"return_token_ids": True})
    assert resp.model == model
    return resp.choices[0].token_ids


def test_static_runtime_and_base_models_served_concurrently(
        client, lora_server, adapters, tiny_model_factory):
    names = list(adapters)
    cards = {m.id: m for m in client.models.list().data}
    assert set(cards) == {"tiny", names[0], names[1]}
    assert cards[names[0]].root == adapters[names[0]]
    assert cards[names[1]].parent == "tiny"
    assert _load(client, names[2], adapters[names[2]]) == (
        f"Success: LoRA adapter '{names[2]}' added successfully.")
    assert names[2] in {m.id for m in client.models.list().data}

    models = ["tiny", *names]
    jobs = [(m, p) for p in PROMPTS for m in models]
    # The openai client's response models are built by pydantic on first
    # use, which is not thread-safe: one answer parsed first builds them.
    _complete(client, "tiny", PROMPTS[0])
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        got = list(pool.map(lambda job: _complete(client, *job), jobs))
    base = tiny_model_factory()
    for model in models:
        want = hf_peft_runner(base, None if model == "tiny" else adapters[model])
        want = [ids for ids, _ in want.generate_greedy(PROMPTS, MAX_TOKENS)]
        assert [g for (m, _), g in zip(jobs, got) if m == model] == want, model
    # The same through a stream.
    chunks = client.completions.create(model=names[2], prompt=PROMPTS[0],
                                       max_tokens=MAX_TOKENS, temperature=0,
                                       stream=True)
    text = "".join(c.choices[0].text for c in chunks)
    full = client.completions.create(model=names[2], prompt=PROMPTS[0],
                                     max_tokens=MAX_TOKENS, temperature=0)
    assert text == full.choices[0].text
    assert pages_all_free(lora_server[1])


def test_bad_loads_are_refused_and_serving_goes_on(client, adapters,
                                                   tiny_model_factory,
                                                   tmp_path):
    names = list(adapters)
    before = _complete(client, names[0], PROMPTS[0])
    with pytest.raises(openai.BadRequestError, match="already been loaded"):
        _load(client, names[0], adapters[names[0]])
    with pytest.raises(openai.NotFoundError, match="No adapter found"):
        _load(client, "ghost", str(tmp_path / "nowhere"))
    big = make_peft_adapter(tiny_model_factory(), str(tmp_path / "r16"),
                            seed=9, r=16, target_modules=["q_proj"])
    with pytest.raises(openai.BadRequestError, match="max_lora_rank"):
        _load(client, "big", big)
    with pytest.raises(openai.BadRequestError, match="lora_path"):
        client.post("/load_lora_adapter", cast_to=str,
                    body={"lora_name": "x"})
    listed = {m.id for m in client.models.list().data}
    assert "ghost" not in listed and "big" not in listed
    assert _complete(client, names[0], PROMPTS[0]) == before


def test_unloaded_adapter_is_a_404(client, adapters):
    name = list(adapters)[1]
    resp = client.post("/unload_lora_adapter", cast_to=str,
                       body={"lora_name": name})
    assert resp == f"Success: LoRA adapter '{name}' removed successfully."
    assert name not in {m.id for m in client.models.list().data}
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model=name, prompt="hi", max_tokens=2)
    assert f"`{name}` does not exist" in str(e.value)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "hi"}],
            max_tokens=2)
    with pytest.raises(openai.NotFoundError, match="cannot be found"):
        client.post("/unload_lora_adapter", cast_to=str,
                    body={"lora_name": name})
    # The others still serve.
    assert _complete(client, list(adapters)[0], PROMPTS[0])


def test_runtime_routes_need_the_variable(lora_server, monkeypatch):
    from jaxinfer.entrypoints.openai.api_server import build_app

    def paths():
        app = build_app(lora_server[1], ["tiny"], owns_engine=False)
        return {r.path for r in app.routes}
    for var in ("VLLM_ALLOW_RUNTIME_LORA_UPDATING",
                "JAXINFER_ALLOW_RUNTIME_LORA_UPDATING"):
        monkeypatch.delenv(var, raising=False)
    assert "/v1/models" in paths() and "/v1/load_lora_adapter" not in paths()
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "0")
    assert "/v1/load_lora_adapter" not in paths()
    monkeypatch.setenv("JAXINFER_ALLOW_RUNTIME_LORA_UPDATING", "1")
    assert {"/v1/load_lora_adapter", "/v1/unload_lora_adapter"} <= paths()
