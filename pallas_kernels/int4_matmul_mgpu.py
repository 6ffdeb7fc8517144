"""int4 x bf16 matmul in Pallas Mosaic GPU (Hopper), for AWQ / GPTQ layers
at decode-sized batches.

Weights in ``GroupedWeights``' layout (see ``int4_matmul.py``): ``qweight``
uint8 [Out, In / 2] (input 2j in the low nibble of byte j), ``scales``
[Out, G], ``qzeros`` uint8 [Out, G], groups of 128 inputs;
``w[o, i] = (q[o, i] - z[o, g]) * s[o, g]``. No layout is converted: the
kernel reads the checkpoint's arrays as they are.

Why it is built this way (the Triton kernel stays far below the copy
bandwidth whatever its form; NOTES.md, int4 section):

* A/B swapped: the weights are the wgmma's M side (64 output features per
  consumer warpgroup) and the few activation rows its N side (N = 8 for a
  decode), so a one-row product wastes no tensor-core rows on padding
  weights and the activations are the smem operand, read transposed.
* Memory pipeline as the Mosaic decode attention kernel's: a producer
  warpgroup TMA-copies each group's codes (``64 * W`` rows x 64 bytes) and
  the matching activation columns into a ring of ``num_stages`` slots;
  ``W`` consumer warpgroups each dequantize their 64 rows in registers and
  multiply. The program's scales and zero points come in two TMA boxes at
  its start (16 groups wide: a TMA box row is at least 16 bytes).
* Dequantization in registers with Mosaic's own int4 path: the bytes are
  viewed as int4 in smem (an aliased view of the same ring), loaded in the
  layout that upcasts cheaply, xor-ed with 8 (so the signed nibble reads
  q - 8), relaid to the wgmma operand layout and converted to bf16 (a few
  integer ops per pair of weights, CUTLASS's conversion).
* Two forms (``scale_on``): "partials" multiplies the raw codes q - 8
  (exact in bf16) and applies each group's scale and zero point to the
  [64, N] partial product, s * (acc - (z - 8) * sum(x)), the group's input
  sums from a second wgmma against a tile of ones: no per-weight arithmetic
  past the conversion. "weights" forms (q - z) * s per weight in bf16 and
  accumulates all groups in one accumulator. Weights is the default (it
  is the faster form even at one row), computed as q * s + (-z * s)
  ("fma": one multiply-add per pair of weights instead of a subtract and
  a multiply).
* Split-K over groups for small batches: ``splits`` programs share a row
  tile, each writing its f32 partial product; a jnp sum adds them.

On CPU the same kernel runs in Mosaic GPU's interpret mode, with jnp stand-
ins for what the interpreter does not take (register wgmma operands, the
int4 view of the ring, register layouts): it checks the pipeline, the
indexing and the arithmetic, not Mosaic's register layouts.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from .kernel_common import (
    Ref,
    mosaic_interpret_params,
    mosaic_register_helpers,
    round_up,
    swizzled_smem_transforms,
)
from .ragged_paged_attention_tuning import NUM_SMS

GROUP = 128  # inputs per group (and per pipeline step)
ROWS = 64  # output features per consumer warpgroup (the wgmma M)
BOX_GROUPS = 16  # groups per scale / zero-point TMA box (16 bytes of zeros)


class Int4MosaicUnsupported(ValueError):
    """A case the Mosaic kernel does not take; the message says why."""


@dataclasses.dataclass(frozen=True)
class Int4MosaicTuning:
    """Static launch parameters of the Mosaic int4 kernel."""
    warpgroups: int = 2  # consumer warpgroups per program (64 outputs each)
    num_stages: int = 0  # ring depth in groups; 0 = as many as smem_budget
    splits: int = 0  # programs sharing a row tile's groups; 0 = automatic
    programs_per_sm: int = 1  # target of the automatic split count
    block_rows: int = 0  # x rows per program (wgmma N); 0 = automatic
    scale_on: str = "auto"  # "partials", "weights", "fma"; auto: fma
    smem_budget: int = 200 * 1024  # bytes of shared memory per program
    # Measurement only (wrong results on purpose): leave one stage out to
    # see which bounds the kernel. "no_math": consumers only wait and
    # release; "no_loads": after the ring's first fill the producer arrives
    # without copying; "no_dequant": a constant tile stands in for the
    # dequantized weights.
    probe: str = ""

    def __post_init__(self):
        if self.warpgroups not in (1, 2, 4):
            raise ValueError(f"warpgroups must be 1, 2 or 4, got "
                             f"{self.warpgroups}")
        if self.num_stages < 0 or self.num_stages == 1:
            raise ValueError(f"num_stages={self.num_stages} must be 0 "
                             "(automatic) or >= 2")
        if self.splits < 0 or self.programs_per_sm < 1:
            raise ValueError("splits must be >= 0, programs_per_sm >= 1")
        if self.block_rows < 0 or self.block_rows % 8 or self.block_rows > 256:
            raise ValueError(f"block_rows={self.block_rows} must be 0 or a "
                             "multiple of 8 up to 256 (the wgmma N)")
        if self.probe not in ("", "no_math", "no_loads", "no_dequant"):
            raise ValueError(f"probe must be '', 'no_math', 'no_loads' or "
                             f"'no_dequant', got {self.probe!r}")
        if self.scale_on not in ("auto", "partials", "weights", "fma"):
            raise ValueError(f"scale_on must be 'auto', 'partials', "
                             f"'weights' or 'fma', got {self.scale_on!r}")


class _Plan(NamedTuple):
    """The launch a tuning gives for one shape (all static)."""
    rows: int  # wgmma N: x rows per program
    padded: int  # x rows after padding (a multiple of rows)
    splits: int
    groups_per_split: int
    boxes: int  # 16-group scale boxes per program
    stages: int
    partials: bool
    fma: bool = False  # weights as q * s + (-z * s): one multiply-add each
    probe: str = ""  # Int4MosaicTuning.probe


def problem(x_dtype: jax.typing.DTypeLike, n_in: int, n_out: int, groups: int,
            scale_dtype: jax.typing.DTypeLike, warpgroups: int = 2
            ) -> str | None:
    """None if the kernel takes this case, else the reason it does not."""
    if jnp.dtype(x_dtype) != jnp.dtype(jnp.bfloat16):
        return f"activations {jnp.dtype(x_dtype).name} (bf16 only)"
    if jnp.dtype(scale_dtype).itemsize != 2:
        return f"scales {jnp.dtype(scale_dtype).name} (16-bit only)"
    if groups * GROUP != n_in:
        return f"groups of {n_in // max(groups, 1)} inputs ({GROUP} only)"
    if groups % BOX_GROUPS:
        return f"{groups} groups (a multiple of {BOX_GROUPS}: TMA boxes)"
    if n_out % (ROWS * warpgroups):
        return f"{n_out} outputs (a multiple of {ROWS * warpgroups})"
    return None


def _valid_splits(groups: int) -> list[int]:
    """Split counts whose group ranges tile the 16-group scale boxes."""
    return [s for s in range(1, groups + 1) if groups % s == 0
            and ((groups // s) % BOX_GROUPS == 0
                 or BOX_GROUPS % (groups // s) == 0)]


def plan(M: int, n_out: int, groups: int, tuning: Int4MosaicTuning) -> _Plan:
    """The launch for M rows: x rows per program (up to 128), the split count
    (automatic: the fewest that give ``programs_per_sm`` programs per SM,
    keeping 2+ groups per program) and the ring depth (what fits
    ``smem_budget``, at most 8 and the program's group count)."""
    rows = tuning.block_rows or min(round_up(M, 8), 128)
    padded = round_up(M, rows)
    # "auto" is the weights form as one multiply-add per pair ("fma"), the
    # fastest of the three forms at every shape timed.
    partials = tuning.scale_on == "partials"
    tiles = (padded // rows) * (n_out // (ROWS * tuning.warpgroups))
    valid = _valid_splits(groups)
    if tuning.splits:
        if tuning.splits not in valid:
            raise Int4MosaicUnsupported(
                f"splits={tuning.splits} for {groups} groups (valid: "
                f"{valid})")
        splits = tuning.splits
    else:
        want = tuning.programs_per_sm * NUM_SMS
        filling = [s for s in valid if tiles * s >= want and groups // s >= 2]
        splits = (filling[0] if filling
                  else max(s for s in valid if groups // s >= 2 or s == 1))
    gps = groups // splits
    boxes = max(1, gps // BOX_GROUPS)
    r = ROWS * tuning.warpgroups
    step = r * GROUP // 2 + rows * GROUP * 2  # codes + activations
    fixed = boxes * r * BOX_GROUPS * 3
    stages = tuning.num_stages or max(
        2, min(8, (tuning.smem_budget - fixed - 2048) // step))
    return _Plan(rows, padded, splits, gps, boxes, min(stages, max(gps, 2)),
                 partials, tuning.scale_on in ("fma", "auto"), tuning.probe)


class _Buffers(NamedTuple):
    """The kernel's shared-memory buffers (one scoped allocation)."""
    q: Any  # [S, W, 64, 64] uint8 codes ring (and its int4 view, compiled)
    x: Any  # [S, N, 128] activation columns ring
    s: Any  # [boxes, W, 64, 16] scales of the program's groups
    z: Any  # [boxes, W, 64, 16] uint8 zero points


class _Barriers(NamedTuple):
    ready: Any  # [S] a slot's codes and activations landed (2 copies)
    free: Any  # [S] every consumer warpgroup released a slot
    sz: Any  # [1] the scales and zero points landed


def _int4_kernel(
    x_ref: Ref,  # [Mp, In] bf16
    *refs: Ref,  # per weight set: q [Out_j / 64, 64, In / 2] uint8 codes (two
    # per byte), s [Out_j / 64, 64, G] scales, z [Out_j / 64, 64, G] uint8
    # zero points; then o [splits, sum Out_j / 64, 64, Mp] f32, each
    # split's partial product (the sets' tiles one after another)
    p: _Plan, warpgroups: int, bounds: tuple[int, ...], interpret: bool
) -> None:
    """``bounds``: the first tile of each weight set, then the tile count;
    a program's tiles lie in one set (each set's tiles are a multiple of
    ``warpgroups``). Only the producer's copies depend on the set (one
    branch per set around each copy); the consumers read the ring and
    write the program's global tiles of ``o_ref`` alike for every set."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    o_ref = refs[-1]
    sets = [refs[3 * j:3 * j + 3] for j in range(len(bounds) - 1)]
    W, S, N = warpgroups, p.stages, p.rows
    dt = x_ref.dtype

    def scoped(buffers: _Buffers, barriers: _Barriers) -> None:
        _body(buffers, barriers, x_ref, sets, o_ref, bounds, p=p,
              warpgroups=W, interpret=interpret)

    r = (S, W, ROWS, GROUP // 2)
    if interpret:
        q_alloc = plgpu.SMEM(r, jnp.uint8)
    else:
        # One ring, two views: TMA writes bytes, the consumers read int4.
        q_alloc = plgpu.RefUnion(
            plgpu.SMEM(r, jnp.uint8, transforms=_tiles(jnp.uint8, 64)),
            plgpu.SMEM((S, W, ROWS, GROUP), jnp.int4,
                       transforms=_tiles(jnp.int4, 64)))
    sz = (p.boxes, W, ROWS, BOX_GROUPS)
    pl.run_scoped(
        scoped,
        _Buffers(
            q=q_alloc,
            x=plgpu.SMEM((S, N, GROUP), dt,
                         transforms=swizzled_smem_transforms(dt)),
            s=plgpu.SMEM(sz, refs[1].dtype),
            z=plgpu.SMEM(sz, jnp.uint8)),
        _Barriers(
            ready=plgpu.Barrier(num_arrivals=2, num_barriers=S),
            free=plgpu.Barrier(num_arrivals=W, num_barriers=S),
            sz=plgpu.Barrier(num_arrivals=2 * p.boxes, num_barriers=1)),
        collective_axes="wg",
    )


def _body(
    buffers: _Buffers,
    barriers: _Barriers,
    x_ref: Ref,  # [Mp, In] bf16
    sets: Sequence[Sequence[Ref]],  # (q, s, z) of each weight set
    o_ref: Ref,  # [splits, sum Out_j / 64, 64, Mp] f32
    bounds: tuple[int, ...],
    *, p: _Plan, warpgroups: int, interpret: bool,
) -> None:
    """One program: the producer copies its tiles' codes, scales and zero
    points from the weight set they lie in, the consumers multiply."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    cast, _ = mosaic_register_helpers(interpret)
    W, S, N = warpgroups, p.stages, p.rows
    m0 = lax.axis_index("m") * N
    split = lax.axis_index("k")
    g0 = split * p.groups_per_split
    box0 = lax.div(g0, BOX_GROUPS) * BOX_GROUPS
    wg = lax.axis_index("wg")
    dt = x_ref.dtype
    gbytes = GROUP // 2
    t0 = lax.axis_index("n") * W  # the program's first tile, all sets

    def from_set(copy):
        """copy(q_ref, s_ref, z_ref, first tile in the set) for the set
        holding the program's tiles."""
        if len(sets) == 1:
            copy(*sets[0], t0)
            return
        for (q_ref, s_ref, z_ref), lo, hi in zip(sets, bounds[:-1],
                                                 bounds[1:]):
            @pl.when((t0 >= lo) & (t0 < hi))
            def _(q_ref=q_ref, s_ref=s_ref, z_ref=z_ref, lo=lo):
                copy(q_ref, s_ref, z_ref, t0 - lo)

    q_ring, x_ring, s_smem, z_smem = buffers
    if interpret:
        q4_ring = None
    else:
        q_ring, q4_ring = q_ring
    ready, free, sz_bar = barriers

    @pl.when(wg == W)
    def _producer():
        def scales(q_ref, s_ref, z_ref, t):
            for b in range(p.boxes):
                cols = pl.ds(box0 + b * BOX_GROUPS, BOX_GROUPS)
                plgpu.copy_gmem_to_smem(s_ref.at[pl.ds(t, W), :, cols],
                                        s_smem.at[b], sz_bar.at[0])
                plgpu.copy_gmem_to_smem(z_ref.at[pl.ds(t, W), :, cols],
                                        z_smem.at[b], sz_bar.at[0])
        from_set(scales)

        def issue(i, slot):
            g = g0 + i
            from_set(lambda q_ref, s_ref, z_ref, t: plgpu.copy_gmem_to_smem(
                q_ref.at[pl.ds(t, W), :, pl.ds(g * gbytes, gbytes)],
                q_ring.at[slot], ready.at[slot]))
            plgpu.copy_gmem_to_smem(
                x_ref.at[pl.ds(m0, N), pl.ds(g * GROUP, GROUP)],
                x_ring.at[slot], ready.at[slot])

        for i in range(min(S, p.groups_per_split)):
            issue(i, i)
        if p.groups_per_split > S:
            @pl.loop(0, p.groups_per_split - S)
            def _(i):
                slot = lax.rem(i, S)
                plgpu.barrier_wait(free.at[slot])
                if p.probe == "no_loads":
                    plgpu.barrier_arrive(ready.at[slot])
                    plgpu.barrier_arrive(ready.at[slot])
                else:
                    issue(i + S, slot)

    @pl.when(wg < W)
    def _consumer():
        plgpu.barrier_wait(sz_bar.at[0])
        if p.partials or p.probe == "no_dequant":
            ones = cast(jnp.ones((ROWS, GROUP), dt), plgpu.Layout.WGMMA)

        def q4_tile(slot):
            """This warpgroup's codes of a ring slot viewed as int4
            (compiled only)."""
            return None if q4_ring is None else q4_ring.at[slot, wg]

        def step(i, acc):
            slot = lax.rem(i, S)
            g = g0 + i
            box = lax.div(g, BOX_GROUPS) - lax.div(box0, BOX_GROUPS)
            col = lax.rem(g, BOX_GROUPS)
            s_row = s_smem.at[box, wg, :, col]
            z_row = z_smem.at[box, wg, :, col]
            plgpu.barrier_wait(ready.at[slot])
            x_tile = x_ring.at[slot]
            if p.probe == "no_math":
                pass
            elif p.probe == "no_dequant":
                acc = _accumulate(acc, ones, x_tile, interpret)
            elif p.partials:
                q = _codes(q_ring.at[slot, wg], q4_tile(slot), interpret)
                part, xsum = _dots(q, ones, x_tile, N, interpret)
                s, z = _row_scales(s_row, z_row, interpret)
                acc = (acc + lax.broadcast_in_dim(s, acc.shape, [0]) * part
                       - lax.broadcast_in_dim(s * z, acc.shape, [0]) * xsum)
            else:
                w = _weights(q_ring.at[slot, wg], q4_tile(slot), s_row,
                             z_row, interpret, p.fma)
                acc = _accumulate(acc, w, x_tile, interpret)

            @pl.when(i + S < p.groups_per_split)
            def _():
                plgpu.barrier_arrive(free.at[slot])
            return acc

        acc = cast(jnp.zeros((ROWS, N), jnp.float32), plgpu.Layout.WGMMA)
        acc = lax.fori_loop(0, p.groups_per_split, step, acc)
        # Straight from registers: a [64, N] f32 tile is small beside
        # the program's codes, and staging it would take smem the ring
        # can use.
        o_ref.at[split, t0 + wg, :, pl.ds(m0, N)][...] = acc


def _tiles(dtype, swizzle):
    """Tiling + swizzle of an smem ring whose rows are ``swizzle`` bytes."""
    from jax.experimental.pallas import mosaic_gpu as plgpu
    bits = 4 if jnp.dtype(dtype) == jnp.dtype(jnp.int4) else \
        8 * jnp.dtype(dtype).itemsize
    return (plgpu.TilingTransform((8, swizzle * 8 // bits)),
            plgpu.SwizzleTransform(swizzle))


@functools.cache
def _load_takes_index() -> bool:
    """Whether ``plgpu.load`` wants an index argument (jax 0.10; jax 0.11
    deprecates it in favour of indexing the ref)."""
    import inspect

    from jax.experimental.pallas import mosaic_gpu as plgpu
    idx = inspect.signature(plgpu.load).parameters["idx"]
    return idx.default is inspect.Parameter.empty


def _load(ref, layout, optimized=True):
    """The whole of ``ref`` in registers, in ``layout``."""
    from jax.experimental.pallas import mosaic_gpu as plgpu
    if _load_takes_index():
        return plgpu.load(ref, (), layout=layout, optimized=optimized)
    # jax 0.11's signature, with no index; mypy reads the installed jax's.
    return plgpu.load(ref, layout=layout,  # type: ignore[call-arg]
                      optimized=optimized)


def _codes(q8_ref, q4_ref, interpret):
    """A [64, 128] tile of codes minus 8 (-8..7, exact) in bf16, in the
    wgmma operand layout. ``q8_ref``: [64, 64] bytes; ``q4_ref``: the same
    bytes viewed as [64, 128] int4 (compiled only)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu
    if interpret:
        q = q8_ref[...]
        q = jnp.stack([q & 0xF, q >> 4], axis=-1).reshape(ROWS, GROUP)
        return (q.astype(jnp.int32) - 8).astype(jnp.bfloat16)
    q = _load(q4_ref, plgpu.Layout.WGMMA_UPCAST_4X)
    # Flipping bit 3 makes the signed nibble read q - 8 (q in 0..15).
    q = q ^ jnp.int4(-8)
    q = plgpu.layout_cast(q, plgpu.Layout.WGMMA)
    return q.astype(jnp.bfloat16)


def _row_scales(s_ref, z_ref, interpret):
    """The tile's 64 scales and zero points minus 8 (f32, one per row)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu
    if interpret:
        s, z = s_ref[...], z_ref[...]
    else:
        row = plgpu.Layout.WGMMA.reduce(1)
        s = _load(s_ref, row, optimized=False)
        z = _load(z_ref, row, optimized=False)
    return s.astype(jnp.float32), z.astype(jnp.float32) - 8.0


def _weights(q8_ref, q4_ref, s_ref, z_ref, interpret, fma=False):
    """The tile's weights (q - z) * s in bf16 [64, 128]; ``fma``: as
    q * s + m with m = -z * s rounded to bf16 once per row (one fused
    multiply-add per pair of weights instead of a subtract and a
    multiply)."""
    q = _codes(q8_ref, q4_ref, interpret)  # q - 8
    s, z = _row_scales(s_ref, z_ref, interpret)  # z - 8
    if fma:
        m = (-z * s).astype(jnp.bfloat16)
        s = s.astype(jnp.bfloat16)
        if interpret:
            return (q.astype(jnp.float32) * s[:, None].astype(jnp.float32)
                    + m[:, None].astype(jnp.float32)).astype(jnp.bfloat16)
        s = lax.broadcast_in_dim(s, q.shape, [0])
        m = lax.broadcast_in_dim(m, q.shape, [0])
        return q * s + m
    if interpret:
        return ((q.astype(jnp.float32) - z[:, None]) * s[:, None]).astype(
            jnp.bfloat16)
    s = lax.broadcast_in_dim(s.astype(jnp.bfloat16), q.shape, [0])
    z = lax.broadcast_in_dim(z.astype(jnp.bfloat16), q.shape, [0])
    return (q - z) * s


def _dot(w, x):
    """w [64, K] . x [N, K] -> [64, N] f32."""
    return lax.dot_general(w, x, (((1,), (1,)), ((), ())),
                           preferred_element_type=jnp.float32)


def _accumulate(acc, w, x_ref, interpret):
    """acc + w @ x^T, w in registers, x [N, 128] in smem."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu
    if interpret:
        return acc + _dot(w, x_ref[...])

    def body(acc_ref):
        plgpu.wgmma(acc_ref, w, x_ref.transpose((1, 0)))
    return pl.run_state(body)(plgpu.ACC.init(acc))


def _dots(q, ones, x_ref, n, interpret):
    """(q @ x^T, ones @ x^T): the group's raw partial product and its
    input sums (every row the same), both [64, N] f32."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu
    if interpret:
        x = x_ref[...]
        return _dot(q, x), _dot(ones, x)

    def body(part_ref, sum_ref):
        xt = x_ref.transpose((1, 0))
        plgpu.wgmma(part_ref, q, xt)
        plgpu.wgmma(sum_ref, ones, xt)
        return part_ref[...], sum_ref[...]
    return pl.run_scoped(body, plgpu.ACC((ROWS, n), jnp.float32),
                         plgpu.ACC((ROWS, n), jnp.float32))


def int4_matmul_mgpu(
    x: jax.Array,  # [M, In] bf16
    qweight: jax.Array,  # [Out, In / 2] uint8
    scales: jax.Array,  # [Out, G] f16 / bf16
    qzeros: jax.Array,  # [Out, G] uint8
    *,
    tuning: Int4MosaicTuning = Int4MosaicTuning(),
    interpret: bool = False,
) -> jax.Array:  # [M, Out] in x's dtype
    """x @ w.T (see module doc); raises ``Int4MosaicUnsupported`` for
    cases the kernel does not take. Call it under jit."""
    [y] = int4_matmul_mgpu_many(x, [(qweight, scales, qzeros)],
                                tuning=tuning, interpret=interpret)
    return y


def int4_matmul_mgpu_many(
    x: jax.Array,  # [M, In] bf16
    # (qweight [Out_j, In / 2], scales [Out_j, G], qzeros [Out_j, G]) each
    weight_sets: Sequence[tuple[jax.Array, jax.Array, jax.Array]],
    *,
    tuning: Int4MosaicTuning = Int4MosaicTuning(),
    interpret: bool = False,
) -> list[jax.Array]:  # [M, Out_j] in x's dtype, one per set
    """x @ w_j.T for several weight sets that read the same input (q, k
    and v; gate and up) in one kernel call: one launch, one ring fill and
    one epilogue instead of one each (a call's fixed cost is a large share
    of a one-row product). The sets' tiles are laid one after another over
    the grid; the split count is planned for all of them together."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    M, n_in = x.shape
    G = weight_sets[0][1].shape[1]
    sdt = weight_sets[0][1].dtype
    for qweight, scales, qzeros in weight_sets:
        n_out = scales.shape[0]
        why = problem(x.dtype, n_in, n_out, scales.shape[1], scales.dtype,
                      tuning.warpgroups)
        if why is None and qweight.shape != (n_out, n_in // 2):
            why = f"qweight {qweight.shape} != [{n_out}, {n_in // 2}]"
        if why is None and (scales.shape[1] != G or scales.dtype != sdt
                            or qzeros.shape != scales.shape):
            why = (f"weight sets differ in groups or scale dtype ({G} "
                   f"{sdt.name} against {scales.shape[1]} "
                   f"{scales.dtype.name})")
        if why:
            raise Int4MosaicUnsupported(why)
    outs = [s.shape[0] for _, s, _ in weight_sets]
    p = plan(M, sum(outs), G, tuning)
    xp = jnp.pad(x, ((0, p.padded - M), (0, 0))) if p.padded != M else x
    bounds = tuple(sum(outs[:j]) // ROWS for j in range(len(outs) + 1))
    tiles = bounds[-1]
    kw = {}
    if interpret:
        kw["interpret"] = mosaic_interpret_params()
    else:
        # Lane semantics (explicit register layouts), which this kernel is
        # written in; jax 0.11 made Warpgroup semantics the default.
        kw["compiler_params"] = plgpu.CompilerParams(
            approx_math=True,
            lowering_semantics=plgpu.LoweringSemantics.Lane)
    W = tuning.warpgroups
    mesh = plgpu.Mesh(grid=(p.padded // p.rows, tiles // W, p.splits),
                      grid_names=("m", "n", "k"), num_threads=W + 1,
                      thread_name="wg")
    args = []
    for (qweight, scales, qzeros), n_out in zip(weight_sets, outs):
        t = n_out // ROWS
        args += [qweight.reshape(t, ROWS, -1), scales.reshape(t, ROWS, G),
                 qzeros.reshape(t, ROWS, G)]
    part = pl.kernel(
        functools.partial(_int4_kernel, p=p, warpgroups=W, bounds=bounds,
                          interpret=interpret),
        mesh=mesh, name="int4_matmul_mgpu",
        out_type=jax.ShapeDtypeStruct((p.splits, tiles, ROWS, p.padded),
                                      jnp.float32), **kw,
    )(xp, *args)
    y = part.sum(axis=0) if p.splits > 1 else part[0]
    y = y.reshape(tiles * ROWS, p.padded)
    return [y[lo * ROWS:hi * ROWS, :M].T.astype(x.dtype)
            for lo, hi in zip(bounds[:-1], bounds[1:])]
