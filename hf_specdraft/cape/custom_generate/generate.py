"""Greedy speculative decoding with CAPE (Du et al. 2024, §4.2), with only torch and transformers installed::

    out = target.generate(input_ids=x, custom_generate="<checkpoint dir or Hub id>", trust_remote_code=True,
                          max_new_tokens=64)                      # the draft saved in that checkpoint
    out = target.generate(input_ids=x, custom_generate="<dir>", trust_remote_code=True,
                          assistant_model=draft, max_new_tokens=64)  # any causal LM with the target's vocabulary

The draft proposes γ greedy tokens, each widened by the K_i = S(max q_i) next-best tokens, and the target verifies
them as one tree: the output is the target's greedy decoding. The loop is hf_specdraft's core (``loop.py`` and its
siblings), the drafter ``cape_draft.py``. Batch size 1, unpadded.
"""

import copy
import re

import transformers
from transformers import GenerationMixin

# the transformers versions hf_specdraft's loop is tested on (its pyproject.toml): older ones build caches and layer
# masks differently, so the folder refuses them by name rather than fail inside a sibling module
SUPPORTED_TRANSFORMERS = ((5, 23), (5, 25))  # >= 5.23, < 5.25


def check_transformers_version(version: str = transformers.__version__) -> None:
    """Raise `ImportError` naming the version needed unless ``version`` is in :data:`SUPPORTED_TRANSFORMERS`."""
    found = tuple(int(part) for part in re.findall(r"\d+", version)[:2])
    low, high = SUPPORTED_TRANSFORMERS
    needed = f"transformers>={low[0]}.{low[1]},<{high[0]}.{high[1]}"
    if not low <= found < high:
        raise ImportError(
            f"this custom_generate folder (hf_specdraft's speculative decoding loop) needs {needed}; found "
            f"transformers {version}: pip install '{needed}'"
        )


check_transformers_version()  # before the siblings below import transformers internals

from .cape_draft import CapeTreeDrafter, check_input_ids, load_draft, make_drafter  # noqa: E402  (after the version check)

try:  # written beside this file by write_custom_generate, from hf_specdraft's core and cape/expansion_sets.py
    from .expansion_sets import DEFAULT_SCHEDULE, check_schedule
    from .loop import speculative_generate
    from .support import chains_only, check_target, model_type
except ImportError:
    # the template inside the installed library (absolute: transformers reads `from .` lines as sibling files)
    from hf_specdraft.cape.expansion_sets import DEFAULT_SCHEDULE, check_schedule
    from hf_specdraft.core.loop import speculative_generate
    from hf_specdraft.core.support import chains_only, check_target, model_type

# generate() hands these to every custom_generate function; this greedy loop needs them unset
_PASSED_THROUGH = (
    "logits_processor",
    "stopping_criteria",
    "prefix_allowed_tokens_fn",
    "negative_prompt_ids",
    "negative_prompt_attention_mask",
)
# generation_config fields that would change greedy's choice; the loop takes the plain argmax
_UNSUPPORTED_CONFIG = (
    "repetition_penalty",
    "no_repeat_ngram_size",
    "bad_words_ids",
    "min_length",
    "min_new_tokens",
    "suppress_tokens",
    "begin_suppress_tokens",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "sequence_bias",
)


def generate(
    model,
    inputs=None,
    input_ids=None,
    generation_config=None,
    assistant_model=None,
    num_draft_tokens=5,
    verification_budget=32,
    expansion_schedule=DEFAULT_SCHEDULE,
    streamer=None,
    **kwargs,
):
    """Greedy draft + CAPE decoding: the ``custom_generate`` entry point transformers calls.

    Args:
        model: the target causal LM.
        inputs / input_ids (`torch.LongTensor` of shape `(1, L)`): the prompt.
        generation_config: defaults to ``model.generation_config``; other keyword arguments update a copy.
        assistant_model: the draft; ``None`` loads the draft saved in the ``custom_generate`` checkpoint.
        num_draft_tokens (`int`): γ, chain tokens drafted per step (default 5).
        verification_budget (`int`): most tokens verified per step (chain + expansion sets), ≥ γ (32 as in §5.3).
        expansion_schedule: S(p) as ``(upper_bound, K)`` bins.

    Returns:
        `torch.LongTensor` `(1, L + n)`, or the core's ``SpeculativeGenerateOutput`` with
        ``return_dict_in_generate=True``.
    """
    prompt = input_ids if input_ids is not None else inputs
    check_input_ids(prompt)
    if not isinstance(num_draft_tokens, int) or num_draft_tokens < 1:
        raise ValueError(f"num_draft_tokens must be a positive int, got {num_draft_tokens!r}")
    if not isinstance(verification_budget, int) or verification_budget < num_draft_tokens:
        raise ValueError(
            f"verification_budget={verification_budget!r} is smaller than the drafted chain "
            f"(num_draft_tokens={num_draft_tokens})"
        )
    schedule = check_schedule(expansion_schedule, "expansion_schedule")
    config = _generation_setup(model, generation_config, kwargs)
    drafter = make_drafter(assistant_model if assistant_model is not None else load_draft(model), model)
    # the core loop as transformers' custom_generate callable; GenerationMixin.generate itself, since a checkpoint
    # loaded with trust_remote_code replaces model.generate with this very function
    return GenerationMixin.generate(
        model,
        prompt,
        generation_config=config,
        custom_generate=speculative_generate,
        candidate_generator=CapeTreeDrafter(drafter, num_draft_tokens, schedule, verification_budget),
        token_streamer=streamer,
    )


def _generation_setup(model, generation_config, kwargs):
    """The generation config (a copy, updated by ``kwargs``); rejects what greedy CAPE cannot honour."""
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
        raise ValueError(
            "the CAPE custom_generate loop is greedy: pass do_sample=False and leave num_beams / num_return_sequences "
            "at 1"
        )
    changed = [name for name in _UNSUPPORTED_CONFIG if getattr(config, name, None) not in (None, 0, 1.0, [])]
    if changed:
        raise ValueError(
            f"generation options {changed} change greedy decoding and are not supported by the CAPE custom_generate "
            "loop"
        )
    check_target(model)  # recurrent state: refused by name
    why = chains_only(model)
    if why is not None:  # the core loop would verify the tree's first chain only: no CAPE left
        raise ValueError(
            f"the target is a {model_type(model)!r} model whose verification takes chains only ({why}), so CAPE's "
            "expansion sets cannot be verified; use hf_specdraft's speculative_generate with a chain drafter"
        )
    return config
