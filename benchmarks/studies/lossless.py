"""Is a greedy output token-identical to target-only greedy, and where not, was it a near tie?

In float32 a speculative greedy output equals the target's own greedy output token for token. In bf16 a forward over
several tokens rounds otherwise than a one-token forward, so where the target's top two logits lie within a few bf16
steps (random weights make that common) either token may come out. :func:`compare_greedy` finds the first differing
token and tells the two cases apart: a near tie the call resolved the other way, or a lost token (a bug).
"""

from __future__ import annotations

import torch

NEAR_TIE_STEPS = 4  # top-two logits this many dtype steps apart (eps × |logit|) or closer: a rounding can pick either


def compare_greedy(target, prompt_length: int, reference: torch.Tensor, output: torch.Tensor) -> dict:
    """Compare ``output`` `(1, L')` with ``reference`` `(1, L)` (target-only greedy from the same prompt).

    Returns:
        ``{"identical": True}``, or ``identical`` False with ``first_difference`` (index among the new tokens),
        ``near_tie`` (the reference's top two logits there are within :data:`NEAR_TIE_STEPS` steps of ``target``'s
        dtype and ``output`` picked the other), ``top2_gap`` and ``dtype_step`` (logit units).
    """
    if output.shape == reference.shape and torch.equal(output, reference):
        return {"identical": True}
    length = min(output.shape[1], reference.shape[1])
    differs = (output[0, :length] != reference[0, :length]).nonzero()
    at = int(differs[0]) if len(differs) else length
    with torch.no_grad():
        logits = target(reference[:, :at]).logits[0, -1].float()  # what the target saw where the two parted
    top = logits.topk(2)
    step = torch.finfo(target.dtype).eps * top.values[0].abs().clamp(min=1.0)
    picked = int(output[0, at]) if at < output.shape[1] else None
    near_tie = bool(top.values[0] - top.values[1] <= NEAR_TIE_STEPS * step) and picked in top.indices.tolist()
    return {
        "identical": False,
        "first_difference": at - prompt_length,
        "near_tie": near_tie,
        "top2_gap": float(top.values[0] - top.values[1]),
        "dtype_step": float(step),
    }
