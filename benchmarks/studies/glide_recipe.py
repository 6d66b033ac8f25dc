"""What GLIDE's recipe may be missing: the block-wise mask's L, a second layer and a wider MLP, each
trained on the gap curve's data and weighed at every cache delay and in modeled tokens per second.

    python -m benchmarks.studies.glide_recipe --work gap-work                # train and score (resumable)
    python -m benchmarks.studies.glide_recipe --work gap-work --costs        # then, on an idle machine: time the drafts

Every run is :mod:`~benchmarks.studies.glide_gap_curve`'s largest size at 2 epochs (1,280 windows of 256 tokens,
320 steps of 8 windows, the same draws for every run), with one change to the shipped recipe (``--variants``, in
:func:`~benchmarks.studies.glide_gap_curve.variant_recipe`'s syntax). The L variants change GLIDE alone: its twin
is the plain run's. ``layers2`` (two draft layers, both reading the target's top layer: the store holds that layer
alone, and reading layers 25, 20 or 14 instead moved α by under a point in ``cpu-glide-glimpse.json``) and
``mlp3072`` change both drafters.

Scored teacher-forced on the curve's 64 held-out code windows: α = 1 - TV(p, q) and greedy agreement at cache delays
1..6. In a chain step the k-th drafted token glimpses the cache with delay k (Du et al. 2024, §4.1), so a step of γ
drafted tokens is expected to accept ``E_γ = Σ_k Π_{j<=k} a_j`` of them under greedy verification, ``a_j`` the
agreement at delay ``j`` (each position treated as independent: a proxy, not the loop). ``--costs`` times one
drafted token of each drafter (bfloat16, as the loop drafts on CPU, on a 256-token cache glimpsing 256 target
positions) and the target's forward over ``n`` tokens (float32 with the loop's few-token linears, on the same cache),
and models greedy speed against target-only decoding with the same linears as
``(1 + E_γ) · c_target(1) / (γ · c_draft + c_target(γ + 1))`` at the best γ.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from hf_specdraft.core.support import with_cache

from .glide_gap_curve import TOP_LAYER, heldout_store, run_name, train_one
from .glide_glimpse import score

SIZE = 1280
VARIANTS = ("x2", "x2-block1", "x2-block3", "x2-layers2", "x2-mlp3072")
DELAYS = (1, 2, 3, 4, 5, 6)
MAX_GAMMA = 8


def expected_accepted(agreement: list[float], gamma: int) -> float:
    """``E_γ = Σ_{k=1..γ} Π_{j<=k} a_j``: drafted tokens a greedy chain step of γ accepts, ``a_j`` = agreement at
    delay j (the last value repeats past the list)."""
    total, reach = 0.0, 1.0
    for k in range(gamma):
        reach *= agreement[min(k, len(agreement) - 1)]
        total += reach
    return total


def modeled_speed(agreement: list[float], draft_ms: float, target_ms: dict[str, float]) -> dict:
    """The best γ's modeled greedy speed against target-only decoding (see the module docstring); ``target_ms`` is
    :func:`target_ms`'s, keyed by the token count as a string (as JSON keeps it)."""
    rows = {
        gamma: (1 + expected_accepted(agreement, gamma))
        * target_ms["1"]
        / (gamma * draft_ms + target_ms[str(gamma + 1)])
        for gamma in range(1, MAX_GAMMA + 1)
    }
    best = max(rows, key=rows.get)
    return {
        "best_gamma": best,
        "speed": round(rows[best], 3),
        "by_gamma": {str(g): round(v, 3) for g, v in rows.items()},
    }


def agreement_by_delay(scores: dict) -> list[float]:
    """A drafter's greedy agreement at delays 1, 2, …: GLIDE's by delay, the twin's one value (it never glimpses)."""
    return [scores["delays"][str(d)]["agreement"] for d in DELAYS] if "delays" in scores else [scores["agreement"]]


def score_row(kind: str, model, test: dict) -> dict:
    """α and agreement: GLIDE at every delay and without its glimpse, the twin once (it never glimpses)."""
    if kind == "vanilla":
        return score(model, test)
    return {"delays": {str(d): score(model, test, d) for d in DELAYS}, "no_glimpse": score(model, test, None)}


@torch.no_grad()
def draft_token_ms(model, target_kv: list, prefix: int = 256, repeats: int = 60) -> float:
    """Median ms of one drafted token: a one-token forward and the draft head on a ``prefix``-token cache."""
    from transformers import DynamicCache

    ids = torch.randint(0, 1000, (1, prefix + 1))
    cache = DynamicCache(config=model.config)
    model(
        input_ids=ids[:, :prefix],
        past_key_values=cache,
        use_cache=True,
        target_past_key_values=target_kv,
        logits_to_keep=1,
    )
    samples = []
    for _ in range(repeats + 5):
        started = time.perf_counter()
        model(
            input_ids=ids[:, prefix:],
            past_key_values=cache,
            use_cache=True,
            target_past_key_values=target_kv,
            logits_to_keep=1,
        )
        samples.append(time.perf_counter() - started)
        cache.crop(-1)  # transformers 5.23: a negative count of tokens to remove
    return round(1e3 * statistics.median(samples[5:]), 3)


