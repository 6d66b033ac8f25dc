"""Greedy speculative decoding with CAPE (confidence-aware proposal expansion, glide_cape.txt §4.2).

Runs with only torch and transformers installed::

    out = target.generate(input_ids=x, custom_generate="<checkpoint dir or Hub id>", trust_remote_code=True,
                          max_new_tokens=64)                      # the draft saved in that checkpoint
    out = target.generate(input_ids=x, custom_generate="<dir>", trust_remote_code=True,
                          assistant_model=draft, max_new_tokens=64)  # any causal LM with the target's vocabulary

Each step: the draft proposes a greedy chain of γ = ``num_draft_tokens`` tokens with their distributions
q_i; every position gets an expansion set of the K_i = S(max q_i) next-best tokens (leaves beside the
chain token); chain and sets go through the target in one forward under a tree mask; the deepest path
that matches the target's argmax is kept, plus the target's own next token. The output equals the
target's greedy decoding. On CPU every linear layer of a few-token verification runs as ``W @ h.T``.
``projection.py``, ``tree.py`` (the tree mask and cache compaction), ``acceptance.py`` (the tree walk) and
``expansion_sets.py`` (CAPE's S(p) and expansion sets) are hf_specdraft's own modules, written beside this file at
save time.

Options (keyword arguments of ``generate``): ``num_draft_tokens`` (γ, default 5), ``verification_budget``
(most tokens verified per step, default 32 as in §5.3), ``expansion_schedule`` ((upper_bound, K) bins,
default ((.3, 7), (.6, 5), (.8, 3), (1., 1))). Greedy decoding, batch size 1, unpadded prompt.
"""

import copy

import torch
from transformers import DynamicCache
from transformers.generation import GenerateDecoderOnlyOutput

from .cape_draft import load_draft, make_drafter

try:  # written beside this file by write_custom_generate, from hf_specdraft's own projection.py, tree.py, acceptance.py
    from .acceptance import accept_tree  # and cape/expansion_sets.py
    from .expansion_sets import DEFAULT_SCHEDULE, check_schedule, expand
    from .projection import few_token_linears
    from .tree import DraftTree, compact_cache, layer_masks, tree_attention_inputs
except ImportError:  # the template inside the installed library (absolute: transformers reads `from .` lines as sibling files)
    from hf_specdraft.acceptance import accept_tree
    from hf_specdraft.cape.expansion_sets import DEFAULT_SCHEDULE, check_schedule, expand
    from hf_specdraft.projection import few_token_linears
    from hf_specdraft.tree import DraftTree, compact_cache, layer_masks, tree_attention_inputs

# generate() hands these to every custom_generate function; this greedy loop needs them unset
_PASSED_THROUGH = ("logits_processor", "stopping_criteria", "prefix_allowed_tokens_fn", "negative_prompt_ids", "negative_prompt_attention_mask")
# generation_config fields that would change greedy's choice; the loop takes the plain argmax
_UNSUPPORTED_CONFIG = ("repetition_penalty", "no_repeat_ngram_size", "bad_words_ids", "min_length", "min_new_tokens",
                       "suppress_tokens", "begin_suppress_tokens", "forced_bos_token_id", "forced_eos_token_id", "sequence_bias")


