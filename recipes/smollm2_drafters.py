"""Drafters for the real default target (SmolLM2-135M-Instruct), trained on this CPU from a distillation store.

Three drafters share one shape family, one store (:mod:`.distillation`) and one training path —
:func:`hf_specdraft.glide.train_glide` reading the store as :class:`~hf_specdraft.glide.training.store.StoreWindows` —
so comparisons isolate what differs:

- ``glide``: GLIDE (Du et al. 2024, §4.1), one layer as wide as the target (576), cross-attending to the target's
  top layer (``l = N_T - N_D + m`` = 29) with the block-wise training mask (L = 5);
- ``vanilla``: its twin without cross-attention (§5.2, Figure 4) — also the project's plain draft model
  (speculative decoding, CAPE on a draft, the cascade's first draft);
- ``small``: a narrower MLP and a smaller vocabulary, the cascade's second draft (CS Drafting §3.1).

A recipe is a configuration of that path: what the drafter is (:data:`DRAFTERS`, ``GlideConfig.from_target_config``'s
keywords) and how it trains (:data:`RECIPES`, :class:`~hf_specdraft.glide.GlideTrainingArguments`).

Vocabulary (measured, see the README): SmolLM2's 49,152 × 576 LM head alone costs ~13 ms on this CPU,
an eighth of a target forward, so each draft scores a reduced vocabulary — the target ids the target itself
predicts most often in the store (FR-Spec / EAGLE-3), scattered back to the full vocabulary — and its
embedding rows start from the target's (tied) embedding rows of those ids.

Loss: KL from the target's renormalised top-k next-token distribution (``distillation_weight=1``: token-level
distillation, the cheaper form of Du et al. 2024, Appendix B; the gradient of the cross-entropy against it): the drafts
learn what the target says, which greedy acceptance rewards. Training is resumable:
``OUTPUT_DIR/state/<kind>/checkpoint-last`` every ``save_steps`` steps; rerunning the same command continues from it.

    # stage 1 on the corpus store; stage 2 from its weights, 600 steps, on the corpus store plus two stores of the
    # target's own text, each 3x (distillation.py's docstring builds them); stage 3 (what ships for glide and
    # vanilla) 900 more steps on the same mix at a lower peak learning rate
    python -m recipes.smollm2_drafters store/smollm2 drafters --kinds glide,vanilla
    python -m recipes.smollm2_drafters store/smollm2 drafters3 --kinds glide,vanilla \
        --init-from drafters --extra-store store/selfgen --extra-store store/selfgen2 --extra-weight 3 --steps 600
    python -m recipes.smollm2_drafters store/smollm2 drafters4 --kinds glide,vanilla \
        --init-from drafters3 --extra-store store/selfgen --extra-store store/selfgen2 --extra-weight 3 \
        --steps 900 --learning-rate 3e-4
    python -m recipes.smollm2_drafters store/smollm2 drafters2 --kinds small \
        --extra-store store/selfgen --extra-weight 4
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch
from transformers import PreTrainedModel

from hf_specdraft.glide import GlideConfig, GlideForCausalLM, GlideTrainingArguments, train_glide
from hf_specdraft.glide.model_card import training_stages
from hf_specdraft.glide.training.objective import WindowSource
from hf_specdraft.glide.training.store import StoreWindows

from .drafters import LICENSE

DATASET = (
    "hf-specdraft distillation stores: the train split of the local Python corpus (stdlib + installed dependencies; "
    "15 % as chat requests in SmolLM2's template), the target's own greedy continuations of train-split prompts, and "
    "its greedy answers to requests of seven groups (conversation with a follow-up turn, translation, summaries, "
    "questions, arithmetic word problems, questions about a passage, code; recipes/requests.py: project-written "
    "templates, train-split docstrings and requests the target wrote itself from project-written instructions, no "
    "evaluation set); labels = the target's top-8 next-token distribution"
)

# What each drafter is: GlideConfig.from_target_config's keywords (num_hidden_layers 1, Appendix E: one layer up to 13B
# targets; target_layer_ids §4.1's N_T - N_D + m, the top layer), and draft_vocab_size: how many target ids it scores.
DRAFTERS: dict[str, dict] = {
    "glide": {
        "cross_attention": True,
        "intermediate_size": 1536,  # the target's MLP width: Appendix E favours one wide layer
        "draft_vocab_size": 6144,
    },  # target-argmax coverage ~0.99 on held-out code (README); head 6K × 576 ≈ 1.7 ms
    "vanilla": {
        "cross_attention": False,
        "intermediate_size": 1536,
        "draft_vocab_size": 6144,
    },  # GLIDE's twin, no glimpse
    "small": {
        "cross_attention": False,
        "intermediate_size": 384,
        "draft_vocab_size": 2048,
    },  # the cascade's second, cheaper draft
    # GLIDE reading the target's last hidden state ([embedding ; h_{t-1}] in, its own state after), trained unrolled
    "glide-state": {"cross_attention": True, "state_input": True, "intermediate_size": 1536, "draft_vocab_size": 6144},
    # the same in Gemma 4's assistant layout (no cache of its own, Gemma 4's block and activation): what vLLM serves
    "glide-assistant": {
        "cross_attention": True,
        "state_input": True,
        "self_attention": False,
        "hidden_act": "gelu_pytorch_tanh",
        "intermediate_size": 1536,
        "draft_vocab_size": 6144,
    },
}
# a drafter that starts from another kind's weights (--init-from DIR: DIR/<WARM_START[kind]>), what it shares of them
WARM_START = {"glide-state": "glide", "glide-assistant": "glide"}


def _recipe(kind: str, max_steps: int = 400) -> GlideTrainingArguments:
    return GlideTrainingArguments(
        output_dir=kind,  # each run puts it under its own OUTPUT_DIR/state/
        max_steps=max_steps,
        seq_len=256,  # the store's windows
        per_device_batch_size=8,  # windows of 256 tokens: 2,048 tokens a step
        learning_rate=1e-3,
        warmup_steps=20,
        block_size=5,  # §4.1: KV-cache delay of up to L = 5 tokens simulated in training; a tuple cycles L by step
        distillation_weight=1.0,  # the target's top-k alone (what a store holds), no corpus labels
        save_steps=50,  # a killed CPU run loses at most 50 steps
        dataset_name=DATASET,
        license=LICENSE,
    )


RECIPES: dict[str, GlideTrainingArguments] = {
    "glide": _recipe("glide"),
    "vanilla": _recipe("vanilla"),
    "small": _recipe("small", max_steps=300),
    "glide-state": _recipe("glide-state"),
    "glide-assistant": _recipe("glide-assistant"),
}

# stage 2: from stage 1's weights, on the target's own text
FINETUNE = {"max_steps": 300, "learning_rate": 5e-4, "warmup_steps": 10}


def choose_draft_vocab(
    store: dict[str, torch.Tensor], size: int, vocab_size: int, always: tuple[int, ...] = ()
) -> list[int]:
    """The ``size`` target ids the target predicts most often in ``store`` (argmax), then most frequent as input.

    ``always`` (e.g. eos) are kept whatever their counts. Ids are ordered most frequent first.
    """
    argmax = torch.bincount(store["topk_ids"][..., 0].flatten().long(), minlength=vocab_size).double()
    inputs = torch.bincount(store["input_ids"].flatten().long(), minlength=vocab_size).double()
    score = argmax * 1e3 + inputs
    score[list(always)] = float("inf")
    return score.argsort(descending=True)[:size].tolist()


def build_drafter(
    target: PreTrainedModel, draft_token_ids: list[int], drafter: dict, block_size: int = 5, seed: int = 0
) -> GlideForCausalLM:
    """A GLIDE-family drafter for ``target`` shaped by ``drafter`` (a :data:`DRAFTERS` entry) whose embedding rows
    start from the target's rows of its vocabulary; ``block_size``: the largest L it trains with (its config's)."""
    keywords = {key: value for key, value in drafter.items() if key != "draft_vocab_size"}
    if keywords.get("target_layer_ids") is not None:
        keywords["target_layer_ids"] = list(keywords["target_layer_ids"])
    config = GlideConfig.from_target_config(
        target.config,
        block_size=block_size,
        draft_token_ids=draft_token_ids,
        **{"tie_word_embeddings": True, **keywords},
    )
    torch.manual_seed(seed)
    model = GlideForCausalLM(config)
    rows = target.get_input_embeddings().weight.detach().float()
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        emb[: len(draft_token_ids)] = rows[draft_token_ids]
        emb[-1] = rows.mean(0)  # the row every other input id shares
    return model


def extended_vocabulary(vocab: list[int], store: dict[str, torch.Tensor], extra: int, vocab_size: int) -> list[int]:
    """``vocab`` (in its order), then the ``extra`` ids the target predicts most often in ``store`` that it lacks.

    A drafter whose vocabulary was chosen on code cannot draft what a chat target says about anything else: on the
    target's answers to natural-language requests, 22 % of its greedy tokens fall outside the code-chosen 6,144 ids.
    """
    argmax = torch.bincount(store["topk_ids"][..., 0].flatten().long(), minlength=vocab_size)
    argmax[vocab] = -1
    order = argmax.argsort(descending=True)[:extra]
    return list(vocab) + [int(i) for i in order if argmax[i] > 0]


def draft_vocabulary(
    store: dict[str, torch.Tensor],
    size: int,
    target: PreTrainedModel,
    state_dir: Path,
    start_from: GlideForCausalLM | None,
    extra: int = 0,
) -> list[int]:
    """A drafter's reduced vocabulary: the one its interrupted run chose (kept in ``state_dir``, so a resumed run
    rebuilds the same rows), else the checkpoint's it starts from (with ``extra`` more ids from ``store``:
    :func:`extended_vocabulary`), else the ``size`` ids the target predicts most."""
    path = state_dir / "draft_token_ids.json"
    if path.is_file():
        return json.loads(path.read_text())
    if start_from is not None:
        vocab = start_from.config.draft_token_ids
        if extra:
            vocab = extended_vocabulary(vocab, store, extra, target.config.vocab_size)
    else:
        eos = target.config.eos_token_id
        vocab = choose_draft_vocab(
            store,
            size,
            target.config.vocab_size,
            always=() if eos is None else (eos,) if isinstance(eos, int) else tuple(eos),
        )
    state_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(vocab))
    return vocab


def train_drafter(
    kind: str,
    target: PreTrainedModel,
    store: dict[str, torch.Tensor] | WindowSource,
    args: GlideTrainingArguments,
    drafter: dict | None = None,
    init_from: str | Path | None = None,
    extra_vocab: int = 0,
) -> tuple[GlideForCausalLM, dict]:
    """Build one drafter and train it from ``store`` with :func:`~hf_specdraft.glide.train_glide`.

    Args:
        kind: one of :data:`DRAFTERS` (``"glide"``, ``"vanilla"``, ``"small"``, ``"glide-state"``,
            ``"glide-assistant"``).
        store: a distillation store (:mod:`.distillation`), or windows the target runs over every step
            (:class:`~hf_specdraft.glide.training.objective.TargetWindows`, the GPU recipe's: then ``init_from`` is
            required, for its draft vocabulary).
        args: how it trains (a :data:`RECIPES` entry with its ``output_dir``: the fp32 checkpoint, ``training_log.json``
            and ``checkpoint-last/``, which a rerun resumes from); its windows are the data's (``seq_len`` is theirs).
        drafter: what it is (default ``DRAFTERS[kind]``).
        init_from: a trained drafter checkpoint to start from (its draft vocabulary is kept; :func:`warm_start`).
        extra_vocab: with ``init_from``, extend its vocabulary by this many ids from ``store``
            (:func:`extended_vocabulary`).

    Returns:
        the trained drafter and its training log (with the drafter's shape, the data's size and the parameter count).
    """
    if kind not in DRAFTERS:
        raise ValueError(f"kind must be one of {sorted(DRAFTERS)}, got {kind!r}")
    if not isinstance(store, dict) and init_from is None:
        raise ValueError(
            "a drafter trained on windows without a store needs init_from: its draft vocabulary is chosen from a store"
        )
    drafter = DRAFTERS[kind] if drafter is None else drafter
    source = StoreWindows(store) if isinstance(store, dict) else store
    args = dataclasses.replace(args, seq_len=source.seq_len)
    start_from = GlideForCausalLM.from_pretrained(init_from, dtype=torch.float32) if init_from is not None else None
    vocab = draft_vocabulary(store, drafter["draft_vocab_size"], target, Path(args.output_dir), start_from, extra_vocab)
    # the config records the largest L
    block_size = {} if args.block_size is None else {"block_size": max(args.block_sizes(1))}
    model = build_drafter(target, vocab, drafter, seed=args.seed, **block_size)
    if start_from is not None:
        warm_start(model, start_from)
        kept_rows(model, start_from)
    if (
        not model.config.tie_word_embeddings
    ):  # the input rows are the target's, frozen (what vLLM feeds the assistant layout)
        pin_target_rows(model, target)
    extra = {
        "drafter": {"kind": kind, **drafter},
        "store_windows": len(source),
        "store_tokens": source.tokens,
        "draft_vocab_size": len(vocab),
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    return model, train_glide(target, model, source, args, extra_log=extra)


def pin_target_rows(model: GlideForCausalLM, target: PreTrainedModel) -> None:
    """Set ``model``'s input embedding to the target's rows of its draft vocabulary (the row every other id shares:
    their mean) and freeze it: a serving engine feeding the draft the target's embeddings computes the same inputs."""
    rows = target.get_input_embeddings().weight.detach().float()
    ids = model.config.draft_token_ids
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        emb[: len(ids)] = rows[ids]
        emb[-1] = rows.mean(0)
    emb.requires_grad_(False)


