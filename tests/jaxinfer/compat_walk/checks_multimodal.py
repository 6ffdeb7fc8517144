"""Behaviour checks of the image rows: ``limit_mm_per_prompt``,
``allowed_local_media_path`` and ``chat_template_content_format``, on one
tiny LLaVA engine (``tests/tiny_llava.py``). The serve flags land in
EngineArgs / the app (``serve_flags_reach_their_fields``); what they do is
the engine rows' checks here, which use the same code the server does
(``jaxinfer.multimodal``)."""

from __future__ import annotations

import pytest

from jaxinfer import SamplingParams

from .registry import row_check

GREEDY = SamplingParams(temperature=0.0, max_tokens=3)


@pytest.fixture(scope="session")
def image_llm(tiny_llava_path, tmp_path_factory):
    """(LLM with limit 1 image and an allowed media folder, the folder)."""
    from jaxinfer import LLM
    from tests.tiny_llava import random_image
    media = tmp_path_factory.mktemp("walk-media")
    random_image(3).save(media / "in.png")
    llm = LLM(tiny_llava_path, max_model_len=128, num_gpu_blocks_override=64,
              max_num_seqs=2, limit_mm_per_prompt={"image": 1},
              allowed_local_media_path=str(media))
    return llm, media


def _image_chat(urls: list[str]) -> list[dict]:
    return [{"role": "user", "content": [
        *({"type": "image_url", "image_url": {"url": u}} for u in urls),
        {"type": "text", "text": "What is it?"}]}]


@row_check("engine_args", "limit_mm_per_prompt")
def image_limit_refuses_one_image_too_many(image_llm):
    from tests.tiny_llava import random_image
    llm, _ = image_llm
    one = {"prompt": "<image>\nWhat is it?",
           "multi_modal_data": {"image": random_image(1)}}
    assert len(llm.generate([one], GREEDY)[0].outputs[0].token_ids) == 3
    two = {"prompt": "<image>\n<image>\nWhat is it?",
           "multi_modal_data": {"image": [random_image(1), random_image(2)]}}
    with pytest.raises(ValueError, match="limit_mm_per_prompt"):
        llm.generate([two], GREEDY)


@row_check("engine_args", "allowed_local_media_path")
def local_files_only_inside_the_allowed_folder(image_llm, tmp_path):
    from tests.tiny_llava import random_image
    llm, media = image_llm
    out = llm.chat(_image_chat([(media / "in.png").as_uri()]), GREEDY,
                   use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3
    outside = tmp_path / "out.png"
    random_image(4).save(outside)
    with pytest.raises(ValueError, match="outside the allowed local media path"):
        llm.chat(_image_chat([outside.as_uri()]), GREEDY, use_tqdm=False)


@row_check("serve_flags", "chat_template_content_format")
def content_format_decides_what_the_template_sees(image_llm):
    """``string`` joins the text parts into one string for the template;
    ``openai`` hands it the list of parts: the rendered prompts differ."""
    llm, _ = image_llm
    template = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    conv = [{"role": "user", "content": [{"type": "text", "text": "a"},
                                         {"type": "text", "text": "b"}]}]
    ids = {fmt: llm.chat(conv, GREEDY, use_tqdm=False, chat_template=template,
                         chat_template_content_format=fmt)[0].prompt_token_ids
           for fmt in ("string", "openai")}
    assert ids["string"] != ids["openai"]
    text = llm.llm_engine.tokenizer.decode(ids["string"])
    assert "[a\nb]" in text, text
    from jaxinfer.entrypoints.cli import build_parser
    ns = build_parser().parse_args(
        ["serve", "m", "--chat-template-content-format", "openai"])
    assert ns.chat_template_content_format == "openai"


@row_check("serve_flags", "limit_mm_per_prompt", "allowed_local_media_path")
def serve_flags_reach_their_fields(rows, tmp_path):
    from jaxinfer.entrypoints.cli import build_parser
    from jaxinfer.entrypoints.openai.cli_args import serve_engine_args
    args = serve_engine_args(build_parser().parse_args(
        ["serve", "m", "--limit-mm-per-prompt", '{"image": 2}',
         "--allowed-local-media-path", str(tmp_path)]))
    assert args.limit_mm_per_prompt == {"image": 2}
    assert args.allowed_local_media_path == str(tmp_path)
