"""`/v1/chat/completions` with images on a tiny LLaVA, through the `openai`
client: base64 data URLs give HF's greedy text (streaming and not); a
remote URL, a corrupt image, too many images, and a file outside the
allowed folder are each a 400 in OpenAI's error shape; the pages and the
encoder cache are free afterwards."""

from __future__ import annotations

import base64
import io

import openai
import pytest

from tests.tiny_llava import HfLlava, random_image

from .conftest import openai_client, pages_all_free, start_server

MAX_TOKENS = 10
QUESTION = "What is in this picture?"


def data_url(image, fmt="PNG") -> str:
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return (f"data:image/{fmt.lower()};base64,"
            + base64.b64encode(buf.getvalue()).decode())


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def user(*parts) -> list[dict]:
    return [{"role": "user", "content": [*parts, {"type": "text",
                                                 "text": QUESTION}]}]


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("media")
    random_image(5).save(folder / "cat.png")
    return folder


@pytest.fixture(scope="module")
def image_server(tiny_llava_path, media_dir):
    server, engine = start_server(
        tiny_llava_path, served_model_names=["llava"], max_model_len=128,
        num_gpu_blocks_override=64, max_num_seqs=4, max_num_batched_tokens=32,
        limit_mm_per_prompt={"image": 2},
        allowed_local_media_path=str(media_dir))
    yield server, engine
    server.stop()


@pytest.fixture(scope="module")
def client(image_server):
    return openai_client(image_server[0])


@pytest.fixture(scope="module")
def hf(tiny_llava_path):
    return HfLlava(tiny_llava_path)


def hf_text(hf, images) -> str:
    """HF's greedy text for user(...) with these images: the placeholders
    on their own lines before the question (vLLM's string content)."""
    content = "\n".join(["<image>"] * len(images) + [QUESTION])
    prompt = hf.tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False,
        add_generation_prompt=True)
    return hf.generate_greedy([(prompt, images)], MAX_TOKENS)[0][1]


@pytest.mark.slow
def test_base64_images_give_hf_greedy_text(client, hf, image_server,
                                           media_dir):
    from PIL import Image
    a, b = random_image(3), random_image(4, size=(30, 90))
    cases = [([a], [image_part(data_url(a))]),
             ([a, b], [image_part(data_url(a)), image_part(data_url(b))]),
             ([Image.open(media_dir / "cat.png")],
              [image_part((media_dir / "cat.png").as_uri())])]
    for images, parts in cases:
        want = hf_text(hf, images)
        resp = client.chat.completions.create(
            model="llava", messages=user(*parts), max_tokens=MAX_TOKENS,
            temperature=0)
        assert resp.choices[0].message.content == want
        # 16 tokens per image: the prompt counts the expanded placeholders.
        assert resp.usage.prompt_tokens > 16 * len(images)
    stream = client.chat.completions.create(
        model="llava", messages=user(image_part(data_url(a))),
        max_tokens=MAX_TOKENS, temperature=0, stream=True)
    text = "".join(chunk.choices[0].delta.content or ""
                   for chunk in stream if chunk.choices)
    assert text == hf_text(hf, [a])
    engine = image_server[1]
    assert pages_all_free(engine)
    enc = engine.engine.scheduler.encoder
    assert enc.num_free == enc.num_slots - 1


@pytest.mark.parametrize("parts, words", [
    ([image_part("https://example.com/cat.png")], "remote image URLs"),
    ([image_part("data:image/png;base64,iVBORw0KGgoAAAANSUhEUg==")],
     "not an image"),
    ([image_part("data:image/png;base64,***")], "invalid base64"),
    ([image_part(data_url(random_image(0)))] * 3, "At most 2 image(s)"),
    ([image_part("file:///etc/passwd")], "outside the allowed local media"),
    ([{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}],
     "audio"),
])
def test_bad_images_are_400s(image_server, client, parts, words):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="llava", messages=user(*parts),
                                       max_tokens=4)
    body = e.value.response.json()
    assert set(body["error"]) >= {"message", "type", "code"}
    assert body["error"]["code"] == 400
    assert body["error"]["type"] == "BadRequestError"
    assert words in body["error"]["message"], body
    assert pages_all_free(image_server[1])


@pytest.fixture(scope="module")
def bomb_url():
    """A PNG of 5,790 x 5,790 black pixels: about 100 KB compressed, 100 MB
    decoded (just under the per-image limit)."""
    from PIL import Image
    return data_url(Image.new("RGB", (5790, 5790)))


def _rss() -> int:
    import os
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize("count", [10, 1], ids=["ten-5790px", "one-8000px"])
def test_image_bombs_are_refused_before_decoding(image_server, client,
                                                 bomb_url, count):
    """Ten such images in one request (or one of 8,000 x 8,000) are refused
    from their headers: in well under a second, the server's memory (this
    process's: the server runs in a thread) growing by under 100 MB."""
    import threading
    import time

    from PIL import Image
    url = bomb_url if count > 1 else data_url(Image.new("L", (8000, 8000)))
    peak, start, stop = [0], _rss(), threading.Event()

    def sample():
        while not stop.wait(0.002):
            peak[0] = max(peak[0], _rss())
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(
                model="llava", messages=user(*[image_part(url)] * count),
                max_tokens=4)
    finally:
        elapsed = time.perf_counter() - t0
        stop.set()
        sampler.join()
    message = e.value.response.json()["error"]["message"]
    assert ("At most 2 image(s)" if count > 1 else "pixels") in message
    assert elapsed < 1.0, elapsed
    assert max(peak[0], _rss()) - start < 100 * 2**20, (peak[0] - start) / 2**20
    assert pages_all_free(image_server[1])
