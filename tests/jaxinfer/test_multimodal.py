"""The host side of images, without a model: media loading and its
refusals, chat content formats and placeholders, limit_mm_per_prompt,
placeholder expansion, and the scheduler's encoder-cache slots driven by
random arrivals, aborts, prefix hits and preemptions."""

from __future__ import annotations

import base64
import io
import os
import random

import numpy as np
import pytest

from jaxinfer.errors import InvalidConfigError, InvalidRequestError, UnsupportedFeatureError
from jaxinfer.multimodal.chat import detect_content_format, parse_chat_messages
from jaxinfer.multimodal.inputs import MultiModalInput
from jaxinfer.multimodal.limits import parse_limit_mm_per_prompt
from jaxinfer.multimodal.media import MAX_IMAGE_PIXELS, MAX_PROMPT_IMAGE_PIXELS, load_image_url
from tests.tiny_llava import random_image


def png_bytes(image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def data_url(raw: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(raw).decode()


# -- media ------------------------------------------------------------------

def test_data_urls_decode_and_bad_ones_say_why():
    img = random_image(0)
    got = load_image_url(data_url(png_bytes(img)))
    assert got.size == img.size and got.tobytes() == img.tobytes()
    truncated = png_bytes(img)[:200]  # a valid header, its pixels cut off
    for url, words in [(data_url(truncated), "could not be decoded"),
                       ("data:image/png;base64,@@@", "invalid base64"),
                       ("data:text/plain;base64,aGk=", "media type"),
                       ("data:image/png,abc", "only base64"),
                       ("http://example.com/a.png", "remote image URLs"),
                       ("ftp://x/y.png", "must be a data URL"),
                       ("/tmp/a.png", "must be a data URL")]:
        with pytest.raises(InvalidRequestError, match=words):
            load_image_url(url)


def test_huge_images_are_refused_from_their_header():
    from PIL import Image
    w = 8192
    h = MAX_IMAGE_PIXELS // w + 1
    raw = png_bytes(Image.new("1", (w, h)))
    with pytest.raises(InvalidRequestError, match="at most"):
        load_image_url(data_url(raw))


def test_local_files_only_inside_the_allowed_folder(tmp_path):
    allowed = tmp_path / "media"
    allowed.mkdir()
    random_image(1).save(allowed / "a.png")
    random_image(2).save(tmp_path / "secret.png")
    os.symlink(tmp_path / "secret.png", allowed / "link.png")
    url = (allowed / "a.png").as_uri()
    with pytest.raises(InvalidRequestError, match="--allowed-local-media-path"):
        load_image_url(url)
    assert load_image_url(url, str(allowed)).size == (70, 40)
    os.symlink("/proc/self/environ", allowed / "proc.png")
    for path in (allowed / "link.png", allowed / ".." / "secret.png",
                 allowed / "proc.png", "/etc/passwd"):
        with pytest.raises(InvalidRequestError, match="outside the allowed") as e:
            load_image_url("file://" + str(path), str(allowed))
        # The rule broken, never where the link leads or the folder is.
        for disclosed in ("secret.png", "/proc", str(tmp_path), "/etc"):
            assert disclosed not in str(e.value), e.value
    with pytest.raises(InvalidRequestError, match="no such file") as e:
        load_image_url((allowed / "b.png").as_uri(), str(allowed))
    assert str(tmp_path) not in str(e.value)


def test_prompt_pixels_are_checked_before_any_image_is_decoded():
    """Images each within MAX_IMAGE_PIXELS but together over
    MAX_PROMPT_IMAGE_PIXELS are refused from their headers: decoding
    none of them."""
    from PIL import Image
    side = int(MAX_IMAGE_PIXELS ** 0.5)
    buf = io.BytesIO()
    Image.new("L", (side, side)).save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    decoded = []
    real_load = Image.Image.load

    def counting_load(image):
        decoded.append(image.size)
        return real_load(image)
    messages = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}] * 3}]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Image.Image, "load", counting_load)
        with pytest.raises(InvalidRequestError, match="in one prompt") as e:
            parse_chat_messages(messages, content_format="openai",
                                placeholder="<image>")
    assert not [s for s in decoded if s == (side, side)], decoded
    assert str(MAX_PROMPT_IMAGE_PIXELS) in str(e.value)


# -- chat -------------------------------------------------------------------

LLAVA_TEMPLATE = (
    "{% for message in messages %}{{ message['role'].upper() + ': ' }}"
    "{% for c in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>\\n' }}{% endfor %}"
    "{% for c in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ c['text'] }}{% endfor %}{% endfor %}")


