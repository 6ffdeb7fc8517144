"""Typed errors of the engine. Bad input is a ValueError subclass whose
message says what to change; the server answers these with HTTP 400."""


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
