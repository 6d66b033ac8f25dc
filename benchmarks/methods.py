"""The lab's bench rows: fixed γ, tree sizes and K matrices beside the library's "auto" rows, those rows compiled on any
device (``-compiled``), and the settings tuned on the machines that measured them. Importing this module registers
them in :data:`hf_specdraft.bench.METHODS`; the package registers only what ``hf-specdraft bench`` and ``hf-specdraft
demo`` run by default (baselines and the default calls, eager and ``-static``). Run a grid from the repository root
with these rows registered::

    python -m benchmarks.bench --task completion --methods target-only,glide,glide-γ3,glide-auto,max-gram

A method that copies from the context (GLIDE's ``copy_from_context``) says so in its name: ``glide+copy``,
``draft-model+copy``, … ; every other GLIDE-family row passes ``copy_from_context=0``, so ``glide`` against ``vanilla``
compares the drafters alone (GLIDE against its twin). A fixed-γ copying row copies ``COPY_TOKENS`` tokens at a match
(``max_copy_tokens``), its model drafts γ.
"""

from __future__ import annotations

import dataclasses

from transformers import CompileConfig

from hf_specdraft.bench.methods import (
    METHODS,
    NO_COPY,
    STATIC_METHODS,
    Method,
    cascade_run,
    casd_run,
    prompt_lookup,
    register_method,
    speculative_run,
    stock_assisted,
    stock_generate,
    with_expansion_sizes,
    with_linears,
)
from hf_specdraft.cascade.max_gram import MAX_GRAM_TOKENS
from hf_specdraft.core.drafting import DraftModelCandidateGenerator, TreeCandidateGenerator
from hf_specdraft.core.tree import DraftTree

from . import swi  # noqa: F401  (adds SWI, c and E(speedup) to every bench summary)

COPY_TOKENS = (
    6  # a fixed-γ "+copy" row's copies (max_copy_tokens): a match that long tends to continue for several tokens
)

# Drafts' γ and CAPE's (γ, verification budget) for the default target on CPU, tuned by
# `python -m benchmarks.studies.tune_glide` on completion items 20..25 (benchmarks/results/cpu-tune-glide.json); the
# bench measures them on items 0..N-1. The best γ follows the CPU's verification cost curve
# (hf_specdraft/core/projection.py, benchmarks/studies/projection.py), so it is tuned on the machine running the bench.
# On the 2-core AMD EPYC VM of 2026-11-25 (one-row linears computed as two rows, a forward
# over 2 tokens 0.9x a one-token forward, over 3-4 tokens 1.2x): GLIDE γ = 1 (1.98x; γ = 2: 1.80x, γ = 3: 1.81x,
# γ = 5: 1.47x), CAPE γ = 2 with a 3-token budget (1.95x; γ = 2 / budget 2: 1.74x, γ = 1 / budget 3: 1.79x). On the
# 2-core AVX-512 Xeon VM of the same day (2-3 tokens 1.0-1.1x, 4 tokens 1.5x): GLIDE γ = 2 (1.29x; γ = 1: 1.22x, γ = 3:
# 1.01x) and CAPE γ = 1 / budget 2 (1.26x). The paper's γ = 5 / 32 tokens assume a GPU's flat cost.
GLIDE_GAMMA = 1
CAPE_GAMMA, CAPE_BUDGET = 2, 3
# The plain draft (the vanilla twin) drafts with the same γ and CAPE settings.

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

# CASD's draft-tree size for the default target on CPU, tuned by `python -m benchmarks.studies.tune_casd` on context
# items 8..13 (benchmarks/results/cpu-tune-casd.json): 8 nodes 1.09x, 4 nodes 1.09x, 16: 1.01x, REST's 64: 0.91x; a
# 64-node verification costs ~2.5x a one-token forward here. The library's CasdConfig keeps REST's 64.
CASD_MAX_NODES = 8


# --- more baselines: the loop proposing nothing, stock assisted decoding with the few-row linears or GLIDE attached


class NullCandidateGenerator(TreeCandidateGenerator):
    """Proposes nothing: every step is one plain target forward. Measures the loop's own overhead."""

    reads_target_cache = False  # never reads the target's cache

    def propose(self, input_ids, target_cache=None) -> DraftTree:
        return DraftTree.empty(input_ids.device)


def _stock_glide(ctx, kind: str):
    glide = ctx.extras[kind].attach(ctx.target)
    try:
        return stock_generate(ctx, assistant_model=glide), None
    finally:
        glide.detach()


