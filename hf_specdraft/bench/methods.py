"""The methods the bench harness and the demo put side by side, registered here by name (:func:`register_method`); the
method packages only lend their ``build_*_for_bench`` factories, and a study registers its own grid (e.g.
``benchmarks/studies/k_sweep.py``).

A method is a function ``run(ctx) -> (sequences (1, L+n), SpeculativeStats | None)``. Baselines use
stock ``generate``; speculative methods go through :func:`hf_specdraft.speculative_generate`.

A method that copies from the context (GLIDE's ``copy_from_context``) says so in its name: ``glide+copy``,
``glide+copy-auto``, ``draft-model+copy``, … ; every other GLIDE-family row passes ``copy_from_context=0``, so ``glide``
against ``vanilla`` compares the drafters alone (GLIDE against its twin). A fixed-γ copying row copies
``COPY_TOKENS`` tokens at a match (``max_copy_tokens``), its model drafts γ.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..defaults.tasks import TaskItem
from ..core.drafting import DraftModelCandidateGenerator, TreeCandidateGenerator
from ..core.loop import speculative_generate
from ..core.stats import SpeculativeStats
from ..core.projection import few_token_linears
from ..cascade.max_gram import MAX_GRAM_TOKENS
from ..core.tree import DraftTree

COPY_TOKENS = 6  # a fixed-γ "+copy" row's copies (max_copy_tokens): a match that long tends to continue for several tokens
NO_COPY = {"copy_from_context": 0}  # every GLIDE-family row whose name does not say "+copy"


# Drafts' γ and CAPE's (γ, verification budget) for the default target on CPU, tuned by `python -m benchmarks.studies.tune_glide`
# on completion items 20..25 (benchmarks/results/cpu-tune-glide.json); the bench measures them on items 0..N-1.
# The best γ follows the CPU's verification cost curve (hf_specdraft/core/projection.py, benchmarks/studies/projection.py), so it is tuned on the
# machine that runs the bench. On the 2-core AMD EPYC VM of 2026-11-25 (one-row linears computed as two rows, a forward
# over 2 tokens 0.9x a one-token forward, over 3-4 tokens 1.2x): GLIDE γ = 1 (1.98x; γ = 2: 1.80x, γ = 3: 1.81x,
# γ = 5: 1.47x), CAPE γ = 2 with a 3-token budget (1.95x; γ = 2 / budget 2: 1.74x, γ = 1 / budget 3: 1.79x). On the
# 2-core AVX-512 Xeon VM of the same day (2-3 tokens 1.0-1.1x, 4 tokens 1.5x): GLIDE γ = 2 (1.29x; γ = 1: 1.22x, γ = 3:
# 1.01x) and CAPE γ = 1 / budget 2 (1.26x). The paper's γ = 5 / 32 tokens assume a GPU's flat cost.
GLIDE_GAMMA = 1
CAPE_GAMMA, CAPE_BUDGET = 2, 3
# The plain draft (the vanilla twin) drafts with the same γ and CAPE settings.


@dataclass
class BenchContext:
    target: PreTrainedModel
    draft: PreTrainedModel | None
    tokenizer: PreTrainedTokenizerBase
    item: TaskItem
    prompt_ids: torch.Tensor  # (1, L)
    max_new_tokens: int
    extras: dict = field(default_factory=dict)  # trained drafters, tables, … keyed by name
    overrides: dict = field(default_factory=dict)  # more generate arguments (a method's static-cache / compiled variant)

    def generate_kwargs(self) -> dict:
        return {"max_new_tokens": self.max_new_tokens, "do_sample": False, "eos_token_id": self.tokenizer.eos_token_id,
                "pad_token_id": self.tokenizer.pad_token_id, **self.overrides}


@dataclass(frozen=True)
class Method:
    name: str
    run: Callable[[BenchContext], tuple[torch.Tensor, SpeculativeStats | None]]
    tasks: tuple[str, ...] = ("completion", "context", "chat")
    requires: tuple[str, ...] = ()  # names in ctx.extras (or "draft") that must be present
    lossless: bool = True  # greedy output must equal target-only greedy
    description: str = ""
    cost_models: Callable[[dict], dict] | None = None  # extras (+ "draft") -> {drafter_calls name: model or None (free)}, for SWI

    def available(self, ctx_extras: dict, has_draft: bool) -> bool:
        return all((name == "draft" and has_draft) or name in ctx_extras for name in self.requires)


METHODS: dict[str, Method] = {}


def register_method(method: Method) -> Method:
    if method.name in METHODS:
        raise ValueError(f"a bench method named {method.name!r} is already registered")
    METHODS[method.name] = method
    return method


class NullCandidateGenerator(TreeCandidateGenerator):
    """Proposes nothing: every step is one plain target forward. Measures the loop's own overhead."""

    reads_target_cache = False  # never reads the target's cache

    def propose(self, input_ids, target_cache=None) -> DraftTree:
        return DraftTree.empty(input_ids.device)


