"""One draft forward for every row of a batch: chain drafting over a ragged draft cache.

The draft's ``DynamicCache`` holds every active row; each row remembers its valid columns (``columns[a]``) and the
tokens they cover (``seen[a]``). A step re-syncs each row to its accepted text by common prefix, gathers the kept
columns into a right-aligned block, feeds each row's new tokens (left-padded: the padding slots stay as masked holes
until the next gather) and drafts γ tokens in lockstep, with a 2D padding mask and explicit positions.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import DynamicCache

from .cache import common_prefix, repack_cache
from .support import with_cache
from .tree import DraftTree


def target_key_mask(width: int, cached: list[int], positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Which columns of a right-aligned batch target cache (``width`` columns, row ``a``'s in its last ``cached[a]``)
    each draft query at ``positions`` `(A, q)` may read (GLIDE's glimpse in a batch): an additive mask
    `(A, 1, q, width)`, 0 where the column is the row's and at a position before the query's."""
    columns = torch.arange(width, device=positions.device)[None]
    key_positions = columns - (width - torch.tensor(cached, device=positions.device))[:, None]  # (A, width); <0: pad
    allowed = (key_positions >= 0)[:, None, :] & (key_positions[:, None, :] < positions[:, :, None])
    return torch.zeros(allowed.shape, dtype=dtype, device=positions.device).masked_fill_(
        ~allowed, torch.finfo(dtype).min
    )[:, None]


class BatchProposer:
    """A drafter that proposes for every active row at once: :meth:`propose` every step, :meth:`keep_rows` when rows
    leave the batch."""

    target = None  # this step's (target cache, [cached columns per row]), kept by propose for the draft forwards
    forwards = 0  # draft forwards run for the whole batch (each one drafts a token for every active row)

    def propose(self, requests: list, target: tuple | None = None) -> list[DraftTree]:
        """One proposal per row for its request ``requests[a]``, reading ``target``: ``(target cache, [cached columns
        per row])``."""
        raise NotImplementedError

    def keep_rows(self, survivors: list[int]) -> None:
        """Rows ``survivors`` (indices into the current rows) stay; the others left the batch."""
        raise NotImplementedError


class BatchChainDrafter(BatchProposer):
    """Chain drafting of ``num_draft_tokens`` (γ) tokens for every active row in one forward per token of a causal LM.

    Args:
        drafters: the rows' drafters (forks of one drafter): each keeps its sampling settings and forward counts.
        model: the draft causal LM, on whose device the inputs are built.
        cache: the draft's empty cache.
        inputs (*optional*): ``inputs(batch, position_ids) -> dict``, further inputs of every forward (GLIDE's glimpse
            of the target cache in ``batch.target``, set per step).
    """

    def __init__(self, drafters: list, model, cache: DynamicCache, inputs: Callable | None = None):
        self.drafters, self.model, self.cache, self.inputs = list(drafters), model, cache, inputs
        self.device = model.device
        self.num_draft_tokens = drafters[0].num_draft_tokens  # γ where the loop chooses none
        self.seen = [torch.zeros(0, dtype=torch.long) for _ in drafters]
        self.columns = [torch.zeros(0, dtype=torch.long) for _ in drafters]

    @classmethod
    def of_model(cls, drafters: list, model, cache: DynamicCache, inputs: Callable | None = None) -> BatchChainDrafter:
        """The drafters' name for building one: the arguments are the class's."""
        return cls(drafters, model, cache, inputs)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The draft's logits `(A, V)` at the last column of ``ids`` `(A, k)`, ``mask`` `(A, K)` 0/1 over the cache
        and the new columns, ``positions`` `(A, k)`."""
        extra = {} if self.inputs is None else self.inputs(self, positions)
        own = with_cache(self.model, self.cache)
        return self.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, **own, use_cache=True, logits_to_keep=1, **extra
        ).logits[:, -1]

    def keep_rows(self, survivors: list[int]) -> None:
        self.drafters = [self.drafters[a] for a in survivors]
        self.seen = [self.seen[a] for a in survivors]
        self.columns = [self.columns[a] for a in survivors]
        self.cache.batch_select_indices(torch.tensor(survivors, dtype=torch.long))

    @torch.no_grad()
    def propose(self, requests: list, target: tuple | None = None) -> list[DraftTree]:
        """Draft a γ-token chain after each row's accepted text; a row whose drafter copies from its text gets its copy
        (when every row copies, no draft forward runs)."""
        self.target = target
        copies = [drafter.copy_from_text(request) for drafter, request in zip(self.drafters, requests)]
        if all(copy is not None for copy in copies):
            return copies
        device, gamma = self.device, requests[0].num_draft_tokens or self.num_draft_tokens
        texts = [request.input_ids[0].to(device) for request in requests]
        keep = [common_prefix(seen.to(device), ids) for seen, ids in zip(self.seen, texts)]
        # a layer that holds nothing yet (the first step) is left as it is
        repack_cache(self.cache, [self.columns[a][: keep[a]] for a in range(len(texts))], torch.arange(len(texts)))
        width = max(keep)
        feeds = [ids[k:].to(device) for ids, k in zip(texts, keep)]
        chunk = max(f.numel() for f in feeds)
        ids = torch.zeros(len(texts), chunk, dtype=torch.long, device=device)
        mask = torch.zeros(len(texts), width + chunk, dtype=torch.long, device=device)
        positions = torch.zeros(len(texts), chunk, dtype=torch.long, device=device)
        for a, (feed, k) in enumerate(zip(feeds, keep)):
            start = chunk - feed.numel()  # the feed's left padding
            ids[a, start:] = feed
            mask[a, width - k : width] = 1
            mask[a, width + start :] = 1
            positions[a, start:] = k + torch.arange(feed.numel(), device=device)
            self.columns[a] = torch.cat([torch.arange(width - k, width), torch.arange(width + start, width + chunk)])
        tokens, probs = [], []
        for step in range(gamma):
            logits = self.forward(ids, mask, positions)  # (A, V)
            self.forwards += 1
            picked, q = [], []
            for a, drafter in enumerate(self.drafters):
                context = torch.cat([texts[a][None], *[t[a : a + 1] for t in tokens]], dim=-1)
                row_q = drafter.draft_distribution(logits[a : a + 1], context)
                picked.append(drafter.pick(row_q))
                q.append(row_q[0])
            ids = torch.cat(picked)  # (A, 1)
            tokens.append(ids)
            probs.append(torch.stack(q))
            if step < gamma - 1:  # the last drafted token is not fed: its KV is computed next step if accepted
                mask = torch.cat([mask, mask.new_ones(len(texts), 1)], dim=-1)
                positions = positions[:, -1:] + 1
        drafted = torch.cat(tokens, dim=-1)  # (A, γ)
        q = torch.stack(probs, dim=1)  # (A, γ, V)
        fed = torch.arange(width + chunk, width + chunk + gamma - 1)  # the columns of the drafted tokens fed back
        trees = []
        for a, drafter in enumerate(self.drafters):
            drafter.count_call("draft", gamma)
            self.columns[a] = torch.cat([self.columns[a], fed])
            self.seen[a] = torch.cat([texts[a], drafted[a, :-1]])
            sampled = torch.ones(gamma, dtype=torch.bool) if drafter.generation_config.do_sample else None
            trees.append(DraftTree.chain(drafted[a], q[a], sampled) if copies[a] is None else copies[a])
        return trees
