"""Held-out evaluation of a GLIDE draft while it trains (p the frozen target's next-token distribution, q GLIDE's):

- **α** (teacher-forced, with the training-time block-wise mask, §4.1): the mean over positions of
  Σ_x min(p(x), q(x)) = 1 - TV(p, q) (Leviathan et al. 2023, §3.3);
- **greedy agreement**: the share of those positions where argmax q == argmax p (what greedy decoding accepts);
- **tokens per target forward** τ: the loop's ``mean_accepted_length`` (greedy, default settings) on held-out prompts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...core.loop import speculative_generate
from ...core.stats import SpeculativeStats, overlap
from .objective import TargetWindows, draft_passes


def heldout_windows(stream: torch.Tensor, seq_len: int, max_windows: int) -> torch.Tensor:
    """Up to ``max_windows`` non-overlapping windows `(N, T)` from the start of the held-out ``stream`` `(S,)`; a
    stream shorter than ``seq_len`` gives one window of all of it."""
    if stream.numel() < 2:
        raise ValueError(
            f"the held-out data holds {stream.numel()} tokens, too few to evaluate: raise --eval-fraction / "
            "--eval-examples"
        )
    length = min(seq_len, stream.numel())
    count = min(max_windows, stream.numel() // length)
    return stream[: count * length].view(count, length)


@torch.no_grad()
def teacher_forced_alpha(target, glide, windows: torch.Tensor, block_size: int, batch_size: int = 8) -> dict:
    """α and greedy agreement of ``glide`` against ``target`` on held-out windows `(N, T)` (see the module docstring),
    GLIDE glimpsing the target's KV with training's block-wise mask of L = ``block_size`` (§4.1). A ``state_input``
    GLIDE is scored at its first draft step, as the loop runs it.

    Returns:
        ``{"alpha": mean Σ_x min(p, q), "greedy_agreement": mean [argmax q == argmax p], "eval_positions": count}``.
    """
    source = TargetWindows(windows.reshape(-1), windows.shape[-1], stride=windows.shape[-1])
    device = next(glide.parameters()).device
    alpha, agree = torch.zeros((), device=device), torch.zeros((), device=device)
    for rows in torch.arange(len(source)).split(batch_size):
        batch = source.batch(target, glide, rows, device, glide.config.cross_attention, True)
        logits = glide.to_target_logits(next(iter(draft_passes(glide, batch, block_size)))[1])
        q, p = logits.float().softmax(-1), batch.target_logits.float().softmax(-1)  # (B, T, V)
        alpha += overlap(p, q).sum()
        agree += (q.argmax(-1) == p.argmax(-1)).sum()
    positions = windows.numel()
    return {
        "alpha": round(alpha.item() / positions, 4),
        "greedy_agreement": round(agree.item() / positions, 4),
        "eval_positions": positions,
    }


@dataclass
class HeldOutEvaluation:
    """What :func:`~.trainer.train_glide` measures every ``eval_every`` steps, called as ``evaluate(target, glide)``."""

    windows: torch.Tensor  # (N, T) held-out token windows for the teacher-forced α
    prompts: list[list[int]]  # held-out prompts (token ids) for τ; empty skips τ
    block_size: int  # L of the block-wise mask (the training one)
    max_new_tokens: int = 32  # tokens the loop generates per prompt for τ
    eos_token_id: int | None = None  # for the loop's generate arguments
    pad_token_id: int | None = None

    def __call__(self, target, glide) -> dict[str, float]:
        was_training = glide.training
        glide.eval()
        try:
            result = teacher_forced_alpha(target, glide, self.windows, self.block_size)
            # τ: the loop's tokens per target forward with glide as the draft (greedy, default γ), a prompt at a time
            device = next(target.parameters()).device
            stats = [
                speculative_generate(
                    target,
                    torch.tensor([prompt], device=device),
                    draft_model=glide,
                    max_new_tokens=self.max_new_tokens,
                    do_sample=False,
                    eos_token_id=self.eos_token_id,
                    pad_token_id=self.pad_token_id,
                    return_dict_in_generate=True,
                ).speculative_stats
                for prompt in self.prompts
            ]
            if stats:
                result["tokens_per_forward"] = round(SpeculativeStats.merge(stats).mean_accepted_length, 4)
        finally:
            glide.train(was_training)
        return result