def _target_only(ctx):
    return ctx.target.generate(ctx.prompt_ids, **ctx.generate_kwargs()), None


def _stock_generate(ctx, **kwargs) -> torch.Tensor:
    """``target.generate`` with transformers' own warnings held back: assisted decoding calls the assistant's
    ``generate`` with a generation config and arguments together, and its deprecation notice would land in the
    middle of the bench's progress and tables (it is transformers' internal call, nothing the user passed)."""
    from transformers.utils import logging

    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        return ctx.target.generate(ctx.prompt_ids, **kwargs, **ctx.generate_kwargs())
    finally:
        logging.set_verbosity(verbosity)


def _stock_assisted(ctx):
    return _stock_generate(ctx, assistant_model=ctx.draft), None


def _prompt_lookup(ctx):
    return ctx.target.generate(ctx.prompt_ids, prompt_lookup_num_tokens=10, **ctx.generate_kwargs()), None


def _speculative(ctx, **kwargs):
    out = speculative_generate(ctx.target, ctx.prompt_ids, return_dict_in_generate=True, **kwargs, **ctx.generate_kwargs())
    return out.sequences, out.speculative_stats


register_method(Method("target-only", _target_only, description="target.generate(do_sample=False)"))


def _with_linears(run):
    """``run`` inside :func:`~hf_specdraft.core.projection.few_token_linears`: stock ``generate`` with the linears in the
    orientation this CPU's BLAS runs fastest (what our loop uses), so its rows compare loops, not matrix kernels."""
    def wrapped(ctx):
        with few_token_linears(ctx.target):
            return run(ctx)
    return wrapped


# the stock baselines as a user gets them with `with few_token_linears(target): target.generate(...)`: on the AMD VM a
# one-token fp32 linear ran on one core, and this made plain greedy decoding 1.5x faster (hf_specdraft/core/projection.py)
FAST_BASELINE = "target-only+linears"
register_method(Method(FAST_BASELINE, _with_linears(_target_only), description="target.generate(do_sample=False) inside few_token_linears"))
register_method(Method("stock-assisted", _stock_assisted, requires=("draft",), description="transformers assisted decoding with the plain draft"))
register_method(Method("stock-assisted+linears", _with_linears(_stock_assisted), requires=("draft",),
                       description="transformers assisted decoding with the plain draft, inside few_token_linears"))
register_method(Method("prompt-lookup", _prompt_lookup, description="transformers prompt lookup decoding (prompt_lookup_num_tokens=10)"))
register_method(Method("prompt-lookup+linears", _with_linears(_prompt_lookup),
                       description="transformers prompt lookup decoding (prompt_lookup_num_tokens=10), inside few_token_linears"))
register_method(Method("draft-model", lambda ctx: _speculative(ctx, draft_model=ctx.draft, num_draft_tokens=GLIDE_GAMMA, copy_from_context=False),
                       requires=("draft",), description=f"speculative_generate with the plain draft, γ={GLIDE_GAMMA}, no copying",
                       cost_models=lambda e: {"draft": e["draft"]}))
