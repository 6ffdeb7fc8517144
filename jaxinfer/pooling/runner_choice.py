"""Which runner an engine is: vLLM's ``runner`` (generate / pooling), its
older ``task`` names and ``convert``, resolved to one answer with typed
errors for the combinations that contradict each other, and the engine
settings a pooling engine refuses."""

from __future__ import annotations

from typing import Any

from ..errors import InvalidConfigError, UnsupportedFeatureError

RUNNERS = ("auto", "generate", "pooling")
CONVERTS = ("auto", "none", "embed")
# vLLM's task names -> the runner that serves them here.
TASKS = {"auto": None, "generate": "generate", "embed": "pooling",
         "embedding": "pooling", "score": "pooling", "encode": "pooling"}
UNSERVED_TASKS = ("classify", "reward", "transcription", "draft")


def resolve_runner(args: Any) -> str:
    """"generate" or "pooling" for EngineArgs ``args``; ``auto`` is
    generate (every architecture jaxinfer serves is a generative one,
    used as an embedder only when asked)."""
    runner, task, convert = args.runner, args.task, args.convert
    if runner not in RUNNERS:
        raise InvalidConfigError(
            f"runner must be one of {', '.join(RUNNERS)}, got {runner!r}")
    if convert not in CONVERTS:
        raise InvalidConfigError(
            f"convert must be one of {', '.join(CONVERTS)}, got {convert!r}")
    if task in UNSERVED_TASKS:
        raise UnsupportedFeatureError(
            f"task={task!r}", f"the {task} task",
            "jaxinfer serves generate and embed (runner='pooling')")
    if task is not None and task not in TASKS:
        raise InvalidConfigError(
            f"task must be one of {', '.join(TASKS)}, got {task!r}")
    wanted = {w for w in (None if runner == "auto" else runner,
                          TASKS.get(task) if task else None,
                          "pooling" if convert == "embed" else None) if w}
    if len(wanted) > 1:
        raise InvalidConfigError(
            f"runner={runner!r}, task={task!r} and convert={convert!r} ask "
            "for both generation and pooling: give runner='pooling' (or "
            "task='embed') for an embedding model, or neither")
    chosen = wanted.pop() if wanted else "generate"
    if chosen == "pooling" and convert == "none":
        raise InvalidConfigError(
            "convert='none' keeps a generative model as it is, which cannot "
            "pool: drop convert (a decoder is served as an embedder by "
            "runner='pooling')")
    return chosen


def check_pooling_engine(args: Any, model_config: Any, num_processes: int
                         ) -> None:
    """Refuses, by name, the engine settings a pooling engine lacks."""
    refused = []
    if args.enable_lora:
        refused.append("enable_lora (LoRA adapters)")
    if args.pipeline_parallel_size > 1:
        refused.append("pipeline_parallel_size > 1")
    if args.warmup:
        refused.append("warmup (a pooling engine builds its programs on "
                       "first use)")
    if num_processes > 1:
        refused.append("a multi-process engine")
    if getattr(model_config, "image_input", None) is not None:
        refused.append(f"a model that takes images ({model_config.architecture})")
    if refused:
        raise UnsupportedFeatureError(
            "runner='pooling'", "pooling with " + "; ".join(refused),
            "drop it, or serve the model for generation")