@torch.no_grad()
def target_ms(target, prefix: int = 256, lengths=range(1, MAX_GAMMA + 2), repeats: int = 20) -> dict[str, float]:
    """Median ms of the target's forward over ``n`` new tokens on a ``prefix``-token cache, per n (interleaved)."""
    from transformers import DynamicCache

    ids = torch.randint(0, 1000, (1, prefix + max(lengths)))
    cache = DynamicCache(config=target.config)
    target(input_ids=ids[:, :prefix], **with_cache(target, cache), use_cache=True, logits_to_keep=1)
    samples = {n: [] for n in lengths}
    for _ in range(repeats + 2):
        for n in lengths:
            started = time.perf_counter()
            target(input_ids=ids[:, prefix : prefix + n], **with_cache(target, cache), use_cache=True)
            samples[n].append(time.perf_counter() - started)
            cache.crop(-n)
    return {str(n): round(1e3 * statistics.median(values[2:]), 3) for n, values in samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--work", required=True, help="the gap curve's --work: its store, held-out windows and training states"
    )
    parser.add_argument("--output", default="benchmarks/verification/cpu-glide-recipe.json")
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma-separated variants of the recipe at 2 epochs"
    )
    parser.add_argument(
        "--reference",
        action="append",
        default=[],
        help="a trained pair (DIR/glide, DIR/vanilla, e.g. a fine-tune of the shipped pair) scored beside the "
        "shipped one; may be repeated",
    )
    parser.add_argument("--costs", action="store_true", help="time the drafts and the target (run on an idle machine)")
    parser.add_argument("--plot", default="benchmarks/plots/cpu-glide-recipe.png")
    args = parser.parse_args(argv)
    from hf_specdraft.core.projection import few_token_linears
    from hf_specdraft.glide.training.store import load_store
    from hf_specdraft.defaults.loading import SMOLLM2_DRAFTERS_DIR
    from hf_specdraft.defaults.smollm2 import load_smollm2
    from hf_specdraft.glide import GlideForCausalLM
    from .glide_gap_curve import variant_recipe
    from hf_specdraft.bench.harness import cpu_model

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for variant in variants:
        try:
            variant_recipe("glide", SIZE, variant)
        except ValueError as error:
            parser.error(f"--variants: {error}")
    references = {"shipped": SMOLLM2_DRAFTERS_DIR, **{Path(path).name: Path(path) for path in args.reference}}
    for name, folder in references.items():
        if not all((folder / kind / "config.json").is_file() for kind in ("glide", "vanilla")):
            parser.error(f"--reference {str(folder)!r} holds no glide/ and vanilla/ checkpoints")
    work = Path(args.work)
    if not (work / "store" / "store.json").is_file():
        parser.error(
            f"--work {args.work!r} holds no store: run python -m benchmarks.studies.glide_gap_curve "
            f"--work {args.work} first"
        )
    target, tokenizer = load_smollm2(dtype=torch.float32, device="cpu")
    store = load_store(work / "store")
    test = heldout_store(target, tokenizer, work, 64)
    output = Path(args.output)
    result = json.loads(output.read_text()) if output.is_file() else {"rows": {}}
    rows = result.setdefault("rows", {})
    import transformers

    result["meta"] = {
        "hardware": f"CPU: {cpu_model()}, {torch.get_num_threads()} threads",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "date": time.strftime("%Y-%m-%d"),
        "command": f"python -m benchmarks.studies.glide_recipe --work WORK --variants {args.variants}"
        + "".join(f" --reference {path}" for path in args.reference)
        + (" --costs" if args.costs else ""),
        "data": f"the gap curve's first {SIZE} train-split windows of 256 tokens, 2 epochs (320 steps of 8 windows)",
        "heldout": "64 held-out code windows of 256 tokens, positions 16..",
        "speed_model": (
            "(1 + E_gamma) * c_target(1) / (gamma * c_draft + c_target(gamma + 1)), E from agreement by delay"
        ),
    }

    def save() -> None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(result, indent=1) + "\n")

    models = {}
    for variant in variants:
        row = rows.setdefault(variant, {})
        arch = any(part.startswith(("layers", "mlp")) for part in variant.split("-"))
        row["twin"] = variant if arch or variant == "x2" else "x2"  # L variants change GLIDE alone
        for kind in ("glide", "vanilla") if row["twin"] == variant else ("glide",):
            model, seconds, drafter, args = train_one(kind, SIZE, variant, target, store, work)
            models[kind, variant] = model
            if kind not in row:
                row[kind] = {
                    **score_row(kind, model, test),
                    "train_seconds": seconds,
                    "steps": args.max_steps,
                    "run": run_name(kind, SIZE, variant),
                    "block_size": args.block_size,
                    "layers": model.config.num_hidden_layers,
                    "mlp": drafter["intermediate_size"],
                    "parameters": sum(p.numel() for p in model.parameters()),
                }
                save()
                print(variant, kind, row[kind], flush=True)
    scored = result.setdefault("references", {})
    for name, folder in references.items():
        for kind in ("glide", "vanilla"):
            model = GlideForCausalLM.from_pretrained(folder / kind, dtype=torch.float32).eval()
            models[kind, f"reference:{name}"] = model
            if kind not in scored.get(name, {}):
                log = json.loads((folder / kind / "training_log.json").read_text())
                scored.setdefault(name, {})[kind] = {
                    **score_row(kind, model, test),
                    "last_stage": {
                        "steps": log["steps"][-1]["step"],
                        "block_size": log["arguments"]["block_size"],
                        "learning_rate": log["arguments"]["learning_rate"],
                        "store_windows": log.get("store_windows"),
                    },
                }
                save()
                print(name, kind, scored[name][kind], flush=True)
    if args.costs:
        kv = [(None, None)] * target.config.num_hidden_layers
        kv[TOP_LAYER] = (
            test[f"keys.{TOP_LAYER}"][:1].to(torch.bfloat16),
            test[f"values.{TOP_LAYER}"][:1].to(torch.bfloat16),
        )
        with few_token_linears(
            target
        ):  # the loop's verification forward on CPU (and target-only + linears as the base)
            result["target_ms"] = target_ms(target)
        for (kind, variant), model in models.items():
            row = scored[variant.split(":", 1)[1]] if variant.startswith("reference:") else rows[variant]
            row[kind]["draft_ms"] = draft_token_ms(model.to(torch.bfloat16), kv if kind == "glide" else None)
            row[kind]["modeled"] = modeled_speed(
                agreement_by_delay(row[kind]), row[kind]["draft_ms"], result["target_ms"]
            )
        save()
    print("plot:", plot(result, Path(args.plot)))
    return 0


