"""The Mosaic GPU decode kernel against the jnp reference.

On CPU it runs in Mosaic GPU's interpret mode (jax's GPU interpreter: TMA
copies, barriers and the smem ring are simulated; the two matmuls are plain
dots there, since the interpreter takes no transposed or register wgmma
operand). On a Hopper GPU the same cases run compiled, plus the ``gpu`` cases.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxinfer.pallas_kernels import (
    RaggedAttentionShapeError,
    RaggedPagedAttentionTuning,
    TuningError,
    ragged_paged_attention,
)
from jaxinfer.pallas_kernels import ragged_paged_attention_decode_mgpu as mg
from jaxinfer.pallas_kernels.ragged_paged_attention_reference import (
    ragged_paged_attention_reference,
)
from jaxinfer.pallas_kernels.ragged_paged_attention_tuning import SMEM_PER_BLOCK, MosaicDecodeTuning
from tests.pallas_kernels.cases import (
    INTERPRET,
    check_against_reference,
    fp8_case,
    gpu,
    make_case,
    rel_error,
)
from tests.pallas_kernels.lowering import decode_lowering_args

# Decodes at one page, at a page boundary, at many pages, plus a prefill
# chunk (served by the Triton prefill kernel in the same call).
MIX = [(1, 1), (1, 64), (1, 129), (5, 18), (1, 300)]


def _mosaic(**kw):
    # One warpgroup unless asked: the interpreter runs two far slower.
    kw.setdefault("producer_warpgroup", False)
    return RaggedPagedAttentionTuning(decode_backend="mosaic",
                                      mosaic_decode=MosaicDecodeTuning(**kw))


_check = check_against_reference


@pytest.mark.parametrize("page_size,group,head_dim,tuning", [
    (16, 4, 64, dict(num_stages=2)),
    (16, 1, 64, dict(num_stages=3, kv_splits=4)),
    (16, 8, 128, dict(num_stages=2, tokens_per_step=128, kv_splits=2)),
])
def test_mosaic_decode_matches_reference(page_size, group, head_dim, tuning):
    case = make_case(MIX, num_q_heads=2 * group, num_kv_heads=2,
                     head_dim=head_dim, page_size=page_size,
                     dtype=jnp.bfloat16)
    _check(case, _mosaic(**tuning))


def test_mosaic_decode_window_cap_and_scales():
    case = make_case(MIX, num_q_heads=8, num_kv_heads=2, head_dim=64,
                     dtype=jnp.bfloat16, seed=4)
    tuning = _mosaic(num_stages=2, kv_splits=4)
    _check(case, tuning, sliding_window=70, logit_soft_cap=5.0)
    _check(case, tuning, k_scale=0.5, v_scale=2.0)


def test_mosaic_decode_long_table_in_pieces():
    """One split over 263 pages: the table slice takes two TMA pieces."""
    case = make_case([(1, 4200), (1, 3)], num_q_heads=2, num_kv_heads=1,
                     head_dim=64, dtype=jnp.bfloat16, seed=5)
    _check(case, _mosaic(num_stages=4, kv_splits=1, tokens_per_step=128))


@pytest.mark.parametrize("pad_tokens,pad_seqs", [(3, 1), (0, 3)])
def test_mosaic_decode_only_skips_the_prefill_half(pad_tokens, pad_seqs):
    """decode_only: row s is sequence s's token; more token rows than
    sequence rows (the engine's buckets) and fewer both come back right,
    padding rows zero."""
    case = make_case([(1, 40), (1, 1), (1, 129)], num_q_heads=8,
                     num_kv_heads=2, head_dim=64, dtype=jnp.bfloat16, seed=7,
                     pad_tokens=pad_tokens, pad_seqs=pad_seqs)
    _check(case, _mosaic(num_stages=2, kv_splits=2), decode_only=True)


def test_mosaic_decode_producer_warpgroup():
    """The warp-specialized variant (a copy-issuing warpgroup beside the
    computing one), with a ring shorter than the sequences."""
    case = make_case([(1, 200), (1, 7)], num_q_heads=4, num_kv_heads=1,
                     head_dim=64, page_size=16, dtype=jnp.bfloat16, seed=6)
    _check(case, _mosaic(num_stages=2, kv_splits=2, producer_warpgroup=True))


def test_mosaic_decode_fp8_f16_clamps_the_query():
    """fp8_f16 casts the query rows to f16: a |q| past f16's range is
    clamped to it (finite output, the row's softmax saturated) instead of
    becoming inf and every output of its row NaN."""
    case, ks, vs = fp8_case([(1, 40), (1, 100)], num_q_heads=4,
                            num_kv_heads=2, head_dim=64, seed=15)
    q = case[0].at[0, 0, 0].set(1e6)
    out = ragged_paged_attention(
        q, *case[1:], sm_scale=0.125, k_scale=ks, v_scale=vs,
        interpret=INTERPRET, decode_only=True,
        tuning=_mosaic(num_stages=2, kv_splits=1, fp8_f16=True))
    assert bool(jnp.all(jnp.isfinite(out[:2].astype(jnp.float32))))


def test_mosaic_decode_overlapped_softmax():
    """overlap_softmax (each step's softmax during the next step's QK^T,
    the first QK^T before the loop): one-step and many-step sequences,
    empty splits (four splits over 7 tokens), a padding row, a window and
    a soft cap."""
    case = make_case([(1, 200), (1, 7), (1, 129)], num_q_heads=4,
                     num_kv_heads=1, head_dim=64, dtype=jnp.bfloat16, seed=8,
                     pad_seqs=1)
    tuning = _mosaic(num_stages=2, kv_splits=4, producer_warpgroup=True,
                     overlap_softmax=True)
    _check(case, tuning, decode_only=True)
    _check(case, tuning, decode_only=True, sliding_window=70,
           logit_soft_cap=5.0)
    with pytest.raises(TuningError, match="overlap_softmax"):
        MosaicDecodeTuning(overlap_softmax=True, producer_warpgroup=False)


def test_mosaic_decode_rejects_what_it_cannot_take():
    case = make_case([(1, 20)], num_q_heads=4, num_kv_heads=2, head_dim=64,
                     dtype=jnp.float32)
    with pytest.raises(RaggedAttentionShapeError, match="dtype"):
        ragged_paged_attention(*case, sm_scale=0.1, tuning=_mosaic(),
                               interpret=True)
    # Page 32 faults on GPU (NOTES.md v4): the automatic backend keeps it
    # on Triton, a forced Mosaic backend refuses it.
    case = make_case([(1, 20)], num_q_heads=4, num_kv_heads=2, head_dim=64,
                     page_size=32, dtype=jnp.bfloat16)
    with pytest.raises(RaggedAttentionShapeError, match="page size"):
        ragged_paged_attention(*case, sm_scale=0.1, tuning=_mosaic(),
                               interpret=True)
    with pytest.raises(TuningError):
        MosaicDecodeTuning(num_stages=1)
    with pytest.raises(TuningError, match="multiple of 64"):
        MosaicDecodeTuning(tokens_per_step=32)
    with pytest.raises(TuningError):
        RaggedPagedAttentionTuning(decode_backend="cuda")


def test_mosaic_decode_fp8_pages_with_per_page_scales():
    """fp8 pages dequantized in the kernel, times each (kv head, page)'s
    own K and V scales; ragged lengths (one token, a page boundary, a
    partial last step, several splits), pages scattered over the pool."""
    case, ks, vs = fp8_case([(1, 40), (1, 1), (1, 129), (1, 300)],
                            num_q_heads=8, num_kv_heads=2, head_dim=64,
                            seed=11)
    out = _check(case, _mosaic(num_stages=2, kv_splits=2), k_scale=ks,
                 v_scale=vs, decode_only=True)
    # The scales matter: without them (or with K's and V's swapped) the
    # reference is far from the kernel's output.
    for wrong in ({}, {"k_scale": vs, "v_scale": ks}):
        ref = ragged_paged_attention_reference(
            *case, sm_scale=64 ** -0.5, decode_only=True, **wrong)
        assert rel_error(out[:4], ref[:4]) > 0.2


def test_mosaic_decode_fp8_per_tensor_and_mixed_scales():
    """H=128 (a 128-byte fp8 row), 128-token steps (two 64-row tiles, four
    pages each, per step), a prefill chunk beside the decodes (Triton);
    per-tensor scales, then per-page K scales with one V scale."""
    case, ks, vs = fp8_case(MIX, num_q_heads=4, num_kv_heads=2,
                            head_dim=128, seed=12)
    tuning = _mosaic(num_stages=2, kv_splits=2, tokens_per_step=128)
    _check(case, tuning, k_scale=jnp.float32(0.03), v_scale=jnp.float32(0.02))
    _check(case, tuning, k_scale=ks, v_scale=jnp.float32(0.02))


def test_mosaic_decode_fp8_in_f16():
    """fp8_f16: bf16 queries, the wgmmas in f16 (pages dequantized to f16,
    scales multiplied in f16); output back in bf16."""
    case, ks, vs = fp8_case([(1, 200), (1, 17)], num_q_heads=8,
                            num_kv_heads=2, head_dim=64, seed=14)
    _check(case, _mosaic(num_stages=2, kv_splits=2, fp8_f16=True),
           k_scale=ks, v_scale=vs, decode_only=True)


@pytest.mark.parametrize("producers,extra", [
    (1, {}), (2, {}),
    # K and V staged to different depths (K 1 tile, V 3).
    (1, dict(v_staging_stages=3, staging_stages=1)),
    (1, dict(overlap_softmax=True)),
    # FP8_MOSAIC_DECODE's settings (the fp8 default at head_dim 128) but
    # one producer, in this process (its two run in
    # test_mosaic_decode_many_warpgroups_interpreted, with a wider pool).
    (1, dict(tokens_per_step=128, no_auto_barriers=True, fp8_f16=True,
             overlap_softmax=True, smem_budget=224 * 1024))])
def test_mosaic_decode_fp8_producer_warpgroup(producers, extra):
    """Producer warpgroups dequantize into staging rings ahead of the
    consumer (one for K and V, or one each); the sequence is longer than
    ring and staging."""
    case, ks, vs = fp8_case([(1, 330), (1, 7)], num_q_heads=4,
                            num_kv_heads=1, head_dim=64, seed=13)
    _check(case, _mosaic(num_stages=2, kv_splits=1, producer_warpgroup=True,
                         **{"staging_stages": 2, "fp8_producers": producers,
                            **extra}),
           k_scale=ks, v_scale=vs, decode_only=True)


def _fp8_default(**kw):
    from jaxinfer.pallas_kernels.ragged_paged_attention_tuning import FP8_MOSAIC_DECODE
    return dataclasses.replace(FP8_MOSAIC_DECODE, **kw)


# Tunings of three to five warpgroups, interpreted. jax's interpreter runs
# each warpgroup as its own computation, and XLA's CPU runtime executes
# them on a pool as wide as the machine's cores: on two cores, two
# warpgroups blocked at barriers leave none to run the one they wait for,
# and the test hangs (NOTES.md v17). PJRT_NPROC widens that pool; it is read
# once, when the CPU client starts, so these run in a fresh process.
WIDE_POOL_TUNINGS = {
    "fp8-default": {},  # FP8_MOSAIC_DECODE: two producers, overlap, f16
    "fp8-default-window": dict(window=300, cap=30.0),
    "4producers": dict(fp8_producers=4, overlap_softmax=False),
    "4producers-overlap": dict(fp8_producers=4),
    "4producers-swap": dict(fp8_producers=4, overlap_softmax=False,
                            swap_ab=True),
    "4producers-swap-bf16": dict(fp8_producers=4, overlap_softmax=False,
                                 swap_ab=True, fp8_f16=False, window=300,
                                 cap=30.0),
    # swap_ab's wider query rows at head_dim 128 (R = 32, 64).
    "4producers-swap-group20": dict(fp8_producers=4, overlap_softmax=False,
                                    swap_ab=True, group=20, head_dim=128),
    "swap-group64": dict(overlap_softmax=False, swap_ab=True, group=64,
                         head_dim=128),
}


def run_wide_pool_tuning(name: str) -> None:
    """One of WIDE_POOL_TUNINGS on FP8_MOSAIC_DECODE's base, checked
    against the reference (the body of the subprocess below)."""
    tune = dict(WIDE_POOL_TUNINGS[name])
    window, cap = tune.pop("window", None), tune.pop("cap", None)
    group, head_dim = tune.pop("group", 4), tune.pop("head_dim", 64)
    # Five 128-token steps: the 2-step ring and the staging tiles wrap.
    case, ks, vs = fp8_case([(1, 600), (1, 7)], num_q_heads=group,
                            num_kv_heads=1, head_dim=head_dim, seed=17)
    tuning = RaggedPagedAttentionTuning(
        decode_backend="mosaic", mosaic_decode=_fp8_default(
            num_stages=2, kv_splits=1, **tune))
    _check(case, tuning, k_scale=ks, v_scale=vs, sliding_window=window,
           logit_soft_cap=cap, decode_only=True)


def run_wide_pool_tunings(names: list[str], out: str) -> None:
    """run_wide_pool_tuning for each of ``names`` in turn (the body of the
    subprocess below); writes {name: None, or the failure's traceback} to
    the JSON file ``out``."""
    import json
    import traceback
    results = {}
    for name in names:
        try:
            run_wide_pool_tuning(name)
            results[name] = None
        except Exception:  # noqa: BLE001 - reported by the tuning's test
            results[name] = traceback.format_exc()[-3000:]
    with open(out, "w") as f:
        json.dump(results, f)


@pytest.fixture(scope="module")
def wide_pool_results(tmp_path_factory):
    """Every WIDE_POOL_TUNINGS case run in one fresh process (its imports,
    the reference's programs and the thread programs the tunings share
    built once): name -> None, or the failure's traceback."""
    import json
    import os
    import subprocess
    import sys
    out = str(tmp_path_factory.mktemp("wide-pool") / "results.json")
    # The fresh process compiles each thread program once, as the suite's
    # processes do (conftest.py installs the memo there).
    code = ("from tests import interpret_compile_memo; "
            "interpret_compile_memo.install(); "
            "from tests.pallas_kernels.test_ragged_paged_attention_decode_"
            f"mgpu import run_wide_pool_tunings; "
            f"run_wide_pool_tunings({list(WIDE_POOL_TUNINGS)!r}, {out!r})")
    env = dict(os.environ, PJRT_NPROC="8")
    root = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=root,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(out) as f:
        return json.load(f)


# One worker runs every tuning: they share the fixture's one process.
@pytest.mark.slow
@pytest.mark.xdist_group("decode_mgpu_wide_pool")
@pytest.mark.parametrize("name", list(WIDE_POOL_TUNINGS))
def test_mosaic_decode_many_warpgroups_interpreted(wide_pool_results, name):
    """The fp8 default (three warpgroups) and the v17 four-producer
    tunings (five), with and without swap_ab, match the reference in the
    interpreter once XLA's CPU pool is wider than the warpgroups."""
    assert name in wide_pool_results
    assert wide_pool_results[name] is None, wide_pool_results[name]


# The window and soft cap take one code path under swap_ab whatever the
# tuning (the transposed mask and cap in ``_scaled``; the window's first
# block in ``_program_range``, shared by every tuning): they run on one
# 16-bit and one fp8 case, not on all five.
@pytest.mark.parametrize("pages,group,tune,windowed", [
    ("bf16", 4, dict(producer_warpgroup=False), False),
    ("bf16", 20, dict(producer_warpgroup=True), True),
    ("fp8", 1, dict(producer_warpgroup=False), False),
    ("fp8", 8, dict(producer_warpgroup=True, fp8_f16=True,
                    tokens_per_step=128, no_auto_barriers=True), True),
    ("fp8", 64, dict(producer_warpgroup=True, v_staging_stages=1), False)])
def test_mosaic_decode_swap_ab(pages, group, tune, windowed):
    """swap_ab (tokens on the wgmmas' M side, the query rows on N, rounded
    up to 16, 32 or 64): one warpgroup and a producer, 16-bit and fp8
    pages, one-token and many-step sequences, empty splits (four over
    7 tokens), a padding row; a window with a soft cap."""
    decodes = [(1, 330), (1, 7), (1, 1)]
    kw = dict(num_q_heads=group, num_kv_heads=1, head_dim=64, seed=30 + group)
    tuning = _mosaic(num_stages=2, kv_splits=4, swap_ab=True, **tune)
    if pages == "fp8":
        case, ks, vs = fp8_case(decodes, pad_seqs=1, **kw)
        scales = dict(k_scale=ks, v_scale=vs)
    else:
        case = make_case(decodes, dtype=jnp.bfloat16, pad_seqs=1, **kw)
        scales = {}
    _check(case, tuning, decode_only=True, **scales)
    if windowed:
        _check(case, tuning, decode_only=True, sliding_window=100,
               logit_soft_cap=5.0, **scales)


def test_swap_ab_and_four_producers_plans():
    """The register split (a raise completes only once the cuts freed as
    many: consumer + producers within the launch's figure per thread times
    the warpgroups) and the tunings refused."""
    for producers, swap, want in ((1, False, (232, 160)),
                                  (2, False, (232, 136)),
                                  (4, False, (232, 56)), (4, True, (160, 80))):
        got = MosaicDecodeTuning(swap_ab=swap).registers(producers)
        assert got == want, (producers, swap, got)
        launch = 65536 // (128 * (1 + producers)) // 8 * 8
        assert got[0] + producers * got[1] <= min(248, launch) * (1 + producers)
    assert MosaicDecodeTuning(consumer_registers=200).registers(4) == (200, 64)
    # The most a consumer may ask still leaves four producers 56.
    assert MosaicDecodeTuning(consumer_registers=256).registers(4) == (256, 56)
    with pytest.raises(TuningError, match="consumer_registers"):
        MosaicDecodeTuning(consumer_registers=100)
    with pytest.raises(TuningError, match="producer_warpgroup"):
        MosaicDecodeTuning(consumer_registers=200, producer_warpgroup=False)
    with pytest.raises(TuningError, match="multiple of 128"):
        MosaicDecodeTuning(fp8_producers=4, tokens_per_step=64)
    with pytest.raises(TuningError, match="overlap_softmax"):
        MosaicDecodeTuning(swap_ab=True, overlap_softmax=True)
    # The four producers' shares: every (kind, 64-token chunk) of a step
    # exactly once.
    shares = [mg._producer_share(p, 4, 256) for p in range(4)]
    assert sorted((k, c) for kinds, chunks in shares for k in kinds
                  for c in chunks) == [(k, c) for k in (0, 1)
                                       for c in range(4)]
    # swap_ab's smem plan counts its query, output and P tiles at the
    # rows' width: at 16 rows (4 KiB each) the fp8 default's 2 + 2 staging
    # still fits 224 KiB beside a 2-step ring; at 64 (48 KiB) it gives way.
    t = MosaicDecodeTuning(tokens_per_step=128, smem_budget=224 * 1024,
                           swap_ab=True)
    assert t.fp8_stages(128, 2, rows=16) == (2, (2, 2))
    assert t.fp8_stages(128, 2, rows=64) == (3, (1, 1))
    for rows in (16, 32, 64):
        ring, (k, v) = t.fp8_stages(128, 2, rows)
        tiles = rows * (2 * 128 + 128) * 2 + 4096
        assert tiles + (k + v) * 128 * 128 * 2 + ring * 2 * 128 * 128 \
            <= t.smem_budget


def test_mosaic_decode_plans_that_overflow_shared_memory_are_refused():
    """The least plan at 256-token steps of head_dim 128 (two ring steps,
    one staging tile per kind) takes 276 KiB: refused with a TuningError
    that names the field, for 16-bit and fp8 pages. The limit is the SM's
    227 KiB, not smem_budget (which only picks the automatic depths)."""
    t = MosaicDecodeTuning(tokens_per_step=256, smem_budget=224 * 1024)
    for plan in (t.stages, t.fp8_stages):
        with pytest.raises(TuningError, match="276 KiB.*tokens_per_step"):
            plan(128, 2)
    assert t.stages(64, 2) == 3 and t.fp8_stages(64, 2)[0] >= 2  # 64 KiB steps
    # swap_ab's least plan for a group of 64 at head_dim 256: 205 KiB.
    assert MosaicDecodeTuning(swap_ab=True).fp8_stages(256, 2, 64) == (
        2, (1, 1))
    by_hand = MosaicDecodeTuning(tokens_per_step=128, num_stages=3)
    assert by_hand.stages(128, 2) == 3  # 212 KiB: over 200, under 227
    with pytest.raises(TuningError, match="lower num_stages"):
        dataclasses.replace(by_hand, num_stages=4).stages(128, 2)


def _tuning_or_none(**kw):
    try:
        return MosaicDecodeTuning(**kw)
    except TuningError:
        return None


@settings(max_examples=300, deadline=None)
@given(tokens=st.sampled_from([64, 128, 192, 256]),
       head_dim=st.sampled_from([64, 128, 256]),
       rows=st.sampled_from([8, 16, 32, 64]),
       fp8=st.booleans(), producer=st.booleans(), swap=st.booleans(),
       k=st.integers(1, 4), v=st.integers(0, 4),
       stages=st.sampled_from([0, 0, 2, 3, 5, 8]),
       budget=st.integers(96, 227).map(lambda x: x * 1024))
def test_every_smem_plan_fits_or_is_refused(tokens, head_dim, rows, fp8,
                                            producer, swap, k, v, stages,
                                            budget):
    """Property over tunings, head dims and row widths: a plan either fits
    the SM's shared memory (and an automatic one fits smem_budget whenever
    its least plan does) or is a TuningError, exactly when even one
    staging tile per kind would not fit; never a silent overflow. (It
    found fp8 staging sized for a 2-step ring beside a deeper ring set by
    hand.)"""
    t = _tuning_or_none(tokens_per_step=tokens, producer_warpgroup=producer,
                        swap_ab=swap, staging_stages=k, v_staging_stages=v,
                        num_stages=stages, smem_budget=budget)
    if t is None:
        return
    fixed = t._fixed(head_dim, 2, rows)
    step = 2 * tokens * head_dim * (1 if fp8 else 2)
    tile = tokens * head_dim * 2
    least = fixed + 2 * step + (2 * tile if fp8 else 0)
    try:
        if fp8:
            ring, (ks, vs) = t.fp8_stages(head_dim, 2, rows)
            planned = fixed + (ks + vs) * tile + ring * step
        else:
            ring = t.stages(head_dim, 2, rows)
            planned = fixed + ring * step
    except TuningError as e:
        assert "KiB" in str(e) and ("tokens_per_step" in str(e)
                                    or "num_stages" in str(e))
        assert (least if not stages else
                fixed + stages * step + (2 * tile if fp8 else 0)) \
            > SMEM_PER_BLOCK
        return
    assert planned <= SMEM_PER_BLOCK and ring >= 2
    if not stages and least <= budget:
        assert planned <= budget


def test_mosaic_decode_probe_leaves_out_the_math():
    """The measurement-only probe: with no_math the loop still waits for
    and releases every tile (it finishes) but computes nothing (zeros);
    an unknown probe name is refused."""
    case = make_case([(1, 200), (1, 7)], num_q_heads=4, num_kv_heads=1,
                     head_dim=64, dtype=jnp.bfloat16, seed=6)
    whole = _check(case, _mosaic(num_stages=2, kv_splits=2))
    probed = ragged_paged_attention(
        *case, sm_scale=0.125, interpret=INTERPRET, decode_only=True,
        tuning=_mosaic(num_stages=2, kv_splits=2, probe="no_math"))
    assert jnp.any(whole[:2]) and not jnp.any(probed[:2])
    with pytest.raises(TuningError, match="probe"):
        MosaicDecodeTuning(probe="no_loads")


def test_fp8_pages_take_their_own_default_tuning():
    """fp8 pages at head_dim 128 get FP8_MOSAIC_DECODE from the tuned
    table; 16-bit pages and other head dims keep the table's entry."""
    from jaxinfer.pallas_kernels.ragged_paged_attention_tuning import (
        FP8_MOSAIC_DECODE,
        default_tuning,
    )
    h200 = "NVIDIA H200"
    fp8 = default_tuning(128, 16, h200, kv_itemsize=1)
    bf16 = default_tuning(128, 16, h200)
    assert fp8.mosaic_decode == FP8_MOSAIC_DECODE != bf16.mosaic_decode
    assert fp8 == dataclasses.replace(bf16, mosaic_decode=FP8_MOSAIC_DECODE)
    assert FP8_MOSAIC_DECODE.fp8_producers == 2
    assert default_tuning(64, 16, h200, kv_itemsize=1) == default_tuning(
        64, 16, h200)


def test_mosaic_decode_takes_fp8_pages_only_with_per_page_scales():
    bf16, fp8 = jnp.bfloat16, jnp.float8_e4m3fn
    assert mg.supports(bf16, fp8, 128, 16, 4, 64, per_page_scales=True) is None
    assert mg.supports(bf16, fp8, 128, 16, 4) is None
    assert "per-page" in mg.supports(bf16, bf16, 128, 16, 4,
                                     per_page_scales=True)
    assert "dtype" in mg.supports(jnp.float32, fp8, 128, 16, 4)
    assert "dtype" in mg.supports(bf16, jnp.float8_e5m2, 128, 16, 4)
    # The smem plan for fp8 pages: a deeper fp8 ring beside the 16-bit
    # staging tiles, within the budget.
    t = MosaicDecodeTuning()
    ring, staging = t.fp8_stages(128, 2)
    assert staging == (2, 2) and ring > t.stages(128, 2)
    assert 64 * 128 * 2 + sum(staging) * 64 * 128 * 2 + ring * 2 * 64 * 128 \
        <= t.smem_budget
    assert t.fp8_stages(256, 2)[1] == (1, 1)  # H=256: one tile each fits
    # V's own depth; over budget the deeper one gives way first.
    t = MosaicDecodeTuning(tokens_per_step=128, staging_stages=1,
                           v_staging_stages=2, smem_budget=224 * 1024)
    assert t.fp8_stages(128, 2) == (3, (1, 2))
    assert dataclasses.replace(t, v_staging_stages=4).fp8_stages(
        128, 2) == (2, (1, 3))
    assert dataclasses.replace(t, smem_budget=200 * 1024).fp8_stages(
        128, 2) == (2, (1, 2))
    # At 128-token steps 2 + 2 tiles do not fit 200 KiB, 1 + 1 do; the fp8
    # default's 224 KiB take 2 + 2 beside a 2-step ring.
    from jaxinfer.pallas_kernels.ragged_paged_attention_tuning import FP8_MOSAIC_DECODE
    assert dataclasses.replace(FP8_MOSAIC_DECODE, smem_budget=200 * 1024
                               ).fp8_stages(128, 2) == (3, (1, 1))
    assert FP8_MOSAIC_DECODE.fp8_stages(128, 2) == (2, (2, 2))
    with pytest.raises(TuningError):
        MosaicDecodeTuning(staging_stages=0)
    with pytest.raises(TuningError, match="v_staging_stages"):
        MosaicDecodeTuning(v_staging_stages=-1)
    with pytest.raises(TuningError, match="fp8_producers"):
        MosaicDecodeTuning(fp8_producers=3)


@gpu
@pytest.mark.parametrize("group,head_dim", [(1, 64), (4, 128), (8, 128),
                                            (4, 256)])
@pytest.mark.parametrize("window,cap", [(None, None), (300, 30.0)])
def test_mosaic_decode_fp8_on_gpu(group, head_dim, window, cap):
    """fp8 pages with per-page scales, compiled, through the automatic
    backend (Mosaic decode, Triton prefill for the chunk)."""
    decodes = [(1, 1), (1, 129), (1, 2048), (1, 5000)]
    kw = dict(num_q_heads=4 * group, num_kv_heads=4, head_dim=head_dim,
              seed=head_dim + group)
    case, ks, vs = fp8_case(decodes + [(7, 40)], **kw)
    _check(case, None, sliding_window=window, logit_soft_cap=cap,
           k_scale=ks, v_scale=vs)
    case, ks, vs = fp8_case(decodes, **kw)
    _check(case, None, sliding_window=window, logit_soft_cap=cap,
           k_scale=ks, v_scale=vs, decode_only=True)


@gpu
@pytest.mark.parametrize("page_size,group,head_dim", [
    (16, 1, 64), (16, 4, 128), (32, 8, 128), (16, 4, 256), (32, 8, 64)])
@pytest.mark.parametrize("window,cap", [(None, None), (300, 30.0)])
def test_mosaic_decode_on_gpu(page_size, group, head_dim, window, cap):
    """Compiled, at model-like lengths, through the automatic backend
    (Mosaic for page 16, Triton for page 32)."""
    mix = [(1, 1), (1, 129), (1, 2048), (7, 40), (1, 5000)]
    case = make_case(mix, num_q_heads=4 * group, num_kv_heads=4,
                     head_dim=head_dim, page_size=page_size,
                     dtype=jnp.bfloat16, seed=head_dim + group)
    _check(case, None, sliding_window=window, logit_soft_cap=cap)


@gpu
@pytest.mark.parametrize("pages,tune", [
    ("fp8", dict(staging_stages=1, v_staging_stages=2)),
    ("fp8", dict(overlap_softmax=True)),
    ("fp8", dict(overlap_softmax=True, tokens_per_step=64)),
    ("fp8", dict(fp8_f16=True)),
    ("fp8", dict(overlap_softmax=True, fp8_f16=True)),
    ("bf16", dict(overlap_softmax=True)),
    # v17: swap_ab, four producers, both (and a consumer asking for more).
    ("fp8", dict(swap_ab=True, fp8_f16=True)),
    ("fp8", dict(fp8_producers=4, fp8_f16=True)),
    ("fp8", dict(fp8_producers=4, fp8_f16=True, overlap_softmax=True)),
    ("fp8", dict(fp8_producers=4, fp8_f16=True, swap_ab=True)),
    ("fp8", dict(fp8_producers=4, swap_ab=True, consumer_registers=200)),
    ("bf16", dict(swap_ab=True)),
])
@pytest.mark.parametrize("window,cap", [(None, None), (300, 30.0)])
def test_mosaic_decode_pipeline_tunings_on_gpu(pages, tune, window, cap):
    """bench_decode_fp8.py --pipeline's tunings (on the fp8 default's two
    producers and 128-token steps, in 224 KiB of smem), compiled at
    head_dim 128: V staged deeper than K, the softmax overlapped with the
    next QK^T."""
    base = dict(fp8_producers=2, tokens_per_step=128, no_auto_barriers=True,
                smem_budget=224 * 1024) if pages == "fp8" else {}
    tuning = _mosaic(producer_warpgroup=True, **{**base, **tune})
    decodes = [(1, 1), (1, 129), (1, 2048), (1, 5000)]
    kw = dict(num_q_heads=16, num_kv_heads=4, head_dim=128, seed=21)
    if pages == "fp8":
        case, ks, vs = fp8_case(decodes, **kw)
        _check(case, tuning, sliding_window=window, logit_soft_cap=cap,
               k_scale=ks, v_scale=vs, decode_only=True)
    else:
        case = make_case(decodes, dtype=jnp.bfloat16, **kw)
        _check(case, tuning, sliding_window=window, logit_soft_cap=cap,
               decode_only=True)


@gpu
@pytest.mark.parametrize("group,head_dim,producers", [
    (1, 64, 1), (4, 128, 2), (20, 128, 4), (64, 128, 2), (8, 256, 1)])
def test_mosaic_decode_swap_ab_on_gpu(group, head_dim, producers):
    """swap_ab compiled over the query-row widths it pads to (16, 32, 64)
    and head dims 64-256, fp8 pages with one, two or four producers, and
    16-bit pages; with a window and soft cap."""
    decodes = [(1, 1), (1, 129), (1, 2048), (1, 5000)]
    kw = dict(num_q_heads=2 * group, num_kv_heads=2, head_dim=head_dim,
              seed=40 + group)
    fp8 = _mosaic(producer_warpgroup=True, swap_ab=True,
                  fp8_producers=producers,
                  tokens_per_step=128 if producers == 4 else 64)
    case, ks, vs = fp8_case(decodes, **kw)
    _check(case, fp8, k_scale=ks, v_scale=vs, decode_only=True,
           sliding_window=300, logit_soft_cap=30.0)
    case = make_case(decodes, dtype=jnp.bfloat16, **kw)
    _check(case, _mosaic(producer_warpgroup=True, swap_ab=True), decode_only=True)


def _lower_for_cuda(pages, head_dim, group, tuning, **kw) -> str:
    """The decode kernel lowered for cuda on this machine (Mosaic GPU's
    layout inference, transforms and barriers run in Python, so their
    errors show without a GPU; ptxas' do not)."""
    import functools

    import jax
    args = decode_lowering_args(pages, head_dim, group,
                                per_page=pages != jnp.bfloat16)
    fn = jax.jit(functools.partial(mg.decode_attention,
                                   sm_scale=head_dim ** -0.5, tuning=tuning,
                                   **kw))
    return fn.trace(*args).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("pages,head_dim,group,tuning,kw", [
    (jnp.bfloat16, 128, 4, MosaicDecodeTuning(), {}),
    (jnp.bfloat16, 64, 20, MosaicDecodeTuning(swap_ab=True,
                                              producer_warpgroup=False), {}),
    (jnp.float8_e4m3fn, 128, 4, _fp8_default(), {}),
    (jnp.float8_e4m3fn, 128, 8, _fp8_default(),
     dict(sliding_window=300, logit_soft_cap=30.0)),
    (jnp.float8_e4m3fn, 128, 4, _fp8_default(fp8_producers=4, swap_ab=True,
                                             overlap_softmax=False), {}),
], ids=["bf16", "bf16-swap-1wg", "fp8-default", "fp8-default-window",
        "fp8-4producers-swap"])
def test_decode_lowers_to_a_mosaic_gpu_kernel(pages, head_dim, group,
                                              tuning, kw):
    """The shipped defaults and the v17 variants the next GPU run times
    lower to one Mosaic GPU call for Hopper (the GPU-only tests cannot run
    in CI; ``benchmarks/kernels/preflight_decode_mgpu.py`` lowers all 61
    tunings the benchmarks use)."""
    text = _lower_for_cuda(pages, head_dim, group, tuning, **kw)
    assert text.count("custom_call @mosaic_gpu") == 1  # the one kernel
    assert "wgmma" in text  # its products on Hopper's tensor cores
