"""The pooler read from sentence-transformers' files, the runner chosen
from vLLM's runner / task / convert names, and the host's assembly of a
prompt's pooled vector from its chunks (restarted when a preempted prompt
is recomputed from position 0)."""

from __future__ import annotations

import json
import types

import numpy as np
import pytest

from jaxinfer.errors import InvalidConfigError, UnsupportedFeatureError
from jaxinfer.pooling.config import pooler_config
from jaxinfer.pooling.rows import PooledRows
from jaxinfer.pooling.runner_choice import resolve_runner


def _folder(tmp_path, pooling: dict | None, normalize=False, config=None):
    (tmp_path / "config.json").write_text(json.dumps(config or {}))
    if pooling is None:
        return str(tmp_path)
    modules = [{"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return str(tmp_path)


def test_sentence_transformers_files(tmp_path):
    cfg = pooler_config(_folder(tmp_path, {"pooling_mode_cls_token": True,
                                           "pooling_mode_mean_tokens": False},
                                normalize=True,
                                config={"matryoshka_dimensions": [8, 16]}))
    assert (cfg.pooling_type, cfg.normalize, cfg.matryoshka_dimensions) == (
        "CLS", True, (8, 16))


def test_defaults_without_files(tmp_path):
    cfg = pooler_config(_folder(tmp_path, None))
    assert (cfg.pooling_type, cfg.normalize, cfg.matryoshka_dimensions) == (
        "LAST", True, None)
    assert pooler_config(None).pooling_type == "LAST"


@pytest.mark.parametrize("pooling,error", [
    ({"pooling_mode_max_tokens": True}, UnsupportedFeatureError),
    ({"pooling_mode_mean_tokens": True, "pooling_mode_lasttoken": True},
     InvalidConfigError),
    ({}, InvalidConfigError),
])
def test_unserved_or_ambiguous_modes_are_refused(tmp_path, pooling, error):
    with pytest.raises(error):
        pooler_config(_folder(tmp_path, pooling))


def _args(runner="auto", task=None, convert="auto"):
    return types.SimpleNamespace(runner=runner, task=task, convert=convert)


@pytest.mark.parametrize("kw,want", [
    ({}, "generate"), ({"runner": "pooling"}, "pooling"),
    ({"task": "embed"}, "pooling"), ({"task": "embedding"}, "pooling"),
    ({"convert": "embed"}, "pooling"), ({"task": "generate"}, "generate"),
    ({"runner": "pooling", "task": "embed", "convert": "embed"}, "pooling"),
])
def test_runner_names(kw, want):
    assert resolve_runner(_args(**kw)) == want


@pytest.mark.parametrize("kw,error", [
    ({"runner": "generate", "task": "embed"}, InvalidConfigError),
    ({"runner": "pooling", "convert": "none"}, InvalidConfigError),
    ({"task": "reward"}, UnsupportedFeatureError),
    ({"runner": "draft"}, InvalidConfigError),
])
def test_contradicting_runner_names_are_refused(kw, error):
    with pytest.raises(error):
        resolve_runner(_args(**kw))


def _row(rid, start, n, last):
    return types.SimpleNamespace(request_id=rid, start_pos=start,
                                 token_ids=[0] * n, sample=last)


@pytest.mark.parametrize("pooling", ["MEAN", "CLS", "LAST"])
def test_chunks_add_up_and_restart_at_position_zero(pooling):
    rng = np.random.default_rng(0)
    hidden = rng.normal(size=(10, 4)).astype(np.float32)  # one prompt, 10 tokens
    want = {"MEAN": hidden.mean(0), "CLS": hidden[0], "LAST": hidden[-1]}[pooling]

    def reduce(lo, hi):  # what the device returns for one chunk's row
        return np.stack([hidden[lo:hi].sum(0), hidden[lo], hidden[hi - 1]])[None]

    rows = PooledRows(pooling)
    assert rows.add([_row("a", 0, 4, False)], reduce(0, 4)) == {}
    # Preempted by recompute: the prompt starts over at position 0.
    assert rows.add([_row("a", 0, 3, False)], reduce(0, 3)) == {}
    assert rows.add([_row("a", 3, 4, False)], reduce(3, 7)) == {}
    done = rows.add([_row("a", 7, 3, True)], reduce(7, 10))
    np.testing.assert_allclose(done["a"], want, atol=1e-6)
    assert not rows._sums and not rows._first  # nothing kept after the end
