"""Per-request serving metrics of `AsyncLLMEngine`: what a request's
outputs say about its queue time, time to first token, inter-token
latency and end-to-end latency, recorded into `EngineMetrics` (vLLM's
metric names). Used by the engine loop thread only."""

from __future__ import annotations

from ..metrics import EngineMetrics
from ..outputs import PoolingRequestOutput, RequestOutput
from ..sampling_params import SamplingParams


class _Tracker:
    """One request's timing so far."""
    __slots__ = ("arrival", "last_token", "first_done", "generated")

    def __init__(self, arrival: float):
        self.arrival = arrival
        self.last_token: float | None = None
        self.first_done = False
        self.generated = 0  # tokens so far (outputs arrive as deltas)


class RequestTimings:
    def __init__(self, metrics: EngineMetrics):
        self.metrics = metrics
        self._trackers: dict[str, _Tracker] = {}

    def start(self, request_id: str, arrival: float,
              params: SamplingParams) -> None:
        """A request the engine accepted."""
        self._trackers[request_id] = _Tracker(arrival)
        self.metrics.record_request_params(params)

    def abort(self, request_id: str) -> None:
        self._trackers.pop(request_id, None)
        self.metrics.record_finished("abort")

    def stopped(self, request_id: str, now: float) -> None:
        """A request its front end finished on a stop string (the engine
        was told to free it, so no finished output comes)."""
        tr = self._trackers.pop(request_id, None)
        if tr is not None:
            self.metrics.e2e_request_latency.observe(now - tr.arrival)
        self.metrics.record_finished("stop")

    def clear(self) -> None:
        """Every request failed at once (the loop stopped)."""
        self._trackers.clear()

    def observe(self, out: RequestOutput | PoolingRequestOutput,
                now: float) -> None:
        """One output delta of a tracked request, received at ``now``."""
        m, tr = self.metrics, self._trackers.get(out.request_id)
        if tr is None:
            return
        if isinstance(out, PoolingRequestOutput):  # one output, no tokens
            self._trackers.pop(out.request_id, None)
            m.prompt_tokens.inc(len(out.prompt_token_ids))
            m.e2e_request_latency.observe(now - tr.arrival)
            m.record_finished("stop")
            return
        new_tokens = sum(len(c.token_ids) for c in out.outputs)
        if new_tokens:
            if not tr.first_done:
                tr.first_done = True
                m.prompt_tokens.inc(len(out.prompt_token_ids))
                m.time_to_first_token.observe(now - tr.arrival)
                sched = out.metrics.first_scheduled_time if out.metrics else None
                m.request_queue_time.observe(max(0.0, (sched or now) - tr.arrival))
            elif tr.last_token is not None:
                m.inter_token_latency.observe(now - tr.last_token)
                m.time_per_output_token.observe(now - tr.last_token)
            tr.last_token = now
            tr.generated += new_tokens
            m.generation_tokens.inc(new_tokens)
        if out.finished:
            self._trackers.pop(out.request_id, None)
            m.e2e_request_latency.observe(now - tr.arrival)
            m.record_request_done(out, now, tr.generated)
            reasons = [c.finish_reason for c in out.outputs if c.finish_reason]
            m.record_finished(reasons[0] if reasons else "stop")
