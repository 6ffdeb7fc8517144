"""Errors in OpenAI's JSON shape, as vLLM returns them:
``{"error": {"message", "type", "param", "code"}}``.

Bad input is a ValueError (our ``InvalidRequestError`` included) and becomes
400; pydantic's validation errors are 400 too (not FastAPI's 422), so clients
see one status for every invalid parameter.
"""

from __future__ import annotations

import http
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ...engine.async_engine import EngineDeadError, QueueFullError
from .protocol import ErrorInfo, ErrorResponse

logger = logging.getLogger(__name__)


class APIError(Exception):
    """An error with its HTTP status, raised by handlers."""

    def __init__(self, message: str, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.message, self.status, self.param = message, status, param


class ModelNotFoundError(APIError):
    def __init__(self, name: str, served: list[str]):
        super().__init__(f"The model `{name}` does not exist; this server "
                         f"serves {served}.", 404, "model")


def error_type(status: int) -> str:
    """vLLM's error type names: the status phrase in CamelCase + 'Error'."""
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        return "Error"
    return "".join(w.capitalize() for w in phrase.replace("-", " ").split()) + "Error"


def error_response(message: str, status: int = 400,
                   param: str | None = None) -> JSONResponse:
    body = ErrorResponse(error=ErrorInfo(message=message, type=error_type(status),
                                         param=param, code=status))
    return JSONResponse(body.model_dump(), status_code=status)


def sse_error(message: str, status: int = 400) -> str:
    """An error inside an event stream (after the 200 was sent)."""
    body = ErrorResponse(error=ErrorInfo(message=message, type=error_type(status),
                                         code=status))
    return f"data: {body.model_dump_json()}\n\n"


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    parts, param = [], None
    for err in exc.errors()[:5]:
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
        return error_response(str(exc), 400)

    @app.exception_handler(QueueFullError)
    async def _full(_: Request, exc: QueueFullError):
        return error_response(str(exc), 503)

    @app.exception_handler(EngineDeadError)
    async def _dead(_: Request, exc: EngineDeadError):
        return error_response(str(exc), 500)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException):
        return error_response(str(exc.detail), exc.status_code)