register_method(Method("draft-model+copy", lambda ctx: _speculative(ctx, draft_model=ctx.draft, num_draft_tokens=GLIDE_GAMMA, copy_from_context=2,
                                                                    max_copy_tokens=COPY_TOKENS), requires=("draft",),
                       description=f"speculative_generate with the plain draft (GLIDE-family), γ={GLIDE_GAMMA}, copying {COPY_TOKENS} tokens "
                                   "from the context where its last 2 tokens recur", cost_models=lambda e: {"draft": e["draft"]}))
register_method(Method("null-drafter", lambda ctx: _speculative(ctx, candidate_generator=NullCandidateGenerator()),
                       description="speculative_generate proposing nothing (loop overhead)"))


# --- cascade speculative drafting (hf_specdraft.cascade) -------------------------------------------------

def _bigram(ctx):
    return ctx.extras.get("bigram_table")


def _max_gram(ctx):
    from ..cascade import build_max_gram_for_bench

    return _speculative(ctx, candidate_generator=build_max_gram_for_bench(ctx.target, _bigram(ctx), num_draft_tokens=MAX_GRAM_TOKENS))


def _max_gram_auto(ctx):
    from ..cascade import build_max_gram_for_bench

    return _speculative(ctx, candidate_generator=build_max_gram_for_bench(ctx.target, _bigram(ctx)))


def _cascade(ctx, drafts, k_matrix=None, **options):
    from ..cascade import build_cascade_for_bench

    options = options if k_matrix is None else {"k_matrix": k_matrix, **options}
    options.setdefault("num_draft_tokens", None)  # the K matrix's budgets alone (the paper), unless a row asks for "auto"
    return _speculative(ctx, candidate_generator=build_cascade_for_bench(ctx.target, drafts, _bigram(ctx), **options))


register_method(Method("max-gram", _max_gram, description="Max-Gram (10 tokens) with the bigram fallback", cost_models=lambda e: {"max_gram": None}))
register_method(Method("cascade-1draft", lambda ctx: _cascade(ctx, [ctx.draft]), requires=("draft",),
                       description="CS drafting: plain draft + Max-Gram, default K matrix",
                       cost_models=lambda e: {"draft0": e["draft"], "max_gram": None}))
register_method(Method("cascade-2drafts", lambda ctx: _cascade(ctx, [ctx.draft, ctx.extras["small_draft"]]), requires=("draft", "small_draft"),
                       description="CS drafting: plain draft + smaller draft + Max-Gram",
                       cost_models=lambda e: {"draft0": e["draft"], "draft1": e["small_draft"], "max_gram": None}))

# Tuned for the embedded default on CPU by `python -m benchmarks.studies.k_sweep --drafts 1` on completion items 20..24,
# chosen by wall time against target-only (the paper ranks by SWI, whose cost model ignores that verifying more tokens
# costs more here). `--grid short` (cpu-k-sweep-short.json, MaG's 10 tokens): K = [[3, 0], [0, 4]] 1.12x; MaG's level-0
# call adds all its tokens to every verification, so `--grid mag --max-gram-tokens 2,3` (cpu-k-sweep-mag.json) shortened
# MaG: K = [[3, 0], [0, 1]] with 3 MaG tokens 1.41x (SWI 1.78) beside SD γ = 3 at 1.44x (SWI 1.66); best SWI
# [[2, 1], [0, 1]] / 3 tokens 1.83, 1.19x. SD's γ gets the same tuning as the cascade's K, so the comparison stays fair.
TUNED_GAMMA = GLIDE_GAMMA  # the cascade's SD baseline (the K below was tuned on the AMD VM beside γ = 3)
TUNED_K_1DRAFT = [[3, 0], [0, 1]]
TUNED_MAX_GRAM_TOKENS = 3
TUNED_K_2DRAFTS = [[3, 2, 10], [0, 1, 10], [0, 0, 10]]
register_method(Method("draft-model-tuned", lambda ctx: _speculative(ctx, candidate_generator=DraftModelCandidateGenerator(ctx.draft, TUNED_GAMMA)),
                       requires=("draft",), description=f"plain draft, γ={TUNED_GAMMA} (tuned)", cost_models=lambda e: {"draft": e["draft"]}))
