"""DSpark greedy accept: row argmax over the verify logits and the accept rule, in one launch.

At BS=1 DSpark verifies ``n = 6`` rows of ``[129280]`` fp32 logits per step; SGLang computes
``torch.argmax`` (one block per row, ~27 µs on an H200) and then the accept rule in further
small launches. Here the multi-block row argmax of
:mod:`dsv41_kernels.ops.speculative.row_argmax` also applies the rule, so the whole greedy
accept is one launch with no host sync, and with ``out`` given it allocates nothing, which
makes it safe inside a captured CUDA graph. Where the row argmax takes its CUDA cluster
kernel (few rows, sm_90+) the accept does too (``accept_greedy_cluster`` in
``sgl-kernel/csrc/row_argmax.cu``: each row's leader CTA adds its match bit to a
per-request ticket and the last one applies the rule, with one ticket round trip and one
read of the bonus row's slot); elsewhere the Triton kernel's last block applies it.

Contract (SGLang 0.5.23 ``dspark_accept.accept_greedy``), bitwise:
``predict = torch.argmax(logits, -1).view(bs, n)``; ``correct_len[b]`` counts the leading
``k`` with ``candidates[b, k + 1] == predict[b, k]``; ``bonus[b] = predict[b, correct_len[b]]``.
With ``cutoff_verify_lens``: ``correct_len`` is capped at ``verify_lens - 1``,
``cap_trim_lens`` is what the cap removed and the bonus is read at the capped index;
without it ``cap_trim_lens`` is zeros. Outputs: int32, int64, int32, each ``[bs]``.
"""

from __future__ import annotations

import torch

from dsv41_kernels.admission import Admission, admit, check_tensor, refuse
from dsv41_kernels.jit import load_module
from dsv41_kernels.ops.speculative.row_argmax import (
    MAX_ROWS,
    launch,
    row_argmax_admission,
    uses_cluster_kernel,
)
from dsv41_kernels.workspace import device_workspace

MAX_DRAFT_ROWS = 64  # n: the accept epilogue holds [bs, n] in one block's registers
CLUSTER_MAX_DRAFT_ROWS = 16  # n: the CUDA kernel keeps 16 match bits and slots a request
INDEX_DTYPES = (torch.int32, torch.int64)


def uses_cluster_accept(candidates: torch.Tensor, logits: torch.Tensor) -> bool:
    """The CUDA cluster kernel applies the rule: the row argmax takes it, and n <= 16."""
    return candidates.shape[1] <= CLUSTER_MAX_DRAFT_ROWS and uses_cluster_kernel(logits)


def accept_greedy_admission(
    candidates: torch.Tensor, logits: torch.Tensor, cutoff_verify_lens: torch.Tensor | None = None
) -> Admission:
    """Whether the one-launch kernel may run; pure (shapes, dtypes, strides, devices)."""
    rows = row_argmax_admission(logits)
    if not rows:
        return rows
    if candidates.device != logits.device:
        return refuse("candidates and logits on different devices")
    if candidates.stride(1) != 1:
        return refuse("candidates last-dim stride != 1")
    if candidates.shape[1] > MAX_DRAFT_ROWS:
        return refuse(f"{candidates.shape[1]} verify rows per request > {MAX_DRAFT_ROWS}")
    if cutoff_verify_lens is not None and (
        cutoff_verify_lens.device != logits.device or not cutoff_verify_lens.is_contiguous()
    ):
        return refuse("cutoff_verify_lens not contiguous on the logits' device")
    bs, n = candidates.shape
    kernel = "cuda cluster" if uses_cluster_accept(candidates, logits) else "Triton"
    return admit(f"one {kernel} launch, bs {bs} x n {n} x vocab {logits.shape[1]}")


