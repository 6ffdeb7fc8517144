"""The data-parallel router alone (pure Python): balance under load, a
repeated prefix sent back to the replica that holds it, and the bounds that
keep a prefix from pinning everything to one replica."""

from __future__ import annotations

import random

from jaxinfer.engine.dp_router import DataParallelRouter, prompt_block_hashes

B = 16


def _never(_h):
    return False


def _holding(prompt):
    held = set(prompt_block_hashes(prompt, B))
    return lambda h: h in held


def _tokens(rng, n):
    return [rng.randrange(1, 49152) for _ in range(n)]


def test_balanced_under_random_load():
    """Random prompts arriving while earlier ones finish at random: both
    replicas get within 20% of each other's request count, and the loads
    stay close (only the random finishes move them apart)."""
    rng = random.Random(0)
    router = DataParallelRouter(2, B, max_imbalance=4)
    running: list[list[int]] = [[], []]  # remaining steps of each request
    worst = 0
    for _ in range(400):
        loads = [len(r) for r in running]
        worst = max(worst, abs(loads[0] - loads[1]))
        r = router.choose(_tokens(rng, rng.randrange(5, 80)), loads,
                          [_never, _never])
        running[r].append(rng.randrange(1, 12))
        for queue in running:  # one step of each replica
            queue[:] = [t - 1 for t in queue if t > 1]
    a, b = router.assigned
    assert abs(a - b) <= 0.2 * max(a, b)
    assert worst <= 4


def test_a_repeated_prefix_goes_back_to_its_replica():
    rng = random.Random(1)
    router = DataParallelRouter(2, B, max_imbalance=4)
    conversation = _tokens(rng, 5 * B + 3)
    first = router.choose(conversation, [0, 0], [_never, _never])
    other = 1 - first
    loads = [0, 0]
    loads[first] = 3  # busier, but within max_imbalance
    follow_up = conversation + _tokens(rng, 20)
    cached = [_never, _never]
    cached[first] = _holding(conversation)
    assert router.choose(follow_up, loads, cached) == first
    # Even before its pages are cached (still queued): the router's memory.
    assert router.choose(conversation + [7, 8], loads, [_never, _never]) == first
    # The least-loaded rule alone would have picked the other replica.
    assert DataParallelRouter(2, B, 4).choose(follow_up, loads,
                                              [_never, _never]) == other


def test_a_prefix_yields_to_a_large_imbalance():
    rng = random.Random(2)
    router = DataParallelRouter(2, B, max_imbalance=4)
    conversation = _tokens(rng, 4 * B)
    assert router.choose(conversation, [0, 0], [_holding(conversation),
                                                _never]) == 0
    assert router.choose(conversation + [1], [9, 2],
                         [_holding(conversation), _never]) == 1


def test_a_short_common_prefix_does_not_pin_requests():
    """A shared system prompt covering less than half of each prompt's
    blocks: requests still spread."""
    rng = random.Random(3)
    router = DataParallelRouter(2, B, max_imbalance=8)
    system = _tokens(rng, 2 * B)
    loads = [0, 0]
    for _ in range(40):
        r = router.choose(system + _tokens(rng, 4 * B), loads,
                          [_holding(system), _holding(system)])
        loads[r] += 1
    assert router.assigned == [20, 20]
