"""Drafters: the loop's contract with a drafter (its :class:`DrafterTraits` read once per call, a :class:`DraftRequest`
a step answered with a :class:`DraftTree`, a :class:`DraftOutcome` to learn from), the base every drafter extends, the
draft-model drafter, the registry of drafters by model type, and a draft model scoring a token tree (CAPE's beam mode).
The loop owns the target cache: a drafter may read it, never change it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from types import MappingProxyType

import torch
from transformers import DynamicCache, GenerationConfig, LogitsProcessorList, PreTrainedModel
from transformers.generation import CandidateGenerator, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from .support import ATTENTION_LAYERS, cache_layer_names, model_type, output_cache, recurrent_state, with_cache
from .batch_drafting import BatchChainDrafter, BatchProposer
from .cache import croppable_cache, crop_to, resync_cache
from .draft_cache import DynamicDraftCache, StaticDraftCache
from .target_state import TargetState
from .tree import DraftTree, tree_mask
from .verify import LayerWindows


def output_vocab_size(model: PreTrainedModel) -> int:
    """Rows of the model's output embedding (what its logits index), else ``config.vocab_size`` (also for a draft whose
    reduced vocabulary maps back to the target's, GLIDE's ``draft_token_ids``)."""
    if getattr(model.config, "draft_token_ids", None) is not None:
        return int(model.config.vocab_size)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    return int(model.config.get_text_config().vocab_size)


def check_same_vocab(target: PreTrainedModel, draft: PreTrainedModel, argument: str = "draft_model") -> None:
    target_vocab, draft_vocab = output_vocab_size(target), output_vocab_size(draft)
    if target_vocab != draft_vocab:
        raise ValueError(
            f"{argument} predicts {draft_vocab} token ids but the target predicts {target_vocab}; a draft must "
            "share the target's vocabulary (use a draft trained with the target's tokenizer)"
        )


def check_same_device(target: PreTrainedModel, draft: PreTrainedModel, argument: str = "draft_model") -> None:
    """Refuse a draft off the target's device; never move it: a user's model moved behind their back may not fit."""
    if getattr(target, "hf_device_map", None) is not None or getattr(draft, "hf_device_map", None) is not None:
        return  # a model split over devices (device_map="auto") hands tensors between its own devices
    if draft.device != target.device:
        raise ValueError(
            f"{argument} is on {draft.device} but the target is on {target.device}: put the draft on the target's "
            f"device first, e.g. {argument}.to(target.device)"
        )


AUTO = "auto"  # num_draft_tokens="auto": the loop's DraftLengthController picks γ every step (core/controller.py)
AUTO_START = 5  # γ of an auto drafter another wraps (CAPE, the cascade), which reads it once: the papers' §5.1 value
AUTO_MAX = 8  # the longest draft the controller considers


@dataclass(frozen=True)
class DrafterTraits:
    """What a drafter declares to the loop, read once per call (:func:`traits_of`) from its attributes."""

    num_draft_tokens: int | None = None  # γ it drafts where the request names none (None: its own rule decides)
    adaptive_draft_length: bool = False  # num_draft_tokens="auto": the loop's controller picks γ every step
    adaptive_budget: bool = False  # a tree drafter whose node budget the controller picks too
    max_draft_tokens: int = AUTO_MAX  # the longest γ the controller considers for it
    stops_on_confidence: bool = False  # a chain that asks the loop's stop rule after every drafted token
    widens_chain: bool = False  # a chain plus leaves (CAPE): the controller learns what the chain alone accepts
    reads_target_cache: bool = True  # propose() reads the target's cache (the loop builds a view only for those)
    tokens_in_vocab: bool = False  # its tokens come from a draft checked to share the target's vocabulary
    requires_model_outputs: bool = False  # it reads the target's state (core.target_state)
    model_kwargs_overrides: dict = field(default_factory=dict)  # what it asks of the target's forward
    compiles_draft: bool = False  # it has compile_draft: its draft runs on a static cache on the compiled path
    learns_from_outcome: bool = False  # it learns from each step's DraftOutcome (update_candidate_strategy)


@dataclass(frozen=True, slots=True)
class DraftRequest:
    """What the loop hands a drafter for one step. A choice left ``None`` is the drafter's own."""

    input_ids: torch.LongTensor  # (1, L): the row's accepted text, its last token the target's newest
    host_text: list[int] | None = None  # the same text on the host (re-sync or suffix match without a device read)
    target_cache: object = None  # a read-only view of the target's cache over input_ids[:, :-1] (reads_target_cache)
    target_state: TargetState | None = None  # the target's state, for a drafter that requires_model_outputs
    num_draft_tokens: int | None = None  # γ, as the loop's controller chose it for an "auto" drafter
    budget: int | None = None  # a tree's node budget, as the controller chose it for an "auto" tree drafter
    # confidences -> bool, asked after each drafted token of a chain: whether another token is worth its cost
    stop_rule: Callable[[list[float]], bool] | None = None
    # (match, available) -> tokens to copy from the text after a suffix match of `match` tokens (0: draft instead)
    copy_rule: Callable[[int, int], int] | None = None