def cluster_workspace(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The CUDA accept's per-device slots (int64 [16 * bs], made as -1) and request tickets
    (int64 [bs], made as 0): see :func:`dsv41_kernels.workspace.device_workspace` (made before
    capture, stream-ordered, like the Triton kernel's)."""
    return device_workspace(
        "accept_greedy",
        device,
        lambda d: (
            torch.full((MAX_ROWS,), -1, dtype=torch.int64, device=d),
            torch.zeros(MAX_ROWS, dtype=torch.int64, device=d),
        ),
    )


def _validate(candidates, logits, cutoff_verify_lens, out):
    check_tensor("candidates", candidates, dtypes=INDEX_DTYPES, ndim=2)
    check_tensor("logits", logits, ndim=2)
    if not logits.dtype.is_floating_point:
        raise ValueError(f"logits must be floating point, got {logits.dtype}")
    bs, n = candidates.shape
    if n == 0 or logits.shape[1] == 0:
        raise ValueError(
            f"empty rows: candidates {tuple(candidates.shape)}, logits {tuple(logits.shape)}"
        )
    if logits.shape[0] != bs * n:
        raise ValueError(
            f"logits must have bs * n = {bs} * {n} = {bs * n} rows (one per candidate), "
            f"got {logits.shape[0]}"
        )
    if cutoff_verify_lens is not None:
        check_tensor("cutoff_verify_lens", cutoff_verify_lens, dtypes=INDEX_DTYPES, ndim=1)
        if cutoff_verify_lens.shape[0] != bs:
            raise ValueError(
                f"cutoff_verify_lens must have shape [{bs}], got {tuple(cutoff_verify_lens.shape)}"
            )
    if out is not None:
        if len(out) != 3:
            raise ValueError("out must be (correct_len, bonus, cap_trim_lens)")
        for name, t, dtype in zip(
            ("out[0] (correct_len)", "out[1] (bonus)", "out[2] (cap_trim_lens)"),
            out,
            (torch.int32, torch.int64, torch.int32),
        ):
            check_tensor(name, t, dtypes=(dtype,), ndim=1)
            if t.shape[0] != bs or t.device != logits.device or not t.is_contiguous():
                raise ValueError(f"{name} must be contiguous [{bs}] on {logits.device}")


def accept_greedy_torch(candidates, logits, cutoff_verify_lens=None, out=None):
    """The same rule in torch ops: the fallback, and the baseline the benchmark times."""
    bs, n = candidates.shape
    predict = torch.argmax(logits, dim=-1).view(bs, n)
    matches = candidates[:, 1:].to(torch.int64) == predict[:, :-1]
    correct = matches.to(torch.int32).cumprod(dim=1).sum(dim=1, dtype=torch.int32)
    capped = correct
    if cutoff_verify_lens is not None:
        capped = torch.minimum(correct, cutoff_verify_lens.to(torch.int32) - 1)
    trim = correct - capped
    take = torch.where(capped < 0, capped + n, capped).to(torch.int64)
    bonus = predict.gather(1, take[:, None]).squeeze(1)
    if out is None:
        return capped, bonus, trim
    for dst, src in zip(out, (capped, bonus, trim)):
        dst.copy_(src)
    return tuple(out)


def accept_greedy(
    candidates: torch.Tensor,
    logits: torch.Tensor,
    *,
    cutoff_verify_lens: torch.Tensor | None = None,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(correct_len, bonus, cap_trim_lens)`` for ``candidates [bs, n]`` and ``logits [bs*n, V]``.

    ``cutoff_verify_lens`` (int ``[bs]``, optional) caps the accepted length per request
    (each ``>= 1``). ``out``, a preallocated ``(int32 [bs], int64 [bs], int32 [bs])``, is
    written in place.
    """
    _validate(candidates, logits, cutoff_verify_lens, out)
    if not accept_greedy_admission(candidates, logits, cutoff_verify_lens):
        return accept_greedy_torch(candidates, logits, cutoff_verify_lens, out)
    bs, n = candidates.shape
    if out is None:
        dev = logits.device
        out = (
            torch.empty(bs, dtype=torch.int32, device=dev),
            torch.empty(bs, dtype=torch.int64, device=dev),
            torch.empty(bs, dtype=torch.int32, device=dev),
        )
    if uses_cluster_accept(candidates, logits):
        slots, tickets = cluster_workspace(logits.device)
        no_cutoff = tickets[:0]
        load_module("row_argmax", logits.device.index or 0).accept_greedy_cluster(
            candidates,
            logits,
            no_cutoff if cutoff_verify_lens is None else cutoff_verify_lens,
            *out,
            slots,
            tickets,
        )
    else:
        launch(logits, candidates=candidates, cutoff=cutoff_verify_lens, accept_out=out, n=n)
    return tuple(out)


def check_cases(device: torch.device, small: bool) -> list:
    from dsv41_kernels.check import CheckCase, bit_mismatches
    from dsv41_kernels.reference.accept import accept_greedy as reference

    bs, n, vocab = (2, 3, 4099) if small else (1, 6, 129280)
    gen = torch.Generator(device="cpu").manual_seed(7)
    logits = torch.randn(bs * n, vocab, generator=gen).to(device)
    predict = torch.argmax(logits, dim=-1).view(bs, n)
    candidates = torch.zeros(bs, n, dtype=torch.int64, device=device)
    candidates[:, 1:] = predict[:, :-1]  # accept everything, then reject one position
    candidates[-1, n // 2] += 1
    cutoff = torch.full((bs,), max(1, n - 2), dtype=torch.int32, device=device)
    cases = []
    for label, cut in (("", None), (" cutoff", cutoff)):
        cases.append(
            CheckCase(
                op="accept_greedy",
                shape=f"bs {bs} x n {n} x {vocab} fp32{label}",
                admission=accept_greedy_admission(candidates, logits, cut),
                run=lambda c=cut: accept_greedy(candidates, logits, cutoff_verify_lens=c),
                reference=lambda c=cut: tuple(
                    t.to(device) for t in reference(candidates, logits, cutoff_verify_lens=c)
                ),
                mismatches=bit_mismatches,
                baseline=lambda c=cut: accept_greedy_torch(candidates, logits, c),
            )
        )
    return cases
