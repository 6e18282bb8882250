"""What the fuzz tier draws: tensors of random data with special values planted, strided views,
and the one settings profile every fuzz test runs under.

Hypothesis draws a few numbers (a seed, a scale, where each special goes); the tensor is built
from them, so an example is cheap to draw and replays exactly. The profile is fixed: a set
number of examples per test, a per-example time limit, ``derandomize`` (the same examples on
every run, so CI is reproducible) and no shrinking (a failure reports the example as drawn and
CI time stays bounded).
"""

from __future__ import annotations

from datetime import timedelta

import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

FUZZ = settings(
    max_examples=20,
    deadline=timedelta(seconds=30),
    derandomize=True,
    database=None,
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=list(HealthCheck),
)
"""The tier's profile; each test sets its own ``max_examples`` (its budget) from it."""

SPECIALS = ("nan", "inf", "-inf", "zero", "-zero", "subnormal", "huge", "tiny", "tie")
"""Values planted in drawn tensors: NaN, ±Inf, ±0, the dtype's smallest subnormal, its largest
and smallest normal magnitudes, and ``tie``: a copy of the row's largest value."""


def special_value(kind: str, dtype: torch.dtype) -> float:
    info = torch.finfo(dtype)
    return {
        "nan": float("nan"),
        "inf": float("inf"),
        "-inf": -float("inf"),
        "zero": 0.0,
        "-zero": -0.0,
        "subnormal": info.smallest_normal * info.eps,
        "huge": info.max,
        "tiny": info.tiny,
    }[kind]


@st.composite
def tensors(
    draw,
    rows: int,
    cols: int,
    dtype: torch.dtype,
    *,
    kinds=SPECIALS,
    max_specials: int = 6,
    log2_scale: tuple[int, int] = (-20, 20),
) -> torch.Tensor:
    """A ``[rows, cols]`` tensor of ``dtype``: standard normal times ``2**k`` (``k`` drawn in
    ``log2_scale``), with up to ``max_specials`` of ``kinds`` planted anywhere."""
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    scale = 2.0 ** draw(st.integers(*log2_scale))
    t = (torch.randn(rows, cols, generator=gen, dtype=torch.float64) * scale).to(dtype)
    if t.numel() == 0 or not kinds:
        return t
    cells = st.tuples(st.integers(0, rows - 1), st.integers(0, cols - 1), st.sampled_from(kinds))
    for row, col, kind in draw(st.lists(cells, max_size=max_specials)):
        if kind == "tie":
            t[row, col] = t[row].float().nan_to_num(nan=-float("inf")).max().to(dtype)
        else:
            t[row, col] = special_value(kind, dtype)
    return t


@st.composite
def laid_out(draw, t: torch.Tensor, *, transposed: bool = True) -> torch.Tensor:
    """``t`` as it is, as a view with a wider row stride, or (``transposed``) with last-dim
    stride 2: the same values, so the op's result must not change."""
    layout = draw(
        st.sampled_from(("contiguous", "row stride", "column stride")[: 3 if transposed else 2])
    )
    rows, cols = t.shape
    if layout == "contiguous":
        return t
    if layout == "row stride":
        wide = torch.zeros(rows, cols + draw(st.integers(1, 40)), dtype=t.dtype)
        wide[:, :cols] = t
        return wide[:, :cols]
    wide = torch.zeros(rows, 2 * cols, dtype=t.dtype)
    wide[:, ::2] = t
    return wide[:, ::2]