register_method(Method("cascade-1draft-tuned", lambda ctx: _cascade(ctx, [ctx.draft], TUNED_K_1DRAFT, max_gram_tokens=TUNED_MAX_GRAM_TOKENS),
                       requires=("draft",), description=f"CS drafting: plain draft + Max-Gram ({TUNED_MAX_GRAM_TOKENS} tokens), K = {TUNED_K_1DRAFT} (tuned)",
                       cost_models=lambda e: {"draft0": e["draft"], "max_gram": None}))
register_method(Method("cascade-2drafts-tuned", lambda ctx: _cascade(ctx, [ctx.draft, ctx.extras["small_draft"]], TUNED_K_2DRAFTS),
                       requires=("draft", "small_draft"), description=f"CS drafting: two drafts + Max-Gram, K = {TUNED_K_2DRAFTS} (tuned)",
                       cost_models=lambda e: {"draft0": e["draft"], "draft1": e["small_draft"], "max_gram": None}))

# the default calls: γ, or the cascade's cap on what K proposes, chosen every step; fixed γ beside them
register_method(Method("draft-model-auto", lambda ctx: _speculative(ctx, draft_model=ctx.draft, copy_from_context=False), requires=("draft",),
                       description="speculative_generate(target, ids, draft_model=draft, copy_from_context=False): γ 'auto', no copying",
                       cost_models=lambda e: {"draft": e["draft"]}))
register_method(Method("draft-model+copy-auto", lambda ctx: _speculative(ctx, draft_model=ctx.draft, copy_from_context=2), requires=("draft",),
                       description="speculative_generate(target, ids, draft_model=draft): the default call with a GLIDE-family draft, γ "
                                   "'auto', copying from the context (the controller sizes each copy)",
                       cost_models=lambda e: {"draft": e["draft"]}))
for _gamma in (2, 3, 4, 5):
    register_method(Method(f"draft-model-γ{_gamma}", lambda ctx, g=_gamma: _speculative(ctx, candidate_generator=DraftModelCandidateGenerator(ctx.draft, g)),
                           requires=("draft",), description=f"speculative_generate with the plain draft, γ={_gamma} fixed",
                           cost_models=lambda e: {"draft": e["draft"]}))
register_method(Method("cascade-1draft-auto", lambda ctx: _cascade(ctx, [ctx.draft], num_draft_tokens="auto"), requires=("draft",),
                       description="CascadeCandidateGenerator([draft]): the default call, default K, the cap 'auto' (chosen every step)",
                       cost_models=lambda e: {"draft0": e["draft"], "max_gram": None}))


# --- CAPE over the plain draft (hf_specdraft.cape); GLIDE variants register with the GLIDE package ---------

def _with_expansion_sizes(ctx, generator):
    sequences, stats = _speculative(ctx, candidate_generator=generator)
    stats.extra["expansion_sizes"] = [list(map(int, sizes)) for sizes in generator.expansion_sizes]  # per step, per position
    if generator.expansion_seconds:  # CAPE's own share of the draft time (confidence / fixed modes)
        stats.extra["expansion_seconds"] = sum(generator.expansion_seconds)
    return sequences, stats


def _cape(ctx, mode):
    from ..cape import build_cape_for_bench

    chain = DraftModelCandidateGenerator(ctx.draft, num_draft_tokens=CAPE_GAMMA)
    return _with_expansion_sizes(ctx, build_cape_for_bench(chain, mode=mode, budget=CAPE_BUDGET))


