"""GLIDE as an hf_specdraft drafter: a chain of γ tokens drafted while glimpsing the target's KV cache.

The loop hands :meth:`GlideCandidateGenerator.draft_tree` the target's live cache, which covers ``input_ids[:, :-1]``:
the verified prefix GLIDE §4.1 lets the draft glimpse (the loop prefills the target first, so even the first step
glimpses the prompt). Each drafted token comes with q, so speculative sampling (Leviathan et al. 2023, Algorithm 1)
keeps ``do_sample=True`` exact. Notation: p target distribution, q draft distribution; γ is ``num_draft_tokens``.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, GenerationConfig, PreTrainedModel

from ..core.batch_drafting import BatchChainDrafter, target_key_mask
from ..core.drafting import (
    DraftModelTreeScorer,
    DraftRequest,
    TreeCandidateGenerator,
    check_same_device,
    check_same_vocab,
    draft_chain,
    draft_length,
    same_drafters,
)
from ..core.static_cache import StaticRowsCache
from ..core.draft_cache import DynamicDraftCache, StaticDraftCache
from ..core.cache import crop_to
from ..core.target_state import TargetState
from ..core.tree import DraftTree
from ..core.validation import method_config
from ..core.ngram_table import CHAIN_TOKENS, copy_table_of
from ..core.suffix_match import longest_suffix_match
from ..core.support import with_cache
from .drafting_config import GlideDraftingConfig
from .modeling_glide import read_target_layer


COPY_TOKENS = 6  # the shortest copy: a match that long tends to continue for several tokens
# where no controller weighs each copy (a fixed γ, a batch), a copy needs a match this long: after a one-token match
# the text goes on as before about a third of the time on chat, half on summaries (the controller learns which)
UNWEIGHED_SHORTEST = 2
COPY_MATCH_CAP = 64  # matches this long count as equally long (bounds the work on endlessly repeating text)


def check_target_cache(target_cache, config, kv_heads: int | None = None) -> None:
    """Raise `ValueError` unless ``target_cache`` holds readable keys/values for every layer GLIDE reads (``kv_heads``:
    a rank's share under tensor parallelism)."""
    if target_cache is None:
        raise ValueError(
            "target_cache is None: GLIDE cross-attends to the target's KV cache, so the decoding loop must pass the "
            "target's live cache to propose() (speculative_generate does)"
        )
    try:
        for layer_idx in config.target_layer_ids:
            read_target_layer(target_cache, layer_idx, config, kv_heads)
    except (TypeError, ValueError) as error:
        raise ValueError(f"target_cache is not a KV cache GLIDE can read: {error}") from error


class GlideCandidateGenerator(TreeCandidateGenerator):
    """Drafts γ tokens with GLIDE (§4.1), each glimpsing the target's cached keys and values; GLIDE keeps its own
    cache across steps, re-synced to the accepted text by common prefix, and never writes to the target cache.

    Args:
        glide: a GLIDE model (``config.model_type == "glide"``), also one loaded with ``trust_remote_code=True`` or
            the vanilla drafter (``cross_attention=False``), which ignores the target cache.
        config (:class:`GlideDraftingConfig`, *optional*): the options; or pass its fields as keywords
            (``num_draft_tokens``: γ, tokens drafted per step, §5.1 uses 5).
    """

    def __init__(self, glide: PreTrainedModel, config: GlideDraftingConfig | None = None, **options):
        super().__init__()
        if not isinstance(glide, PreTrainedModel) or getattr(glide.config, "model_type", None) != "glide":
            raise TypeError(f"glide must be a GLIDE model (config.model_type 'glide'), got {type(glide).__name__}")
        self.glide = glide
        self.controller_anchor = glide  # the next call with the same GLIDE starts from what this one learned
        # a state_input GLIDE reads the target's last hidden state (hf_specdraft.core.target_state)
        self.requires_model_outputs = bool(getattr(glide.config, "state_input", False))
        self.model_kwargs_overrides = {"output_hidden_states": -1} if self.requires_model_outputs else {}
        self.config = method_config(GlideDraftingConfig, config, options)
        # what the loop and CAPE read
        self.num_draft_tokens, self.adaptive_draft_length = draft_length(self.config.num_draft_tokens)
        self._reset()

    stops_on_confidence = True  # draft_chain asks the request's stop_rule after every token
    tokens_in_vocab = True  # GLIDE shares its target's vocabulary (checked when it binds to the target)
    compiles_draft = True  # compile_draft: its forwards on a static cache of its own (eager where it cannot)

    def _reset(self) -> None:
        self.cache = DynamicDraftCache(self.glide, lambda target_cache, committed: glimpse_of(self.glide, target_cache))
        self.seen = torch.zeros(0, dtype=torch.long)  # tokens GLIDE's own cache covers
        # state_input: the target's last hidden states still needed `(1, n, hidden)`, from position states_from
        self.states, self.states_from = None, 0
        self.fed = 0  # state_input with self-attention: positions whose first-step entries GLIDE's cache holds

    def prepare(self, target: PreTrainedModel, generation_config: GenerationConfig) -> None:
        """Check that ``target`` is the kind of target GLIDE was built for, then start a fresh draft cache."""
        super().prepare(target, generation_config)
        self.glide.check_target(target)
        check_same_vocab(target, self.glide, argument="glide")
        check_same_device(target, self.glide, argument="glide")
        check_same_split(target, self.glide)
        self._reset()

    @torch.no_grad()
    def draft_tree(self, request: DraftRequest) -> DraftTree:
        """Draft a chain of γ tokens after the request's text `(1, L)` (or copy one from it, ``copy_from_context``),
        glimpsing the target's cache over ``input_ids[:, :-1]``; a ``state_input`` GLIDE also reads the target's new
        states. Returns a chain :class:`~hf_specdraft.core.tree.DraftTree` with ``draft_probs`` `(γ, V)`."""
        copied = self.copy_from_text(request)
        if self.requires_model_outputs:
            self._take_states(request.target_state)
        if copied is not None:
            return copied
        cross = self.glide.config.cross_attention
        if self.requires_model_outputs:
            return self._propose_from_state(request, glimpse_of(self.glide, request.target_cache) if cross else {})
        glimpse = self.cache.glimpse(request.target_cache, request.input_ids.shape[1] - 1) if cross else None
        return draft_chain(self, request, lambda feed: self.cache.forward(feed, glimpse), self.glide.device)

    def copy_from_text(self, request: DraftRequest) -> DraftTree | None:
        """``copy_from_context``: the tokens after the most recent longest earlier occurrence of the text's suffix, when
        it is at least that long (no q: the target judges them exactly); else `None`. As many as ``max_copy_tokens``
        says, else γ when fixed, with "auto" the request's ``copy_rule`` (in a batch ``max(COPY_TOKENS, γ)``). With
        "auto" at batch 1, where the text offers no copy, the chain of the checkpoint's copy table, if it has one."""
        shortest, input_ids = self.config.copy_from_context, request.input_ids
        if not shortest or input_ids.shape[1] <= shortest:
            return None
        host = request.host_text  # the loop's host copy of the text: the match then reads nothing back from the device
        if host is not None and len(host) != input_ids.shape[1]:
            host = None
        text = torch.tensor(host) if host is not None else input_ids[0]
        weighed = self.adaptive_draft_length and request.copy_rule is not None  # "auto" at batch 1: the controller's
        copied = self._copy_from_context(request, text, weighed)
        if copied is None and weighed and self.config.copy_from_table:  # the table of the target's own text
            copied = self._copy_from_table(request, host, text)
        return copied

    def _copy_from_context(self, request: DraftRequest, text: torch.Tensor, weighed: bool) -> DraftTree | None:
        """The context copy of :meth:`copy_from_text` (``text`` `(L,)`), or `None`."""
        shortest, input_ids = self.config.copy_from_context, request.input_ids
        end, length = longest_suffix_match(text, max_match_length=COPY_MATCH_CAP)
        if length < (shortest if weighed else max(shortest, UNWEIGHED_SHORTEST)):
            return None
        available, longest = text.shape[0] - end - 1, self.config.max_copy_tokens
        cap = available if longest is None else min(available, longest)
        gamma = request.num_draft_tokens or self.num_draft_tokens
        if weighed or longest is not None:
            count = request.copy_rule(length, cap) if weighed else cap
        else:
            count = max(COPY_TOKENS, gamma) if self.adaptive_draft_length else gamma
        if not count:  # the loop's controller expects more from GLIDE's own draft here
            return None
        tree = DraftTree.chain(text[end + 1 : end + 1 + count].to(input_ids.device))
        tree.copied = True
        return tree

    def _copy_from_table(self, request: DraftRequest, host: list[int] | None, text: torch.Tensor) -> DraftTree | None:
        """The chain of the checkpoint's :class:`~hf_specdraft.core.ngram_table.NGramTable` after the text (``host``,
        else the tail of ``text`` read back), sized by the controller from how often the table's chains were right (its
        own copy bin); `None` without a table or a chain."""
        table = copy_table_of(self.glide)
        if table is None:
            return None
        tail = host if host is not None else text[-table.orders[0] :].tolist()  # chain() reads its longest context
        chain = table.chain(tail, self.config.max_copy_tokens or CHAIN_TOKENS)
        count = request.copy_rule(0, len(chain)) if chain else 0
        if not count:
            return None
        tree = DraftTree.chain(torch.tensor(chain[:count], device=request.input_ids.device))
        tree.copied = True
        return tree

    def _take_states(self, target_state: TargetState | None) -> None:
        """Keep the target's last hidden states the loop hands over (every position, in order, once)."""
        if target_state is None:
            raise ValueError(
                "this GLIDE reads the target's hidden state (state_input=True), which transformers' assisted loop does "
                "not hand to a draft model: call speculative_generate(target, ids, draft_model=glide) or "
                "target.generate(ids, custom_generate=speculative_generate, draft_model=glide)"
            )
        if target_state.first:
            self.states, self.states_from = None, 0
        if target_state.outputs is not None and target_state.outputs.hidden_states:
            new = target_state.outputs.hidden_states[-1].to(device=self.glide.device, dtype=self.glide.dtype)
            self.states = new if self.states is None else torch.cat([self.states, new], dim=1)
            drop = max(self.fed - 1, 0) - self.states_from  # a proposal reads h from position fed - 1 on
            if drop > 0:
                self.states, self.states_from = self.states[:, drop:], self.states_from + drop

    def _propose_from_state(self, request: DraftRequest, glimpse: dict) -> DraftTree:
        """A ``state_input`` GLIDE's chain: step 1 reads ``[embedding(x_t) ; h_{t-1}]``, later steps the drafted token
        and its own ``draft_state``; with self-attention, GLIDE's cache first takes the newly verified positions."""
        glide, device, own = self.glide, self.glide.device, self.glide.config.self_attention
        ids = request.input_ids[0].to(device)
        t = ids.shape[0] - 1  # the newest token's position: the target's cache and states cover 0 .. t-1
        if self.states is None or self.states_from + self.states.shape[1] != t or t < 1:
            # no state yet (the first step of a call): the target decodes alone
            return DraftTree.chain(ids.new_zeros(0))
        start = min(self.fed, t) if own else t  # without self-attention: queried from h_{t-1}'s position
        if own:
            crop_to(self.cache, start)
        # (1, t + 1 - start, hidden): the state each position start .. t is read with, h_{j-1} (zeros at 0)
        kept = self.states[:, max(start - 1, 0) - self.states_from : t - self.states_from]
        state_in = torch.cat([kept.new_zeros(1, 1, kept.shape[2]), kept], dim=1) if start == 0 else kept
        position = torch.arange(start, t + 1, device=device)[None] if own else torch.tensor([[t - 1]], device=device)

        def next_logits(feed: torch.Tensor) -> torch.Tensor:
            nonlocal state_in, position
            out = glide(
                input_ids=feed,
                position_ids=position,
                target_hidden_states=state_in,
                logits_to_keep=1,
                **with_cache(glide, self.cache.past_key_values if own else None),
                use_cache=own,
                **glimpse,
            )
            self.fed = t + 1
            state_in = out.draft_state[:, -1:]
            if own:
                position = position[:, -1:] + 1
            return out.logits[:, -1]

        return draft_chain(self, request, next_logits, device, feed=ids[start:][None])

    def compile_draft(
        self, generation_config: GenerationConfig, compile_config, target_cache: StaticRowsCache
    ) -> StaticDraftCache:
        """The compiled static path of a batch-1 call: GLIDE on a static cache of its own, glimpsing the target's static
        buffers under a key mask (:func:`static_glimpse`). ``None`` (eager) for windowed rings or a ``state_input``."""
        if target_cache.has_rings or self.requires_model_outputs:
            return None

        def glimpse(_, committed: int | None):  # the warm-up (committed None) sees every column: a query that saw none
            # would write NaN states, which a later full-buffer forward multiplies by its zero weights
            return static_glimpse(
                target_cache, target_cache.max_cache_len if committed is None else committed, self.glide.dtype
            )

        self.cache = StaticDraftCache(
            self.glide, generation_config, compile_config, reads=glimpse if self.glide.config.cross_attention else None
        )
        return self.cache

    def batch_drafter(self, drafters: list[TreeCandidateGenerator]) -> BatchChainDrafter | None:
        """Every row's γ tokens in one GLIDE forward per token; each row glimpses its own target cache columns."""
        if self.requires_model_outputs or not same_drafters(self, drafters, "glide", GlideCandidateGenerator):
            return None  # a state_input GLIDE: each row proposes from its own states
        glide = self.glide

        def glimpse(batch: BatchChainDrafter, positions: torch.Tensor) -> dict:  # each row its own target cache columns
            target_cache, cached = batch.target
            keys = target_key_mask(target_cache.get_seq_length(), cached, positions, glide.dtype)
            return {"target_past_key_values": target_cache, "target_attention_mask": keys}

        reads = glimpse if glide.config.cross_attention else None
        return BatchChainDrafter.of_model(drafters, glide, DynamicCache(config=glide.config), reads)

    def beam_scorer(self, distribution) -> GlideTreeScorer:
        """The scorer CAPE's beam mode (Du et al. 2024, §5.3, GLIDE+BeamSearch) drafts its tree with."""
        if self.requires_model_outputs:
            raise ValueError(
                "CAPE's beam mode scores tree nodes by the draft's tokens alone, and this GLIDE reads the target's "
                "state (state_input=True): use CAPE's default mode (the GLIDE chain widened by its confidence)"
            )
        return GlideTreeScorer(self.glide, distribution)


def glimpse_of(glide: PreTrainedModel, target_cache) -> dict:
    """What GLIDE's forwards read of the target on a ``DynamicCache`` of its own: the target's live cache (§4.1)."""
    check_target_cache(target_cache, glide.config, kv_heads_per_rank(glide))
    return {"target_past_key_values": target_cache}


def kv_heads_per_rank(glide: PreTrainedModel) -> int:
    """The target KV heads ``glide`` reads on this rank (an older checkpoint's GLIDE class: all of them)."""
    return getattr(glide.base_model, "kv_heads_per_rank", glide.config.target_num_key_value_heads)


def check_same_split(target: PreTrainedModel, glide: PreTrainedModel) -> None:
    """GLIDE glimpses the target's cache as each rank holds it: split by tensor parallelism over as many ranks as the
    target, or not at all. Raises `ValueError` naming both splits and the route otherwise."""
    if not glide.config.cross_attention:
        return  # the vanilla drafter reads no target cache: any split runs
    target_split, glide_split = getattr(target, "tp_size", None) or 1, getattr(glide, "tp_size", None) or 1
    if target_split != glide_split:
        raise ValueError(
            "glide reads the target's KV cache as this rank holds it, but the target is split over "
            f"{target_split} tensor-parallel rank(s) and glide over {glide_split}: load glide the way the target was "
            "loaded, e.g. "
            f"GlideForCausalLM.from_pretrained(path, tp_plan='auto') under the same torchrun (docs/multi-gpu.md)"
        )
    glide.config.check_tensor_parallel(glide_split)
    heads = kv_heads_per_rank(glide)
    if target_split > 1 and heads * target_split != glide.config.target_num_key_value_heads:
        raise ValueError(
            f"glide reads {heads} KV heads per rank over {target_split} ranks, but the target has "
            f"{glide.config.target_num_key_value_heads}: load glide with tp_plan='auto' (docs/multi-gpu.md)"
        )


def static_glimpse(target_cache: StaticRowsCache, committed: int, dtype: torch.dtype):
    """GLIDE's glimpse on the static path: ``columns (Q,) ->`` the target's buffers `(1, H, L, D)` per layer and a key
    mask `(1, 1, Q, L)`: a query at ``j`` sees the target keys ``k < min(j, committed)`` (§4.1's inference rule)."""
    pairs = [(layer.keys, layer.values) for layer in target_cache.layers]
    length = target_cache.max_cache_len

    def glimpse(columns: torch.Tensor) -> dict:
        keys = torch.arange(length)
        visible = keys[None, :] < columns.clamp(max=committed)[:, None]
        mask = torch.zeros(visible.shape, dtype=dtype).masked_fill_(~visible, torch.finfo(dtype).min)
        # host: the draft's forward stages it
        return {"target_past_key_values": pairs, "target_attention_mask": mask[None, None]}

    return glimpse


class GlideTreeScorer(DraftModelTreeScorer):
    """:class:`~hf_specdraft.core.drafting.DraftModelTreeScorer` for GLIDE: every beam node sits past the target cache
    (over ``input_ids[:, :-1]``), so each glimpses the whole verified prefix, as in chain drafting (§4.1)."""

    def _forward(self, target_cache: DynamicCache | None, **inputs):
        glimpse = glimpse_of(self.draft_model, target_cache) if self.draft_model.config.cross_attention else {}
        return super()._forward(target_cache, **inputs, **glimpse)