register_method(
    Method(
        "null-drafter",
        lambda ctx: speculative_run(ctx, candidate_generator=NullCandidateGenerator()),
        description="speculative_generate proposing nothing (loop overhead)",
    )
)
register_method(
    Method(
        "stock-assisted+linears",
        with_linears(stock_assisted),
        requires=("draft",),
        description="transformers assisted decoding with the plain draft, inside few_token_linears",
    )
)
register_method(
    Method(
        "prompt-lookup+linears",
        with_linears(prompt_lookup),
        description="transformers prompt lookup decoding (prompt_lookup_num_tokens=10), inside few_token_linears",
    )
)
for _kind in ("glide", "vanilla"):
    register_method(
        Method(
            f"stock-assisted-{_kind}",
            lambda ctx, k=_kind: _stock_glide(ctx, k),
            requires=(_kind,),
            description=f"transformers assisted decoding with the {_kind} drafter (attach)",
        )
    )


# --- the plain draft at a fixed γ, alone, copying and under CAPE ------------------------------------------------------

register_method(
    Method(
        "draft-model",
        lambda ctx: speculative_run(ctx, draft_model=ctx.draft, num_draft_tokens=GLIDE_GAMMA, copy_from_context=False),
        requires=("draft",),
        description=f"speculative_generate with the plain draft, γ={GLIDE_GAMMA}, no copying",
    )
)
register_method(
    Method(
        "draft-model+copy",
        lambda ctx: speculative_run(
            ctx, draft_model=ctx.draft, num_draft_tokens=GLIDE_GAMMA, copy_from_context=2, max_copy_tokens=COPY_TOKENS
        ),
        requires=("draft",),
        description=f"speculative_generate with the plain draft (GLIDE-family), γ={GLIDE_GAMMA}, copying "
        f"{COPY_TOKENS} tokens from the context where its last 2 tokens recur",
    )
)
register_method(
    Method(
        "draft-model-tuned",
        lambda ctx: speculative_run(ctx, candidate_generator=DraftModelCandidateGenerator(ctx.draft, TUNED_GAMMA)),
        requires=("draft",),
        description=f"plain draft, γ={TUNED_GAMMA} (tuned)",
    )
)
for _gamma in (2, 3, 4, 5):
    register_method(
        Method(
            f"draft-model-γ{_gamma}",
            lambda ctx, g=_gamma: speculative_run(ctx, candidate_generator=DraftModelCandidateGenerator(ctx.draft, g)),
            requires=("draft",),
            description=f"speculative_generate with the plain draft, γ={_gamma} fixed",
        )
    )


def _cape(ctx, mode):
    from hf_specdraft.cape import build_cape_for_bench

    chain = DraftModelCandidateGenerator(ctx.draft, num_draft_tokens=CAPE_GAMMA)
    return with_expansion_sizes(ctx, build_cape_for_bench(chain, mode=mode, budget=CAPE_BUDGET))


for _mode, _label in (("confidence", "cape"), ("fixed", "fixed-k"), ("beam", "beam")):
    register_method(
        Method(
            f"draft-model+{_label}",
            lambda ctx, m=_mode: _cape(ctx, m),
            requires=("draft",),
            description=f"plain draft γ={CAPE_GAMMA} with {_label} expansion (budget {CAPE_BUDGET}), "
            "one tree-verified forward",
        )
    )


# --- cascade speculative drafting: the paper's default K and the tuned ones -------------------------------------------


def _max_gram(ctx):
    from hf_specdraft.cascade import build_max_gram_for_bench

    table = ctx.extras.get("bigram_table")
    return speculative_run(
        ctx, candidate_generator=build_max_gram_for_bench(ctx.target, table, num_draft_tokens=MAX_GRAM_TOKENS)
    )


register_method(
    Method(
        "max-gram",
        _max_gram,
        description=f"Max-Gram ({MAX_GRAM_TOKENS} tokens) with the bigram fallback",
    )
)
register_method(
    Method(
        "cascade-1draft",
        lambda ctx: cascade_run(ctx, [ctx.draft]),
        requires=("draft",),
        description="CS drafting: plain draft + Max-Gram, default K matrix",
    )
)
register_method(
    Method(
        "cascade-2drafts",
        lambda ctx: cascade_run(ctx, [ctx.draft, ctx.extras["small_draft"]]),
        requires=("draft", "small_draft"),
        description="CS drafting: plain draft + smaller draft + Max-Gram",
    )
)
register_method(
    Method(
        "cascade-1draft-tuned",
        lambda ctx: cascade_run(ctx, [ctx.draft], TUNED_K_1DRAFT, max_gram_tokens=TUNED_MAX_GRAM_TOKENS),
        requires=("draft",),
        description=f"CS drafting: plain draft + Max-Gram ({TUNED_MAX_GRAM_TOKENS} tokens), "
        f"K = {TUNED_K_1DRAFT} (tuned)",
    )
)
register_method(
    Method(
        "cascade-2drafts-tuned",
        lambda ctx: cascade_run(ctx, [ctx.draft, ctx.extras["small_draft"]], TUNED_K_2DRAFTS),
        requires=("draft", "small_draft"),
        description=f"CS drafting: two drafts + Max-Gram, K = {TUNED_K_2DRAFTS} (tuned)",
    )
)