@dataclass(frozen=True, slots=True)
class DraftOutcome:
    """What the loop hands back after verifying a proposal, to a drafter that declares ``learns_from_outcome``."""

    input_ids: torch.LongTensor  # (1, L'): the row's text after the step (its emitted tokens appended)
    scores: torch.FloatTensor  # (1, n + 1, V): the target's logits at the kept columns (update_candidate_strategy's)
    accepted: int  # draft tokens accepted
    kept: list[int]  # the verified columns kept (0: the last token, 1 + i: node i)
    draft_seconds: float  # what drafting cost the row
    verify_seconds: float  # its share of verification


def draft_length(value, argument: str = "num_draft_tokens", start: int = AUTO_START) -> tuple[int, bool]:
    """``(γ, adaptive)`` of a drafter's ``num_draft_tokens``: a positive int exactly, or ``"auto"`` from ``start``."""
    if value == AUTO:
        return start, True
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(
            f"{argument} must be a positive int or 'auto' (chosen every step from measured costs), got {value!r}"
        )
    return value, False


def traits_of(generator: TreeCandidateGenerator) -> DrafterTraits:
    """``generator``'s :class:`DrafterTraits`, as its class declares them."""
    return DrafterTraits(**{name.name: getattr(generator, name.name) for name in fields(DrafterTraits)})