for _mode, _label in (("confidence", "cape"), ("fixed", "fixed-k"), ("beam", "beam")):
    register_method(Method(f"draft-model+{_label}", lambda ctx, m=_mode: _cape(ctx, m), requires=("draft",),
                           description=f"plain draft γ={CAPE_GAMMA} with {_label} expansion (budget {CAPE_BUDGET}), one tree-verified forward",
                           cost_models=lambda e: {"draft": e["draft"]}))


# --- CASD (hf_specdraft.casd): the "context" task, drafts retrieved from the rest of the file ----------------

# CASD's draft-tree size for the default target on CPU, tuned by `python -m benchmarks.studies.tune_casd` on context items
# 8..13 (benchmarks/results/cpu-tune-casd.json): 8 nodes 1.09x, 4 nodes 1.09x, 16: 1.01x, REST's 64: 0.91x; a
# 64-node verification costs ~2.5x a one-token forward here. The library's CasdConfig keeps REST's 64.
CASD_MAX_NODES = 8


def _casd(ctx, **options):
    from ..casd import build_casd_for_bench

    options.setdefault("max_nodes", CASD_MAX_NODES)
    context_ids = torch.tensor(ctx.tokenizer(ctx.item.context, add_special_tokens=False).input_ids)
    generator, acceptance = build_casd_for_bench(ctx.target, context_ids, **options)
    return _speculative(ctx, candidate_generator=generator, acceptance=acceptance)


register_method(Method("casd-strict", lambda ctx: _casd(ctx, strict=True), tasks=("context",),
                       description=f"CASD, exact verification (lossless context lookup decoding), {CASD_MAX_NODES} draft nodes"))
for _nodes in (4, 16):  # the fixed tree sizes beside the tuned 8 and the auto row
    register_method(Method(f"casd-strict-{_nodes}", lambda ctx, n=_nodes: _casd(ctx, strict=True, max_nodes=n), tasks=("context",),
                           description=f"CASD, exact verification, {_nodes} draft nodes"))
register_method(Method("casd-strict+output", lambda ctx: _casd(ctx, strict=True, draft_from_output=True), tasks=("context",),
                       description=f"CASD strict, retrieving from the generated tokens too (not in the CASD paper), {CASD_MAX_NODES} draft nodes"))
register_method(Method("casd-conditional", lambda ctx: _casd(ctx, threshold=0.1), tasks=("context",), lossless=False,
                       description=f"CASD, conditional verification p > max(0.1, p(eos)) (eq. 3), {CASD_MAX_NODES} draft nodes"))
register_method(Method("casd-mixed", lambda ctx: _casd(ctx, threshold=0.1, top_k=5), tasks=("context",), lossless=False,
                       description=f"CASD, conditional + top-5 (eq. 4), {CASD_MAX_NODES} draft nodes"))


# --- GLIDE (hf_specdraft.glide): the default target's GLIDE and its vanilla twin, alone and with CAPE -----------

def _glide_chain(ctx, kind: str, gamma: int = GLIDE_GAMMA, copy: bool = False):
    """The ``kind`` drafter at a fixed γ: copying ``COPY_TOKENS`` tokens from the context at a match (``copy``), or never."""
    from ..glide import GlideCandidateGenerator

    copying = {"max_copy_tokens": COPY_TOKENS} if copy else NO_COPY
    return GlideCandidateGenerator(ctx.extras[kind], num_draft_tokens=gamma, **copying)


def _glide_cape(ctx, mode, gamma: int = CAPE_GAMMA, budget: int = CAPE_BUDGET, copy: bool = False):
    from ..cape import build_cape_for_bench

    return _with_expansion_sizes(ctx, build_cape_for_bench(_glide_chain(ctx, "glide", gamma, copy), mode=mode, budget=budget))


def _cape_default(ctx, copy: bool = True):
    from ..cape import CapeCandidateGenerator
    from ..glide import GlideCandidateGenerator

    return CapeCandidateGenerator(GlideCandidateGenerator(ctx.extras["glide"], **({} if copy else NO_COPY)))


