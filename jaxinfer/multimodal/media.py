"""Images from what clients send: PIL images (``LLM.generate``), base64
data URLs, and local files behind ``allowed_local_media_path``.

Remote URLs are refused: jaxinfer never fetches anything at run time, and
a server that fetched client-chosen URLs would reach whatever its network
reaches. Local files are read only inside the allowed folder (vLLM's
``--allowed-local-media-path``), resolved after following links, so
``..`` or a symlink cannot leave it. Every image is decoded completely
here, so a corrupt or truncated one fails its own request with a 400,
never the engine.
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


def check_image(image: Any, field: str):
    """A decoded PIL image within the size limit; raises
    InvalidRequestError naming ``field``."""
    from PIL import Image
    if not isinstance(image, Image.Image):
        raise InvalidRequestError(
            f"{field} must be a PIL.Image.Image, got {type(image).__name__}")
    w, h = image.size
    if w < 1 or h < 1:
        raise InvalidRequestError(f"{field} is empty ({w} x {h} pixels)")
    if w * h > MAX_IMAGE_PIXELS:
        raise InvalidRequestError(
            f"{field} is {w} x {h} = {w * h} pixels; at most "
            f"{MAX_IMAGE_PIXELS} are accepted: send a smaller image (the "
            "model resizes it to its own input size anyway)")
    try:
        image.load()
    except Exception as e:  # noqa: BLE001 - PIL raises many kinds
        raise InvalidRequestError(
            f"{field} could not be decoded as an image: {e}") from None
    return image


def decode_image_bytes(data: bytes, field: str):
    """Bytes of an image file (PNG, JPEG, ...) -> a decoded PIL image."""
    from PIL import Image
    try:
        image = Image.open(io.BytesIO(data))
    except Exception as e:  # noqa: BLE001 - not an image PIL can open
        raise InvalidRequestError(
            f"{field} is not an image PIL can read: {e}") from None
    # The size is known from the header; check it before decoding pixels.
    w, h = image.size
    if w * h > MAX_IMAGE_PIXELS:
        raise InvalidRequestError(
            f"{field} is {w} x {h} = {w * h} pixels; at most "
            f"{MAX_IMAGE_PIXELS} are accepted: send a smaller image")
    return check_image(image, field)


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
    return decode_image_bytes(data, field)


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
    path = os.path.realpath(urllib.request.url2pathname(parsed.path))
    root = os.path.realpath(allowed_local_media_path)
    if os.path.commonpath([root, path]) != root:
        raise InvalidRequestError(
            f"{field}: {path} is outside the allowed local media path {root}")
    if not os.path.isfile(path):
        raise InvalidRequestError(f"{field}: no such file {path}")
    with open(path, "rb") as f:
        return decode_image_bytes(f.read(), field)


def load_image_url(url: Any, allowed_local_media_path: str = "",
                   field: str = "image_url.url"):
    """An ``image_url`` part's URL -> a decoded PIL image."""
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