# --- CASD: the tuned tree size, fixed sizes beside it, and the lossy rules --------------------------------------------


def _casd(ctx, **options):
    return casd_run(ctx, **{"max_nodes": CASD_MAX_NODES, **options})


register_method(
    Method(
        "casd-strict",
        lambda ctx: _casd(ctx, strict=True),
        tasks=("context",),
        description=f"CASD, exact verification (lossless context lookup decoding), {CASD_MAX_NODES} draft nodes",
    )
)
for _nodes in (4, 16):  # the fixed tree sizes beside the tuned 8 and the auto row
    register_method(
        Method(
            f"casd-strict-{_nodes}",
            lambda ctx, n=_nodes: _casd(ctx, strict=True, max_nodes=n),
            tasks=("context",),
            description=f"CASD, exact verification, {_nodes} draft nodes",
        )
    )
register_method(
    Method(
        "casd-strict+output",
        lambda ctx: _casd(ctx, strict=True, draft_from_output=True),
        tasks=("context",),
        description="CASD strict, retrieving from the generated tokens too (not in the CASD paper), "
        f"{CASD_MAX_NODES} draft nodes",
    )
)
register_method(
    Method(
        "casd-conditional",
        lambda ctx: _casd(ctx, threshold=0.1),
        tasks=("context",),
        description=f"CASD, conditional verification p > max(0.1, p(eos)) (eq. 3), {CASD_MAX_NODES} draft nodes",
    )
)
register_method(
    Method(
        "casd-mixed",
        lambda ctx: _casd(ctx, threshold=0.1, top_k=5),
        tasks=("context",),
        description=f"CASD, conditional + top-5 (eq. 4), {CASD_MAX_NODES} draft nodes",
    )
)


# --- GLIDE and its vanilla twin at a fixed γ, alone and with CAPE -----------------------------------------------------


def glide_chain(ctx, kind: str, gamma: int = GLIDE_GAMMA, copy: bool = False):
    """The ``kind`` drafter at a fixed γ, copying ``COPY_TOKENS`` context tokens at a match (``copy``) or never."""
    from hf_specdraft.glide import GlideCandidateGenerator

    copying = {"max_copy_tokens": COPY_TOKENS} if copy else NO_COPY
    return GlideCandidateGenerator(ctx.extras[kind], num_draft_tokens=gamma, **copying)


def glide_cape(ctx, mode, gamma: int = CAPE_GAMMA, budget: int = CAPE_BUDGET, copy: bool = False):
    """GLIDE (``glide_chain``) under CAPE's ``mode`` expansion with a verification ``budget``."""
    from hf_specdraft.cape import build_cape_for_bench

    return with_expansion_sizes(
        ctx, build_cape_for_bench(glide_chain(ctx, "glide", gamma, copy), mode=mode, budget=budget)
    )


def _register_glide_rows(kind: str) -> None:
    register_method(
        Method(
            kind,
            lambda ctx: speculative_run(ctx, candidate_generator=glide_chain(ctx, kind)),
            requires=(kind,),
            description=f"speculative_generate with the default's {kind} drafter, γ={GLIDE_GAMMA}, no copying",
        )
    )
    register_method(
        Method(
            f"{kind}+copy",
            lambda ctx: speculative_run(ctx, candidate_generator=glide_chain(ctx, kind, copy=True)),
            requires=(kind,),
            description=f"speculative_generate with the default's {kind} drafter, γ={GLIDE_GAMMA}, copying "
            f"{COPY_TOKENS} tokens from the context where its last 2 tokens recur",
        )
    )
    for gamma in (2, 3, 4, 5):  # fixed γ beside auto, for comparison
        register_method(
            Method(
                f"{kind}-γ{gamma}",
                lambda ctx, g=gamma: speculative_run(ctx, candidate_generator=glide_chain(ctx, kind, g)),
                requires=(kind,),
                description=f"speculative_generate with the default's {kind} drafter, γ={gamma} fixed, no copying",
            )
        )
        register_method(
            Method(
                f"{kind}+copy-γ{gamma}",
                lambda ctx, g=gamma: speculative_run(ctx, candidate_generator=glide_chain(ctx, kind, g, copy=True)),
                requires=(kind,),
                description=f"speculative_generate with the default's {kind} drafter, γ={gamma} fixed, "
                f"copying {COPY_TOKENS} tokens from the context where its last 2 tokens recur",
            )
        )