def _stock_glide(ctx, kind: str):
    glide = ctx.extras[kind].attach(ctx.target)
    try:
        return _stock_generate(ctx, assistant_model=glide), None
    finally:
        glide.detach()


for _kind in ("glide", "vanilla"):
    register_method(Method(_kind, lambda ctx, k=_kind: _speculative(ctx, candidate_generator=_glide_chain(ctx, k)), requires=(_kind,),
                           description=f"speculative_generate with the default's {_kind} drafter, γ={GLIDE_GAMMA}, no copying",
                           cost_models=lambda e, k=_kind: {"draft": e[k]}))
    register_method(Method(f"{_kind}+copy", lambda ctx, k=_kind: _speculative(ctx, candidate_generator=_glide_chain(ctx, k, copy=True)),
                           requires=(_kind,), description=f"speculative_generate with the default's {_kind} drafter, γ={GLIDE_GAMMA}, copying "
                                                          f"{COPY_TOKENS} tokens from the context where its last 2 tokens recur",
                           cost_models=lambda e, k=_kind: {"draft": e[k]}))
    register_method(Method(f"stock-assisted-{_kind}", lambda ctx, k=_kind: _stock_glide(ctx, k), requires=(_kind,),
                           description=f"transformers assisted decoding with the {_kind} drafter (attach)"))
for _kind in ("glide", "vanilla"):  # the default call: speculative_generate(target, ids, draft_model=drafter), γ chosen every step
    register_method(Method(f"{_kind}+copy-auto", lambda ctx, k=_kind: _speculative(ctx, draft_model=ctx.extras[k]), requires=(_kind,),
                           description=f"speculative_generate(target, ids, draft_model={_kind}): the default call, γ 'auto' "
                                       "(chosen every step from measured costs), copying from the context where it recurs",
                           cost_models=lambda e, k=_kind: {"draft": e[k]}))
    register_method(Method(f"{_kind}-auto", lambda ctx, k=_kind: _speculative(ctx, draft_model=ctx.extras[k], copy_from_context=False),
                           requires=(_kind,), description=f"speculative_generate(target, ids, draft_model={_kind}, copy_from_context=False): "
                                                          "γ 'auto', no copying", cost_models=lambda e, k=_kind: {"draft": e[k]}))
register_method(Method("casd-strict-auto", lambda ctx: _casd(ctx, strict=True, max_nodes="auto"), tasks=("context",),
                       description="CasdCandidateGenerator(context): the default call, exact verification, tree depth and size 'auto'"))
register_method(Method("max-gram-auto", _max_gram_auto, description="Max-Gram with the bigram fallback, γ 'auto' (1-10, chosen every step)",
                       cost_models=lambda e: {"max_gram": None}))
register_method(Method("glide+copy+cape-auto", lambda ctx: _with_expansion_sizes(ctx, _cape_default(ctx)), requires=("glide",),
                       description="CapeCandidateGenerator(GlideCandidateGenerator(glide)): the default call, γ and budget 'auto', "
                                   "copying from the context where it recurs", cost_models=lambda e: {"draft": e["glide"]}))
register_method(Method("glide+cape-auto", lambda ctx: _with_expansion_sizes(ctx, _cape_default(ctx, copy=False)), requires=("glide",),
                       description="CapeCandidateGenerator(GlideCandidateGenerator(glide, copy_from_context=0)): γ and budget 'auto', no copying",
                       cost_models=lambda e: {"draft": e["glide"]}))
register_method(Method("glide+copy+cape", lambda ctx: _glide_cape(ctx, "confidence", copy=True), requires=("glide",),
                       description=f"GLIDE γ={CAPE_GAMMA} with cape expansion (budget {CAPE_BUDGET}), copying {COPY_TOKENS} tokens from the "
                                   "context where its last 2 tokens recur", cost_models=lambda e: {"draft": e["glide"]}))
