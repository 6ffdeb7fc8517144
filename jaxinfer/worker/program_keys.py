"""What names one compiled step program.

A step runs a forward pass and a sampler (with, when asked for, the
prompt-logprob program, and before it the penalty counting of fresh
slots), or one window of decode steps. Each compiled program is found by its key: the
program's kind, its static arguments, and the structure and shapes of its
per-step inputs (the params, pages and LoRA pool never change shape, so
only whether the pool is passed). Keys are named tuples: fields read by
name, and a key is hashable, compares by value and has a stable ``repr``
(the executable cache's file names are digests of it).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax

from .buckets import Bucket

FORWARD, SAMPLE, WINDOW = "forward", "sample", "window"
# A speculative engine's sampler: draws at each scored position, then
# accepts drafts (spec_decode/verify.py).
VERIFY = "verify"
PROMPT_LOGPROBS, COUNT = "prompt_logprobs", "count"


class InputShapes(NamedTuple):
    """The structure and leaf shapes of a program's per-step inputs."""
    tree: Any  # jax PyTreeDef
    leaves: tuple[tuple[tuple[int, ...], str], ...]  # (shape, dtype) each


def input_shapes(per_step) -> InputShapes:
    leaves, tree = jax.tree_util.tree_flatten(per_step)
    return InputShapes(tree, tuple((tuple(x.shape), str(x.dtype))
                                   for x in leaves))


class ModelProgram(NamedTuple):
    """A bucket's model program whatever its input variant: what a step
    waits for when none was built (`StepPrograms.will_build`)."""
    num_steps: int  # 1: the forward pass; k > 1: a window of k decode steps
    bucket: Bucket


class ForwardKey(NamedTuple):
    """The forward pass over a bucket's tokens -> logits and pages."""
    kind: str  # FORWARD
    bucket: Bucket
    inputs: InputShapes  # packed buffer, logits indices, encoder inputs
    with_lora: bool

    @classmethod
    def of(cls, bucket: Bucket, per_step, with_lora: bool) -> ForwardKey:
        return cls(FORWARD, bucket, input_shapes(per_step), with_lora)

    @property
    def model_program(self) -> ModelProgram:
        return ModelProgram(1, self.bucket)


class SampleKey(NamedTuple):
    """The sampler over a forward pass's logits."""
    kind: str  # SAMPLE, or VERIFY (with drafts)
    num_logprobs: int | None  # top-K logprobs returned (static)
    inputs: InputShapes  # logits, penalty state, sampling arrays, drafts

    @classmethod
    def of(cls, num_logprobs: int | None, per_step,
           kind: str = SAMPLE) -> SampleKey:
        return cls(kind, num_logprobs, input_shapes(per_step))

    @property
    def model_program(self) -> None:
        return None  # small: never waited for


class WindowKey(NamedTuple):
    """``num_steps`` decode steps in one program (multi-step scheduling)."""
    kind: str  # WINDOW
    num_steps: int
    bucket: Bucket
    inputs: InputShapes  # packed buffer, sampling arrays, stop ids
    with_lora: bool

    @classmethod
    def of(cls, num_steps: int, bucket: Bucket, per_step,
           with_lora: bool) -> WindowKey:
        return cls(WINDOW, num_steps, bucket, input_shapes(per_step),
                   with_lora)

    @property
    def model_program(self) -> ModelProgram:
        return ModelProgram(self.num_steps, self.bucket)


class AuxKey(NamedTuple):
    """A small program beside the model's: prompt logprobs over a bucket's
    T rows, or the penalty counting of fresh slots."""
    kind: str  # PROMPT_LOGPROBS or COUNT
    static: tuple  # (num_logprobs,) or ()
    inputs: InputShapes

    @classmethod
    def of(cls, kind: str, static: tuple, per_step) -> AuxKey:
        return cls(kind, static, input_shapes(per_step))

    @property
    def model_program(self) -> None:
        return None  # small: never waited for


ProgramKey = ForwardKey | SampleKey | WindowKey | AuxKey


class ProgramBuild(NamedTuple):
    """How to build one program ahead: ``jitted.lower(*static, *args)``."""
    jitted: Any
    static: tuple
    args: tuple  # arrays or ShapeDtypeStructs
