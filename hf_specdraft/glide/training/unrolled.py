"""Draft steps unrolled over whole windows ("training-time test", EAGLE-3 §3.2): what GLIDE would draft at each step of
each position, one forward per step, for training and for held-out agreement by draft step.

A draft that starts at position t (the target's cache covering ``0 .. t-1``) stands at ``j = t + k - 1`` at step k and
predicts ``x_{j+1}``. Pass k computes step k for every t at once (query j, ``t = j - k + 1``), teacher-forced:

- the glimpse (GLIDE §4.1) sees the target keys ``i < t``, the cache a draft of step k reads in the loop;
- a ``state_input`` GLIDE reads the target's hidden state ``h_{t-1}`` at step 1 and its own previous ``draft_state``
  after (Gemma 4's assistant; EAGLE's features), as inference feeds them;
- with self-attention, the passes share one cache: pass k attends to pass 1's keys ``<= t`` and to passes 2..k's on
  their own diagonal (:func:`self_attention_mask`), the cache the loop leaves at step k;
- without it every step queries from position t - 1 (Gemma 4's assistant layout, as vLLM serves it).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from accelerate.utils import extract_model_from_parallel
from transformers import DynamicCache

from ..modeling_glide import cross_attention_mask

if TYPE_CHECKING:
    from .objective import GlideBatch


def glimpse_mask(seq_len: int, step: int, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """`(1, 1, T, T)` additive mask of the target keys ``i <= j - step`` the query at j glimpses at draft step ``step``
    (in the loop the k-th drafted token sees the cache with a delay of k, §4.1; step 1 is the inference rule)."""
    index = torch.arange(seq_len, device=device)
    return cross_attention_mask(index - step + 1, index, None, dtype)[0]  # inference's rule, each query moved back


def self_attention_mask(seq_len: int, step: int, dtype: torch.dtype, device) -> torch.Tensor:
    """`(1, 1, T, step·T)` additive mask of pass ``step`` over the keys of passes 1..step (in that order): pass 1's at
    ``i <= t``, pass m's (2 <= m <= step) at ``i = t + m - 1`` only, with ``t = j - step + 1``."""
    index = torch.arange(seq_len, device=device)
    start = index - step + 1  # (T,) t of each query
    blocks = [index[None, :] <= start[:, None]]
    blocks += [index[None, :] == (start + m - 1)[:, None] for m in range(2, step + 1)]
    allowed = torch.cat(blocks, dim=1)[None, None]
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)


def shifted(states: torch.Tensor) -> torch.Tensor:
    """`(B, T, D)` -> the state each position's token is read with: ``states[:, j - 1]`` at j, zeros at 0."""
    return torch.cat([states.new_zeros(states.shape[0], 1, states.shape[2]), states[:, :-1]], dim=1)


def unrolled_passes(model, batch: GlideBatch, steps: int) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """Yield ``(k, logits, valid)`` for draft steps k = 1..``steps``: ``logits`` `(B, T, rows)` over GLIDE's own rows at
    every query j (step k of the draft started at ``j - k + 1``), ``valid`` `(T,)` where that draft exists (``t >= 1``:
    the loop drafts only once the target has a state and a cache). ``model`` may be GLIDE as accelerate prepared it.
    """
    glide = extract_model_from_parallel(model)
    config = glide.config
    ids = batch.input_ids
    batch_size, length = ids.shape
    device, dtype = ids.device, glide.dtype
    index = torch.arange(length, device=device)
    state = None
    if config.state_input:
        if batch.target_hidden is None:
            raise ValueError(
                "a GLIDE built with state_input=True trains on the target's hidden states: the batch has none "
                "(a store written before they were kept, or a window source that does not compute them)"
            )
        state = shifted(batch.target_hidden.to(dtype))
    cache = DynamicCache(config=config) if config.state_input and config.self_attention else None
    for k in range(1, steps + 1):
        start = index - k + 1
        kwargs = {"use_cache": cache is not None}
        if config.cross_attention and batch.target_past_key_values is not None:
            kwargs["target_past_key_values"] = batch.target_past_key_values
            kwargs["target_attention_mask"] = glimpse_mask(length, k, dtype, device)
        if cache is not None:
            kwargs.update(cache=cache, attention_mask=self_attention_mask(length, k, dtype, device))
        positions = index if config.self_attention else (start - 1).clamp(min=0)  # assistant layout: h_{t-1}'s position
        out = model(
            input_ids=ids,
            position_ids=positions[None].expand(batch_size, -1),
            draft_rows=True,
            target_hidden_states=state,
            **kwargs,
        )
        yield k, out.logits, start >= 1
        if config.state_input:
            state = shifted(out.draft_state)
