"""The KV cache is paged: one engine step writes exactly this step's K/V, at
the slots its block tables name, and nothing else.

Request A is prefilled in a first step; then one jitted step runs A's first
decode token together with B's whole prompt (a mixed prefill + decode batch).
After it, the pages must hold, at each (page, offset) the block tables give
for a position, the post-rope K and the V that HF transformers computes for
that token (``past_key_values`` of an independent forward), and every other
slot of every real page must be bit-for-bit what it was before the step.
"""

from __future__ import annotations

import numpy as np
import pytest

from jaxinfer import SamplingParams

BLOCK = 16
PROMPT_A = list(range(1000, 1020))  # 20 tokens: A's decode lands in page 2
PROMPT_B = list(range(2000, 2030))  # 30 tokens: spans two pages
KV_ATOL = 1e-5  # float32; a different program computes the reference


def _hf_kv(path, token_ids):
    """[(k [K, T, H], v [K, T, H]) per layer] from HF's past_key_values."""
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                 local_files_only=True).eval()
    with torch.no_grad():
        cache = model(torch.tensor([token_ids]), use_cache=True).past_key_values
    layers = getattr(cache, "layers", None)
    out = []
    for i in range(model.config.num_hidden_layers):
        k, v = (layers[i].keys, layers[i].values) if layers is not None else cache[i]
        out.append((k[0].numpy(), v[0].numpy()))
    return out


def _host_pages(kv_pages):
    return [(np.array(k), np.array(v)) for k, v in kv_pages]


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def stepped(request, tiny_model_factory):
    """Runs the two steps; returns what the test needs to check step 2."""
    from jaxinfer.config import EngineArgs
    from jaxinfer.engine.llm_engine import LLMEngine
    path = tiny_model_factory(request.param)
    engine = LLMEngine(EngineArgs(
        model=path, dtype="float32", max_model_len=64, max_num_seqs=4,
        max_num_batched_tokens=64, block_size=BLOCK, num_gpu_blocks_override=16,
        enable_prefix_caching=False,
        # One step at a time: each step() returns its own tokens and the
        # pages read after it hold exactly that step's writes.
        async_scheduling=False))
    runner = engine.runner
    seen = []
    dispatch = runner.dispatch

    def recording_dispatch(out, *rest):
        seen.append(out)
        return dispatch(out, *rest)

    runner.dispatch = recording_dispatch
    greedy = SamplingParams(temperature=0.0, max_tokens=4)
    engine.add_request("A", {"prompt_token_ids": PROMPT_A}, greedy)
    first = engine.step()
    a_token = first[0].outputs[0].token_ids[0]
    engine.add_request("B", {"prompt_token_ids": PROMPT_B}, greedy)
    before = _host_pages(runner.kv_pages)
    engine.step()
    after = _host_pages(runner.kv_pages)
    step = {s.request_id: s for s in seen[-1].scheduled}
    return dict(path=path, before=before, after=after, step=step,
                a_tokens=PROMPT_A + [a_token], num_pages=runner.num_blocks)


def test_step_is_mixed_prefill_and_decode(stepped):
    a, b = stepped["step"]["A"], stepped["step"]["B"]
    assert (a.start_pos, len(a.token_ids)) == (len(PROMPT_A), 1)  # decode
    assert (b.start_pos, list(b.token_ids)) == (0, PROMPT_B)  # whole prefill
    assert not set(a.block_table) & set(b.block_table)
    assert 0 not in a.block_table + b.block_table  # page 0 is the null page


def _slots(table, positions):
    return [(table[p // BLOCK], p % BLOCK) for p in positions]


def test_pages_hold_hf_kv_at_the_block_table_slots(stepped):
    after = stepped["after"]
    for rid, tokens in (("A", stepped["a_tokens"]), ("B", PROMPT_B)):
        table = stepped["step"][rid].block_table
        ref = _hf_kv(stepped["path"], tokens)
        pos = range(len(tokens))
        pages = np.array([p for p, _ in _slots(table, pos)])
        offs = np.array([o for _, o in _slots(table, pos)])
        for layer, ((k_pages, v_pages), (k_ref, v_ref)) in enumerate(
                zip(after, ref)):
            # k_pages [K, num_pages, B, H] -> [K, T, H] in token order
            np.testing.assert_allclose(k_pages[:, pages, offs], k_ref,
                                       atol=KV_ATOL, rtol=0,
                                       err_msg=f"{rid} layer {layer} K")
            np.testing.assert_allclose(v_pages[:, pages, offs], v_ref,
                                       atol=KV_ATOL, rtol=0,
                                       err_msg=f"{rid} layer {layer} V")


def test_nothing_else_changed(stepped):
    """Only A's decode slot and B's prompt slots differ from before the step
    (page 0, the null page padding rows write to, is not real data)."""
    a, b = stepped["step"]["A"], stepped["step"]["B"]
    written = set(_slots(a.block_table, [a.start_pos]))
    written |= set(_slots(b.block_table, range(len(PROMPT_B))))
    mask = np.zeros((stepped["num_pages"], BLOCK), bool)
    for page, off in written:
        mask[page, off] = True
    mask[0] = True  # null page
    for layer, ((k0, v0), (k1, v1)) in enumerate(zip(stepped["before"],
                                                     stepped["after"])):
        for name, x0, x1 in (("K", k0, k1), ("V", v0, v1)):
            changed = np.any(x0 != x1, axis=(0, 3))  # [num_pages, B]
            assert not np.any(changed & ~mask), (
                f"layer {layer} {name}: slots outside this step's writes "
                f"changed: {np.argwhere(changed & ~mask).tolist()}")
            # Every slot this step wrote really changed (it held zeros or
            # nothing before; a random model's K/V are never exactly zero).
            for page, off in written:
                assert changed[page, off], (layer, name, page, off)
