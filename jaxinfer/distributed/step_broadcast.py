"""Multi-process steps: process 0 schedules, every process runs the step.

One JAX program spans every process (``jax.distributed``), and each process
must call it with the same inputs in the same order. Process 0 owns the
scheduler. Before each step it broadcasts that step's inputs (its
`StepInputs`: the packed int32 metadata buffer of ``packing.py``, logits
indices, sampling arrays, prompt-logprob targets and its bucket), through
a JAX collective (`StepChannel`); every other process
runs the same compiled step on its own devices' shards of the params and
pages. The device state each process keeps (KV pages, penalty counts, the
previous step's tokens) evolves identically because the programs and their
inputs are the same. Nothing but JAX carries the bytes.
"""

from __future__ import annotations

import atexit
import logging
import pickle

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ..worker.model_runner import ModelRunner

logger = logging.getLogger(__name__)

# Message kinds: a step's inputs; the end of the engine; a capacity change.
STEP, STOP, GROW = 1, 2, 3
_HEADER = 3  # int32 words: kind, payload bytes, new capacity (GROW)


def runner_class() -> type[ModelRunner]:
    """The runner of this process: a `DistributedRunner` when the program
    spans several processes."""
    return DistributedRunner if jax.process_count() > 1 else ModelRunner


class StepChannel:
    """Bytes from process 0 to every process, through a sum over one device
    of each process to which the others add zeros (exact for integers).

    The buffer has a capacity both sides know, so one message is one
    collective; a larger message is preceded by a GROW message carrying the
    new capacity. Process 0 never waits for its own sends: they queue on
    its device behind the step in flight, and the others read them there
    (``in_order``: each message is waited for, see `DistributedRunner`).
    """

    def __init__(self, capacity: int = 1 << 16, in_order: bool = False):
        self.in_order = in_order
        devices = [jax.local_devices(process_index=p)[0]
                   for p in range(jax.process_count())]
        self.mesh = Mesh(np.array(devices), ("processes",))
        self.words = capacity // 4
        self._sum = jax.jit(lambda x: x.sum(0),
                            out_shardings=NamedSharding(self.mesh, PartitionSpec()))

    def _collective(self, words: np.ndarray) -> jax.Array:
        sharding = NamedSharding(self.mesh, PartitionSpec("processes"))
        local = jax.make_array_from_process_local_data(
            sharding, words[None], (len(self.mesh.devices), words.size))
        return self._sum(local)

    def _message(self, kind: int, payload: bytes, new_words: int = 0
                 ) -> jax.Array:
        buf = np.zeros(self.words, np.int32)
        buf[:_HEADER] = (kind, len(payload), new_words)
        buf.view(np.uint8)[4 * _HEADER:4 * _HEADER + len(payload)] = \
            np.frombuffer(payload, np.uint8)
        out = self._collective(buf)
        if self.in_order:
            jax.block_until_ready(out)
        return out

    def send(self, kind: int, payload: bytes = b"") -> jax.Array:
        """Process 0: enqueues one message (and a GROW first if needed);
        returns the collective's result, which nobody has to wait for."""
        need = _HEADER + -(-len(payload) // 4)
        if need > self.words:
            new_words = 1 << (need - 1).bit_length()
            self._message(GROW, b"", new_words)
            self.words = new_words
        return self._message(kind, payload)

    def recv(self) -> tuple[int, bytes]:
        """The other processes: blocks until process 0's next message."""
        while True:
            out = self._collective(np.zeros(self.words, np.int32))
            buf = np.asarray(out.addressable_data(0))
            kind, length, new_words = (int(v) for v in buf[:_HEADER])
            if kind == GROW:
                self.words = new_words
                continue
            return kind, buf.view(np.uint8)[4 * _HEADER:4 * _HEADER + length].tobytes()


class DistributedRunner(ModelRunner):
    """A `ModelRunner` in one process of a multi-process engine: process 0
    broadcasts each step's inputs before running it; the others `follow`.
    Page swaps, LoRA and image models are refused at start
    (``check_fits``): swapped pages would pass through one process's host
    memory, and adapter slots and encoded images exist on process 0 only."""

    def __init__(self, *args, **kwargs):
        # On the CPU a program starts once its inputs are ready, not in the
        # order it was launched, so a process could start the channel's
        # collective (its inputs are always ready) ahead of a step's
        # collectives launched before it, while the other process waits in
        # the step's: both then wait forever. There every collective
        # program finishes before the next is launched. A GPU runs one
        # device's programs in launch order, which is the same on every
        # process, so nothing waits there.
        self.in_order = jax.devices()[0].platform == "cpu"
        self.channel = StepChannel(in_order=self.in_order)
        self.is_driver = jax.process_index() == 0
        self._stopped = False
        super().__init__(*args, **kwargs)
        if self.is_driver:
            # The others wait for a STOP; jax.distributed's own shutdown
            # (registered earlier, so run later) waits for them in turn.
            atexit.register(self.shutdown)

    def _wait_for_last_step(self) -> None:
        """Before a channel message: on CPU (``in_order``), the last step's
        programs, collectives included, must have finished."""
        if self.in_order:
            jax.block_until_ready(self.prev_tokens)

    def _num_blocks(self) -> int:
        # Every process must hold the same pool: the smallest one wins.
        local = np.array([super()._num_blocks()], np.int64)
        return int(np.min(multihost_utils.process_allgather(local)))

    def run_programs(self, inputs, penalty_state):
        # check_fits refuses LoRA and image models over several processes,
        # so neither is ever set.
        assert inputs.encoder is None and inputs.lora_pool is None
        if self.is_driver:
            self._wait_for_last_step()
            # Every process samples with the same masks: they are filled
            # before the broadcast (no overlap with the forward pass here).
            fill, inputs.fill_token_masks = inputs.fill_token_masks, None
            if fill is not None and inputs.sampling.token_bitmask is not None:
                fill(inputs.sampling.token_bitmask)
            self.channel.send(STEP, pickle.dumps(
                inputs, protocol=pickle.HIGHEST_PROTOCOL))
        return super().run_programs(inputs, penalty_state)

    def collect(self, step):
        # The step's outputs are replicated over every process's devices;
        # process 0 reads its own copy.
        step.res, step.prompt_lp = _local_copy(step.res), _local_copy(step.prompt_lp)
        return super().collect(step)

    def shutdown(self) -> None:
        """Process 0: tells the others the engine is done (idempotent)."""
        if self.is_driver and not self._stopped:
            self._stopped = True
            self._wait_for_last_step()
            jax.block_until_ready(self.channel.send(STOP))

    def follow(self) -> int:
        """The other processes: runs process 0's steps until it stops;
        returns the number of steps run."""
        steps = 0
        while True:
            self._wait_for_last_step()
            kind, payload = self.channel.recv()
            if kind == STOP:
                logger.info("process 0 stopped the engine after %d steps", steps)
                return steps
            inputs = pickle.loads(payload)  # as dispatch runs on process 0
            self._keep(self.run_programs(inputs,
                                         self._take_penalty_state(inputs)))
            steps += 1


def _local_copy(tree):
    """A replicated global array -> this process's copy of it."""
    def one(x):
        if not isinstance(x, jax.Array) or x.is_fully_addressable:
            return x
        if not x.is_fully_replicated:
            raise RuntimeError(f"a step output of shape {x.shape} is split "
                               f"over processes ({x.sharding}); it must be "
                               "replicated to be read on process 0")
        return x.addressable_data(0)
    return jax.tree_util.tree_map(one, tree)
