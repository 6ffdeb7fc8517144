"""Property tests: random arrivals, aborts, sibling requests (n > 1),
preemptions (recompute and swap) and prefix hits against the pure-Python
scheduler (see harness.py), with the host reading each step's tokens at once
or one step late (host/device overlap)."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .harness import Driver

op = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 3), st.integers(0, 30),
              st.integers(0, 3), st.integers(1, 12)),
    st.tuples(st.just("abort"), st.integers(0, 100)),
    st.tuples(st.just("siblings"), st.integers(2, 4), st.integers(1, 30),
              st.integers(1, 12)),
    st.just(("step",)), st.just(("step",)), st.just(("step",)),
)

configs = st.fixed_dictionaries(dict(
    num_blocks=st.integers(18, 40),
    max_tokens=st.sampled_from([4, 8, 16, 40]),
    max_seqs=st.integers(1, 8),
    policy=st.sampled_from(["fcfs", "priority"]),
    mode=st.sampled_from(["recompute", "swap"]),
    host_blocks=st.sampled_from([0, 8, 64]),
    caching=st.booleans(),
    seed=st.integers(0, 2**16),
    overlap=st.booleans(),
))


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs, ops=st.lists(op, min_size=1, max_size=80))
def test_random_traffic_keeps_invariants(cfg, ops):
    d = Driver(**cfg)
    d.run(ops)
    d.drain()


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_long_soak(policy, mode, overlap):
    """Thousands of steps under memory pressure with frequent prefix hits."""
    rng = random.Random(7)
    d = Driver(num_blocks=20, max_tokens=16, max_seqs=6, policy=policy,
               mode=mode, host_blocks=24, seed=3, overlap=overlap)
    steps = 0
    while steps < 2500:
        r = rng.random()
        if r < 0.25:
            d.add(rng.randrange(4), rng.randrange(0, 30), rng.randrange(4),
                  rng.randrange(1, 16))
        elif r < 0.28:
            d.abort(rng.randrange(100))
        elif r < 0.31:
            d.add_siblings(rng.randrange(2, 4), rng.randrange(1, 30),
                           rng.randrange(1, 12))
        else:
            d.n_steps += 1
            d.step()
            steps += 1
    d.drain()
    s = d.sched
    assert s.num_preemptions > 0, "the soak never preempted"
    if mode == "swap":
        assert s.num_swap_outs > 0
    assert s.kv.prefix_cache_hits > 0
