"""Bad adapters (rank above max_lora_rank, unknown target
module, mismatched shapes, missing files, PEFT features jaxinfer does not
run) give typed errors that say what to change, and the engine keeps
serving: a good request right after gives the same tokens as before."""

from __future__ import annotations

import os

import pytest

from jaxinfer import LoRARequest, SamplingParams
from jaxinfer.errors import InvalidRequestError
from jaxinfer.lora.errors import (
    LoRAAdapterNotFoundError,
    LoRAError,
    LoRANotEnabledError,
    LoRARankError,
    LoRAShapeMismatchError,
    UnknownLoRAModuleError,
    UnsupportedLoRAAdapterError,
)
from tests.lora_adapters import edit_adapter, make_peft_adapter

A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
GOOD = "all-r8"


def _renamed(old: str, new: str):
    def edit(d):
        d[new] = d.pop(old)
        return d
    return edit


def _changed(key: str, fn):
    def edit(d):
        d[key] = fn(d[key])
        return d
    return edit


def _broken(adapters, base_path, root: str) -> dict:
    """{case: (folder, error type, words the message must hold)}."""
    good = adapters[GOOD]
    p = lambda name: os.path.join(root, name)
    cases = {
        "rank-above-max": (make_peft_adapter(
            base_path, p("r16"), seed=5, r=16, target_modules=["q_proj"]),
            LoRARankError, ["rank 16", "max_lora_rank=8", "--max-lora-rank"]),
        "unknown-module": (edit_adapter(good, p("qkv"), tensors=_renamed(
            A, A.replace("q_proj", "qkv_proj"))), UnknownLoRAModuleError,
            ["qkv_proj", "does not have"]),
        "layer-past-the-model": (edit_adapter(good, p("layer9"), tensors=_renamed(
            A, A.replace("layers.0", "layers.9"))), UnknownLoRAModuleError,
            ["layers.9", "layers 0-1"]),
        "unknown-target-in-config": (edit_adapter(good, p("cfgtarget"), config={
            "target_modules": ["q_proj", "wq"]}), UnknownLoRAModuleError,
            ["'wq'"]),
        "a-of-wrong-width": (edit_adapter(good, p("narrow"), tensors=_changed(
            A, lambda t: t[:, :32].contiguous())), LoRAShapeMismatchError,
            ["lora_A (8, 32)", "[r, 64]"]),
        "rank-not-the-config's": (edit_adapter(good, p("r4cfg"), config={
            "r": 4}), LoRAShapeMismatchError, ["rank 8", "says 4"]),
        "b-missing": (edit_adapter(good, p("noB"), tensors=lambda d: {
            k: v for k, v in d.items() if k != B}), LoRAShapeMismatchError,
            ["no lora_B"]),
        "dora": (edit_adapter(good, p("dora"), config={"use_dora": True}),
                 UnsupportedLoRAAdapterError, ["DoRA"]),
        "bias": (edit_adapter(good, p("bias"), config={"bias": "all"}),
                 UnsupportedLoRAAdapterError, ["bias"]),
        "not-lora": (edit_adapter(good, p("ia3"), config={"peft_type": "IA3"}),
                     UnsupportedLoRAAdapterError, ["IA3"]),
        "embeddings": (make_peft_adapter(
            base_path, p("embed"), seed=6, r=4,
            target_modules=["q_proj", "embed_tokens"]),
            UnsupportedLoRAAdapterError, ["embed_tokens"]),
        "lm-head": (make_peft_adapter(
            base_path, p("head"), seed=7, r=4,
            target_modules=["v_proj", "lm_head"]),
            UnsupportedLoRAAdapterError, ["lm_head"]),
        "no-folder": (p("nowhere"), LoRAAdapterNotFoundError,
                      ["No adapter found", "local folder"]),
    }
    no_config = edit_adapter(good, p("noconfig"))
    os.remove(os.path.join(no_config, "adapter_config.json"))
    cases["no-config"] = (no_config, LoRAAdapterNotFoundError,
                          ["adapter_config.json"])
    no_weights = edit_adapter(good, p("noweights"))
    os.remove(os.path.join(no_weights, "adapter_model.safetensors"))
    cases["no-weights"] = (no_weights, LoRAAdapterNotFoundError,
                           ["adapter_model.safetensors"])
    pickled = edit_adapter(good, p("pickle"))
    os.rename(os.path.join(pickled, "adapter_model.safetensors"),
              os.path.join(pickled, "adapter_model.bin"))
    cases["pickle-only"] = (pickled, LoRAAdapterNotFoundError,
                            ["adapter_model.bin", "safe_serialization"])
    bad_json = edit_adapter(good, p("badjson"))
    with open(os.path.join(bad_json, "adapter_config.json"), "w") as f:
        f.write("{not json")
    cases["config-not-json"] = (bad_json, LoRAError, ["not readable JSON"])
    return cases


@pytest.fixture(scope="module")
def broken(adapters, base_path, tmp_path_factory):
    return _broken(adapters, base_path, str(tmp_path_factory.mktemp("broken")))


