"""The methods the bench harness and the demo put side by side, registered by name (:func:`register_method`): the
baselines (stock ``generate``, with the few-row linears, prompt lookup, assisted decoding) and the library's default
calls (the ``*-auto`` rows), each also on the static cache. Rows at a fixed γ, tree size or K matrix, and compiled
on any device, are the lab's (``benchmarks/methods.py``), registered the same way.

A method is a function ``run(ctx) -> (sequences (1, L+n), SpeculativeStats | None)``. Only a row named ``+copy`` copies
from the context; every other GLIDE-family row passes :data:`NO_COPY`, so ``glide-auto`` against ``vanilla-auto``
compares the drafters alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..cape import CapeCandidateGenerator
from ..cascade import build_cascade_for_bench, build_max_gram_for_bench
from ..casd import build_casd_for_bench
from ..core.loop import speculative_generate
from ..core.projection import few_token_linears
from ..core.stats import SpeculativeStats
from ..defaults.tasks import TaskItem
from ..glide import GlideCandidateGenerator

NO_COPY = {"copy_from_context": 0}  # every GLIDE-family row whose name does not say "+copy"


@dataclass
class BenchContext:
    target: PreTrainedModel
    draft: PreTrainedModel | None
    tokenizer: PreTrainedTokenizerBase
    item: TaskItem
    prompt_ids: torch.Tensor  # (1, L)
    max_new_tokens: int
    extras: dict = field(default_factory=dict)  # trained drafters, tables, … keyed by name
    overrides: dict = field(default_factory=dict)  # more generate arguments (a static-cache / compiled variant)

    def generate_kwargs(self) -> dict:
        return {
            "max_new_tokens": self.max_new_tokens,
            "do_sample": False,
            "eos_token_id": self.tokenizer.eos_token_id,
            "pad_token_id": self.tokenizer.pad_token_id,
            **self.overrides,
        }


@dataclass(frozen=True)
class Method:
    name: str
    run: Callable[[BenchContext], tuple[torch.Tensor, SpeculativeStats | None]]
    tasks: tuple[str, ...] = ("completion", "context", "chat")
    requires: tuple[str, ...] = ()  # names in ctx.extras (or "draft") that must be present
    description: str = ""

    def available(self, ctx_extras: dict, has_draft: bool) -> bool:
        return all((name == "draft" and has_draft) or name in ctx_extras for name in self.requires)


METHODS: dict[str, Method] = {}


def register_method(method: Method) -> Method:
    if method.name in METHODS:
        raise ValueError(f"a bench method named {method.name!r} is already registered")
    METHODS[method.name] = method
    return method


def _row(name: str, run, description: str, **options) -> Method:
    return register_method(Method(name, run, description=description, **options))


def _target_only(ctx):
    return ctx.target.generate(ctx.prompt_ids, **ctx.generate_kwargs()), None


def stock_generate(ctx, **kwargs) -> torch.Tensor:
    """``target.generate`` with transformers' own warnings held back: assisted decoding's internal call to the
    assistant's ``generate`` warns of a deprecation that is nothing the user passed, mid-table."""
    from transformers.utils import logging

    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        return ctx.target.generate(ctx.prompt_ids, **kwargs, **ctx.generate_kwargs())
    finally:
        logging.set_verbosity(verbosity)


def stock_assisted(ctx):
    return stock_generate(ctx, assistant_model=ctx.draft), None


def prompt_lookup(ctx):
    return ctx.target.generate(ctx.prompt_ids, prompt_lookup_num_tokens=10, **ctx.generate_kwargs()), None


def speculative_run(ctx: BenchContext, **kwargs) -> tuple[torch.Tensor, SpeculativeStats]:
    """``speculative_generate`` on the context's prompt with ``kwargs``: the sequences and the call's statistics."""
    out = speculative_generate(
        ctx.target, ctx.prompt_ids, return_dict_in_generate=True, **kwargs, **ctx.generate_kwargs()
    )
    return out.sequences, out.speculative_stats


def with_linears(run):
    """``run`` inside :func:`~hf_specdraft.core.projection.few_token_linears` (the orientation this CPU's BLAS runs
    fastest, as our loop uses it), so stock rows compare loops, not matrix kernels."""

    def wrapped(ctx):
        with few_token_linears(ctx.target):
            return run(ctx)

    return wrapped


# the stock baseline as a user gets it with `with few_token_linears(target): target.generate(...)`: on the AMD VM a
# one-token fp32 linear ran on one core, and this made plain greedy decoding 1.5x faster (core/projection.py)
FAST_BASELINE = "target-only+linears"
_row("target-only", _target_only, "target.generate(do_sample=False)")
_row(FAST_BASELINE, with_linears(_target_only), "target.generate(do_sample=False) inside few_token_linears")
_row("stock-assisted", stock_assisted, "transformers assisted decoding with the plain draft", requires=("draft",))
_row("prompt-lookup", prompt_lookup, "transformers prompt lookup decoding (prompt_lookup_num_tokens=10)")


# --- the default calls: γ, a tree's budget or the cascade's cap on what K proposes, chosen every step -----------------


def with_expansion_sizes(ctx: BenchContext, generator) -> tuple[torch.Tensor, SpeculativeStats]:
    """:func:`speculative_run` with a CAPE-style ``generator``, recording its expansion-set sizes (per step, per
    position) and its own share of the draft time in ``stats.extra``."""
    sequences, stats = speculative_run(ctx, candidate_generator=generator)
    stats.extra["expansion_sizes"] = [list(map(int, sizes)) for sizes in generator.expansion_sizes]
    if generator.expansion_seconds:  # confidence / fixed modes
        stats.extra["expansion_seconds"] = sum(generator.expansion_seconds)
    return sequences, stats


