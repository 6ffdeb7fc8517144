"""Typed errors of the engine. Bad input is a ValueError subclass whose
message says what to change; the server answers these with HTTP 400. The
others say why a valid request could not be served, and carry the HTTP
status the servers answer them with."""


class InvalidRequestError(ValueError):
    """A request (prompt or sampling parameters) that cannot be served."""


class InvalidConfigError(ValueError):
    """Engine arguments that cannot work together; the message names the
    argument, its value and what it must be."""


class UnsupportedFeatureError(ValueError):
    """A vLLM flag, argument or request field whose feature jaxinfer does
    not have (yet). ``feature`` names it; the message says what to use
    instead. The CLI exits 2 on it, the server answers 400."""

    def __init__(self, name: str, feature: str, hint: str = ""):
        self.name = name  # the flag / argument / field as the user spelled it
        self.feature = feature  # e.g. "LoRA adapters", "structured output"
        msg = f"{name}: jaxinfer does not support {feature}"
        super().__init__(f"{msg}; {hint}" if hint else msg)


class UnsupportedQuantizationError(UnsupportedFeatureError):
    """``quantization`` names a method this engine does not implement."""


class ModelNotServedError(InvalidRequestError):
    """A request names a model or LoRA adapter the engine does not serve
    (or no longer does: another front end unloaded it). HTTP 404."""
    status = 404


class ServingError(RuntimeError):
    """A valid request the server cannot serve now (HTTP ``status``)."""
    status = 500


class QueueFullError(ServingError):
    """The waiting-queue limit is reached; answered with 503 and a
    Retry-After, so a client backs off instead of piling on."""
    status = 503


class ServerShuttingDownError(ServingError):
    """The server stopped accepting (SIGTERM), or its grace period ended
    before this request finished."""
    status = 503


class EngineDeadError(ServingError):
    """The engine loop stopped after an unexpected error; every request is
    answered with 500, /health fails and the server exits non-zero."""
    status = 500


class RequestFailedError(ServingError):
    """One request raised an unexpected error inside the engine loop; that
    request alone is failed and the loop goes on."""
    status = 500


def http_status(exc: BaseException) -> int:
    """The HTTP status a server answers ``exc`` with."""
    if isinstance(exc, (ServingError, ModelNotServedError)):
        return exc.status
    if isinstance(exc, ValueError):
        return 400
    return 500
