"""The longest earlier occurrence of a text's suffix: Max-Gram's match (CS Drafting §3.3), which the cascade's bottom
drafter and GLIDE's ``copy_from_context`` draft from."""

from __future__ import annotations

import torch

FIRST_WINDOW = 8  # look-back offsets compared in the first extension round; doubles each round


def longest_suffix_match(sequence: torch.LongTensor, max_match_length: int | None = None) -> tuple[int, int]:
    """The earlier occurrence of the longest suffix of ``sequence`` `(L,)` (Max-Gram's match, §3.3).

    Among the positions ``j < L - 1`` with ``sequence[j - t] == sequence[L - 1 - t]`` for ``t = 0 .. m - 1``, the
    longest ``m``, then the most recent ``j``: `(j, m)`, ``(-1, 0)`` when the last token is new. Matches of at least
    ``max_match_length`` count as equally long (bounding the work on endlessly repeating text).
    """
    length_total = sequence.numel()
    if length_total < 2:
        return -1, 0
    ends = (sequence[:-1] == sequence[-1]).nonzero().flatten()  # (C,) every match of length >= 1
    if ends.numel() == 0:
        return -1, 0
    cap = length_total - 1 if max_match_length is None else min(max_match_length, length_total - 1)
    if int(_match_length(sequence, ends[-1:], cap)) == cap:  # the most recent match is already as long as allowed
        return int(ends[-1]), cap  # (repetition loops: skips extending thousands of long matches)
    length, window = 1, FIRST_WINDOW
    while length < cap:
        width = min(window, cap - length)
        run = _match_length(sequence, ends, width, offset=length)  # (C,) tokens matched in this window
        full = run == width
        if not bool(full.any()):  # every match ends inside this window: the longest ones win
            best = run.max()
            ends = ends[run == best]
            length += int(best)
            break
        ends, length, window = ends[full], length + width, window * 2  # only full matches can still be longest
    return int(ends.max()), length


def _match_length(sequence: torch.LongTensor, ends: torch.LongTensor, width: int, offset: int = 0) -> torch.LongTensor:
    """For each end ``j`` in ``ends`` `(C,)`, how many of the look-back offsets ``offset .. offset+width-1``
    match the suffix without a break: ``sequence[j - t] == sequence[L - 1 - t]``. Returns `(C,)`."""
    back = offset + torch.arange(width, device=sequence.device)  # (w,) look-back offsets t
    src = ends[:, None] - back  # (C, w) positions in the earlier occurrence
    same = (src >= 0) & (sequence[src.clamp(min=0)] == sequence[sequence.numel() - 1 - back])
    return same.long().cumprod(dim=1).sum(dim=1)