def kept_rows(model: GlideForCausalLM, start_from: GlideForCausalLM) -> int:
    """Where ``model``'s vocabulary extends ``start_from``'s (same ids first, in order), copy the trained embedding and
    head rows of those ids and of the shared "another token" row; the new ids keep the target's rows. Returns how many
    ids kept their trained rows (0 when the vocabularies are the same size: :func:`warm_start` loaded them whole)."""
    old, new = start_from.config.draft_token_ids, model.config.draft_token_ids
    if old is None or new is None or len(new) == len(old) or list(new[: len(old)]) != list(old):
        return 0
    n = len(old)
    with torch.no_grad():
        for mine, theirs in (
            (model.get_input_embeddings(), start_from.get_input_embeddings()),
            (model.get_output_embeddings(), start_from.get_output_embeddings()),
        ):
            mine.weight[:n] = theirs.weight[:n]
            mine.weight[-1] = theirs.weight[-1]
            if getattr(mine, "bias", None) is not None and getattr(theirs, "bias", None) is not None:
                mine.bias[:n] = theirs.bias[:n]
                mine.bias[-1] = theirs.bias[-1]
    return n


def warm_start(model: GlideForCausalLM, start_from: GlideForCausalLM) -> list[str]:
    """Load ``start_from``'s weights into ``model`` wherever name and shape agree; returns the names left as
    initialised. Only parameters: buffers follow ``model``'s own config (``target_to_draft`` maps target ids to *its*
    vocabulary's rows; ``start_from``'s would send every id a wider vocabulary adds to the row after its own).

    A ``state_input`` drafter started from a plain one gets ``pre_projection = [I ; 0]``: at step 0 it reads the token's
    embedding exactly as ``start_from`` did, and learns from there what the target's state adds."""
    theirs = start_from.state_dict()
    mine = model.state_dict()
    parameters = {name for name, _ in model.named_parameters()}
    shared = {
        name: tensor
        for name, tensor in theirs.items()
        if name in parameters and name in mine and mine[name].shape == tensor.shape
    }
    model.load_state_dict(shared, strict=False)
    if model.config.state_input and not start_from.config.state_input:
        with torch.no_grad():
            weight = model.model.pre_projection.weight  # (hidden, hidden + target_hidden)
            weight.zero_()
            weight[:, : model.config.hidden_size] = torch.eye(model.config.hidden_size)
    return sorted(set(mine) - set(shared))


