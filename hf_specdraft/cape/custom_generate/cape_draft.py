"""The draft side of the CAPE ``custom_generate`` loop: a greedy chain drafter that returns q, and draft loading.

Self-contained (torch, transformers and the library's ``tree.py`` written beside it): it ships inside a checkpoint's ``custom_generate/``.

A drafter is any object with ``propose(input_ids, target_cache, num_tokens) -> (tokens (k,), q (k, V))``.
A draft model may bring its own drafter through a ``cape_drafter(target)`` method (GLIDE's does: its
layers read the target cache); any other causal LM gets :class:`CausalLMDrafter`.
"""

import sys

import torch
from transformers import AutoModelForCausalLM

try:  # written beside this file by write_custom_generate, from hf_specdraft's own tree.py
    from .tree import croppable_cache
except ImportError:  # the template inside the installed library
    from hf_specdraft.tree import croppable_cache

_LOADED_DRAFTS = {}  # (checkpoint, device, dtype) -> draft model, so repeated generate calls load it once


def output_vocab_size(model):
    """Rows of the model's output embedding, i.e. how many token ids its logits score."""
    if getattr(model.config, "draft_token_ids", None) is not None:  # a reduced draft vocabulary scored as the full one
        return int(model.config.vocab_size)
    head = model.get_output_embeddings()
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    return int(model.config.get_text_config().vocab_size)


class CausalLMDrafter:
    """Greedy chain drafting with a plain causal LM that keeps its own KV cache across steps.

    Args:
        draft_model: a causal LM sharing the target's vocabulary.
    """

    def __init__(self, draft_model):
        self.draft_model = draft_model
        self.cache = croppable_cache(draft_model)  # sliding-window drafts too crop back past their window
        self.seen = torch.zeros(0, dtype=torch.long)  # tokens the draft cache covers

    @torch.no_grad()
    def propose(self, input_ids, target_cache, num_tokens):
        """Draft ``num_tokens`` greedy tokens after ``input_ids`` `(1, L)`; ``target_cache`` is unused.

        Returns:
            `(tokens, q)`: `(k,)` drafted ids and `(k, V)` float32 draft distributions.
        """
        ids = input_ids[0].to(self.draft_model.device)
        common = self.seen.to(ids.device)[: ids.numel()]
        differ = (common != ids[: common.numel()]).nonzero()
        keep = min(int(differ[0]) if differ.numel() else common.numel(), ids.numel() - 1)
        if self.cache.get_seq_length() > keep:  # drop the rejected draft tokens
            self.cache.crop(keep - self.cache.get_seq_length())
        feed, tokens, probs = ids[keep:][None], [], []
        for _ in range(num_tokens):
            logits = self.draft_model(input_ids=feed, past_key_values=self.cache, use_cache=True).logits[0, -1]
            q = torch.softmax(logits.float(), dim=-1)
            feed = q.argmax()[None, None]
            tokens.append(feed[0])
            probs.append(q)
        self.seen = torch.cat([ids, *tokens])[:-1]  # the last drafted token was never fed
        return torch.cat(tokens), torch.stack(probs)


def make_drafter(draft_model, target):
    """The drafter for ``draft_model``: its own ``cape_drafter(target)`` if it has one, else :class:`CausalLMDrafter`."""
    if output_vocab_size(draft_model) != output_vocab_size(target):
        raise ValueError(
            f"the draft predicts {output_vocab_size(draft_model)} token ids but the target predicts "
            f"{output_vocab_size(target)}; the draft must share the target's vocabulary"
        )
    if hasattr(draft_model, "cape_drafter"):
        return draft_model.cape_drafter(target)
    return CausalLMDrafter(draft_model)


def checkpoint_of_call(target):
    """The ``custom_generate=`` string that ``target.generate`` was called with, or ``None``.

    transformers passes every ``generate`` argument to this function except ``custom_generate`` itself, so
    the checkpoint that holds the draft is read from the calling ``generate`` frame (transformers 5.17-5.23).
    """
    frame = sys._getframe(1)
    while frame is not None:
        local = frame.f_locals
        if frame.f_code.co_name == "generate" and local.get("self") is target and isinstance(local.get("custom_generate"), str):
            return local["custom_generate"]
        frame = frame.f_back
    return None


def load_draft(target):
    """Load the draft saved next to this ``custom_generate/`` folder (same checkpoint), on the target's device and dtype."""
    checkpoint = checkpoint_of_call(target)
    if checkpoint is None:
        raise ValueError("no draft model: pass assistant_model=<draft model> to generate, or call generate(custom_generate=<checkpoint with the draft>)")
    key = (checkpoint, str(target.device), target.dtype)
    if key not in _LOADED_DRAFTS:
        try:
            draft = AutoModelForCausalLM.from_pretrained(checkpoint, trust_remote_code=True, dtype=target.dtype)
        except (OSError, ValueError) as error:
            raise ValueError(f"{checkpoint!r} holds no loadable draft model ({error}); pass assistant_model=<draft model> to generate") from error
        _LOADED_DRAFTS[key] = draft.to(target.device).eval()
    return _LOADED_DRAFTS[key]
