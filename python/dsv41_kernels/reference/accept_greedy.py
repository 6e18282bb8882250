"""DSpark's greedy accept rule, stated in plain Python (SGLang 0.5.23, ``dspark_accept``)."""

from __future__ import annotations

import torch


def accept_greedy(candidates, logits, *, cutoff_verify_lens=None):
    """Greedy accept for ``bs`` requests of ``n`` verify rows each.

    ``predict[b][k] = argmax(logits[b * n + k])`` (torch's argmax: first NaN, lowest index).
    ``correct_len[b]`` counts the leading ``k`` with ``candidates[b][k + 1] == predict[b][k]``;
    the bonus token is ``predict[b][correct_len[b]]``. With ``cutoff_verify_lens`` the length
    is capped at ``verify_lens[b] - 1``, ``cap_trim_lens`` is what the cap removed, and the
    bonus is read at the capped length (a negative one wraps, as Python indexing does;
    lengths below ``1 - n`` count as ``1 - n``).
    Returns ``(correct_len int32 [bs], bonus int64 [bs], cap_trim_lens int32 [bs])``.
    """
    cand = candidates.tolist()
    bs, n = len(cand), candidates.shape[1]
    flat = torch.argmax(logits.cpu(), dim=-1).tolist()
    predict = [flat[b * n : (b + 1) * n] for b in range(bs)]
    correct, bonus, trim = [], [], []
    for b in range(bs):
        length = 0
        while length < n - 1 and cand[b][length + 1] == predict[b][length]:
            length += 1
        capped = length
        if cutoff_verify_lens is not None:
            # SGLang's lengths are 1..n; below 1 - n its bonus index would leave the row.
            capped = min(length, max(int(cutoff_verify_lens[b]), 1 - n) - 1)
        correct.append(capped)
        trim.append(length - capped)
        bonus.append(predict[b][capped])
    return (
        torch.tensor(correct, dtype=torch.int32),
        torch.tensor(bonus, dtype=torch.int64),
        torch.tensor(trim, dtype=torch.int32),
    )