def test_content_format_is_read_from_the_template():
    assert detect_content_format(LLAVA_TEMPLATE) == "openai"
    assert detect_content_format(
        "{% for m in messages %}{% if m.content is string %}{{ m.content }}"
        "{% else %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endif %}"
        "{% endfor %}") == "openai"
    assert detect_content_format(
        "{% for m in messages %}{{ m['role'] + m['content'] }}{% endfor %}"
    ) == "string"
    assert detect_content_format(None) == "string"
    assert detect_content_format("{% for %}") == "string"


def test_string_content_puts_missing_placeholders_first():
    img = random_image(0)
    part = {"type": "image_pil", "image_pil": img}
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a"}, part,
                                         {"type": "text", "text": "b"}]},
            {"role": "user", "content": [part, {"type": "text",
                                                "text": "see <image> here"}]},
            {"role": "assistant", "content": None}]
    conv, images = parse_chat_messages(msgs, content_format="string",
                                       placeholder="<image>")
    assert [m["content"] for m in conv] == ["<image>\na\nb", "see <image> here",
                                            ""]
    assert images == [img, img]
    conv, _ = parse_chat_messages(msgs, content_format="openai",
                                  placeholder="<image>")
    assert conv[0]["content"] == [{"type": "text", "text": "a"},
                                  {"type": "image"}, {"type": "text", "text": "b"}]
    with pytest.raises(InvalidRequestError, match="2 '<image>' placeholders"):
        parse_chat_messages([{"role": "user", "content": [
            part, {"type": "text", "text": "<image><image>"}]}],
            content_format="string", placeholder="<image>")


def test_a_text_only_model_refuses_before_loading_the_image():
    calls = []

    def refuse():
        calls.append(1)
        raise InvalidRequestError("needs a multimodal model")
    with pytest.raises(InvalidRequestError, match="multimodal"):
        parse_chat_messages([{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "not a url"}}]}],
            content_format="string", placeholder="", on_first_image=refuse)
    assert calls == [1]
    with pytest.raises(UnsupportedFeatureError, match="video"):
        parse_chat_messages([{"role": "user", "content": [
            {"type": "video_url", "video_url": {"url": "x"}}]}],
            content_format="string", placeholder="")


# -- limits and placeholders ------------------------------------------------

def test_limit_mm_per_prompt_forms():
    assert parse_limit_mm_per_prompt(None) == {}
    assert parse_limit_mm_per_prompt('{"image": 3}') == {"image": 3}
    assert parse_limit_mm_per_prompt({"image": 0, "video": 0}) == {"image": 0}
    with pytest.raises(UnsupportedFeatureError, match="'video'"):
        parse_limit_mm_per_prompt({"video": 1})
    for bad in ("image=2", {"image": -1}, {"image": True}, {"images": 1}, [1]):
        with pytest.raises(InvalidConfigError, match="limit_mm_per_prompt"):
            parse_limit_mm_per_prompt(bad)


def test_the_cli_takes_limits_as_json_and_checks_the_media_folder(tmp_path):
    from jaxinfer.config import EngineArgs
    from jaxinfer.entrypoints.cli import build_parser
    from jaxinfer.entrypoints.openai.cli_args import serve_engine_args
    args = serve_engine_args(build_parser().parse_args(
        ["serve", "m", "--limit-mm-per-prompt", '{"image": 4}',
         "--allowed-local-media-path", str(tmp_path)]))
    assert args.limit_mm_per_prompt == {"image": 4}
    assert args.allowed_local_media_path == str(tmp_path)
    with pytest.raises(InvalidConfigError, match="allowed_local_media_path"):
        EngineArgs(allowed_local_media_path=str(tmp_path / "missing"))


@pytest.fixture(scope="module")
def image_processor(tiny_llava_path):
    from jaxinfer.models import resolve_model
    from jaxinfer.multimodal.processor import ImageProcessor
    from jaxinfer.tokenizer import load_tokenizer
    files = resolve_model(tiny_llava_path, "dummy")
    return ImageProcessor.for_model(tiny_llava_path, files.config.image_input,
                                    {"image": 2}, load_tokenizer(files.tokenizer))