class TreeCandidateGenerator(CandidateGenerator):
    """Base class of hf_specdraft drafters: :meth:`prepare` once per call, :meth:`draft_tree` every step, :meth:`learn`
    after it, :meth:`finish_call` at the end; its :class:`DrafterTraits` as class attributes. A drafter implements
    :meth:`draft_tree` (honouring the loop's γ, budget, rules) or :meth:`propose` (the text and target cache alone)."""

    controller_anchor = None  # what the controller's learned state belongs to across calls (None: the drafter's class)
    seen_host = None  # draft_chain's last proposal: (the text it followed as a host list, its tree), for resync
    _answers_requests = None  # the draft_tree of the nearest class that implements it (what propose() calls)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "draft_tree" in vars(cls):
            cls._answers_requests = vars(cls)["draft_tree"]
        elif "propose" in vars(cls):  # a subclass refining propose drafts through it
            cls.draft_tree = TreeCandidateGenerator.draft_tree

    def __init__(self):
        self.generation_config = GenerationConfig()
        self.warpers = LogitsProcessorList()
        self.forward_calls: dict[str, int] = {}

    @property
    def name(self) -> str:
        """What error messages call this drafter."""
        return type(self).__name__

    def prepare(self, target: PreTrainedModel, generation_config: GenerationConfig) -> None:
        """Bind to one ``generate`` call: remember the sampling settings, reset per-call state."""
        self.generation_config, self.forward_calls = generation_config, {}
        self.warpers = LogitsProcessorList()  # temperature / top-k / top-p on q: the draft samples like the target
        if generation_config.do_sample:
            if generation_config.temperature not in (None, 1.0):
                self.warpers.append(TemperatureLogitsWarper(generation_config.temperature))
            if generation_config.top_k:
                self.warpers.append(TopKLogitsWarper(generation_config.top_k))
            if generation_config.top_p is not None and generation_config.top_p < 1.0:
                self.warpers.append(TopPLogitsWarper(generation_config.top_p))

    def finish_call(self, stats) -> None:
        """The call's statistics when it ends, kept as ``last_stats``."""
        self.last_stats = stats

    def draft_tree(self, request: DraftRequest) -> DraftTree:
        """This step's proposal for ``request``; by default its text, target cache (and state) go to :meth:`propose`."""
        state = {} if request.target_state is None else {"target_state": request.target_state}  # propose may lack it
        return self.propose(request.input_ids, request.target_cache, **state)

    def propose(
        self,
        input_ids: torch.LongTensor,
        target_cache: DynamicCache | None = None,
        target_state: TargetState | None = None,
    ) -> DraftTree:
        """Draft a tree to follow ``input_ids`` `(1, L)`; ``target_cache`` (read-only) covers ``input_ids[:, :-1]``."""
        if self._answers_requests is None:
            raise NotImplementedError(
                f"{type(self).__name__} implements neither propose(input_ids, target_cache) nor draft_tree(request)"
            )
        return self._answers_requests(DraftRequest(input_ids, target_cache=target_cache, target_state=target_state))

    @property
    def learns_from_outcome(self) -> bool:
        """Whether its class refines :meth:`learn` or ``update_candidate_strategy`` (it is then handed outcomes)."""
        cls = type(self)
        return (
            cls.learn is not TreeCandidateGenerator.learn
            or cls.update_candidate_strategy is not TreeCandidateGenerator.update_candidate_strategy
        )

    def learn(self, outcome: DraftOutcome) -> None:
        """What the step kept of the proposal, handed to transformers' ``update_candidate_strategy``."""
        self.update_candidate_strategy(outcome.input_ids, outcome.scores, outcome.accepted)

    def copy_from_text(self, request: DraftRequest) -> DraftTree | None:
        """This step's draft copied from the request's text (GLIDE's ``copy_from_context``), or `None`: drafted."""
        return None

    def drafted_confidences(self, tree: DraftTree) -> list[float] | None:
        """q of each token of ``tree``'s first-child chain, for the loop's controller; ``None`` without q."""
        if tree.draft_probs is None or not len(tree):
            return None
        if tree.chain_confidences is not None:  # read already, one by one, by the stop rule
            return tree.chain_confidences
        nodes = torch.tensor(tree.chain_nodes(), dtype=torch.long, device=tree.tokens.device)
        probs = tree.draft_probs[nodes.to(tree.draft_probs.device)]
        return probs.gather(-1, tree.tokens[nodes, None].to(probs.device))[:, 0].tolist()

    def draft_distribution(self, logits: torch.Tensor, input_ids: torch.LongTensor) -> torch.Tensor:
        """q `(1, V)` float32 from draft ``logits`` `(1, V)`, warped like the target when sampling."""
        return torch.softmax(self.warpers(input_ids, logits.float()), dim=-1)

    def pick(self, q: torch.Tensor) -> torch.Tensor:
        """Sample from q when sampling, else its argmax. ``q`` `(1, V)` -> `(1, 1)`."""
        if self.generation_config.do_sample:
            return torch.multinomial(q, 1)
        return q.argmax(-1, keepdim=True)

    def beam_scorer(self, distribution: Callable[[torch.Tensor], torch.Tensor]) -> DraftModelTreeScorer | None:
        """A :class:`DraftModelTreeScorer` over this drafter's model for CAPE's beam mode, or ``None``."""
        return None

    def batch_drafter(self, drafters: list[TreeCandidateGenerator]) -> BatchProposer | None:
        """A proposer for the rows' ``drafters`` (this one and its forks) at once, or `None`: each row drafts alone."""
        return None

    def fork(self) -> TreeCandidateGenerator:
        """A copy for another row of a batch: modules and tensors shared (drafters replace their per-request tensors,
        never write into them), everything else copied."""
        memo: dict[int, object] = {}
        _share_tensors(self, memo, set())
        return copy.deepcopy(self, memo)

    def count_call(self, name: str, n: int = 1) -> None:
        self.forward_calls[name] = self.forward_calls.get(name, 0) + n

    def get_candidates(
        self, input_ids: torch.LongTensor, **kwargs
    ) -> tuple[torch.LongTensor, torch.FloatTensor | None]:
        model_kwargs = kwargs.get("model_kwargs") or {}
        chain = self.draft_tree(DraftRequest(input_ids, target_cache=output_cache(model_kwargs))).main_chain()
        ids = torch.cat([input_ids, chain.tokens.to(input_ids.device)[None]], dim=-1)
        logits = None if chain.draft_probs is None else chain.draft_probs.clamp_min(1e-30).log()[None]
        return ids, logits

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, num_matches: int):
        return None


