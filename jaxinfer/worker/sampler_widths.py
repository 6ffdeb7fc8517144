"""The widths a request's sampling inputs are padded to, fixed at start.

Each distinct width is its own compiled sampler program, so a width that
followed the request (a logit_bias of 17, 33, 65, ... entries) would let a
client make the server compile without end. Every request-shaped array
therefore pads to a width from a short list that depends on the model
alone; `StepPrograms` enumerates the programs of those widths and warm-up
builds them. Token masks (allowed ids, bans, grammars) need no list: they
are one packed bit per vocabulary entry whatever the request.
"""

from __future__ import annotations

# Logit bias widths grow by this factor from BIAS_WIDTH_FLOOR up to the
# vocabulary (a row holds at most one entry per token): few programs,
# and a row pads to at most this many times its entries.
BIAS_WIDTH_FLOOR = 16
BIAS_WIDTH_FACTOR = 16


def bias_widths(vocab_size: int) -> tuple[int, ...]:
    """Every logit-bias width, smallest first; the last is the vocabulary."""
    out, w = [], BIAS_WIDTH_FLOOR
    while w < vocab_size:
        out.append(w)
        w *= BIAS_WIDTH_FACTOR
    out.append(vocab_size)
    return tuple(out)


def bias_width(entries: int, vocab_size: int) -> int:
    """The width a step's bias rows pad to when its longest has
    ``entries`` (at most the vocabulary: the input processor refuses
    more)."""
    for w in bias_widths(vocab_size):
        if entries <= w:
            return w
    raise ValueError(f"a logit_bias of {entries} entries is over the "
                     f"vocabulary ({vocab_size})")


def mask_words(vocab_size: int) -> int:
    """int32 words of a packed token mask row."""
    return (vocab_size + 31) // 32
