"""Errors in OpenAI's JSON shape, as vLLM returns them:
``{"error": {"message", "type", "param", "code"}}``.

Bad input is a ValueError (our ``InvalidRequestError`` included) and becomes
400; pydantic's validation errors are 400 too (not FastAPI's 422), so clients
see one status for every invalid parameter. A `ServingError` carries its own
status (503s with a Retry-After); anything else is a 500 in the same shape,
never a plain-text page.
"""

from __future__ import annotations

import http
import logging
from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ...errors import ServingError, http_status
from .protocol import ErrorInfo, ErrorResponse

# Seconds a client is asked to wait after a 503 (queue full, shutting down).
RETRY_AFTER_S = 1

logger = logging.getLogger(__name__)


class APIError(Exception):
    """An error with its HTTP status, raised by handlers."""

    def __init__(self, message: str, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.message, self.status, self.param = message, status, param


# Served names a model-not-found message lists (GET /v1/models has all).
LISTED_MODEL_NAMES = 5


class ModelNotFoundError(APIError):
    """A request's ``model`` names nothing served. The message shows at
    most 64 characters of the name and a few served names: an answer stays
    short however long the name or however many adapters are loaded."""

    def __init__(self, name: str, served: list[str]):
        shown = name if len(name) <= 64 else name[:64] + "..."
        listed = ", ".join(repr(n) for n in served[:LISTED_MODEL_NAMES])
        more = len(served) - LISTED_MODEL_NAMES
        if more > 0:
            listed += f" and {more} more (GET /v1/models lists them)"
        super().__init__(f"The model `{shown}` does not exist; this server "
                         f"serves {listed}.", 404, "model")


def error_type(status: int) -> str:
    """vLLM's error type names: the status phrase in CamelCase, ending in
    'Error' once (BadRequestError, InternalServerError)."""
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        return "Error"
    name = "".join(w.capitalize() for w in phrase.replace("-", " ").split())
    return name if name.endswith("Error") else name + "Error"


def error_headers(status: int) -> dict[str, str]:
    return {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else {}


def error_response(message: str, status: int = 400, param: str | None = None,
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
    body = ErrorResponse(error=ErrorInfo(message=message, type=error_type(status),
                                         param=param, code=status))
    return JSONResponse(body.model_dump(), status_code=status,
                        headers={**error_headers(status), **(headers or {})})


def sse_error(message: str, status: int = 400) -> str:
    """An error inside an event stream (after the 200 was sent)."""
    body = ErrorResponse(error=ErrorInfo(message=message, type=error_type(status),
                                         code=status))
    return f"data: {body.model_dump_json()}\n\n"


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    parts, param = [], None
    for err in exc.errors()[:5]:
        if err.get("type") == "json_invalid":  # loc holds a character offset
            reason = err.get("ctx", {}).get("error", "invalid")
            pos = err.get("loc", ("?",))[-1]
            parts.append(f"the body is not valid JSON ({reason} at character {pos})")
            continue
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        if param is None and loc:
            param = loc[0]
        parts.append(f"{'.'.join(loc) or 'body'}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request", param


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api(_: Request, exc: APIError):
        return error_response(exc.message, exc.status, exc.param)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError):
        message, param = _validation_message(exc)
        return error_response(message, 400, param)

    @app.exception_handler(ValueError)
    async def _value(_: Request, exc: ValueError):
        status = http_status(exc)  # 404 for a model no longer served
        return error_response(str(exc), status,
                              "model" if status == 404 else None)

    @app.exception_handler(ServingError)
    async def _serving(_: Request, exc: ServingError):
        return error_response(str(exc), exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException):
        # Keeps the exception's headers: a 405 must say what is Allowed.
        return error_response(str(exc.detail), exc.status_code,
                              headers=exc.headers)

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception):
        logger.exception("unhandled error in a request handler")
        return error_response(f"internal server error: {exc!r}", 500)
