"""transformers' own drafters in the loop (docs/methods.md): any ``CandidateGenerator`` of its own, wrapped once
(:class:`TransformersCandidateGenerator`), and the state-reading ones transformers builds only inside its assisted loop
(:class:`StateReadingDrafter`: a Gemma 4 assistant, a DFlash drafter), built here for each call so they run with
batches, the static path and the γ controller, handed the target's state as their protocol asks
(:mod:`~hf_specdraft.core.target_state`).
"""

from __future__ import annotations

import torch
from transformers import GenerationConfig, PreTrainedModel
from transformers.generation import CandidateGenerator
from transformers.generation.candidate_generator import (
    DFlashTokenCandidateGenerator,
    SinglePositionMultiTokenCandidateGenerator,
)

from .drafting import AUTO, DraftRequest, TreeCandidateGenerator, draft_length
from .support import CACHE_FIELD
from .target_state import SHARED_KV, TargetOutputs, cache_producers, shared_kv
from .tree import DraftTree

DFLASH_FIELDS = ("target_layer_ids", "block_size", "mask_token_id")


def is_dflash(model) -> bool:
    """Whether ``model``'s config follows DFlash's contract (what transformers' generator reads of it)."""
    return all(getattr(model.config, name, None) is not None for name in DFLASH_FIELDS)


def reads_target_state(model) -> bool:
    """Whether ``draft_model`` is one of the state-reading drafters this module runs (DFlash, a Gemma 4 assistant)."""
    return is_dflash(model) or type(model).__name__.startswith(("Gemma4Assistant", "Gemma4UnifiedAssistant"))


class StateReadingDrafter(TreeCandidateGenerator):
    """One of transformers' state-reading generators, built afresh for every call and every row.

    Args:
        draft_model: a Gemma 4 assistant or a DFlash drafter, on the target's device.
        num_draft_tokens: γ of a Gemma 4 assistant (``"auto"``: chosen every step); a DFlash drafter takes only
            ``"auto"`` or its ``block_size``.
    """

    requires_model_outputs = True

    def __init__(self, draft_model: PreTrainedModel, num_draft_tokens: int | str = AUTO):
        super().__init__()
        if not reads_target_state(draft_model):
            raise ValueError(
                "draft_model must be a Gemma 4 assistant or a DFlash drafter (a config with "
                f"{', '.join(DFLASH_FIELDS)}), got {type(draft_model).__name__}"
            )
        export = draft_model.config.to_dict().get("hf_specdraft_export")  # its inputs are scaled for vLLM
        if export:
            glide = repr(export["glide"]) if export.get("glide") else "<the GLIDE checkpoint it was exported from>"
            raise ValueError(
                f"draft_model is a GLIDE exported for vLLM ({type(draft_model).__name__}, hf-specdraft export), which "
                f"drafts right only in vLLM: in transformers pass the GLIDE itself, "
                f"draft_model=GlideForCausalLM.from_pretrained({glide})"
            )
        self.draft_model = draft_model
        self.dflash = is_dflash(draft_model)
        if self.dflash:
            block = int(draft_model.config.block_size)
            if num_draft_tokens not in (AUTO, block):
                raise ValueError(
                    f"num_draft_tokens must be 'auto' or the DFlash drafter's block_size {block} (it drafts one block "
                    f"per forward), got {num_draft_tokens!r}"
                )
            self.num_draft_tokens, self.adaptive_draft_length = block, False
        else:
            self.num_draft_tokens, self.adaptive_draft_length = draft_length(num_draft_tokens)
        self.generator = None
        self.model_kwargs_overrides: dict = {}
        self.producers: dict[str, int] | None = None  # the assistant's layer type -> the target layer it reads
        self.reads_target_cache = not self.dflash  # the assistant reads the target's last layers' keys and values

    def prepare(self, target: PreTrainedModel, generation_config: GenerationConfig) -> None:
        """Build this call's generator (its state is per request: DFlash's cache, the assistant's first-step flag)."""
        super().prepare(target, generation_config)
        if self.dflash:
            self.generator = DFlashTokenCandidateGenerator(
                self.draft_model, target.get_input_embeddings(), target.get_output_embeddings(), generation_config
            )
            self.model_kwargs_overrides = dict(self.generator.model_kwargs_overrides)
        else:
            self.generator = SinglePositionMultiTokenCandidateGenerator(
                self.draft_model, target.get_input_embeddings(), generation_config
            )
            self.producers = cache_producers(target)
            self.model_kwargs_overrides = {"output_hidden_states": -1}  # the generator reads hidden_states[-1] alone

    def draft_tree(self, request: DraftRequest) -> DraftTree:
        """The generator's chain after the request's text `(1, L)`, with q where it returns logits."""
        if request.target_state is None or self.generator is None:
            raise ValueError(
                f"{type(self.draft_model).__name__} reads the target's hidden states, which transformers' assisted "
                "loop hands only to its own generators: call speculative_generate(target, ids, draft_model=...) or "
                "target.generate(ids, custom_generate=speculative_generate, draft_model=...)"
            )
        if not self.dflash:
            self.generator.num_assistant_tokens = request.num_draft_tokens or self.num_draft_tokens
        # q: what the tokens were drawn from. DFlash samples from softmax(logits) when sampling; the assistant always
        # takes its argmax, so under sampling it gives no q and the target samples each position itself (lossless)
        gives_probs = self.dflash or not self.generation_config.do_sample
        kwargs = request.target_state.model_kwargs()
        tree = candidates_chain(self.generator, request, self.producers, kwargs, gives_probs)
        self.count_call("draft", 0 if not len(tree) else 1 if self.dflash else len(tree))
        return tree