def cascade_run(ctx: BenchContext, drafts: list, k_matrix: list[list[int]] | None = None, **options):
    """Cascade speculative drafting over ``drafts`` and Max-Gram (with the run's bigram table, if any): the K matrix's
    budgets alone (the paper), unless ``options`` ask for ``num_draft_tokens="auto"``."""
    options = options if k_matrix is None else {"k_matrix": k_matrix, **options}
    options.setdefault("num_draft_tokens", None)
    table = ctx.extras.get("bigram_table")
    return speculative_run(ctx, candidate_generator=build_cascade_for_bench(ctx.target, drafts, table, **options))


def casd_run(ctx: BenchContext, **options):
    """CASD drafting from the task item's context, with its acceptance rule; ``options`` go to
    :class:`~hf_specdraft.casd.CasdConfig`."""
    context_ids = torch.tensor(ctx.tokenizer(ctx.item.context, add_special_tokens=False).input_ids)
    generator, acceptance = build_casd_for_bench(ctx.target, context_ids, **options)
    return speculative_run(ctx, candidate_generator=generator, acceptance=acceptance)


def _cape_auto(ctx, copy: bool = True):
    generator = CapeCandidateGenerator(GlideCandidateGenerator(ctx.extras["glide"], **({} if copy else NO_COPY)))
    return with_expansion_sizes(ctx, generator)


_row(
    "draft-model-auto",
    lambda ctx: speculative_run(ctx, draft_model=ctx.draft, copy_from_context=False),
    "speculative_generate(target, ids, draft_model=draft, copy_from_context=False): γ 'auto', no copying",
    requires=("draft",),
)
_row(
    "draft-model+copy-auto",
    lambda ctx: speculative_run(ctx, draft_model=ctx.draft, copy_from_context=2),
    "speculative_generate(target, ids, draft_model=draft): the default call with a GLIDE-family draft, γ 'auto', "
    "copying from the context (the controller sizes each copy)",
    requires=("draft",),
)
_row(
    "cascade-1draft-auto",
    lambda ctx: cascade_run(ctx, [ctx.draft], num_draft_tokens="auto"),
    "CascadeCandidateGenerator([draft]): the default call, default K, the cap 'auto' (chosen every step)",
    requires=("draft",),
)
for _kind in ("glide", "vanilla"):
    _row(
        f"{_kind}+copy-auto",
        lambda ctx, k=_kind: speculative_run(ctx, draft_model=ctx.extras[k]),
        f"speculative_generate(target, ids, draft_model={_kind}): the default call, γ 'auto' (chosen every step from "
        "measured costs), copying from the context where it recurs",
        requires=(_kind,),
    )
    _row(
        f"{_kind}-auto",
        lambda ctx, k=_kind: speculative_run(ctx, draft_model=ctx.extras[k], copy_from_context=False),
        f"speculative_generate(target, ids, draft_model={_kind}, copy_from_context=False): γ 'auto', no copying",
        requires=(_kind,),
    )
_row(
    "casd-strict-auto",
    lambda ctx: casd_run(ctx, strict=True, max_nodes="auto"),
    "CasdCandidateGenerator(context): the default call, exact verification, tree depth and size 'auto'",
    tasks=("context",),
)
_row(
    "max-gram-auto",
    lambda ctx: speculative_run(
        ctx, candidate_generator=build_max_gram_for_bench(ctx.target, ctx.extras.get("bigram_table"))
    ),
    "Max-Gram with the bigram fallback, γ 'auto' (1-10, chosen every step)",
)
_row(
    "glide+copy+cape-auto",
    _cape_auto,
    "CapeCandidateGenerator(GlideCandidateGenerator(glide)): the default call, γ and budget 'auto', copying from the "
    "context where it recurs",
    requires=("glide",),
)
_row(
    "glide+cape-auto",
    lambda ctx: _cape_auto(ctx, copy=False),
    "CapeCandidateGenerator(GlideCandidateGenerator(glide, copy_from_context=0)): γ and budget 'auto', no copying",
    requires=("glide",),
)


# --- the static cache (docs/static-cache.md) --------------------------------------------------------------------------
# "<method>-static": cache_implementation="static", compiled where transformers compiles (CUDA), eager elsewhere;
# target-only-static is transformers' own static-cache decoding: the baseline a GPU user has (compiled automatically).
# The lab adds "<method>-compiled" rows, compiled on any device (benchmarks/methods.py).
STATIC_METHODS = (
    "glide+copy-auto",
    "vanilla+copy-auto",
    "glide+copy+cape-auto",
    "max-gram-auto",
    "casd-strict-auto",
    "draft-model-auto",
    "cascade-1draft-auto",
)


def static_variant(method: Method, description: str = "") -> Method:
    """Register ``<method>-static``: ``method`` with ``cache_implementation="static"`` added to its generate
    arguments; its description is ``description``, else ``method``'s with the cache named."""

    def run(ctx):
        return method.run(dataclasses.replace(ctx, overrides={**ctx.overrides, "cache_implementation": "static"}))

    description = description or f"{method.description}; cache_implementation='static'"
    return register_method(dataclasses.replace(method, name=f"{method.name}-static", run=run, description=description))


static_variant(
    METHODS["target-only"], "target.generate(cache_implementation='static'): transformers compiles it on CUDA"
)
for _name in STATIC_METHODS:
    static_variant(METHODS[_name])
