"""Typed errors of the engine. Bad input is a ValueError subclass whose
message says what to change; the server answers these with HTTP 400."""


class InvalidRequestError(ValueError):
    """A request (prompt or sampling parameters) that cannot be served."""