def generate(model, inputs=None, input_ids=None, generation_config=None, assistant_model=None,
             num_draft_tokens=5, verification_budget=32, expansion_schedule=DEFAULT_SCHEDULE, streamer=None, **kwargs):
    """Greedy GLIDE/draft + CAPE decoding; the ``custom_generate`` entry point transformers calls.

    Args:
        model: the target causal LM.
        inputs / input_ids (`torch.LongTensor` of shape `(1, L)`): the prompt.
        generation_config: defaults to ``model.generation_config``; other keyword arguments update a copy.
        assistant_model: the draft; ``None`` loads the draft saved in the ``custom_generate`` checkpoint.
        num_draft_tokens (`int`): γ, chain tokens drafted per step.
        verification_budget (`int`): most tokens verified per step (chain + expansion sets), ≥ γ.
        expansion_schedule: S(p) as ``(upper_bound, K)`` bins.

    Returns:
        `torch.LongTensor` `(1, L + n)`, or ``GenerateDecoderOnlyOutput`` with ``return_dict_in_generate=True``.
    """
    prompt = input_ids if input_ids is not None else inputs
    if not isinstance(prompt, torch.Tensor) or prompt.dim() != 2 or prompt.shape[0] != 1 or prompt.shape[1] == 0:
        raise ValueError(f"input_ids must be a non-empty LongTensor of shape (1, L) (batch size 1), got {getattr(prompt, 'shape', prompt)!r}")
    if not isinstance(num_draft_tokens, int) or num_draft_tokens < 1:
        raise ValueError(f"num_draft_tokens must be a positive int, got {num_draft_tokens!r}")
    if not isinstance(verification_budget, int) or verification_budget < num_draft_tokens:
        raise ValueError(f"verification_budget={verification_budget!r} is smaller than the drafted chain (num_draft_tokens={num_draft_tokens})")
    schedule = check_schedule(expansion_schedule, "expansion_schedule")
    config, max_length = _generation_setup(model, generation_config, kwargs, prompt)
    drafter = make_drafter(assistant_model if assistant_model is not None else load_draft(model), model)
    sequences, cache = _cape_loop(model, drafter, prompt, max_length, _eos_ids(config), num_draft_tokens, schedule,
                                  verification_budget, streamer)
    if config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(sequences=sequences, past_key_values=cache)
    return sequences


def _generation_setup(model, generation_config, kwargs, prompt):
    """The generation config (a copy, updated by ``kwargs``) and max_length; rejects what greedy CAPE cannot honour."""
    config = copy.deepcopy(generation_config if generation_config is not None else model.generation_config)
    unused = config.update(**kwargs)
    for name in _PASSED_THROUGH:
        value = unused.pop(name, None)
        if value is not None and not (hasattr(value, "__len__") and len(value) == 0):
            raise ValueError(f"{name} is not supported by the CAPE custom_generate loop (greedy decoding only)")
    unused.pop("synced_gpus", None)
    if unused.pop("use_cache", True) is False:
        raise ValueError("use_cache=False: speculative decoding verifies drafts against the target's KV cache")
    mask = unused.pop("attention_mask", None)
    if mask is not None and not bool(mask.bool().all()):
        raise ValueError("attention_mask has padding: the CAPE loop decodes one unpadded sequence")
    if unused:
        raise ValueError(f"unsupported generate arguments for the CAPE custom_generate loop: {sorted(unused)}")
    if config.do_sample or (config.num_beams or 1) > 1 or (config.num_return_sequences or 1) > 1:
        raise ValueError("the CAPE custom_generate loop is greedy: pass do_sample=False and leave num_beams / num_return_sequences at 1")
    changed = [name for name in _UNSUPPORTED_CONFIG if getattr(config, name, None) not in (None, 0, 1.0, [])]
    if changed:
        raise ValueError(f"generation options {changed} change greedy decoding and are not supported by the CAPE custom_generate loop")
    if config.max_new_tokens is not None:
        max_length = prompt.shape[1] + config.max_new_tokens
    else:
        max_length = config.max_length if config.max_length is not None else 20  # transformers' default max_length
    _check_tree_target(model)
    return config, max_length