@pytest.mark.slow
def test_bad_adapters_fail_alone(lora_llm, adapters, broken):
    sp = SamplingParams(temperature=0.0, max_tokens=6)
    prompt = {"prompt_token_ids": [11, 12, 13, 14, 15]}
    good = LoRARequest(GOOD, 1, adapters[GOOD])
    want = lora_llm.generate([prompt, prompt], sp, lora_request=[good, None],
                             use_tqdm=False)
    want = [o.outputs[0].token_ids for o in want]
    for i, (case, (path, error, words)) in enumerate(broken.items()):
        bad = LoRARequest(case, 100 + i, path)
        with pytest.raises(error) as e:
            # The good prompt beside it is not run either (all or nothing).
            lora_llm.generate([prompt, prompt], sp, lora_request=[good, bad],
                              use_tqdm=False)
        assert isinstance(e.value, InvalidRequestError), case  # a 400
        for w in words:
            assert w in str(e.value), f"{case}: {w!r} not in {e.value}"
        assert not lora_llm.llm_engine.has_unfinished_requests()
        got = lora_llm.generate([prompt, prompt], sp, lora_request=[good, None],
                                use_tqdm=False)
        assert [o.outputs[0].token_ids for o in got] == want, case


def test_requests_name_lora_where_it_is_off(base_path, adapters):
    from jaxinfer.engine.input_processor import InputProcessor
    from tests.tiny_models import embedded_tokenizer
    processor = InputProcessor(embedded_tokenizer(), vocab_size=49152,
                               max_model_len=64, max_logprobs=5, max_num_seqs=4)
    with pytest.raises(LoRANotEnabledError, match="enable_lora=True"):
        processor.process([1, 2], lora_request=LoRARequest("a", 1, adapters[GOOD]))
    with pytest.raises(InvalidRequestError, match="must be a LoRARequest"):
        processor.process([1, 2], lora_request="a")



def _load_error(layout, path: str, name: str = "x") -> str:
    from jaxinfer.lora.peft_format import load_peft_adapter
    with pytest.raises(LoRAError) as e:
        load_peft_adapter(LoRARequest(name, 1, path), layout, "float32")
    return str(e.value)


def test_missing_adapter_parts_answer_alike(lora_llm, broken, tmp_path):
    """A client loading adapters must not learn which folders exist: no
    folder, a folder without the config, without the weights, or with a
    pickle instead, all give one message, naming no path."""
    layout = lora_llm.llm_engine.lora_store.layout
    plain_dir = tmp_path / "exists"
    plain_dir.mkdir()
    paths = [broken[c][0] for c in ("no-folder", "no-config", "no-weights",
                                    "pickle-only")]
    paths += [str(plain_dir), "/proc/self", "/etc/../etc", "/nonexistent"]
    messages = {_load_error(layout, p) for p in paths}
    assert len(messages) == 1, messages
    (message,) = messages
    assert all(p not in message for p in paths), message
    assert "adapter_config.json" in message and "local folder" in message


class _PeakRSS:
    """The process's resident memory, sampled every few milliseconds."""

    def __init__(self):
        import threading
        self.peak = self.start = self.now()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    @staticmethod
    def now() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _sample(self):
        while not self.stop.wait(0.002):
            self.peak = max(self.peak, self.now())

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.peak = max(self.peak, self.now())


def _write_safetensors(path: str, tensors: dict, data_bytes: int) -> None:
    """A weights file whose header names ``tensors`` ({name: (dtype,
    shape)}, back to back) over ``data_bytes`` of zeros (a sparse file:
    large sizes cost no disk)."""
    import json
    import math
    import struct
    size = {"F32": 4, "F16": 2, "BF16": 2}
    header, at = {}, 0
    for key, (dtype, shape) in tensors.items():
        n = math.prod(shape) * size[dtype]
        header[key] = {"dtype": dtype, "shape": list(shape),
                       "data_offsets": [at, at + n]}
        at += n
    raw = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + max(at, data_bytes))


@pytest.mark.parametrize("case", ["1GiB-wrong-shape", "padded-past-limit",
                                  "wrong-shape"])
def test_adapter_refused_from_its_header(lora_llm, adapters, case, tmp_path,
                                         monkeypatch):
    """A 1 GiB weights file with one wrongly shaped tensor and a file
    larger than any adapter of the model at max_lora_rank are refused for
    their size, and a small one with a wrongly shaped tensor for its shape,
    all from the safetensors header: no tensor is read, in well under a
    second, with no memory growth."""
    import shutil
    import time

    import safetensors
    layout = lora_llm.llm_engine.lora_store.layout
    folder = tmp_path / case
    folder.mkdir()
    shutil.copy(os.path.join(adapters[GOOD], "adapter_config.json"), folder)
    weights = str(folder / "adapter_model.safetensors")
    right = {A: ("F32", (8, 64)), B: ("F32", (64, 8))}
    if case == "1GiB-wrong-shape":  # lora_A as wide as 1 GiB of float32
        _write_safetensors(weights, {A: ("F32", (8, 1 << 25)),
                                     B: ("F32", (64, 8))}, 0)
    elif case == "padded-past-limit":
        _write_safetensors(weights, right, 4 * layout.size + (1 << 20))
    else:
        _write_safetensors(weights, {A: ("F32", (8, 32)),
                                     B: ("F32", (64, 8))}, 0)
    opened = []
    real_open = safetensors.safe_open
    monkeypatch.setattr(safetensors, "safe_open",
                        lambda *a, **k: opened.append(a) or real_open(*a, **k))
    t0 = time.perf_counter()
    with _PeakRSS() as rss:
        message = _load_error(layout, str(folder), name=case)
    elapsed = time.perf_counter() - t0
    assert not opened, "the tensors were opened before the header was checked"
    assert elapsed < 1.0, elapsed
    assert rss.peak - rss.start < 100 * 2**20, (rss.peak - rss.start) / 2**20
    if case == "wrong-shape":
        assert "lora_A (8, 32)" in message and "[r, 64]" in message
    else:
        assert "bytes, more than any adapter of this model needs" in message
        assert "max_lora_rank=8" in message
    assert str(folder) not in message
