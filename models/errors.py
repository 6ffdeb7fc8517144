"""Typed errors for models and their checkpoints.

Each subclasses ValueError (bad input, not a bug) so that callers and the
server can answer them as user errors.
"""


class ModelConfigError(ValueError):
    """The model's config is unsupported or malformed."""


class CheckpointError(ValueError):
    """A checkpoint file is missing, malformed or does not match the config."""


class MissingWeightError(CheckpointError):
    """A tensor the architecture needs is not in the checkpoint."""


class ShapeMismatchError(CheckpointError):
    """A checkpoint tensor's shape differs from what the config implies."""
