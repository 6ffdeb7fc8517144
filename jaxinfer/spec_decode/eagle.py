"""An EAGLE head's side of speculative decoding (``method: "eagle"`` or
``"eagle3"``, Llama-family targets): the head (models/eagle.py) drafts
greedily from the target's own hidden states.

Its pages ride the target's block tables, as a draft model's do
(draft_model.py): one layer of K/V, and a pool of the target's hidden
states at the head's taps, ``[1, num_pages, B, W]`` (W = D for EAGLE-1,
3D for EAGLE-3), so allocation, rollback, prefix-cache hits, preemption
and swaps cover both.

The head at position p reads the pair (x_{p+1}, h_p). A step's token x_q
at position q is therefore paired with h_{q-1} and computed at position
q - 1 (position -1 writes the null page). Per step, on the device:

1. `propose`: each drafted row, first input x_n at position n: the pair
   (x_n, h_{n-1}) at n - 1 gives draft 1 (h_{n-1} from the pool, written by
   an earlier step); then (draft_i, the head's own output feature) at
   n - 1 + i gives draft i + 1. Writes past the row's drafts go to the
   null page.
2. `place_inputs` writes the drafts into the target step's inputs.
3. The target's step verifies them and returns its hidden states at the
   taps for all T tokens (step_functions.forward's ``taps``).
4. `mirror`: those hidden states go into the pool at the step's slots,
   then the head runs over the step's pairs, filling its K/V (rejected
   drafts' entries are overwritten when their positions come again).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.models import model_class
from jaxinfer.models.config import load_hf_config
from jaxinfer.models.eagle import EagleConfig, EagleHead, eagle_config, read_head_weights
from jaxinfer.models.errors import ModelConfigError
from jaxinfer.models.llama import LlamaForCausalLM
from jaxinfer.models.runtime import model_constants
from jaxinfer.models.safetensors_loader import SafetensorsReader
from jaxinfer.pallas_kernels import kv_pages_shape

from ..errors import InvalidConfigError, UnsupportedFeatureError
from ..worker.buckets import Bucket
from ..worker.kv_dtype import has_page_scales, page_bytes
from ..worker.packing import unpack_step
from ..worker.page_ops import PageMover
from ..worker.step_functions import window_step
from .draft_model import PagedDrafter, inject_drafts

logger = logging.getLogger(__name__)


def _apply(head, params, constants, *args, method="__call__"):
    return head.apply({"params": params, "constants": constants}, *args,
                      method=method)


def head_view(md, positions, block_size: int):
    """(positions [T], metadata) of the head's pass over a target step: each
    token one position back (its pair's), its K/V slot read from its row's
    block table; position -1 and padding write the null page."""
    S, P = md.block_tables.shape
    T = positions.shape[0]
    tok = jnp.arange(T, dtype=jnp.int32)
    seq = jnp.minimum(jnp.searchsorted(md.cu_q_lens[1:], tok, side="right"),
                      S - 1).astype(jnp.int32)
    pos = positions - 1
    ok = (tok < md.cu_q_lens[md.num_seqs[0]]) & (pos >= 0)
    pos = jnp.maximum(pos, 0)
    page = md.block_tables[seq, jnp.minimum(pos // block_size, P - 1)]
    real_row = jnp.arange(S, dtype=jnp.int32) < md.num_seqs[0]
    return pos, dataclasses.replace(
        md, slot_mapping=jnp.where(ok, page * block_size + pos % block_size, 0),
        kv_lens=jnp.where(real_row, jnp.maximum(md.kv_lens - 1, 0), 0))


def mirror_head(head, block_size, bucket, params, pages, constants, packed,
                hidden):
    """The target step's ``hidden`` [T, W] into the pool at its slots, then
    the head's K/V of the step's pairs. ``pages``: [(k, v), (pool,)]."""
    input_ids, positions, md = unpack_step(packed, bucket)
    pool = pages[1][0]
    flat = pool.reshape(-1, pool.shape[-1]).at[md.slot_mapping].set(
        hidden.astype(pool.dtype))
    pos, md_h = head_view(md, positions, block_size)
    features = _apply(head, params, constants, flat[md_h.slot_mapping],
                      method="combine")
    _, kv = _apply(head, params, constants, input_ids, pos, pages[:1], md_h,
                   features)
    return [kv[0], (flat.reshape(pool.shape),)]


def propose_head(head, block_size, num_steps, bucket, params, pages,
                 constants, packed, num_drafts):
    """``num_steps`` greedy head steps from each row's first input, laid
    out one position back (`proposal_inputs` with shift -1): step i's K/V
    lands at that position + i when i < ``num_drafts`` [S], else in the
    null page. Returns (tokens [num_steps, S], pages)."""
    input_ids, positions, md = unpack_step(packed, bucket)
    pool = pages[1][0]
    features = _apply(head, params, constants,
                      pool.reshape(-1, pool.shape[-1])[md.slot_mapping],
                      method="combine")
    S = md.block_tables.shape[0]
    tok_drafts = num_drafts[jnp.minimum(jnp.arange(input_ids.shape[0]), S - 1)]

    def one_step(i, carry):
        kv, ids, features, tokens = carry
        pos, md_i = window_step(md, positions, i, block_size,
                                writes=i < tok_drafts)
        features, kv = _apply(head, params, constants, ids, pos, kv, md_i,
                              features)
        new = _apply(head, params, constants, features[:S],
                     method="draft_ids")
        ids = jnp.zeros_like(ids).at[:S].set(new)
        return kv, ids, features, tokens.at[i].set(new)

    tokens = jnp.zeros((num_steps, S), jnp.int32)
    kv, _, _, tokens = jax.lax.fori_loop(
        0, num_steps, one_step, (pages[:1], input_ids, features, tokens))
    return tokens, [kv[0], pages[1]]


def read_eagle_config(method: str, source: str, target_cfg) -> EagleConfig:
    """The head's config (its config.json and tensor names), checked
    against the target's: typed errors for what cannot be served."""
    if model_class(target_cfg.architecture) is not LlamaForCausalLM:
        raise UnsupportedFeatureError(
            f"speculative_config.method={method!r}",
            f"an EAGLE head for a {target_cfg.architecture} target",
            "EAGLE heads are served for Llama-family targets; use "
            "'draft_model' or 'ngram'")
    if not os.path.isdir(source):
        raise InvalidConfigError(
            f"speculative_config.model {source!r} must be an EAGLE head's "
            "folder (config.json and safetensors)")
    if not any(f.endswith(".safetensors") for f in os.listdir(source)):
        raise UnsupportedFeatureError(
            f"speculative_config.model={source!r}",
            "an EAGLE head without safetensors (pytorch_model.bin)",
            "convert the head to safetensors")
    hf = load_hf_config(source)
    if hf.get("quantization_config"):
        raise UnsupportedFeatureError(
            f"speculative_config.model={source!r}", "a quantized EAGLE head",
            "use a float head checkpoint")
    names = set(SafetensorsReader(source).names())
    try:
        ec = eagle_config(method, hf, names, target_cfg.num_layers)
    except ModelConfigError as e:
        raise InvalidConfigError(
            f"speculative_config.model {source!r}: {e}") from None
    for field, want in (("hidden_size", target_cfg.hidden_size),
                        ("vocab_size", target_cfg.vocab_size)):
        got = getattr(ec.cfg, field)
        if got != want:
            raise InvalidConfigError(
                f"speculative_config.model {source!r} has {field} {got}, the "
                f"target {want}: an EAGLE head must be trained for its target")
    return ec


class EagleDrafter(PagedDrafter):
    """An EAGLE head's weights, pages and programs, on the target's device
    (the draft-model hooks of the runner: `propose`, `place_inputs`,
    `mirror`, `allocate`, `copy_pages`, `page_bytes`, `warm_up`). Its
    proposal starts one position back: the pair (x_n, h_{n-1})."""
    proposal_shift = -1

    def __init__(self, source: str, ec: EagleConfig, *, target_model,
                 target_params, placement, dtype, kv_dtype, block_size: int,
                 max_model_len: int, num_speculative_tokens: int,
                 tensor_parallel_size: int, pipeline_parallel_size: int):
        method = f"speculative_config.method={ec.method!r}"
        if tensor_parallel_size * pipeline_parallel_size > 1:
            raise UnsupportedFeatureError(
                method, "an EAGLE head beside tensor or pipeline parallelism",
                "run the target on one device, or use method 'ngram'")
        if type(target_model) is not LlamaForCausalLM:
            raise UnsupportedFeatureError(
                method, f"an EAGLE head for {type(target_model).__name__}",
                "EAGLE heads are served for Llama-family targets")
        if has_page_scales(kv_dtype):
            raise UnsupportedFeatureError(
                method, "an EAGLE head with an fp8 KV cache",
                "use kv_cache_dtype 'auto'")
        t0 = time.perf_counter()
        self.ec, self.k, self.block_size = ec, num_speculative_tokens, block_size
        self.dtype, self.kv_dtype = dtype, kv_dtype
        self.replicated = placement.replicated
        tied = target_model.cfg.tie_word_embeddings
        self.head = EagleHead(ec, tied and ec.method == "eagle",
                              backend=target_model.backend, dtype=dtype)
        self.constants = model_constants(
            self.head, max_model_len,
            placement.replicated if placement.mesh.size > 1 else None)
        self.params = self._load(source, target_params, tied)
        logger.info("loaded the %s head %s in %.1fs", ec.method, source,
                    time.perf_counter() - t0)
        self.kv_pages: list | None = None  # allocate() once sized
        self.page_mover: PageMover | None = None
        # Outputs placed as the pages were allocated, so that the first
        # call and the next share one program. (Wrapped per head: equal
        # partials of two engines would share one jit cache.)
        self._propose = jax.jit(
            functools.wraps(propose_head)(functools.partial(
                propose_head, self.head, block_size, self.k)),
            static_argnums=(0,), donate_argnums=(2,),
            out_shardings=self.replicated)
        self._mirror = jax.jit(
            functools.wraps(mirror_head)(functools.partial(
                mirror_head, self.head, block_size)),
            static_argnums=(0,), donate_argnums=(2,),
            out_shardings=self.replicated)
        self._inject = jax.jit(inject_drafts, out_shardings=(
            self.replicated, self.replicated))

    def _load(self, source: str, target_params: dict, tied: bool) -> dict:
        """The head's params; the target's embedding (unless the head has
        its own) and, for EAGLE-1, its lm_head are shared, not copied."""
        params: dict = {}

        def put(path, array, dtype):
            node = params
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = jax.device_put(
                jnp.asarray(array, dtype or self.dtype), self.replicated)

        reader = SafetensorsReader(source)
        read_head_weights(self.ec, reader.get, set(reader.names()), source,
                          put)
        params.setdefault("embedding", target_params["embedding"])
        if self.ec.method == "eagle":
            params["lm_head"] = (target_params["embedding"] if tied
                                 else target_params["lm_head"])
        return params

    @property
    def taps(self) -> tuple:
        return self.ec.taps

    @property
    def page_bytes(self) -> int:
        """Bytes of one of the head's pages: its K/V and the hidden states
        of the page's tokens."""
        c = self.ec.cfg
        return page_bytes(1, self.block_size, c.num_kv_heads, c.head_dim,
                          self.kv_dtype, 1) + (
            self.block_size * self.ec.tap_width * jnp.dtype(self.dtype).itemsize)

    def allocate(self, num_pages: int, num_host_pages: int) -> None:
        """The head's K/V and hidden-state pools: as many pages as the
        target's, pages on axis 1 as `PageMover` moves them."""
        c = self.ec.cfg
        shape = kv_pages_shape(num_pages, self.block_size, c.num_kv_heads,
                               c.head_dim)
        zeros = jax.jit(lambda s, d: jnp.zeros(s, d), static_argnums=(0, 1),
                        out_shardings=self.replicated)
        self.kv_pages = [
            (zeros(shape, self.kv_dtype), zeros(shape, self.kv_dtype)),
            (zeros((1, num_pages, self.block_size, self.ec.tap_width),
                   jnp.dtype(self.dtype)),)]
        self.page_mover = PageMover(num_pages, num_host_pages)

    def mirror(self, bucket: Bucket, packed, hidden) -> None:
        """Stores a target step's hidden states and runs the head over its
        pairs (enqueued; nothing is read back)."""
        # A compiled step program labels its replicated outputs with an
        # equivalent input's sharding (P('model', None) on the one-device
        # mesh), which jit's cache tells apart from warm-up's P(): the
        # same buffer relabelled (no copy), so that one program serves.
        hidden = jax.device_put(hidden, self.replicated)
        self.kv_pages = self._mirror(bucket, self.params, self.kv_pages,
                                     self.constants, packed, hidden)

    def warm_hidden(self, num_tokens: int):
        return jax.device_put(
            np.zeros((num_tokens, self.ec.tap_width), jnp.dtype(self.dtype)),
            self.replicated)
