"""Images from what clients send: PIL images (``LLM.generate``), base64
data URLs, and local files behind ``allowed_local_media_path``.

Remote URLs are refused: jaxinfer never fetches anything at run time, and
a server that fetched client-chosen URLs would reach whatever its network
reaches. Local files are read only inside the allowed folder (vLLM's
``--allowed-local-media-path``), resolved after following links, so
``..`` or a symlink cannot leave it. The images of a prompt are first
opened (PIL reads only the header) and their sizes checked, each and all
together, so an image bomb is refused before a pixel is decoded; then
each is decoded completely here, so a corrupt or truncated one fails its
own request with a 400, never the engine.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import os
import urllib.parse
import urllib.request
from typing import Any

from ..errors import InvalidRequestError

# Larger images are refused before they are decoded (a small compressed
# file can expand to gigabytes of pixels). 32 Mpx is above any camera
# frame a vision tower would be shown; the tower sees a few hundred pixels
# a side anyway.
MAX_IMAGE_PIXELS = 1 << 25
# All images of one prompt together, also checked from their headers
# before any is decoded: what one request may make the server decode
# (4 bytes a pixel at most: RGBA).
MAX_PROMPT_IMAGE_PIXELS = 1 << 26
# A local file (file:// URL) is read only up to this size; data URLs are
# bounded by the request body limit.
MAX_IMAGE_FILE_BYTES = 1 << 25


def _check_size(image: Any, field: str) -> None:
    w, h = image.size
    if w < 1 or h < 1:
        raise InvalidRequestError(f"{field} is empty ({w} x {h} pixels)")
    if w * h > MAX_IMAGE_PIXELS:
        raise InvalidRequestError(
            f"{field} is {w} x {h} = {w * h} pixels; at most "
            f"{MAX_IMAGE_PIXELS} are accepted: send a smaller image (the "
            "model resizes it to its own input size anyway)")


def check_image(image: Any, field: str):
    """A decoded PIL image within the size limit; raises
    InvalidRequestError naming ``field``."""
    from PIL import Image
    if not isinstance(image, Image.Image):
        raise InvalidRequestError(
            f"{field} must be a PIL.Image.Image, got {type(image).__name__}")
    _check_size(image, field)
    try:
        image.load()
    except Exception as e:  # noqa: BLE001 - PIL raises many kinds
        raise InvalidRequestError(
            f"{field} could not be decoded as an image: {e}") from None
    return image


def check_images(images: list, fields: list[str]) -> list:
    """Images (opened, maybe not yet decoded) checked together: each
    within the size limit and all within ``MAX_PROMPT_IMAGE_PIXELS``, from
    their headers, before any is decoded; then decoded (`check_image`)."""
    from PIL import Image
    total = 0
    for image, field in zip(images, fields):
        if isinstance(image, Image.Image):
            _check_size(image, field)
            total += image.size[0] * image.size[1]
    if total > MAX_PROMPT_IMAGE_PIXELS:
        raise InvalidRequestError(
            f"the prompt's {len(images)} images hold {total} pixels; at most "
            f"{MAX_PROMPT_IMAGE_PIXELS} are accepted in one prompt: send "
            "fewer or smaller images")
    return [check_image(image, field) for image, field in zip(images, fields)]


def open_image_bytes(data: bytes, field: str):
    """Bytes of an image file (PNG, JPEG, ...) -> a PIL image whose header
    is read and checked (size) but whose pixels are not decoded yet."""
    from PIL import Image
    try:
        image = Image.open(io.BytesIO(data))
    except Exception as e:  # noqa: BLE001 - not an image PIL can open
        raise InvalidRequestError(
            f"{field} is not an image PIL can read: {e}") from None
    _check_size(image, field)  # from the header, before decoding pixels
    return image


def decode_image_bytes(data: bytes, field: str):
    """Bytes of an image file (PNG, JPEG, ...) -> a decoded PIL image."""
    return check_image(open_image_bytes(data, field), field)


def _data_url(url: str, field: str):
    header, sep, payload = url[len("data:"):].partition(",")
    if not sep:
        raise InvalidRequestError(
            f"{field} is a malformed data URL: expected "
            "'data:image/<type>;base64,<data>'")
    media_type, _, encoding = header.partition(";")
    if encoding.strip().lower() != "base64":
        raise InvalidRequestError(
            f"{field}: only base64 data URLs are accepted "
            "('data:image/png;base64,...')")
    if media_type and not media_type.lower().startswith("image/"):
        raise InvalidRequestError(
            f"{field} has media type {media_type!r}; an image_url part needs "
            "an image (image/png, image/jpeg, ...)")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise InvalidRequestError(
            f"{field} holds invalid base64 data: {e}") from None
    return open_image_bytes(data, field)


def _file_url(url: str, allowed_local_media_path: str, field: str):
    if not allowed_local_media_path:
        raise InvalidRequestError(
            f"{field}: local files are not read unless the server is started "
            "with --allowed-local-media-path DIR (LLM(allowed_local_media_path"
            "=...)); send the image as a data URL instead")
    parsed = urllib.parse.urlparse(url)
    if parsed.netloc not in ("", "localhost"):
        raise InvalidRequestError(
            f"{field}: a file URL must name a local path (file:///path), "
            f"got host {parsed.netloc!r}")
    # The answers name the rule broken, never the path resolved (it would
    # show where links lead and how the server's disk is laid out).
    path = os.path.realpath(urllib.request.url2pathname(parsed.path))
    root = os.path.realpath(allowed_local_media_path)
    if os.path.commonpath([root, path]) != root:
        raise InvalidRequestError(
            f"{field}: the file is outside the allowed local media path "
            "(--allowed-local-media-path; links are followed before the "
            "check)")
    if not os.path.isfile(path):
        raise InvalidRequestError(
            f"{field}: no such file under the allowed local media path")
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_IMAGE_FILE_BYTES + 1)
    except OSError:
        raise InvalidRequestError(f"{field}: the file could not be read"
                                  ) from None
    if len(data) > MAX_IMAGE_FILE_BYTES:
        raise InvalidRequestError(
            f"{field}: the file is over {MAX_IMAGE_FILE_BYTES} bytes; send a "
            "smaller image")
    return open_image_bytes(data, field)


def load_image_url(url: Any, allowed_local_media_path: str = "",
                   field: str = "image_url.url"):
    """An ``image_url`` part's URL -> a decoded PIL image."""
    return check_image(open_image_url(url, allowed_local_media_path, field),
                       field)


