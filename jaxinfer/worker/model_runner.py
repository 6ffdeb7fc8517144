"""`ModelRunner`: SchedulerOutput -> padded arrays -> one jitted step.

The only place that builds device arrays. Each step packs its metadata into
NumPy arrays padded to the step's bucket, transfers them once, and runs
``step(params, kv_pages, ...)`` with the page pool donated (updated in place).
"""

from __future__ import annotations

import functools
import logging
import time
import zlib

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.models import (AttentionMetadata, ModelFiles, load_params,
                             model_class, resolve_backend, rope_cos_sin_table)
from jaxinfer.pallas_kernels import init_kv_pages

from ..config import CacheConfig, SchedulerConfig
from ..core.kv_cache_manager import cdiv
from ..core.scheduler_output import SchedulerOutput
from ..request import Request
from .buckets import Buckets
from .sampler import SamplingMetadata, sample

logger = logging.getLogger(__name__)


def _step(model, params, kv_pages, cos_sin, input_ids, positions,
          md: AttentionMetadata, logits_indices, smd: SamplingMetadata):
    logits, kv_pages = model.apply({"params": params}, input_ids, positions,
                                   kv_pages, md, cos_sin, logits_indices)
    return sample(logits, smd), kv_pages


class ModelRunner:
    def __init__(self, files: ModelFiles, dtype, scheduler_config: SchedulerConfig,
                 cache_config: CacheConfig, seed: int = 0,
                 attention_backend: str | None = None):
        self.cfg = files.config
        self.dtype = dtype
        self.scheduler_config = scheduler_config
        self.cache_config = cache_config
        self.block_size = cache_config.block_size
        self.seed = seed
        self.backend = resolve_backend(attention_backend)
        self.on_cpu = jax.default_backend() == "cpu"
        t0 = time.perf_counter()
        self.params = load_params(files, dtype)
        logger.info("loaded %s (%.1fM params) in %.1fs", files.source,
                    self.cfg.num_params / 1e6, time.perf_counter() - t0)
        self.model = model_class(self.cfg.architecture)(
            self.cfg, backend=self.backend, dtype=dtype)
        self.cos_sin = jnp.asarray(
            rope_cos_sin_table(self.cfg, scheduler_config.max_model_len))
        self.num_blocks = self._num_blocks()
        self.kv_pages = init_kv_pages(self.cfg.num_layers, self.num_blocks,
                                      self.block_size, self.cfg.num_kv_heads,
                                      self.cfg.head_dim, dtype)
        self.max_pages_per_seq = cdiv(scheduler_config.max_model_len,
                                      self.block_size)
        self.buckets = Buckets.make(scheduler_config.max_num_batched_tokens,
                                    scheduler_config.max_num_seqs,
                                    self.max_pages_per_seq)
        self._step = jax.jit(functools.partial(_step, self.model),
                             donate_argnums=(1,))

    # -- sizing -----------------------------------------------------------

    @property
    def page_bytes(self) -> int:
        """Bytes of one page across all layers, K and V."""
        return (2 * self.cfg.num_layers * self.block_size *
                self.cfg.num_kv_heads * self.cfg.head_dim *
                jnp.dtype(self.dtype).itemsize)

    def _num_blocks(self) -> int:
        cc = self.cache_config
        if cc.num_gpu_blocks_override is not None:
            return cc.num_gpu_blocks_override
        if self.on_cpu:
            return cc.cpu_num_blocks
        stats = jax.local_devices()[0].memory_stats() or {}
        limit = stats.get("bytes_limit", 0)
        in_use = stats.get("bytes_in_use", 0)
        # Headroom for the step's activations and logits at the largest bucket.
        sc = self.scheduler_config
        workspace = (sc.max_num_batched_tokens *
                     (self.cfg.hidden_size * 16 + self.cfg.intermediate_size * 8) *
                     4 + sc.max_num_seqs * self.cfg.vocab_size * 16 + (1 << 30))
        free = limit * cc.gpu_memory_utilization - in_use - workspace
        n = int(free // self.page_bytes)
        if n < 2:
            raise ValueError(
                f"no room for the KV cache: {limit / 2**30:.1f} GiB device "
                f"memory x gpu_memory_utilization={cc.gpu_memory_utilization} "
                f"leaves {free / 2**30:.2f} GiB after weights; raise "
                "gpu_memory_utilization or lower max_num_batched_tokens")
        return n

    # -- one step ---------------------------------------------------------

    def request_seed(self, req: Request) -> int:
        sp = req.sampling_params
        if sp.seed is not None:
            return sp.seed & 0xFFFFFFFF
        return zlib.crc32(f"{self.seed}:{req.request_id}".encode())

    def prepare(self, out: SchedulerOutput, requests: dict[str, Request]):
        """Packs a step into host arrays padded to its bucket."""
        sched = out.scheduled
        n_tok = sum(len(s.token_ids) for s in sched)
        n_pages = max(len(s.block_table) for s in sched)
        T, S, P = self.buckets.pick(n_tok, len(sched), n_pages)
        B = self.block_size
        input_ids = np.zeros(T, np.int32)
        positions = np.zeros(T, np.int32)
        slots = np.zeros(T, np.int32)  # padding -> the null page
        tables = np.zeros((S, P), np.int32)
        kv_lens = np.zeros(S, np.int32)
        cu = np.zeros(S + 1, np.int32)
        logits_idx = np.zeros(S, np.int32)
        temp = np.zeros(S, np.float32)
        top_k = np.zeros(S, np.int32)
        top_p = np.ones(S, np.float32)
        seeds = np.zeros(S, np.uint32)
        out_pos = np.zeros(S, np.int32)
        t = 0
        for i, s in enumerate(sched):
            n = len(s.token_ids)
            table = np.asarray(s.block_table, np.int32)
            pos = np.arange(s.start_pos, s.start_pos + n, dtype=np.int32)
            input_ids[t:t + n] = s.token_ids
            positions[t:t + n] = pos
            slots[t:t + n] = table[pos // B] * B + pos % B
            tables[i, :len(table)] = table
            kv_lens[i] = s.start_pos + n
            t += n
            cu[i + 1] = t
            logits_idx[i] = t - 1
            req = requests[s.request_id]
            sp = req.sampling_params
            temp[i] = 0.0 if sp.greedy else sp.temperature
            top_k[i] = sp.top_k
            top_p[i] = sp.top_p
            seeds[i] = self.request_seed(req)
            out_pos[i] = len(req.output_token_ids)
        cu[len(sched) + 1:] = t
        md = AttentionMetadata(slots, tables, kv_lens, cu,
                               np.array([len(sched)], np.int32))
        smd = SamplingMetadata(temp, top_k, top_p, seeds, out_pos)
        return input_ids, positions, md, logits_idx, smd

    def execute_model(self, out: SchedulerOutput,
                      requests: dict[str, Request]) -> dict[str, int]:
        """Runs one step; returns the sampled token of every request whose
        chunk reached its last known token."""
        if out.is_empty:
            return {}
        input_ids, positions, md, logits_idx, smd = self.prepare(out, requests)
        tokens, self.kv_pages = self._step(
            self.params, self.kv_pages, self.cos_sin, input_ids, positions, md,
            logits_idx, smd)
        tokens = np.asarray(tokens)
        return {s.request_id: int(tokens[i])
                for i, s in enumerate(out.scheduled) if s.sample}
