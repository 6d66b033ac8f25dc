"""GLIDE's glimpse against training tokens: GLIDE and its vanilla twin trained on identical data at four
sizes spanning 8x, scored teacher-forced on held-out code (Du et al. 2024, §5.2, Figure 4: the paper's margin is
5.4-23.5 points of acceptance).

    python -m benchmarks.studies.glide_gap_curve --work gap-work \\
        --output benchmarks/verification/cpu-glide-gap-curve.json

Each run trains a drafter from scratch for ``N / 8`` steps of 8 windows drawn (with replacement, by the run's seeded
generator: the same draws for both drafters) from the first ``N`` windows of one distillation store of the
embedded default (:mod:`~recipes.distillation`: the target's top-8 next-token distribution and its layer-29
keys and values over train-split windows of 256 tokens), with the shipped drafters' recipe
(:mod:`~recipes.smollm2_drafters`' ``DRAFTERS`` and ``RECIPES``: one layer as wide as the target, a 6K draft
vocabulary chosen from the same windows, AdamW at 1e-3, cosine decay, 8 windows a step, through ``train_glide``). The
sizes are nested (the first 160 windows are in every run) and GLIDE and its twin see the same windows in the same
order, so the gap isolates the glimpse.
Ablations at one size: the block-wise mask's L = 1 instead of 5 (no delay simulated in training), and the
cross-attention started from the target's own layer-29 attention (``q_proj``, ``o_proj``) instead of at random.
``--epochs 2,4`` adds both drafters trained for more epochs over the largest size's windows (more steps, no new data).

Scored as :mod:`~benchmarks.studies.glide_glimpse` scores (α = 1 - TV(p, q) against the target's top-8, greedy
agreement, positions 16.. of each window; GLIDE glimpsing with a delay of 1, the first drafted token's). The shipped
drafters (3.89M tokens: several epochs over three stores) are scored on the same windows as a reference. Resumable:
the store's shards and every run's training state live under ``--work``, and finished rows are kept in ``--output``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .glide_glimpse import compute_store, heldout_code, score

SIZES = (160, 320, 640, 1280)  # windows of 256 tokens: 41K to 328K tokens, 8x
ABLATION_SIZE = 640
TOP_LAYER = 29  # SmolLM2-135M's top layer: the one the store holds


def run_name(kind: str, windows: int, variant: str) -> str:
    return f"{kind}-{windows}" + (f"-{variant}" if variant else "")


def attention_init(glide, target) -> None:
    """Start GLIDE's cross-attention from the attention of the target layer it reads (same widths: the query and output
    projections of that layer), instead of at random."""
    layer = target.model.layers[glide.config.target_layer_ids[0]].self_attn
    cross = glide.model.layers[0].cross_attn
    with torch.no_grad():
        cross.q_proj.weight.copy_(layer.q_proj.weight)
        cross.o_proj.weight.copy_(layer.o_proj.weight)


def variant_recipe(kind: str, windows: int, variant: str) -> tuple[dict, object, int]:
    """The shipped recipe for ``kind`` changed as ``variant`` says: ``(drafter, args, epochs)``, the drafter's shape (a
    ``DRAFTERS`` entry), its ``GlideTrainingArguments`` and its epochs over the first ``windows`` windows.

    ``variant`` joins parts with ``-``: ``x{E}`` (E epochs), ``block{L}`` (the block-wise mask's L; ``block1+5``
    alternates L = 1 and 5 by step), ``layers{N}``
    (N draft layers, each reading the target's top layer: the store holds that layer alone), ``mlp{N}`` (MLP width),
    ``attn-init`` (the glimpse started from the target's attention); ``""`` is the recipe itself."""
    from recipes.smollm2_drafters import DRAFTERS, RECIPES

    drafter, epochs, changes = dict(DRAFTERS[kind]), 1, {}
    for part in filter(None, variant.replace("attn-init", "").split("-")):
        name = part.rstrip("0123456789+")
        numbers = part[len(name) :].split("+")
        if not all(numbers) or name not in ("x", "block", "layers", "mlp") or len(numbers) > 1 and name != "block":
            raise ValueError(
                f"variant parts must be x<E>, block<L> (block1+5: L by step in turn), layers<N>, mlp<N> or attn-init, "
                f"got {part!r} in {variant!r}"
            )
        number = numbers[0]
        if name == "x":
            epochs = int(number)
        elif name == "block":
            changes["block_size"] = int(number) if len(numbers) == 1 else tuple(map(int, numbers))
        elif name == "layers":
            drafter["num_hidden_layers"] = int(number)
            drafter["target_layer_ids"] = (TOP_LAYER,) * int(number)
        else:
            drafter["intermediate_size"] = int(number)
    steps = epochs * windows // RECIPES[kind].per_device_batch_size
    return (
        drafter,
        dataclasses.replace(RECIPES[kind], max_steps=steps, warmup_steps=max(2, steps // 10), **changes),
        epochs,
    )


def train_one(kind: str, windows: int, variant: str, target, store: dict, work: Path) -> tuple:
    """One drafter trained over the first ``windows`` windows as ``variant`` says (resumable); returns it, its seconds,
    its shape and its training arguments."""
    from recipes.smollm2_drafters import build_drafter, draft_vocabulary, train_drafter

    drafter, args, _ = variant_recipe(kind, windows, variant)
    args = dataclasses.replace(args, output_dir=str(work / run_name(kind, windows, variant)))
    subset = {key: value[:windows] for key, value in store.items()}
    init_from = None
    if variant.endswith(
        "attn-init"
    ):  # a starting checkpoint: the recipe's drafter with the target's attention in its glimpse
        init_from = work / f"{run_name(kind, windows, variant)}-init"
        if not (init_from / "config.json").is_file():
            vocab = draft_vocabulary(subset, drafter["draft_vocab_size"], target, Path(args.output_dir), None)
            start = build_drafter(target, vocab, drafter, block_size=max(args.block_sizes(1)), seed=args.seed)
            attention_init(start, target)
            start.save_pretrained(init_from)
    model, log = train_drafter(kind, target, subset, args, drafter, init_from=init_from)
    return model, log["train_seconds"], drafter, args


def heldout_store(target, tokenizer, work: Path, windows: int) -> dict:
    path = work / f"heldout-{windows}.safetensors"
    if path.is_file():
        return load_file(str(path))
    store = compute_store(target, heldout_code(tokenizer, windows), [target.config.num_hidden_layers - 1])
    save_file({k: v.contiguous() for k, v in store.items()}, str(path))
    return store


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--work", required=True, help="store, held-out windows and training states (resumable; not for git)"
    )
    parser.add_argument("--output", default="benchmarks/verification/cpu-glide-gap-curve.json")
    parser.add_argument("--heldout", type=int, default=64, help="held-out code windows of 256 tokens scored")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="training windows per run, comma-separated")
    parser.add_argument(
        "--ablations",
        default="block1,attn-init",
        help="GLIDE variants trained at the middle size, e.g. block1,attn-init,block3 ('' skips)",
    )
    parser.add_argument(
        "--epochs", default="", help="more epochs over the largest size's windows, e.g. '2,4' (both drafters)"
    )
    parser.add_argument("--plot", default="benchmarks/plots/cpu-glide-gap-curve.png")
    args = parser.parse_args(argv)
    try:
        sizes = sorted(int(x) for x in args.sizes.split(",") if x.strip())
    except ValueError:
        parser.error(f"--sizes must be comma-separated integers, got {args.sizes!r}")
    if not sizes or min(sizes) < 8:
        parser.error(f"--sizes must name at least one size of 8 windows or more, got {args.sizes!r}")
    ablations = [a for a in args.ablations.split(",") if a.strip()]
    try:
        epochs = [int(x) for x in args.epochs.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--epochs must be comma-separated integers, got {args.epochs!r}")
    if any(e < 2 for e in epochs):
        parser.error(f"--epochs must name 2 or more epochs, got {args.epochs!r}")
    for ablation in ablations:
        try:
            variant_recipe("glide", ABLATION_SIZE, ablation)
        except ValueError as error:
            parser.error(f"--ablations: {error}")
    from hf_specdraft.glide.training.store import load_store, write_store
    from recipes.distillation import build_windows
    from hf_specdraft.defaults.loading import SMOLLM2_DRAFTERS_DIR
    from hf_specdraft.defaults.smollm2 import load_smollm2
    from hf_specdraft.glide import GlideForCausalLM
    from hf_specdraft.bench.harness import cpu_model

    work = Path(args.work)
    target, tokenizer = load_smollm2(dtype=torch.float32, device="cpu")
    layer = target.config.num_hidden_layers - 1
    write_store(target, build_windows(tokenizer, max(sizes)), work / "store", [layer])
    store = load_store(work / "store")
    test = heldout_store(target, tokenizer, work, args.heldout)
    output = Path(args.output)
    result = json.loads(output.read_text()) if output.is_file() else {"rows": {}}
    rows = result["rows"]

    def record(name: str, row: dict) -> None:
        rows[name] = row
        import transformers

        result["meta"] = {
            "hardware": f"CPU: {cpu_model()}, {torch.get_num_threads()} threads",
            "dtype": "float32",
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
            "date": time.strftime("%Y-%m-%d"),
            "command": "python -m benchmarks.studies.glide_gap_curve --work WORK"
            + f" --output {args.output} --heldout {args.heldout} --sizes {args.sizes} --ablations '{args.ablations}'"
            + (f" --epochs {args.epochs}" if args.epochs else ""),
            "heldout": f"{args.heldout} held-out code windows of 256 tokens, positions 16..; GLIDE at delay 1",
            "store": "train-split windows of 256 tokens (code, 15 % chat), the target's top-8 and layer-29 KV",
        }
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(result, indent=1) + "\n")
        print(name, row, flush=True)

    if "shipped" not in rows:
        shipped = {
            kind: GlideForCausalLM.from_pretrained(SMOLLM2_DRAFTERS_DIR / kind, dtype=torch.float32).eval()
            for kind in ("glide", "vanilla")
        }
        record(
            "shipped",
            {
                "tokens": 3_890_000,
                "glide": score(shipped["glide"], test),
                "vanilla": score(shipped["vanilla"], test),
                "glide_no_glimpse": score(shipped["glide"], test, None),
            },
        )
    plan = [(size, "") for size in sizes] + [
        (ABLATION_SIZE if ABLATION_SIZE in sizes else sizes[len(sizes) // 2], a) for a in ablations
    ]
    plan += [(sizes[-1], f"x{e}") for e in epochs]
    for size, variant in plan:
        name = run_name("pair", size, variant)
        if name in rows:
            continue
        repeats = int(variant[1:]) if variant.startswith("x") else 1
        row = {
            "windows": size,
            "tokens": repeats * size * int(store["input_ids"].shape[1]),
            "variant": variant or "recipe",
            "epochs": repeats,
        }
        for kind in ("glide",) if variant in ablations else ("glide", "vanilla"):
            model, seconds, _, args = train_one(kind, size, variant, target, store, work)
            row[kind] = {
                **score(model, test),
                "train_seconds": seconds,
                "steps": args.max_steps,
                "block_size": args.block_size,
            }
            if kind == "glide":
                row[kind]["no_glimpse"] = score(model, test, None)
        if variant in ablations:  # the twin of the same size, trained without the variant
            row["vanilla"] = rows[run_name("pair", size, "")]["vanilla"] if run_name("pair", size, "") in rows else None
        record(name, row)
    print("plot:", plot(result, Path(args.plot)))
    return 0


def plot(result: dict, path: Path) -> Path:
    """α and greedy agreement of GLIDE and its twin against training tokens (log scale), the gap annotated; the shipped
    drafters as a reference point, the ablations as single markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks.report.plots import save_figure

    rows = [row for row in result["rows"].values() if row.get("variant") == "recipe"]
    rows.sort(key=lambda row: row["tokens"])
    repeated = sorted(
        (row for row in result["rows"].values() if str(row.get("variant", "")).startswith("x")),
        key=lambda row: row["tokens"],
    )
    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    for axis, metric in zip(axes, ("alpha", "agreement")):
        tokens = [row["tokens"] for row in rows]
        for kind, style in (("glide", "o-"), ("vanilla", "s--")):
            axis.plot(tokens, [row[kind][metric] for row in rows], style, label=kind)
        for row in rows:
            gap = 100 * (row["glide"][metric] - row["vanilla"][metric])
            axis.annotate(
                f"{gap:+.1f}",
                (row["tokens"], row["glide"][metric]),
                textcoords="offset points",
                xytext=(0, 6),
                ha="center",
                fontsize=8,
            )
        if repeated:
            series = [rows[-1], *repeated]
            for kind, style in (("glide", "o:"), ("vanilla", "s:")):
                axis.plot(
                    [row["tokens"] for row in series],
                    [row[kind][metric] for row in series],
                    style,
                    alpha=0.6,
                    label=f"{kind}, more epochs over the largest",
                )
        shipped = result["rows"].get("shipped")
        if shipped:
            axis.plot(
                [shipped["tokens"]] * 2,
                [shipped["glide"][metric], shipped["vanilla"][metric]],
                "k^",
                label="shipped (multi-epoch)",
            )
        for row in result["rows"].values():
            if row.get("variant", "recipe") != "recipe" and not row["variant"].startswith("x"):  # an ablation
                axis.plot(row["tokens"], row["glide"][metric], "x", markersize=8, label=f"glide, {row['variant']}")
        axis.set_xscale("log")
        axis.set_xlabel("training tokens")
        axis.set_title("α = 1 - TV(p, q)" if metric == "alpha" else "greedy agreement")
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return save_figure(
        figure, path, "GLIDE vs its vanilla twin on held-out code (SmolLM2-135M target; gap in points)", fontsize=10
    )


if __name__ == "__main__":
    raise SystemExit(main())