def open_image_url(url: Any, allowed_local_media_path: str = "",
                   field: str = "image_url.url"):
    """An ``image_url`` part's URL -> a PIL image, its header checked
    (`open_image_bytes`), not decoded yet."""
    if not isinstance(url, str) or not url:
        raise InvalidRequestError(f"{field} must be a non-empty string")
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        return _data_url(url, field)
    if scheme == "file":
        return _file_url(url, allowed_local_media_path, field)
    if scheme in ("http", "https"):
        raise InvalidRequestError(
            f"{field}: remote image URLs are not fetched (jaxinfer downloads "
            "nothing at run time); send the image inline as a data URL "
            "('data:image/png;base64,...')")
    raise InvalidRequestError(
        f"{field} must be a data URL ('data:image/png;base64,...') or, with "
        "--allowed-local-media-path, a file:// URL; got "
        f"{url[:40]!r}{'...' if len(url) > 40 else ''}")


def image_hash(image) -> str:
    """Of the image's content (mode, size and pixel bytes): two requests
    with the same picture share prefix-cache pages, different pictures
    behind the same placeholder tokens never do."""
    h = hashlib.sha256(f"{image.mode}:{image.size[0]}x{image.size[1]}:"
                       .encode())
    h.update(image.tobytes())
    return h.hexdigest()
