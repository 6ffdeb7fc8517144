"""Typed errors of the engine. Bad input is a ValueError subclass whose
message says what to change; the server answers these with HTTP 400."""


class InvalidRequestError(ValueError):
    """A request (prompt or sampling parameters) that cannot be served."""


class InvalidConfigError(ValueError):
    """Engine arguments that cannot work together; the message names the
    argument, its value and what it must be."""