for _kind in ("glide", "vanilla"):
    for _gamma in (2, 3, 4, 5):  # fixed γ beside auto, for comparison
        register_method(Method(f"{_kind}-γ{_gamma}", lambda ctx, k=_kind, g=_gamma: _speculative(ctx, candidate_generator=_glide_chain(ctx, k, g)),
                               requires=(_kind,), description=f"speculative_generate with the default's {_kind} drafter, γ={_gamma} fixed, no copying",
                               cost_models=lambda e, k=_kind: {"draft": e[k]}))
        register_method(Method(f"{_kind}+copy-γ{_gamma}",
                               lambda ctx, k=_kind, g=_gamma: _speculative(ctx, candidate_generator=_glide_chain(ctx, k, g, copy=True)),
                               requires=(_kind,), description=f"speculative_generate with the default's {_kind} drafter, γ={_gamma} fixed, "
                                                              f"copying {COPY_TOKENS} tokens from the context where its last 2 tokens recur",
                               cost_models=lambda e, k=_kind: {"draft": e[k]}))
for _gamma, _budget in ((1, 2), (2, 4), (3, 6)):  # CAPE's fixed (γ, budget) grid beside glide+cape's (2, 3) and the auto row
    register_method(Method(f"glide+cape-γ{_gamma}b{_budget}", lambda ctx, g=_gamma, b=_budget: _glide_cape(ctx, "confidence", g, b),
                           requires=("glide",), description=f"GLIDE γ={_gamma} with cape expansion (budget {_budget}), no copying",
                           cost_models=lambda e: {"draft": e["glide"]}))
for _mode, _label in (("confidence", "cape"), ("fixed", "fixed-k"), ("beam", "beam")):
    register_method(Method(f"glide+{_label}", lambda ctx, m=_mode: _glide_cape(ctx, m), requires=("glide",),
                           description=f"GLIDE γ={CAPE_GAMMA} with {_label} expansion (budget {CAPE_BUDGET}), no copying",
                           cost_models=lambda e: {"draft": e["glide"]}))


# --- the static cache and compiled forwards (docs/static-cache.md) ------------------------------------------------------
# "<method>-static": cache_implementation="static", compiled where transformers compiles (CUDA), eager elsewhere;
# "<method>-compiled": the same with compile_config=CompileConfig() given, so it compiles on any device (CPU included).
# target-only-static is transformers' own static-cache decoding: the baseline a GPU user has (compiled automatically).
STATIC_BASELINE, COMPILED_BASELINE = "target-only-static", "target-only-compiled"
STATIC_METHODS = ("glide+copy-auto", "vanilla+copy-auto", "glide+copy+cape-auto", "max-gram-auto", "casd-strict-auto", "draft-model-auto",
                  "cascade-1draft-auto")


def compile_everywhere() -> "CompileConfig":
    """transformers' default ``CompileConfig`` (``reduce-overhead``: CUDA graphs on a GPU), allowed on every device."""
    from transformers import CompileConfig

    config = CompileConfig()
    config._compile_all_devices = True  # what transformers' own generate reads to compile outside CUDA
    return config


def _variant(run, compiled: bool):
    def wrapped(ctx):
        overrides = {"cache_implementation": "static", **({"compile_config": compile_everywhere()} if compiled else {})}
        return run(dataclasses.replace(ctx, overrides={**ctx.overrides, **overrides}))
    return wrapped


register_method(Method(STATIC_BASELINE, _variant(_target_only, False),
                       description="target.generate(cache_implementation='static'): transformers compiles it on CUDA"))
register_method(Method(COMPILED_BASELINE, _variant(_target_only, True),
                       description="target.generate(cache_implementation='static', compile_config=CompileConfig()) on any device"))
for _name in STATIC_METHODS:
    _method = METHODS[_name]
    for _suffix, _compiled in (("static", False), ("compiled", True)):
        register_method(dataclasses.replace(
            _method, name=f"{_name}-{_suffix}", run=_variant(_method.run, _compiled),
            description=f"{_method.description}; cache_implementation='static'" + (", compile_config=CompileConfig()" if _compiled else "")))