# the DrafterTraits defaults as class attributes, overridden where a drafter differs (learns_from_outcome: a property)
for _name, _default in vars(DrafterTraits(model_kwargs_overrides=MappingProxyType({}))).items():
    if _name != "learns_from_outcome":
        setattr(TreeCandidateGenerator, _name, _default)


def _share_tensors(obj, memo: dict[int, object], visited: set[int], depth: int = 0) -> None:
    """Mark every module and tensor reachable from ``obj`` as its own deep copy (``memo``): :meth:`fork` shares them."""
    if id(obj) in visited or depth > 8 or isinstance(obj, (str, bytes, int, float, bool, type(None))):
        return
    visited.add(id(obj))
    # read-only while drafting
    if isinstance(obj, (torch.nn.Module, torch.Tensor, memoryview)) or type(obj).__module__ == "numpy":
        memo[id(obj)] = obj
        return
    if isinstance(obj, dict):
        children = list(obj.keys()) + list(obj.values())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        children = list(obj)
    else:
        children = list(vars(obj).values()) if hasattr(obj, "__dict__") else []
    for child in children:
        _share_tensors(child, memo, visited, depth + 1)


class DraftModelCandidateGenerator(TreeCandidateGenerator):
    """Vanilla speculative decoding's drafter: a chain of γ tokens with their q from a small causal LM, on its own KV
    cache re-synced to the accepted text every step.

    Args:
        draft_model: a causal LM sharing the target's vocabulary.
        num_draft_tokens: γ, tokens drafted per step; ``"auto"`` (the default): chosen by the loop every step.
    """

    reads_target_cache = False
    stops_on_confidence = True
    tokens_in_vocab = True  # prepare checks the draft's vocabulary against the target's
    compiles_draft = True

    def __init__(self, draft_model: PreTrainedModel, num_draft_tokens: int | str = AUTO):
        super().__init__()
        if not isinstance(draft_model, PreTrainedModel):
            raise TypeError(f"draft_model must be a transformers PreTrainedModel, got {type(draft_model).__name__}")
        self.draft_model = self.controller_anchor = draft_model  # anchor: a later call with this draft resumes
        self.num_draft_tokens, self.adaptive_draft_length = draft_length(num_draft_tokens)
        self._reset()

    def _reset(self):
        self.cache = DynamicDraftCache(self.draft_model)
        self.seen = torch.zeros(0, dtype=torch.long)  # tokens the draft cache covers

    def prepare(self, target: PreTrainedModel, generation_config: GenerationConfig) -> None:
        super().prepare(target, generation_config)
        check_same_vocab(target, self.draft_model)
        check_same_device(target, self.draft_model)
        # its cache is re-synced by cropping it to the accepted prefix: attention layers only
        others = sorted({name for name in cache_layer_names(self.draft_model) if name not in ATTENTION_LAYERS})
        if others or recurrent_state(self.draft_model):
            raise ValueError(
                f"draft_model is a {model_type(self.draft_model)!r} model whose cache holds "
                f"{others or 'its own recurrent state'}; a draft model must be attention-only (its cache is cropped "
                "back to the accepted text every step)"
            )
        self._reset()

    def compile_draft(self, generation_config: GenerationConfig, compile_config, target_cache) -> StaticDraftCache:
        """The compiled static path (batch 1): the draft on a static cache of its own. Returns that cache."""
        self.cache = StaticDraftCache(self.draft_model, generation_config, compile_config)
        return self.cache

    @torch.no_grad()
    def draft_tree(self, request: DraftRequest) -> DraftTree:
        return draft_chain(self, request, self.cache.forward, self.draft_model.device)  # its own cache, either kind

    def beam_scorer(self, distribution: Callable[[torch.Tensor], torch.Tensor]) -> DraftModelTreeScorer:
        return DraftModelTreeScorer(self.draft_model, distribution)

    def batch_drafter(self, drafters: list[TreeCandidateGenerator]) -> BatchChainDrafter | None:
        if not same_drafters(self, drafters, "draft_model", DraftModelCandidateGenerator):
            return None
        return BatchChainDrafter.of_model(drafters, self.draft_model, croppable_cache(self.draft_model))


