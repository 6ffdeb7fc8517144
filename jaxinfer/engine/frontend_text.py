"""The text of a multi-process server's requests, made in their front end
(vLLM V1's split: the engine core sends token ids, the API server
detokenizes). Free of JAX.

For each request it owns the front end asks the core for token ids only
(`core_params`: ``detokenize=False``, no stop strings). The core's outputs
carry each step's new token ids, their logprob ids and values, and the
finish reason of EOS, max_tokens or stop token ids; here they go through
the same `OutputProcessor` the in-process engine runs (incremental
detokenizer, stop strings, held-back text, DELTA trimming, logprob
tokens), one sample at a time, and n > 1 samples are merged by the
engine's own `ParentRequest`. A stop string ends its sample here: the
tokens after it are dropped (as the engine drops a window's tokens past a
stop) and the core is told to free it.

The core keeps the text of requests it ranks (best_of > n: the ranking
needs whole samples) and of pooling requests; those pass through.
"""

from __future__ import annotations

import dataclasses
import time

from ..outputs import CompletionOutput, RequestMetrics, RequestOutput
from ..request import RequestStatus
from ..sampling_params import SamplingParams
from .core_messages import CoreOutput
from .input_processor import ProcessedInput
from .output_processor import OutputProcessor
from .parallel_sampling import ParentRequest, child_id


class FrontendSample:
    """One sample of a request as its front end knows it: the fields
    output processing reads (`output_processor.Sample`)."""

    def __init__(self, request_id: str, prompt: ProcessedInput,
                 params: SamplingParams):
        self.request_id = request_id
        self.prompt = prompt.prompt
        self.prompt_token_ids = prompt.prompt_token_ids
        self.sampling_params = params
        self.output_token_ids: list[int] = []
        self.status = RequestStatus.RUNNING
        self.stop_reason: int | str | None = None
        self.arrival_time = 0.0
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self.finished_time: float | None = None
        self.num_cached_tokens = 0

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    def take_metrics(self, metrics: RequestMetrics | None) -> None:
        if metrics is not None:
            self.arrival_time = metrics.arrival_time
            self.first_scheduled_time = metrics.first_scheduled_time
            self.first_token_time = metrics.first_token_time
            self.last_token_time = metrics.last_token_time
            self.finished_time = self.finished_time or metrics.finished_time


@dataclasses.dataclass
class _Tracked:
    samples: list[FrontendSample]  # by sample index
    parent: ParentRequest | None  # merges n > 1 samples; None: n = 1
    # A sample ended on a stop string here: the core has not finished the
    # request and must be told when the front end has.
    stopped_here: bool = False


@dataclasses.dataclass
class TextUpdate:
    """What one core output gives: outputs for the client, and what the
    core must free."""
    outputs: list[RequestOutput]
    finished: bool  # the request is finished for its client
    # Samples ended here on a stop string while others go on (free them),
    # or, with ``stop_request``, the whole request.
    stopped_samples: list[int]
    stop_request: bool


class FrontendText:
    """The requests whose text this front end makes (event loop only)."""

    def __init__(self, tokenizer):
        self.processor = OutputProcessor(tokenizer)
        self._requests: dict[str, _Tracked] = {}

    def owns(self, request_id: str) -> bool:
        return request_id in self._requests

    def add(self, request_id: str, prompt: ProcessedInput,
            params: SamplingParams) -> SamplingParams:
        """Tracks a DELTA request; returns the params to send the core:
        token ids only for a request whose text is made here, ``params``
        unchanged for one whose text the core keeps."""
        if prompt.pooling is not None or params.num_samples != params.n:
            return params
        samples = []
        for i in range(params.n):
            own = params.clone()
            # The core's outputs carry its prompt logprobs already in delta
            # form: they are decoded as they pass, not kept per sample.
            own.prompt_logprobs = None
            sample = FrontendSample(
                request_id if params.n == 1 else child_id(i, request_id),
                prompt, own)
            self.processor.add_request(sample)
            samples.append(sample)
        self._requests[request_id] = _Tracked(
            samples, ParentRequest(request_id, params) if params.n > 1 else None)
        core = params.clone()
        core.detokenize = False
        core.stop = []
        return core

    def abort(self, request_id: str) -> None:
        tracked = self._requests.pop(request_id, None)
        if tracked is not None:
            self.processor.abort_requests([s.request_id for s in tracked.samples])

    def update(self, out: CoreOutput) -> TextUpdate:
        """A core output of a tracked request -> its client's outputs."""
        rid = out.request_id
        tracked = self._requests[rid]
        outputs: list[RequestOutput] = []
        stopped: list[int] = []
        for comp in out.outputs:
            sample = tracked.samples[comp.index]
            if sample.is_finished:
                continue  # tokens the core sampled past a stop string
            sample.take_metrics(out.metrics)
            sample.num_cached_tokens = out.num_cached_tokens
            if self._take_tokens(sample, comp):
                stopped.append(comp.index)
            child = self.processor.make_output(sample)
            if child is None:
                continue
            if out.prompt_logprobs is not None:
                child.prompt_logprobs = self.processor.decode_prompt_logprobs(
                    sample, out.prompt_logprobs)
            merged = (child if tracked.parent is None
                      else tracked.parent.merge(comp.index, child))
            if merged is not None:
                outputs.append(dataclasses.replace(merged, request_id=rid))
        tracked.stopped_here = tracked.stopped_here or bool(stopped)
        finished = all(s.is_finished for s in tracked.samples)
        stop_request = finished and tracked.stopped_here and not out.finished
        if finished:
            del self._requests[rid]
            stopped = []
        return TextUpdate(outputs, finished, stopped, stop_request)

    def _take_tokens(self, sample: FrontendSample,
                     comp: CompletionOutput) -> bool:
        """Appends the core's new tokens one at a time, as the engine takes
        a step's: logprobs, then the core's own finish on its last token,
        then the stop-string check. True when a stop string ended the
        sample here (the tokens after it are dropped)."""
        last = len(comp.token_ids) - 1
        for i, token in enumerate(comp.token_ids):
            sample.output_token_ids.append(token)
            if comp.logprobs is not None and i < len(comp.logprobs):
                self.processor.record_entry(sample, comp.logprobs[i], token)
            if i == last and comp.finish_reason is not None:
                sample.status = RequestStatus(comp.finish_reason)
                sample.stop_reason = comp.stop_reason
            if self.processor.detokenize(sample):
                if sample.is_finished:  # the core's stop came first
                    return False
                sample.status = RequestStatus.FINISHED_STOPPED
                sample.finished_time = time.time()
                return True
        if not comp.token_ids and comp.finish_reason is not None:
            sample.status = RequestStatus(comp.finish_reason)
            sample.stop_reason = comp.stop_reason
        return False
