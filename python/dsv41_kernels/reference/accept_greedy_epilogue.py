"""DSpark's static greedy verify epilogue, stated in plain Python (SGLang 0.5.23,
``DsparkVerifyEpilogue._accept_static_greedy`` on its default path: the accept, then
``build_accept_outs`` and the gate)."""

from __future__ import annotations

import torch

from dsv41_kernels.reference.accept_greedy import accept_greedy


def accept_greedy_epilogue(candidates, logits, seq_lens, verify_lens=None, gate=None):
    """The epilogue for ``bs`` requests of ``n`` verify rows each.

    With ``correct_len`` and ``bonus`` the greedy accept's (no cap: the static epilogue passes
    no verify lengths to it): ``commit_lens[b] = correct_len[b] + 1``,
    ``new_seq_lens[b] = seq_lens[b] + commit_lens[b]``, ``out_tokens[b][k]`` the bonus at
    ``k == correct_len[b]``, else the draft ``candidates[b][k + 1]`` for ``k < n - 1``, else 0;
    ``cap_trim_lens`` zeros; with ``verify_lens`` and ``gate``,
    ``gated[b] = min(commit_lens[b], int32(verify_lens[b])) * gate[0]`` in int32 arithmetic.
    Returns ``(correct_len int64, bonus int64, cap_trim_lens int32, commit_lens int32,
    new_seq_lens (seq_lens' dtype), out_tokens int64 [bs, n], gated int32 or None)``.
    """
    correct, bonus, _ = accept_greedy(candidates, logits)
    cand = candidates.tolist()
    bs, n = len(cand), candidates.shape[1]
    commit = [c + 1 for c in correct.tolist()]
    tokens = [
        [
            int(bonus[b]) if k == correct[b] else (cand[b][k + 1] if k < n - 1 else 0)
            for k in range(n)
        ]
        for b in range(bs)
    ]
    new_seq = [s + c for s, c in zip(seq_lens.tolist(), commit)]
    gated = None
    if verify_lens is not None:
        g = int(gate.reshape(-1)[0])
        limits = verify_lens.cpu().to(torch.int32).tolist()  # torch keeps the low 32 bits
        gated = torch.tensor([_int32(min(c, v) * g) for c, v in zip(commit, limits)])
        gated = gated.to(torch.int32)
    return (
        correct.to(torch.int64),
        bonus,
        torch.zeros(bs, dtype=torch.int32),
        torch.tensor(commit, dtype=torch.int32),
        torch.tensor([_wrap(v, seq_lens.dtype) for v in new_seq], dtype=seq_lens.dtype),
        torch.tensor(tokens, dtype=torch.int64).reshape(bs, n),
        gated,
    )


def _int32(v: int) -> int:
    return (v + 2**31) % 2**32 - 2**31


def _wrap(v: int, dtype: torch.dtype) -> int:
    bits = torch.iinfo(dtype).bits
    return (v + 2 ** (bits - 1)) % 2**bits - 2 ** (bits - 1)