def same_drafters(
    first: TreeCandidateGenerator, drafters: list[TreeCandidateGenerator], model_attribute: str, owner: type
) -> bool:
    """Whether every row drafts as ``first`` (same class, model object and γ) through ``owner``'s own ``draft_tree``,
    which the batch proposer stands in for."""
    model = getattr(first, model_attribute)
    return type(first).draft_tree is owner.draft_tree and all(
        type(d) is type(first) and getattr(d, model_attribute) is model and d.num_draft_tokens == first.num_draft_tokens
        for d in drafters
    )


DrafterFactory = Callable[..., TreeCandidateGenerator]  # factory(draft_model, num_draft_tokens=γ[, copy options])
DRAFTERS: dict[str, DrafterFactory] = {}  # model_type -> drafter, filled by the method packages (hf_specdraft.glide)


def register_drafter(model_type: str, factory: DrafterFactory) -> None:
    """Draft models of ``model_type`` through ``factory(draft_model, num_draft_tokens=γ)`` rather than
    :class:`DraftModelCandidateGenerator`: the loop imports no method, methods register."""
    if not isinstance(model_type, str) or not model_type:
        raise ValueError(f"model_type must be a non-empty string, got {model_type!r}")
    if not callable(factory):
        raise TypeError(
            f"factory must be callable as factory(draft_model, num_draft_tokens=...), got {type(factory).__name__}"
        )
    DRAFTERS[model_type] = factory


def draft_chain(
    generator: TreeCandidateGenerator, request: DraftRequest, next_logits, device: torch.device, feed=None
) -> DraftTree:
    """Draft γ tokens one by one on ``generator.cache`` (re-synced first to the request's text) through ``next_logits``
    (``feed (1, n) -> logits (1, V)``), stopping where the request's ``stop_rule`` says so: a chain with q `(γ, V)`.
    ``feed`` `(1, n)`: the first forward's tokens where a caller readied the cache itself (a ``state_input`` GLIDE)."""
    input_ids, stop_rule = request.input_ids, request.stop_rule
    ids = input_ids[0] if input_ids.device == torch.device(device) else input_ids[0].to(device)
    if feed is None:  # invariant after this: the cache covers ids, then each drafted token
        feed = ids[resync(generator, ids, request.host_text) :][None]
    tokens, probs, confidences = [], [], []
    for _ in range(request.num_draft_tokens or generator.num_draft_tokens):
        # warpers see the drafted prefix
        context = torch.cat([ids[None], *tokens], dim=-1) if generator.warpers else ids[None]
        q = generator.draft_distribution(next_logits(feed), context)
        feed = generator.pick(q)  # (1, 1), left on the device: the next feed, and the tree's token
        tokens.append(feed)
        probs.append(q[0])
        if stop_rule is not None:
            # the loop's controller: stop where another token is not worth its cost (one read per drafted token)
            confidences.append(float(q[0, feed[0, 0]]))
            if not stop_rule(confidences):
                break
    generator.count_call("draft", len(tokens))
    drafted = torch.cat(tokens, dim=-1)[0]
    generator.seen = torch.cat([ids, drafted[:-1]])
    sampled = torch.ones(drafted.shape[0], dtype=torch.bool) if generator.generation_config.do_sample else None
    tree = DraftTree.chain(drafted, torch.stack(probs), sampled)
    tree.chain_confidences = confidences if stop_rule is not None else None
    host = request.host_text
    generator.seen_host = (host, tree) if host is not None and len(host) == ids.shape[0] else None
    return tree


