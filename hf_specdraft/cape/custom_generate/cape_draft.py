"""The draft side of the shipped CAPE folder: a greedy chain drafter, CAPE's tree over it (Du et al. 2024, §4.2), and
draft loading. A chain drafter has ``propose(input_ids, target_cache, num_tokens) -> (tokens (k,), q (k, V))``: a draft
model's own ``cape_drafter(target)``, else :class:`CausalLMDrafter`.
"""

import sys

import torch
from transformers import AutoModelForCausalLM

try:  # written beside this file by write_custom_generate, from hf_specdraft's core and cape/expansion_sets.py
    from .drafting import DraftModelCandidateGenerator, DraftRequest, draft_chain
    from .drafting import TreeCandidateGenerator, check_same_vocab
    from .expansion_sets import expand
    from .tree import DraftTree
except ImportError:  # the template inside the installed library
    from hf_specdraft.cape.expansion_sets import expand
    from hf_specdraft.core.drafting import DraftModelCandidateGenerator, DraftRequest, draft_chain
    from hf_specdraft.core.drafting import TreeCandidateGenerator, check_same_vocab
    from hf_specdraft.core.tree import DraftTree

_LOADED_DRAFTS = {}  # (checkpoint, device, dtype) -> draft model, so repeated generate calls load it once


class CausalLMDrafter:
    """Greedy chain drafting with a causal LM on its own KV cache (the core's draft-model drafter). A draft that
    glimpses (GLIDE, §4.1) reads the target's live cache, which covers ``input_ids[:, :-1]``.

    Args:
        draft_model: a causal LM sharing the target's vocabulary (a GLIDE checkpoint included).
        glimpses (`bool`): pass the target cache to the draft as ``target_past_key_values``.
    """

    def __init__(self, draft_model, glimpses=False):
        self.generator = DraftModelCandidateGenerator(draft_model)  # greedy: never prepared, so no sampling warpers
        self.glimpses = glimpses

    @torch.no_grad()
    def propose(self, input_ids, target_cache, num_tokens):
        """Draft ``num_tokens`` (γ = k) greedy tokens after ``input_ids`` `(1, L)`, reading ``target_cache`` (covering
        ``input_ids[:, :-1]``) when the draft glimpses. Returns `(tokens, q)`: ids `(k,)` and float32 q `(k, V)`."""
        check_input_ids(input_ids)
        if not isinstance(num_tokens, int) or isinstance(num_tokens, bool) or num_tokens < 1:
            raise ValueError(f"num_tokens must be a positive int, got {num_tokens!r}")
        glimpse = None
        if self.glimpses:
            if not hasattr(target_cache, "get_seq_length"):
                raise ValueError(
                    f"target_cache must be the target's live transformers Cache, got {type(target_cache).__name__}"
                )
            covered = target_cache.get_seq_length()
            if covered != input_ids.shape[1] - 1:  # invariant: the cache covers input_ids[:, :-1], the verified prefix
                raise ValueError(
                    f"target_cache covers {covered} tokens but must cover input_ids[:, :-1] ({input_ids.shape[1] - 1} "
                    "tokens): GLIDE glimpses the verified prefix only (GLIDE §4.1)"
                )
            glimpse = {"target_past_key_values": target_cache}
        drafter, request = self.generator, DraftRequest(input_ids, num_draft_tokens=num_tokens)
        chain = draft_chain(
            drafter, request, lambda feed: drafter.cache.forward(feed, glimpse), drafter.draft_model.device
        )
        return chain.tokens, chain.draft_probs


def check_input_ids(input_ids):
    """Raise `ValueError` unless ``input_ids`` is a non-empty tensor of shape `(1, L)`."""
    shape = tuple(getattr(input_ids, "shape", ()))
    if not isinstance(input_ids, torch.Tensor) or len(shape) != 2 or shape[0] != 1 or shape[1] == 0:
        raise ValueError(
            f"input_ids must be a non-empty tensor of shape (1, L) (batch size 1), got "
            f"{getattr(input_ids, 'shape', input_ids)!r}"
        )


class CapeTreeDrafter(TreeCandidateGenerator):
    """CAPE over a chain ``drafter``: γ greedy tokens a step, each with its K_i = S(max q_i) next-best tokens beside
    it, ``budget`` nodes at most."""

    def __init__(self, drafter, num_draft_tokens, schedule, budget):
        super().__init__()
        self.drafter, self.num_draft_tokens, self.schedule, self.budget = drafter, num_draft_tokens, schedule, budget

    def propose(self, input_ids, target_cache=None):
        chain, q = self.drafter.propose(input_ids, target_cache, self.num_draft_tokens)
        return DraftTree(*expand(chain, q, self.schedule, self.budget))  # host lists: the loop stages them once


def make_drafter(draft_model, target):
    """The drafter for ``draft_model``: its own ``cape_drafter(target)``, else :class:`CausalLMDrafter` (glimpsing when
    the draft cross-attends to the target, after checking it was built for ``target``)."""
    check_same_vocab(target, draft_model, argument="the draft")
    if hasattr(draft_model, "cape_drafter"):
        return draft_model.cape_drafter(target)
    if hasattr(draft_model, "check_target"):  # GLIDE: a draft built for one kind of target
        draft_model.check_target(target)
    return CausalLMDrafter(draft_model, glimpses=bool(getattr(draft_model.config, "cross_attention", False)))


def checkpoint_of_call(target):
    """The ``custom_generate=`` string that ``target.generate`` was called with, or ``None``: transformers passes
    every argument but that one on, so it is read from the calling ``generate`` frame."""
    frame = sys._getframe(1)
    while frame is not None:
        local = frame.f_locals
        if (
            frame.f_code.co_name == "generate"
            and local.get("self") is target
            and isinstance(local.get("custom_generate"), str)
        ):
            return local["custom_generate"]
        frame = frame.f_back
    return None


def load_draft(target):
    """Load the draft saved in this folder's checkpoint, on the target's device and dtype."""
    checkpoint = checkpoint_of_call(target)
    if checkpoint is None:
        raise ValueError(
            "no draft model: pass assistant_model=<draft model> to generate, or call "
            "generate(custom_generate=<checkpoint with the draft>)"
        )
    key = (checkpoint, str(target.device), target.dtype)
    if key not in _LOADED_DRAFTS:
        try:
            draft = AutoModelForCausalLM.from_pretrained(checkpoint, trust_remote_code=True, dtype=target.dtype)
        except (OSError, ValueError) as error:
            raise ValueError(
                f"{checkpoint!r} holds no loadable draft model ({error}); pass assistant_model=<draft model> to "
                "generate"
            ) from error
        _LOADED_DRAFTS[key] = draft.to(target.device).eval()
    return _LOADED_DRAFTS[key]
