"""The request widths jaxinfer caps, for docs/compatibility.md: each
request-shaped array pads to a width fixed at start (so no request adds a
compiled program), and a value past the largest is refused with a 400
naming the field and the limit."""

from __future__ import annotations

from ..config import PROMPT_LOGPROB_MAX_ROWS
from ..worker.sampler_widths import BIAS_WIDTH_FACTOR, BIAS_WIDTH_FLOOR
from ..worker.step_functions import WINDOW_STOP_IDS

# (field, limit, how it is served)
REQUEST_LIMITS: tuple[tuple[str, str, str], ...] = (
    ("allowed_token_ids", "at most the vocabulary size entries",
     "folded into one packed token mask per row (one bit per token)"),
    ("logit_bias", "at most the vocabulary size entries (ids in the "
     "vocabulary)", f"padded to a width of {BIAS_WIDTH_FLOOR} times a power "
     f"of {BIAS_WIDTH_FACTOR}, or the vocabulary size"),
    ("logprobs, prompt_logprobs", "at most `--max-logprobs` (default 20; -1: "
     "the whole vocabulary)", "the top `max_logprobs` are computed and cut "
     "per request; a step scores at most "
     f"{PROMPT_LOGPROB_MAX_ROWS:,} prompt tokens (with chunked prefill a "
     "longer prompt goes in chunks of that many), padded to the step's token "
     "bucket or that"),
    ("n, best_of", "at most `--max-num-seqs`", "one sequence row each"),
    ("bad_words, min_tokens", "none", "banned ids go into the packed token "
     "mask"),
    ("presence/frequency/repetition_penalty", "none", "token counts on the "
     "device; a joining request's earlier tokens are counted in chunks of "
     "`--max-num-batched-tokens`"),
    ("stop_token_ids", "none", f"a multi-step window checks the first "
     f"{WINDOW_STOP_IDS} on the device, the host all of them"),
    ("structured_outputs", "none", "the grammar's mask joins the packed "
     "token mask"),
)


def render_limits() -> list[str]:
    out = ["## Request limits", "",
           "Nothing a request sends picks the shape of a compiled program: "
           "request-shaped inputs pad to widths fixed at start, and the "
           "server builds every step program at warm-up. Values past a "
           "limit are refused with a 400 naming the field and the limit.", "",
           "| field | limit | how it is served |", "|---|---|---|"]
    out += [f"| `{f}` | {limit} | {how} |" for f, limit, how in REQUEST_LIMITS]
    return out + [""]