def resync(generator: TreeCandidateGenerator, ids: torch.Tensor, host: list[int] | None = None) -> int:
    """Crop ``generator.cache`` to its common prefix with the accepted text ``ids`` `(L,)`; returns the kept length.
    Compared on the host where the text and the last proposal's tokens are there, else on the device."""
    last = generator.seen_host
    known = None if last is None else last[1].token_list if last[1].token_list is not None else last[1].known_tokens
    if host is None or known is None or len(host) != ids.shape[0]:
        return resync_cache(generator.cache, generator.seen, ids)
    seen = last[0] + known[: len(last[1]) - 1]  # the cache covers the text then every drafted token but the last
    keep = next((i for i, (a, b) in enumerate(zip(seen, host)) if a != b), min(len(seen), len(host)))
    return crop_to(generator.cache, min(keep, len(host) - 1))


class DraftModelTreeScorer:
    """A causal-LM draft scoring a growing token tree past its cached prefix (CAPE's beam mode): :meth:`start` caches
    the prefix and returns q after it, :meth:`extend` q after each new node, :meth:`finish` drops the nodes.

    Args:
        draft_model: a causal LM sharing the target's vocabulary.
        distribution: maps draft logits `(n, V)` to q `(n, V)` (softmax, warped like the target when sampling).
    """

    def __init__(self, draft_model: PreTrainedModel, distribution: Callable[[torch.Tensor], torch.Tensor]):
        self.draft_model, self.distribution = draft_model, distribution
        self.windows = LayerWindows(draft_model)  # the draft's windowed layers, read from its config once
        self.forward_calls = 0
        self.reset()

    def reset(self) -> None:
        self.cache = croppable_cache(self.draft_model)
        self.target_cache = None
        self.seen = torch.zeros(0, dtype=torch.long)  # invariant between steps: the cache covers exactly `seen`

    def start(self, input_ids: torch.LongTensor, target_cache: DynamicCache | None = None) -> torch.Tensor:
        """Cache ``input_ids`` `(1, L)` (re-using the prefix shared with the last step); q `(1, V)` after it.
        ``target_cache`` (read-only) is for GLIDE's scorer."""
        ids = input_ids[0].to(self.draft_model.device)
        keep = resync_cache(self.cache, self.seen, ids)
        logits = self._forward(target_cache, input_ids=ids[keep:][None], logits_to_keep=1).logits[0, -1:]
        self.target_cache, self.seen = target_cache, ids
        return self.distribution(logits)

    def extend(self, tokens: torch.LongTensor, parents: torch.LongTensor) -> torch.Tensor:
        """Append the newest nodes ``tokens`` `(n,)` of a tree to the cache and return q `(n, V)` after each of them.
        ``parents`` `(M,)`: parents of all ``M`` nodes so far, the new ones included (``-1``: the last prefix token)."""
        device, dtype = self.draft_model.device, self.draft_model.dtype
        prefix, n = self.seen.numel(), tokens.numel()
        mask, node_positions = tree_mask(parents, prefix, dtype, device, queries=n)
        positions = node_positions[:, -n:]
        # the cache holds the prefix, then every node
        keys = torch.cat([torch.arange(prefix, device=device), node_positions[0]])
        logits = self._forward(
            self.target_cache,
            input_ids=tokens.to(device)[None],
            position_ids=positions,
            attention_mask=self.windows.masks(mask, positions, keys, self.cache),
        ).logits[0]
        return self.distribution(logits)

    def _forward(self, target_cache: DynamicCache | None, **inputs):
        """One draft forward on the scorer's cache; GLIDE's scorer passes ``target_cache`` on."""
        self.forward_calls += 1
        return self.draft_model(**inputs, **with_cache(self.draft_model, self.cache), use_cache=True)

    def finish(self) -> None:
        """Drop the tree nodes: the cache covers the prefix again."""
        crop_to(self.cache, self.seen.numel())
