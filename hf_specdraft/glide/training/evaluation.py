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
from .objective import GlideBatch, TargetWindows
from .unrolled import glimpse_mask, unrolled_passes


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
def draft_probs(glide, batch: GlideBatch, block_size: int | None = None, delay: int | None = None) -> torch.Tensor:
    """q `(B, T, V)` over the target's vocabulary on ``batch``'s windows, glimpsing its target KV with the block-wise
    mask of L = ``block_size`` (training's, §4.1) or a fixed cache ``delay`` (:func:`~.unrolled.glimpse_mask`); nothing
    when the batch holds no KV. A ``state_input`` GLIDE is scored at its first draft step, as the loop runs it."""
    if getattr(glide.config, "state_input", False):
        _, logits, _ = next(unrolled_passes(glide, batch, 1))
        return glide.to_target_logits(logits.float()).softmax(-1)
    mask, kv = None, batch.target_past_key_values
    # every layer empty: nothing to glimpse (None would read an attached target)
    if kv is None and glide.config.cross_attention:
        kv = [(None, None)] * glide.config.target_num_hidden_layers
    elif delay is not None and kv is not None:
        mask = glimpse_mask(batch.input_ids.shape[1], delay, device=batch.input_ids.device)
    logits = glide(
        input_ids=batch.input_ids,
        target_past_key_values=kv,
        use_cache=False,
        cross_attention_block_size=None if mask is not None else block_size,
        target_attention_mask=mask,
    ).logits
    return logits.float().softmax(-1)


@torch.no_grad()
def teacher_forced_alpha(
    target,
    glide,
    windows,
    block_size: int | None = None,
    batch_size: int = 8,
    *,
    delay: int | None = None,
    skip: int = 0,
    glimpse: bool = True,
) -> dict[str, float]:
    """α and greedy agreement of ``glide`` against ``target`` on held-out windows (see the module docstring).

    Args:
        target: the frozen target (run over the windows; unused for a store).
        windows: `(N, T)` token windows, or a window source (:class:`~.store.StoreWindows`: p is the store's top k,
            unnormalised, so α is then a lower bound by the mass outside it).
        block_size: L of the block-wise mask GLIDE glimpses with (training's); ``delay`` instead: a fixed cache delay.
        skip: leave out each window's first ``skip`` positions (they have little context to glimpse).
        glimpse: `False` runs GLIDE with nothing to glimpse.

    Returns:
        ``{"alpha": mean Σ_x min(p, q), "greedy_agreement": mean [argmax q == argmax p], "eval_positions": count}``.
    """
    source = windows  # a window source as it is; `(N, T)` token windows the target runs over:
    if isinstance(windows, torch.Tensor):
        source = TargetWindows(windows.reshape(-1), windows.shape[-1], stride=windows.shape[-1])
    device = next(glide.parameters()).device
    with_kv = glimpse and glide.config.cross_attention
    alpha, agree, positions = torch.zeros((), device=device), torch.zeros((), device=device), 0
    for rows in torch.arange(len(source)).split(batch_size):
        batch = source.batch(target, glide, rows, device, with_kv, True)
        q = draft_probs(glide, batch, block_size, delay)[:, skip:]  # (B, T - skip, V)
        if batch.target_logits is not None:
            p = batch.target_logits.float().softmax(-1)[:, skip:]
            greedy = p.argmax(-1)
        else:
            p = q.new_zeros(q.shape).scatter_(-1, batch.topk_ids[:, skip:], batch.topk_probs[:, skip:])
            greedy = batch.topk_ids[:, skip:, 0]
        alpha += overlap(p, q).sum()
        agree += (q.argmax(-1) == greedy).sum()
        positions += q.shape[0] * q.shape[1]
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
            if self.prompts:
                result["tokens_per_forward"] = self.tokens_per_forward(target, glide)
        finally:
            glide.train(was_training)
        return result

    def tokens_per_forward(self, target, glide) -> float:
        """τ: tokens emitted per target forward by the loop with ``glide`` as the draft (greedy, default γ) over the
        prompts, one at a time."""
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
        return round(SpeculativeStats.merge(stats).mean_accepted_length, 4)
