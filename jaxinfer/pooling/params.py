"""`PoolingParams` with vLLM's field names and meanings.

What jaxinfer serves of it: ``normalize`` (None: the model's default),
``dimensions`` (keep the first k values, for models trained to allow it),
``truncate_prompt_tokens`` (keep the last k prompt tokens). The fields that
belong to classification and reward models are refused by name.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

from ..errors import InvalidRequestError, UnsupportedFeatureError
from ..sampling_params import RequestOutputKind

# vLLM's pooling tasks that a decoder used as an embedder serves.
SERVED_TASKS = ("embed", "encode", "score")
# vLLM fields of the classify / reward tasks: refused when set.
REFUSED_FIELDS = {
    "activation": "classification / reward outputs (activation)",
    "softmax": "classification / reward outputs (softmax)",
    "step_tag_id": "process reward models (step_tag_id)",
    "returned_token_ids": "process reward models (returned_token_ids)",
    "extra_kwargs": "model-specific pooling arguments (extra_kwargs)",
}


@dataclasses.dataclass
class PoolingParams:
    truncate_prompt_tokens: int | None = None  # keep the last k prompt tokens
    dimensions: int | None = None  # keep the first k values (Matryoshka models)
    normalize: bool | None = None  # L2-normalize; None: the model's default
    activation: bool | None = None  # refused (classify / reward)
    softmax: bool | None = None  # refused (classify / reward)
    step_tag_id: int | None = None  # refused (process reward)
    returned_token_ids: list[int] | None = None  # refused (process reward)
    task: str | None = None  # embed | encode | score; set by the API called
    extra_kwargs: dict[str, Any] | None = None  # refused
    output_kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY

    def __post_init__(self) -> None:
        for name, feature in REFUSED_FIELDS.items():
            if getattr(self, name) is not None:
                raise UnsupportedFeatureError(
                    f"PoolingParams.{name}", feature,
                    f"jaxinfer pools embeddings only; leave {name} unset")
        t = self.truncate_prompt_tokens
        if t is not None and (not _is_int(t) or t < 1):
            raise InvalidRequestError(
                f"truncate_prompt_tokens must be an integer >= 1 or None, got {t!r}")
        d = self.dimensions
        if d is not None and (not _is_int(d) or d < 1):
            raise InvalidRequestError(
                f"dimensions must be an integer >= 1 or None, got {d!r}")
        if self.normalize is not None and not isinstance(self.normalize, bool):
            raise InvalidRequestError(
                f"normalize must be true, false or None, got {self.normalize!r}")
        if self.task is not None and self.task not in SERVED_TASKS:
            raise UnsupportedFeatureError(
                f"PoolingParams.task={self.task!r}",
                f"the pooling task {self.task!r}",
                f"the served tasks are {', '.join(SERVED_TASKS)}")
        if self.output_kind != RequestOutputKind.FINAL_ONLY:
            raise UnsupportedFeatureError(
                f"PoolingParams.output_kind={self.output_kind}",
                "streamed pooling outputs",
                "a pooled output has one final value; leave output_kind at "
                "FINAL_ONLY")

    def clone(self) -> PoolingParams:
        return dataclasses.replace(self)


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)
