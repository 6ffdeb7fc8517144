"""Chat messages with image parts -> the conversation a chat template
renders, and the images in the order their placeholders appear (vLLM's
rules, shared by `LLM.chat` and `/v1/chat/completions`).

Content parts: ``text``; ``image_url`` (``{"url": ...}``: a base64 data
URL, or a file:// URL under ``allowed_local_media_path``); ``image_pil``
(a PIL image, offline only). Audio, video and embedding parts are refused.

How a message's content reaches the template is vLLM's
``chat_template_content_format``: ``string`` (the text parts joined by
newlines, each image's placeholder on a line of its own before the text,
unless the text already holds it) or ``openai`` (the parts as a list,
images as ``{"type": "image"}``, for templates that loop over a message's
content, as LLaVA's does). ``auto`` reads the template to tell which.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import InvalidRequestError, UnsupportedFeatureError
from .media import check_image, check_images, open_image_url

CONTENT_FORMATS = ("auto", "string", "openai")
# Parts that would carry media jaxinfer does not take.
REFUSED_PARTS = {"input_audio": "audio inputs", "audio_url": "audio inputs",
                 "video_url": "video inputs",
                 "image_embeds": "image embeddings as input"}


def detect_content_format(template: Any) -> str:
    """"openai" if the template loops over a message's content (then it
    expects a list of parts), else "string"."""
    if not isinstance(template, str):
        return "string"
    import jinja2
    from jinja2 import nodes
    try:
        tree = jinja2.Environment().parse(template)
    except jinja2.TemplateSyntaxError:
        return "string"

    def reads_content(node) -> bool:
        while isinstance(node, nodes.Filter):  # content | selectattr(...)
            node = node.node
        if isinstance(node, nodes.Getitem):
            return isinstance(node.arg, nodes.Const) and node.arg.value == "content"
        return isinstance(node, nodes.Getattr) and node.attr == "content"

    return ("openai" if any(reads_content(loop.iter)
                            for loop in tree.find_all(nodes.For))
            else "string")


def _image_of(part: dict, kind: str, where: str, allowed_local_media_path: str):
    """The part's image, opened (header checked) but not decoded."""
    if kind == "image_pil":
        return check_image(part.get("image_pil"), f"{where}.image_pil")
    spec = part.get("image_url")
    url = spec.get("url") if isinstance(spec, dict) else spec
    return open_image_url(url, allowed_local_media_path, f"{where}.image_url.url")


def _part_kind(part: Any) -> str | None:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind is None and isinstance(part, dict) and "image_url" in part:
        kind = "image_url"  # vLLM's short form {"image_url": url}
    return kind


def count_images(messages: list[dict]) -> int:
    return sum(_part_kind(part) in ("image_url", "image_pil")
               for message in messages if isinstance(message, dict)
               and isinstance(message.get("content"), list)
               for part in message["content"])


def parse_chat_messages(messages: list[dict], *, content_format: str,
                        placeholder: str, allowed_local_media_path: str = "",
                        on_first_image: Callable[[], None] | None = None,
                        check_count: Callable[[int], None] | None = None
                        ) -> tuple[list[dict], list]:
    """(messages for the template, their images in order, decoded).

    Before any image is opened, ``on_first_image`` runs if there is one (a
    text-only model refuses there, so it is the model, not the URL, that
    the error names) and ``check_count`` with their number; then every
    image's header is read and the sizes checked, and only then are they
    decoded (`media.check_images`)."""
    if content_format not in CONTENT_FORMATS[1:]:
        raise ValueError(f"content_format must be 'string' or 'openai', got "
                         f"{content_format!r}")
    n_total = count_images(messages)
    if n_total:
        if on_first_image is not None:
            on_first_image()
        if check_count is not None:
            check_count(n_total)
    fields: list[str] = []
    out, images = [], []
    for m, message in enumerate(messages):
        msg = dict(message)
        content = msg.get("content")
        if content is None:  # e.g. an assistant turn that only called tools
            msg["content"] = "" if content_format == "string" else []
            out.append(msg)
            continue
        if isinstance(content, str):
            if content_format == "openai":
                msg["content"] = [{"type": "text", "text": content}]
            out.append(msg)
            continue
        texts, parts, n_images = [], [], 0
        for p, part in enumerate(content):
            where = f"messages[{m}].content[{p}]"
            kind = _part_kind(part)
            if kind == "text":
                texts.append(part.get("text", ""))
                parts.append({"type": "text", "text": part.get("text", "")})
            elif kind in ("image_url", "image_pil"):
                images.append(_image_of(part, kind, where,
                                        allowed_local_media_path))
                fields.append(where)
                parts.append({"type": "image"})
                n_images += 1
            elif kind in REFUSED_PARTS:
                raise UnsupportedFeatureError(
                    f"{where}.type={kind!r}", REFUSED_PARTS[kind],
                    "send text and images only")
            else:
                raise InvalidRequestError(
                    f"{where} has type {kind!r}; the content part types are "
                    "'text', 'image_url' (and 'image_pil' offline)")
        if content_format == "openai":
            msg["content"] = parts
        else:
            msg["content"] = _string_content("\n".join(texts), n_images,
                                             placeholder, f"messages[{m}]")
        out.append(msg)
    return out, check_images(images, fields)


def _string_content(text: str, n_images: int, placeholder: str,
                    where: str) -> str:
    """vLLM's string form: the placeholders the text lacks, one a line,
    before it."""
    if not n_images:
        return text
    present = text.count(placeholder)
    if present > n_images:
        raise InvalidRequestError(
            f"{where} holds {present} {placeholder!r} placeholders but "
            f"{n_images} image(s)")
    return "\n".join([placeholder] * (n_images - present) + [text])