for _kind in ("glide", "vanilla"):
    _register_glide_rows(_kind)
register_method(
    Method(
        "glide+copy+cape",
        lambda ctx: glide_cape(ctx, "confidence", copy=True),
        requires=("glide",),
        description=f"GLIDE γ={CAPE_GAMMA} with cape expansion (budget {CAPE_BUDGET}), copying {COPY_TOKENS} tokens "
        "from the context where its last 2 tokens recur",
    )
)
for _gamma, _budget in (
    (1, 2),
    (2, 4),
    (3, 6),
):  # CAPE's fixed (γ, budget) grid beside glide+cape's (2, 3) and the auto row
    register_method(
        Method(
            f"glide+cape-γ{_gamma}b{_budget}",
            lambda ctx, g=_gamma, b=_budget: glide_cape(ctx, "confidence", g, b),
            requires=("glide",),
            description=f"GLIDE γ={_gamma} with cape expansion (budget {_budget}), no copying",
        )
    )
for _mode, _label in (("confidence", "cape"), ("fixed", "fixed-k"), ("beam", "beam")):
    register_method(
        Method(
            f"glide+{_label}",
            lambda ctx, m=_mode: glide_cape(ctx, m),
            requires=("glide",),
            description=f"GLIDE γ={CAPE_GAMMA} with {_label} expansion (budget {CAPE_BUDGET}), no copying",
        )
    )
# the default call as it copied before one-token matches were weighed: copies after a 2-token match only
register_method(
    Method(
        "glide+copy2-auto",
        lambda ctx: speculative_run(ctx, draft_model=ctx.extras["glide"], copy_from_context=2),
        requires=("glide",),
        description="speculative_generate(target, ids, draft_model=glide, copy_from_context=2): γ 'auto', copying "
        "after a 2-token match",
    )
)

# the default call with its GLIDE's copy table switched off: copying from the request's own text only
register_method(
    Method(
        "glide+copy-no-table-auto",
        lambda ctx: speculative_run(ctx, candidate_generator=_glide_without_table(ctx)),
        requires=("glide",),
        description="GlideCandidateGenerator(glide, copy_from_table=False): the default call without its copy table",
    )
)


def _glide_without_table(ctx):
    from hf_specdraft.glide import GlideCandidateGenerator

    return GlideCandidateGenerator(ctx.extras["glide"], copy_from_table=False)


# --- the default calls compiled on any device (docs/static-cache.md) --------------------------------------------------
# "<method>-compiled": "<method>-static" with compile_config=CompileConfig() given, so it compiles on a CPU too;
# target-only-compiled is transformers' own static-cache decoding, compiled the same way.


def compile_everywhere() -> CompileConfig:
    """transformers' default ``CompileConfig`` (``reduce-overhead``: CUDA graphs on a GPU), allowed on every device."""
    config = CompileConfig()
    config._compile_all_devices = True  # what transformers' own generate reads to compile outside CUDA
    return config


def compiled_variant(method: Method, description: str = "") -> Method:
    """Register ``<method>-compiled``: ``<method>-static`` with ``compile_config=compile_everywhere()``, made per call
    (a test swaps in dynamo's eager backend); its description is ``description``, else the static row's and the
    config."""
    static = METHODS[f"{method.name}-static"]

    def run(ctx):
        return static.run(dataclasses.replace(ctx, overrides={**ctx.overrides, "compile_config": compile_everywhere()}))

    description = description or f"{static.description}, compile_config=CompileConfig()"
    return register_method(
        dataclasses.replace(method, name=f"{method.name}-compiled", run=run, description=description)
    )


compiled_variant(
    METHODS["target-only"],
    "target.generate(cache_implementation='static', compile_config=CompileConfig()) on any device",
)
for _name in STATIC_METHODS:
    compiled_variant(METHODS[_name])

__all__ = [
    "CAPE_BUDGET",
    "CAPE_GAMMA",
    "CASD_MAX_NODES",
    "COPY_TOKENS",
    "GLIDE_GAMMA",
    "METHODS",
    "TUNED_GAMMA",
    "TUNED_K_1DRAFT",
    "TUNED_K_2DRAFTS",
    "TUNED_MAX_GRAM_TOKENS",
    "glide_cape",
    "glide_chain",
]