def label(variant: str) -> str:
    """A legend's name for a variant: what it changes from the recipe (L = 5, one layer, MLP 1,536)."""
    changes = [part for part in variant.split("-") if not part.startswith("x")]
    return (
        ", ".join(changes).replace("block", "L=").replace("layers", "layers ").replace("mlp", "MLP ") or "recipe (L=5)"
    )


def plot(result: dict, path: Path) -> Path:
    """α by cache delay of each GLIDE variant beside its twin; modeled speed against γ where costs were timed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks.report.plots import save_figure

    rows = {variant: row for variant, row in result["rows"].items() if "delays" in row.get("glide", {})}  # scored rows
    timed = "target_ms" in result
    figure, axes = plt.subplots(1, 2 if timed else 1, figsize=(11 if timed else 6, 4), squeeze=False)
    axis = axes[0][0]
    for number, (variant, row) in enumerate(rows.items()):
        color = f"C{number}"
        delays = [int(d) for d in row["glide"]["delays"]]
        axis.plot(
            delays,
            [row["glide"]["delays"][str(d)]["alpha"] for d in delays],
            "o-",
            color=color,
            label=f"glide {label(variant)}",
        )
        if row.get("twin") == variant and "vanilla" in row:
            axis.axhline(
                row["vanilla"]["alpha"], color=color, linestyle="--", alpha=0.7, label=f"vanilla {label(variant)}"
            )
    axis.set_xlabel("cache delay (the k-th drafted token glimpses with delay k)")
    axis.set_title("held-out α = 1 - TV(p, q)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=6, ncol=2)
    if timed:
        axis = axes[0][1]
        for number, (variant, row) in enumerate(rows.items()):
            for kind, style in (("glide", "o-"), ("vanilla", "s--")):
                if kind not in row or kind == "vanilla" and row.get("twin") != variant or "modeled" not in row[kind]:
                    continue
                by_gamma = row[kind]["modeled"]["by_gamma"]
                axis.plot(
                    [int(g) for g in by_gamma],
                    list(by_gamma.values()),
                    style,
                    color=f"C{number}",
                    label=f"{kind} {label(variant)}",
                )
        axis.set_xlabel("γ (drafted tokens a step)")
        axis.set_title("modeled greedy speed against target-only")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=6, ncol=2)
    return save_figure(
        figure, path, "GLIDE's recipe, 2 epochs over 328K tokens (SmolLM2-135M target, held-out code)", fontsize=9
    )


if __name__ == "__main__":
    raise SystemExit(main())