def test_placeholders_expand_once_per_image(image_processor):
    p = image_processor
    T, N = p.spec.token_id, p.spec.tokens_per_image
    assert p.placeholder == "<image>"
    ids, inputs = p.process([7, T, 8, T, 9],
                            {"image": [random_image(0), random_image(1)]})
    assert ids == [7] + [T] * N + [8] + [T] * N + [9]
    assert [(m.offset, m.length) for m in inputs] == [(1, N), (2 + N, N)]
    assert inputs[0].pixel_values.shape == (3, 56, 56)
    assert inputs[0].hash != inputs[1].hash
    assert p.process(ids, {"image": [random_image(0), random_image(1)]})[0] == ids
    for ids, images, words in [([T, T], [random_image(0)], "2 image placeholder"),
                               ([T], [], "no image was given"),
                               ([T], [random_image(0)] * 3, "At most 2")]:
        with pytest.raises(InvalidRequestError, match=words):
            p.process(ids, {"image": images})
    with pytest.raises(InvalidRequestError, match="'video'"):
        p.process([T], {"video": []})
    with pytest.raises(InvalidRequestError, match="PIL.Image"):
        p.process([T], {"image": np.zeros((4, 4, 3), np.uint8)})


def test_a_text_only_model_refuses_multi_modal_data():
    from jaxinfer.engine.input_processor import InputProcessor
    from tests.tiny_models import embedded_tokenizer
    ip = InputProcessor(embedded_tokenizer(), vocab_size=49152, max_model_len=64,
                        max_logprobs=5, max_num_seqs=4,
                        architecture="LlamaForCausalLM")
    with pytest.raises(InvalidRequestError,
                       match="multimodal model: LlamaForCausalLM takes text"):
        ip.process({"prompt": "hi", "multi_modal_data": {"image": []}})


# -- encoder-cache slots in the scheduler -----------------------------------

def _image(offset, length=6, tag=""):
    return MultiModalInput(np.zeros(0, np.float32), f"h{offset}{tag}", offset,
                           length)


def test_encoder_slots_under_random_load():
    """Every image a scheduled chunk reaches sits in a slot that holds it
    (encoded this step or kept from an earlier one), slots are never
    shared, and all are free again when the requests are gone."""
    from jaxinfer.config import CacheConfig, SchedulerConfig
    from jaxinfer.core.encoder_cache_manager import encoder_cache_slots
    from jaxinfer.core.scheduler import Scheduler
    from jaxinfer.request import Request, RequestStatus
    from jaxinfer.sampling_params import SamplingParams
    rng = random.Random(0)
    T_IMG = 10
    slots = encoder_cache_slots(16, T_IMG)
    sched = Scheduler(SchedulerConfig(max_model_len=96, max_num_seqs=3,
                                      max_num_batched_tokens=16),
                      CacheConfig(block_size=8, num_gpu_blocks_override=14),
                      14, num_encoder_slots=slots)
    holds: dict[int, tuple] = {}  # slot -> (request, image) written there
    where: dict[tuple, int] = {}  # (request, image) -> slot, as the runner keeps
    n_req = 0
    for _step in range(400):
        if rng.random() < 0.3 and n_req < 40:
            n_img = rng.randrange(0, 4)
            prompt, images = [], []
            for _ in range(n_img):
                prompt += [rng.randrange(1, 9) for _ in range(rng.randrange(0, 9))]
                # Some requests share images (prefix hits land mid-image).
                tag = "" if rng.random() < 0.5 else str(n_req)
                images.append(_image(len(prompt), T_IMG, tag))
                prompt += [99] * T_IMG
            prompt += [rng.randrange(1, 9) for _ in range(rng.randrange(1, 6))]
            sched.add_request(Request(
                f"r{n_req}", prompt, SamplingParams(max_tokens=rng.randrange(1, 12)),
                mm_inputs=images))
            n_req += 1
        if rng.random() < 0.05 and sched.running:
            sched.finish_requests(rng.choice(sched.running).request_id,
                                  RequestStatus.FINISHED_ABORTED)
        out = sched.schedule()
        for rid in out.finished_ids + out.preempted_ids:
            for key in [k for k in where if k[0] == rid]:
                del where[key]
        for rid, i, slot in out.encoder_inputs:
            assert slot != 0
            holds[slot] = (rid, i)
            where[(rid, i)] = slot
        assert len(set(where.values())) == len(where) <= slots - 1
        sampled = {}
        for s in out.scheduled:
            req = sched.requests[s.request_id]
            end = s.start_pos + len(s.token_ids)
            for i, m in enumerate(req.mm_inputs):
                if m.offset < end and m.end > s.start_pos:
                    assert holds[where[(s.request_id, i)]] == (s.request_id, i)
                    if m.end <= end:
                        del where[(s.request_id, i)]
            if s.sample:
                sampled[s.request_id] = rng.randrange(1, 9)
        sched.update_from_output(out, sampled)
    while sched.has_unfinished_requests():
        out = sched.schedule()
        sched.update_from_output(out, {s.request_id: 1 for s in out.scheduled
                                       if s.sample})
    assert sched.num_preemptions > 0
    assert sched.encoder.num_free == slots - 1 and not sched.encoder.slots
