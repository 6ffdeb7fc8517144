"""A model's parameters, placed in their sharding: random (``dummy``), an
orbax checkpoint restored in place, or safetensors / GGUF tensors read one
at a time. The target's runner and a draft model load alike."""

from __future__ import annotations

import dataclasses

from jaxinfer.models import ModelFiles, load_params
from jaxinfer.models.dummy import random_params
from jaxinfer.models.orbax_checkpoint import restore_params

from .placement import Placement


def load_weights(files: ModelFiles, model, cfg, dtype, placement: Placement,
                 load_format: str, seed: int) -> dict:
    if load_format == "dummy":  # random weights, drawn in their sharding
        params = random_params(model, cfg, dtype, placement.param_shardings,
                               seed=seed)
    elif files.format == "orbax":  # restored straight into the sharding
        params = restore_params(files.source, model, cfg, dtype,
                                placement.param_shardings)
    else:  # the weight list of the config the model runs (fused q/k/v)
        params = load_params(dataclasses.replace(files, config=cfg), dtype,
                             place=placement.place_param,
                             elsewhere=placement.elsewhere)
    return placement.finish_params(params)