def candidates_chain(
    generator: CandidateGenerator, request: DraftRequest, producers, model_kwargs: dict | None, gives_probs: bool = True
) -> DraftTree:
    """``generator``'s chain after the request's text `(1, L)`, asked as transformers' loop asks (a state-reading one
    with ``model_kwargs``, the target's state and a Gemma 4 assistant's ``producers`` layers' keys and values, read from
    the kept text's cache); with q where ``gives_probs`` and it gives logits for every token."""
    state = request.target_state
    if state is None:
        ids, logits = generator.get_candidates(request.input_ids)
    else:
        outputs = state.outputs
        if outputs is not None and producers is not None:
            kv = shared_kv(request.target_cache, producers)
            outputs = TargetOutputs(hidden_states=outputs.hidden_states, shared_kv_states=kv)
        ids, logits = generator.get_candidates(
            request.input_ids,
            model_kwargs=model_kwargs,
            model_outputs=outputs,
            is_first_iteration=state.first,
            n_last_matches=state.matched,
        )
    tokens = ids[0, request.input_ids.shape[1] :]
    gives_probs = gives_probs and logits is not None and logits.shape[1] == tokens.numel()
    return DraftTree.chain(tokens, torch.softmax(logits[0].float(), dim=-1) if gives_probs else None)


def transformers_protocol(generator: CandidateGenerator) -> tuple[bool, dict]:
    """``requires_model_outputs`` and ``model_kwargs_overrides``, as a transformers ``CandidateGenerator`` declares
    them (read once, when it is wrapped)."""
    return bool(generator.requires_model_outputs), dict(getattr(generator, "model_kwargs_overrides", None) or {})


class TransformersCandidateGenerator(TreeCandidateGenerator):
    """One of transformers' own ``CandidateGenerator`` s as an hf_specdraft drafter: its ``get_candidates`` gives each
    step's chain (with q where it returns logits for every token), every outcome goes to ``update_candidate_strategy``.

    Args:
        generator: the transformers ``CandidateGenerator``, used as it is (never copied for another row).
    """

    def __init__(self, generator: CandidateGenerator):
        super().__init__()
        self.generator = generator
        self.requires_model_outputs, self.model_kwargs_overrides = transformers_protocol(generator)
        self.producers: dict[str, int] | None = None  # Gemma 4's: the target layers whose keys and values it reads

    @property
    def name(self) -> str:
        return type(self.generator).__name__

    def prepare(self, target: PreTrainedModel, generation_config: GenerationConfig) -> None:
        super().prepare(target, generation_config)
        self.producers = cache_producers(target) if self.model_kwargs_overrides.get(SHARED_KV) else None

    def draft_tree(self, request: DraftRequest) -> DraftTree:
        state = request.target_state  # transformers' own state-reading generators (DFlash, MTP, Gemma 4's assistant)
        kwargs = None if state is None else {**state.model_kwargs(), CACHE_FIELD: request.target_cache}
        return candidates_chain(self.generator, request, self.producers, kwargs)

    def get_candidates(self, input_ids: torch.LongTensor, **kwargs):
        return self.generator.get_candidates(input_ids, **kwargs)

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, num_matches: int):
        return self.generator.update_candidate_strategy(input_ids, scores, num_matches)

    def fork(self) -> TreeCandidateGenerator:
        raise ValueError(
            f"{type(self.generator).__name__} drafts for one sequence and cannot be copied per row; "
            "pass one prompt, a list of one drafter per row, or an hf_specdraft drafter "
            "(TreeCandidateGenerator)"
        )
