"""Images through the engine, against HF transformers' LLaVA token for
token: a batch mixing image and text-only prompts with chunked prefill
splitting images over steps, the prefix cache keyed by image content (the
same image hits, another behind the same tokens does not), recompute
preemption re-encoding images, LLM.chat's image parts, and the encoder
cache empty again when the requests are done."""

from __future__ import annotations

import base64
import io

import pytest

from jaxinfer import SamplingParams
from tests.tiny_llava import TOKENS_PER_IMAGE, HfLlava, random_image

MAX_TOKENS = 12
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)

IMAGE_A, IMAGE_B = random_image(1), random_image(2, size=(64, 48))
# (text, images): an image after some text (split by a 16-token step
# budget), text only, an image first, two images, text only.
PROMPTS = [
    ("USER: <image>\nDescribe the picture. ASSISTANT:", [IMAGE_A]),
    ("The quick brown fox jumps over", []),
    ("<image>\nWhat colour is it?", [IMAGE_B]),
    ("Compare <image> with <image> please.", [IMAGE_A, IMAGE_B]),
    ("Once upon a time, in a land far away, there lived", []),
]


def as_engine_prompt(text, images):
    if not images:
        return text
    return {"prompt": text, "multi_modal_data": {"image": images}}


@pytest.fixture(scope="module")
def hf(tiny_llava_path):
    return HfLlava(tiny_llava_path)


@pytest.fixture(scope="module")
def llm(tiny_llava_path, cache_dir):
    from jaxinfer import LLM
    return LLM(tiny_llava_path, dtype="float32", max_model_len=128,
               max_num_seqs=4, max_num_batched_tokens=16, block_size=16,
               enable_prefix_caching=True, compilation_cache_dir=cache_dir)


def run(llm, prompts):
    outs = llm.generate([as_engine_prompt(t, i) for t, i in prompts], GREEDY,
                        use_tqdm=False)
    return [(list(o.outputs[0].token_ids), o.outputs[0].text) for o in outs]


def spy_image_steps(runner):
    """Records, per step that read the encoder cache, the slots it read."""
    seen, inner = [], runner.encoder.step_inputs

    def step_inputs(*args):
        mm = inner(*args)
        if mm is not None:
            index = mm[1]
            seen.append(set((index[index >= 0] // TOKENS_PER_IMAGE).tolist()))
        return mm
    runner.encoder.step_inputs = step_inputs
    return seen


def check_encoder_idle(llm):
    engine = llm.llm_engine
    enc = engine.scheduler.encoder
    assert enc.num_free == enc.num_slots - 1 and not enc.slots
    assert engine.runner.encoder.slots == {}


@pytest.mark.slow
def test_mixed_batch_with_split_images_matches_hf(llm, hf):
    from tests.runners import check_outputs_equal
    runner = llm.llm_engine.runner
    steps = spy_image_steps(runner)
    encoded = runner.encoder.images_encoded
    got = run(llm, PROMPTS)
    check_outputs_equal(hf.generate_greedy(PROMPTS, MAX_TOKENS), got, "hf",
                        "jaxinfer")
    # Every image was encoded once, and some image's placeholders ran in
    # two steps (the 16-token budget splits them).
    assert runner.encoder.images_encoded - encoded == 4
    assert any(steps[i] & steps[i + 1] for i in range(len(steps) - 1))
    check_encoder_idle(llm)


@pytest.mark.slow
def test_prefix_cache_is_keyed_by_the_image(llm, hf):
    from tests.runners import check_outputs_equal
    engine = llm.llm_engine
    text = ("<image>\nWhat colour is the sky in this picture, and what "
            "stands on the ground below it, near the trees?")  # image: block 0
    first = run(llm, [(text, [IMAGE_B])])
    n_prompt = len(llm.generate(as_engine_prompt(text, [IMAGE_B]),
                                SamplingParams(max_tokens=1),
                                use_tqdm=False)[0].prompt_token_ids)
    assert n_prompt > 2 * 16 and TOKENS_PER_IMAGE == 16
    # Same image, same text: every full block but the last token's hits,
    # and the image is not encoded again (its placeholders are all cached).
    hits = engine.get_stats().prefix_cache_hits
    encoded = engine.runner.encoder.images_encoded
    again = run(llm, [(text, [IMAGE_B])])
    assert engine.get_stats().prefix_cache_hits - hits == (n_prompt - 1) // 16 * 16
    assert engine.runner.encoder.images_encoded == encoded
    assert again == first
    # Another image behind the same tokens: its placeholders are the first
    # block, so nothing hits, and the output is that image's.
    hits = engine.get_stats().prefix_cache_hits
    other = run(llm, [(text, [IMAGE_A])])
    assert engine.get_stats().prefix_cache_hits == hits
    assert engine.runner.encoder.images_encoded == encoded + 1
    check_outputs_equal(hf.generate_greedy([(text, [IMAGE_A])], MAX_TOKENS),
                        other, "hf", "jaxinfer")
    assert other != first
    check_encoder_idle(llm)


def data_url(image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.mark.slow
def test_chat_image_parts_match_hf(llm, hf):
    """A data-URL part and a PIL part render as vLLM renders a string
    template: the placeholder on its own line before the message's text."""
    from tests.runners import check_outputs_equal
    question = "What is in the picture?"
    convs = [[{"role": "user", "content": [
                 {"type": "text", "text": question},
                 {"type": "image_url", "image_url": {"url": data_url(IMAGE_B)}}]}],
             [{"role": "user", "content": [
                 {"type": "image_pil", "image_pil": IMAGE_A},
                 {"type": "text", "text": question}]}]]
    outs = llm.chat(convs, GREEDY, use_tqdm=False)
    got = [(list(o.outputs[0].token_ids), o.outputs[0].text) for o in outs]
    tok = hf.tokenizer
    want = hf.generate_greedy(
        [(tok.apply_chat_template(
            [{"role": "user", "content": f"<image>\n{question}"}],
            tokenize=False, add_generation_prompt=True), [image])
         for image in (IMAGE_B, IMAGE_A)], MAX_TOKENS)
    check_outputs_equal(want, got, "hf", "jaxinfer")


@pytest.mark.slow
def test_recompute_preemption_encodes_again(tiny_llava_path, cache_dir, hf):
    """A pool too small for the batch preempts; a preempted request's
    images are encoded again when it comes back, and outputs stay HF's."""
    from jaxinfer import LLM
    from tests.runners import check_outputs_equal
    small = LLM(tiny_llava_path, dtype="float32", max_model_len=128,
                max_num_seqs=4, max_num_batched_tokens=16, block_size=16,
                num_gpu_blocks_override=9, enable_prefix_caching=False,
                compilation_cache_dir=cache_dir)
    prompts = [p for p in PROMPTS if p[1]]
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    outs = small.generate([as_engine_prompt(t, i) for t, i in prompts], sp,
                          use_tqdm=False)
    engine = small.llm_engine
    assert engine.get_stats().num_preemptions > 0
    assert engine.runner.encoder.images_encoded > 4
    hf_outs = []
    for text, images in prompts:
        inputs = hf.processor(text=text, images=images, return_tensors="pt")
        import torch
        with torch.no_grad():
            seq = hf.model.generate(**inputs, do_sample=False, max_new_tokens=24,
                                    min_new_tokens=24, pad_token_id=2)
        hf_outs.append(seq[0, inputs["input_ids"].shape[1]:].tolist())
    check_outputs_equal([(h, "") for h in hf_outs],
                        [(list(o.outputs[0].token_ids), "") for o in outs],
                        "hf", "jaxinfer")
    check_encoder_idle(small)