def earlier_checkpoint(directory: str | Path, kind: str) -> Path:
    """Where a drafter of ``kind`` starts from in ``directory`` (drafters by kind, e.g. the shipped ones): the same
    kind's checkpoint, else the one it warm-starts from (:data:`WARM_START`)."""
    same = Path(directory) / kind
    return same if (same / "config.json").is_file() else Path(directory) / WARM_START.get(kind, kind)


def earlier_stages(log: dict) -> list[dict]:
    """The stages a fine-tune started from, oldest first: those ``log``'s run started from, then that run itself."""
    # "recipe": stages trained before train_glide
    keys = ("steps", "train_seconds", "recipe", "drafter", "store_windows", "store_tokens")
    return [*training_stages(log)[:-1], {key: log[key] for key in keys if key in log}]


SHIPPED_FILES = ("config.json", "generation_config.json", "model.safetensors", "README.md", "training_log.json")


def ship_drafter(checkpoint: str | Path, destination: str | Path) -> Path:
    """Copy a trained drafter into the package without code: weights, config, card and log only.

    The package loads it with ``GlideForCausalLM``; the trust_remote_code files and CAPE's ``custom_generate/``
    are written from the library's one source when it is saved for the Hub (``save_glide_checkpoint``).
    """
    import shutil

    checkpoint, destination = Path(checkpoint), Path(destination)
    shutil.rmtree(destination, ignore_errors=True)
    destination.mkdir(parents=True)
    for name in SHIPPED_FILES:
        shutil.copy2(checkpoint / name, destination / name)
    log = json.loads((destination / "training_log.json").read_text())
    arguments = log.get("arguments", {})
    if arguments.get("output_dir"):  # the folder it ran in is the trainer's machine's: keep the run's own name only
        arguments["output_dir"] = Path(arguments["output_dir"]).name
        (destination / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
    return destination


def _block_size(parser, value: str | None):
    """``--block-size``: one L or several comma-separated (a tuple, taken by step in turn); None keeps the recipe's."""
    if value is None:
        return None
    try:
        sizes = tuple(int(x) for x in value.split(","))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        parser.error(f"--block-size must be one or more comma-separated integers >= 1, got {value!r}")
    return sizes[0] if len(sizes) == 1 else sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Train SmolLM2's shipped drafters from a distillation store (resumable)."
    )
    parser.add_argument("store", help="a store written by python -m recipes.distillation")
    parser.add_argument(
        "output_dir", help="checkpoints land in OUTPUT_DIR/<kind>; resumable state in OUTPUT_DIR/state/<kind>"
    )
    parser.add_argument("--kinds", default="glide,vanilla,small", help=f"comma-separated, any of {sorted(RECIPES)}")
    parser.add_argument(
        "--init-from", help="stage 2: start each drafter from INIT_FROM/<kind> and fine-tune with FINETUNE's schedule"
    )
    parser.add_argument(
        "--extra-store",
        action="append",
        default=[],
        help="another store (e.g. the target's own text) mixed into the training windows; may be repeated",
    )
    parser.add_argument(
        "--extra-weight", type=int, default=1, help="how many times each extra store's windows are repeated in the mix"
    )
    parser.add_argument(
        "--extra-vocab",
        type=int,
        default=0,
        metavar="N",
        help="with --init-from: add the N ids the target predicts most often in the store that the drafter lacks",
    )
    parser.add_argument(
        "--steps", type=int, help="override the recipe's (or, with --init-from, FINETUNE's) number of steps"
    )
    parser.add_argument("--learning-rate", type=float, help="override the recipe's (or FINETUNE's) peak learning rate")
    parser.add_argument(
        "--seed", type=int, help="override the recipe's seed: a later stage with another seed draws other windows"
    )
    parser.add_argument("--batch-size", type=int, help="override the recipe's windows per step")
    parser.add_argument(
        "--block-size",
        help="override the recipe's block-wise mask L (GLIDE): one L, or several "
        "comma-separated, taken by step in turn (e.g. 1,3 mixes the delays of short drafts)",
    )
    parser.add_argument(
        "--mixed-precision",
        choices=("auto", "no", "bf16"),
        help="override the recipe's precision (auto: bf16 on CUDA, float32 on CPU); bf16 on a CPU with bfloat16 "
        "instructions trains faster",
    )
    ns = parser.parse_args(argv)
    overrides = {
        "mixed_precision": ns.mixed_precision,
        "max_steps": ns.steps,
        "learning_rate": ns.learning_rate,
        "seed": ns.seed,
        "block_size": _block_size(parser, ns.block_size),
        "per_device_batch_size": ns.batch_size,
    }
    if ns.extra_weight < 1:
        parser.error(f"--extra-weight must be >= 1, got {ns.extra_weight}")
    kinds = ns.kinds.split(",")
    unknown = sorted(set(kinds) - set(RECIPES))
    if unknown:
        parser.error(f"--kinds: unknown {unknown}; choose among {sorted(RECIPES)}")
    runs = {}
    for kind in kinds:  # every recipe checked (GlideTrainingArguments' ValueError) before the target loads
        changes = {**(FINETUNE if ns.init_from else {}), **{k: v for k, v in overrides.items() if v is not None}}
        try:
            runs[kind] = dataclasses.replace(
                RECIPES[kind], output_dir=str(Path(ns.output_dir) / "state" / kind), **changes
            )
        except ValueError as error:
            parser.error(f"--steps / --learning-rate / --seed: {error}")
    from hf_specdraft import write_glide_custom_generate
    from hf_specdraft.defaults.smollm2 import HUB_ID, load_smollm2
    from hf_specdraft.glide.model_card import save_glide_checkpoint
    from hf_specdraft.glide.training.store import load_store

    target, _ = load_smollm2(dtype=torch.float32, device="cpu")
    store = load_store(ns.store)
    for path in ns.extra_store:
        extra = load_store(path)
        store = {k: torch.cat([v, *[extra[k]] * ns.extra_weight]) for k, v in store.items()}
    for kind, args in runs.items():
        init_from = None if ns.init_from is None else earlier_checkpoint(ns.init_from, kind)
        model, log = train_drafter(kind, target, store, args, init_from=init_from, extra_vocab=ns.extra_vocab)
        if init_from is not None:
            log["earlier_stages"] = earlier_stages(json.loads((init_from / "training_log.json").read_text()))
        out = save_glide_checkpoint(
            model.to(torch.bfloat16),
            Path(ns.output_dir) / kind,
            target_name=HUB_ID,
            card_info={"dataset": DATASET, "training_log": log, "license": LICENSE},
            custom_generate=write_glide_custom_generate,
        )
        (out / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