def _check_tree_target(model):
    """Refuse, before any forward, targets whose cache or attention cannot take a verified tree.

    Sliding-window and chunked layers verify trees at any length (``layer_masks`` windows each layer's mask).
    """
    text = model.config.get_text_config()
    model_type = getattr(text, "model_type", None) or model.config.model_type
    cache_layers = DynamicCache(config=model.config).layers
    layers = [type(layer).__name__ for layer in cache_layers]
    if any(name not in ("DynamicLayer", "DynamicSlidingWindowLayer") for name in layers):
        raise ValueError(f"the target is a {model_type!r} model whose cache holds non-attention layers ({sorted(set(layers))}); "
                         "tree verification cannot roll them back. Use hf_specdraft's speculative_generate (it refuses or runs chains)")
    if model_type in ("bloom", "mpt") or getattr(text, "alibi", False):
        raise ValueError(f"the target is a {model_type!r} model with ALiBi attention, which takes no tree mask; "
                         "use hf_specdraft's speculative_generate, which verifies such targets' drafts as chains")


def _eos_ids(config):
    eos = config.eos_token_id
    if eos is None:
        return set()
    if isinstance(eos, torch.Tensor):
        return set(eos.flatten().tolist())
    return {eos} if isinstance(eos, int) else set(eos)


class _GreedyRows:
    """The target's verification rows as ``accept_tree`` reads them: row ``r``'s choice is its argmax."""

    def __init__(self, logits):
        self.logits, self.argmax = logits, logits.argmax(-1).tolist()

    def choice(self, row):
        return self.argmax[row]

    def probs(self, row):
        return torch.softmax(self.logits[row].float(), dim=-1)


@torch.no_grad()
def _cape_loop(model, drafter, input_ids, max_length, eos_ids, gamma, schedule, budget, streamer):
    """Draft → expand → verify in one forward → accept → compact, until max_length or EOS."""
    cache = DynamicCache(config=model.config)
    cache.activate_past_recording()  # sliding-window layers keep every key until compaction trims them (tree.trim_windows)
    with few_token_linears(model):  # CPU: each few-token linear as W @ h.T where this CPU runs that faster (projection.py)
        return _cape_steps(model, drafter, input_ids, cache, max_length, eos_ids, gamma, schedule, budget, streamer)


def _cape_steps(model, drafter, input_ids, cache, max_length, eos_ids, gamma, schedule, budget, streamer):
    if input_ids.shape[1] > 1:  # invariant: the target cache covers input_ids[:, :-1]
        model(input_ids=input_ids[:, :-1], past_key_values=cache, use_cache=True)
    if streamer is not None:
        streamer.put(input_ids.cpu())
    done = input_ids.shape[1] >= max_length
    while not done:
        length = input_ids.shape[1]
        k = min(gamma, max_length - length - 1)  # leave room for the accepted path and the target's bonus token
        tokens = parents = input_ids.new_zeros(0)
        if k > 0:
            chain, q = drafter.propose(input_ids, cache, k)
            tokens, parents = expand(chain.to(input_ids.device), q.to(input_ids.device), schedule, budget)
        tree = DraftTree(tokens, parents)
        mask, positions = tree_attention_inputs(tree, length - 1, model.dtype, input_ids.device)
        verify_ids = torch.cat([input_ids[:, -1:], tokens[None]], dim=-1)
        keys = torch.cat([torch.arange(length - 1, device=input_ids.device), positions[0]])
        mask = layer_masks(model, cache, mask, positions, keys)
        logits = model(input_ids=verify_ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True).logits
        path, next_token = accept_tree(_GreedyRows(logits[0]), tree, None, eos_ids)
        new_tokens = tokens[path].tolist() + [next_token]
        for n, token in enumerate(new_tokens):
            if token in eos_ids:
                new_tokens, done = new_tokens[: n + 1], True
                break
        input_ids = torch.cat([input_ids, torch.tensor([new_tokens], device=input_ids.device)], dim=-1)
        kept_nodes = torch.tensor(path[: len(new_tokens) - 1], dtype=torch.long, device=input_ids.device)
        compact_cache(cache, torch.cat([torch.arange(length, device=input_ids.device), length + kept_nodes]))
        if streamer is not None:
            streamer.put(torch.tensor(new_tokens))
        done = done or input_ids.shape[1] >= max_length
    if streamer is not None:
        streamer.end()
    return input_ids, cache
