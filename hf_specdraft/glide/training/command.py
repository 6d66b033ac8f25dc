"""``hf-specdraft train-glide``: a GLIDE draft for your own target in one command (docs/training-glide.md).

    hf-specdraft train-glide --target Qwen/Qwen2.5-0.5B-Instruct --dataset chats.jsonl --regenerate \\
        --eval-every 200 --eval-examples 64 --output-dir glide-qwen --max-steps 2000

loads the target, reads the data (:mod:`.data`), holds out ``--eval-examples`` of it, has the target write the replies
of the rest (``--regenerate``, :mod:`.regenerate`), trains (:func:`~.trainer.train_glide`, resuming from
``checkpoint-last``) and scores the held-out part (:mod:`.evaluation`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

import torch
from accelerate import PartialState
from transformers import AutoModelForCausalLM, AutoTokenizer

from .data import detect_column, heldout_split, load_data, load_examples, render_texts, tokenize_texts
from .evaluation import HeldOutEvaluation, heldout_windows
from .objective import token_stream
from .regenerate import RegenerationArguments, regenerate, regeneration_prompts
from .trainer import GlideTrainingArguments, train_glide


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-specdraft train-glide", description="Train a GLIDE draft model against a frozen target."
    )
    parser.add_argument("--target", required=True, help="target model: Hub id or local directory")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", nargs="+", help="token files (.safetensors/.pt) or text files / directories")
    source.add_argument("--dataset", help="a 🤗 dataset: json/jsonl/parquet/arrow file or directory, or a Hub id")
    parser.add_argument("--split", default="train", help="--dataset split to read from the Hub")
    parser.add_argument("--text-column", default="text", help="--dataset column of plain text")
    parser.add_argument("--messages-column", default="messages", help="--dataset column of conversations")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--tokenizer", help="tokenizer for text data (default: --target)")
    parser.add_argument("--glide", help="start from this GLIDE checkpoint instead of a fresh model")
    parser.add_argument("--num-layers", type=int, default=1, help="N_D (Appendix E: 1 up to 13B targets)")
    parser.add_argument("--hidden-size", type=int, help="d_D (default: the target's hidden size)")
    parser.add_argument("--vanilla", action="store_true", help="train the vanilla drafter (no cross-attention)")
    parser.add_argument("--state-input", action="store_true", help="read the target's last hidden state")
    parser.add_argument(
        "--assistant-layout", action="store_true", help="with --state-input: no self-attention (Gemma 4's, for vLLM)"
    )
    parser.add_argument("--unrolled-steps", type=int, help="draft steps per position (default: 2 with --state-input)")
    _add_typed_flags(
        parser,
        GlideTrainingArguments(output_dir="."),
        "max_steps seq_len per_device_batch_size gradient_accumulation_steps warmup_steps seed logging_steps "
        "save_steps eval_every learning_rate weight_decay min_lr_ratio distillation_weight distillation_temperature",
    )
    parser.add_argument("--block-size", type=int, help="block-wise mask L (default: the config's, 5)")
    parser.add_argument("--mixed-precision", default="auto", choices=["auto", "no", "bf16", "fp16"])
    parser.add_argument(
        "--resume",
        action=argparse.BooleanOptionalAction,
        help="require OUTPUT_DIR/checkpoint-last (resumed by default if it exists); --no-resume: start over",
    )
    parser.add_argument("--report-to", default="none", help="accelerate trackers: none, all, or names (tensorboard)")
    group = parser.add_argument_group(
        "regeneration (sequence-level self-distillation, Du et al. 2024, Appendix B; --dataset only)"
    )
    group.add_argument("--regenerate", action="store_true", help="the target writes the responses GLIDE trains on")
    names = "max_new_tokens batch_size temperature top_p prompt_tokens batches_per_shard"
    _add_typed_flags(group, RegenerationArguments(), names, prefix="regen_")
    group.add_argument(
        "--regen-turns", choices=["last", "each"], default=RegenerationArguments.turns, help="turns to regenerate"
    )
    group = parser.add_argument_group("held-out evaluation (every --eval-every steps)")
    held_out = group.add_mutually_exclusive_group()
    held_out.add_argument("--eval-fraction", type=float, help="data fraction held out (default 0.05 with --eval-every)")
    held_out.add_argument("--eval-examples", type=int, help="examples held out (instead of --eval-fraction)")
    group.add_argument("--eval-windows", type=int, default=16, help="held-out windows of --seq-len tokens for α")
    group.add_argument("--eval-prompts", type=int, default=4, help="prompts for tokens per target forward (0 = skip)")
    group.add_argument("--eval-new-tokens", type=int, default=32, help="tokens generated per held-out prompt")
    parser.add_argument("--dataset-name", help="what the data is, for the model card (default: --dataset)")
    parser.add_argument("--license", help="the weights' license for the model card, a Hub id such as apache-2.0")
    parser.add_argument("--compare-vanilla", help="a vanilla run's output dir (same data): its α goes on the card")
    parser.add_argument("--push-to-hub", action="store_true")
    parser.add_argument("--hub-model-id")
    parser.add_argument("--no-progress", dest="progress_bar", action="store_false")
    return parser


def _add_typed_flags(parser, defaults, names: str, prefix: str = "") -> None:
    """A flag for each field of the dataclass ``defaults`` in ``names``, of its type and default (``dest`` prefixed)."""
    short = {"per_device_batch_size": "batch-size", "gradient_accumulation_steps": "grad-accum", "learning_rate": "lr"}
    for name in names.split():
        flag, default = "--" + short.get(name, (prefix + name).replace("_", "-")), getattr(defaults, name)
        parser.add_argument(flag, dest=prefix + name, type=type(default), default=default)


def model_location_problem(value: str | None) -> str | None:
    """Why ``value`` can be neither a local checkpoint directory nor a Hub repo id (``None`` when it may be one)."""
    if value is None or Path(value).expanduser().is_dir():
        return None
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    with contextlib.suppress(HFValidationError):  # it refuses a path: a leading '.', '/' or '~', two '/', a backslash
        if not Path(value).expanduser().exists():
            validate_repo_id(value)
            return None
    return f"{value!r} is not a directory (and not a Hub repo id like 'namespace/name')"


def _check_flags(parser, ns) -> None:
    """One-line argparse errors for paths and evaluation settings (before any model is loaded)."""
    for flag, value in (("--target", ns.target), ("--glide", ns.glide), ("--tokenizer", ns.tokenizer)):
        if problem := model_location_problem(value):
            parser.error(f"{flag}: {problem}")
    for path in ns.data or ():
        if not Path(path).exists():
            parser.error(f"--data: {path!r} does not exist")
    vanilla_log = ns.compare_vanilla and Path(ns.compare_vanilla) / "training_log.json"
    if vanilla_log and not vanilla_log.is_file():
        parser.error(f"--compare-vanilla: {str(vanilla_log)!r} is not a file")
    if ns.regenerate and ns.dataset is None:
        parser.error("--regenerate needs --dataset (prompts come from its examples)")
    if ns.eval_fraction is not None and not 0 <= ns.eval_fraction < 1:
        parser.error(f"--eval-fraction must lie in [0, 1), got {ns.eval_fraction}")
    for flag, least in {"--eval-examples": 0, "--eval-windows": 1, "--eval-prompts": 0, "--eval-new-tokens": 1}.items():
        value = getattr(ns, flag[2:].replace("-", "_"))
        if value is not None and value < least:
            parser.error(f"{flag} must be an int >= {least}, got {value}")
    if ns.eval_every and ns.eval_fraction is None and ns.eval_examples is None:
        ns.eval_fraction = 0.05  # a twentieth of the data: a few hundred examples of a typical fine-tuning set
    if (ns.eval_fraction or ns.eval_examples) and not ns.eval_every:
        parser.error("--eval-fraction / --eval-examples hold data out for --eval-every N (a positive number of steps)")


def _documents_stream(documents: list[list[int]], eos_token_id: int | None) -> torch.Tensor:
    """Documents joined by eos (a regenerated reply that ended with its own eos is not given a second one)."""
    trimmed = [d[:-1] if eos_token_id is not None and d and d[-1] == eos_token_id else d for d in documents]
    return token_stream([d for d in trimmed if d], eos_token_id)


def dataset_inputs(ns, target, tokenizer, regen: RegenerationArguments) -> tuple:
    """``--dataset`` as ``(training stream, held-out stream or None, held-out prompts, extra log)``."""
    examples = load_examples(ns.dataset, ns.split)
    column = detect_column(examples, ns.text_column, ns.messages_column)
    train, held = heldout_split(len(examples), ns.eval_fraction or 0.0, ns.eval_examples or 0, ns.seed)
    train, held = examples.select(train), examples.select(held)
    data = {"dataset": ns.dataset, "column": column.name, "kind": column.kind}
    extra = {"data": {**data, "train_examples": len(train), "heldout_examples": len(held)}}
    if ns.regenerate:
        if getattr(target, "hf_device_map", None) is None:
            target.to(PartialState().device)  # the target writes on the accelerator, not where from_pretrained left it
        prompts = regeneration_prompts(train, column, tokenizer, regen)
        records = regenerate(target, tokenizer, prompts, ns.output_dir, regen, progress_bar=ns.progress_bar)
        documents = [r["prompt_ids"] + r["response_ids"] for r in records]
        extra["regeneration"] = {**vars(regen), "kind": column.kind, "examples": len(records)}
    else:
        documents = tokenize_texts(tokenizer, render_texts(train, column, tokenizer))
    heldout, prompts = None, []
    if len(held):
        texts = render_texts(held, column, tokenizer)
        heldout = _documents_stream(tokenize_texts(tokenizer, texts), tokenizer.eos_token_id)
        prompts = regeneration_prompts(held, column, tokenizer, regen)[: ns.eval_prompts]
    return _documents_stream(documents, tokenizer.eos_token_id), heldout, prompts, extra


def files_inputs(ns, seq_len: int) -> tuple:
    """``--data`` files as :func:`dataset_inputs`' four; with ``--eval-fraction`` the stream's tail is held out (its
    windows' first halves are the prompts)."""
    stream = load_data(ns.data, ns.tokenizer or ns.target)
    held = round(stream.numel() * (ns.eval_fraction or 0.0))
    heldout = stream[stream.numel() - held :] if held else None
    prompts = []
    if heldout is not None and heldout.numel() >= 4:
        windows = heldout_windows(heldout, seq_len, ns.eval_prompts or 1)
        prompts = [w[: max(1, w.numel() // 2)].tolist() for w in windows][: ns.eval_prompts]
    return stream[: stream.numel() - held], heldout, prompts, {}


def _vanilla_twin(parser, path: str | None) -> dict:
    """``{"vanilla_twin": {"path", "dataset", "eval"}}`` from a vanilla run's ``training_log.json`` (or nothing)."""
    if path is None:
        return {}
    log = json.loads((Path(path) / "training_log.json").read_text())
    if not log.get("eval"):
        parser.error(
            f"--compare-vanilla {path!r}: its training_log.json has no held-out evaluation (train it with --eval-every)"
        )
    if log.get("arguments", {}).get("dataset_name") is None:
        parser.error(f"--compare-vanilla {path!r}: its training_log.json does not say what data it was trained on")
    return {"vanilla_twin": {"path": str(path), "dataset": log["arguments"]["dataset_name"], "eval": log["eval"]}}


def _load_models(parser, ns, seed: int):
    """The target (in its checkpoint's dtype) and GLIDE (``--glide``, or a fresh one shaped by the flags)."""
    from ..configuration_glide import GlideConfig
    from ..modeling_glide import GlideForCausalLM

    def load(flag: str, what: str, name: str, load_model, **kwargs):
        try:
            return load_model(name, **kwargs)
        except (OSError, ValueError) as error:
            parser.error(f"{flag}: cannot load {what} from {name!r}: {str(error).splitlines()[0]}")

    target = load("--target", "a causal LM", ns.target, AutoModelForCausalLM.from_pretrained, dtype="auto")
    if ns.glide:
        return target, load("--glide", "a GLIDE checkpoint", ns.glide, GlideForCausalLM.from_pretrained)
    torch.manual_seed(seed)
    if ns.assistant_layout and not ns.state_input:
        parser.error("--assistant-layout needs --state-input (the layout's draft reads the target's state)")
    config = GlideConfig.from_target_config(
        target.config,
        num_hidden_layers=ns.num_layers,
        hidden_size=ns.hidden_size,
        cross_attention=not ns.vanilla,
        target_name_or_path=ns.target,
        state_input=ns.state_input,
        self_attention=not ns.assistant_layout,
    )
    return target, GlideForCausalLM(config)


def _evaluation(ns, args, glide, heldout, prompts, tokenizer) -> HeldOutEvaluation | None:
    """The held-out evaluation ``train_glide`` runs every ``--eval-every`` steps (`None` without it)."""
    if not args.eval_every:
        return None
    heldout = heldout if heldout is not None else torch.zeros(0, dtype=torch.long)
    eos = tokenizer.eos_token_id if tokenizer is not None else glide.config.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer is not None else None
    windows = heldout_windows(heldout, args.seq_len, ns.eval_windows)
    block_size = args.block_size or glide.config.block_size
    return HeldOutEvaluation(windows, prompts, block_size, ns.eval_new_tokens, eos, pad)


def main(argv: list[str] | None = None, custom_generate=None) -> int:
    """``hf-specdraft train-glide``: load the target and the data, train (resuming if it can), write the checkpoint
    (with ``custom_generate/`` when given its writer, as :func:`~.trainer.train_glide` takes it: the command passes
    CAPE's)."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    _check_flags(parser, ns)
    fields = set(GlideTrainingArguments.__dataclass_fields__)
    try:  # the dataclasses' ValueError as a one-line argparse error
        args = GlideTrainingArguments(
            **{k: v for k, v in vars(ns).items() if k in fields} | {"dataset_name": ns.dataset_name or ns.dataset}
        )
        regen = {k.removeprefix("regen_"): v for k, v in vars(ns).items() if k.startswith("regen_")}
        regen = RegenerationArguments(**regen, seed=ns.seed)
    except ValueError as error:
        parser.error(str(error))
    vanilla = _vanilla_twin(parser, ns.compare_vanilla)
    target, glide = _load_models(parser, ns, args.seed)
    try:
        tokenizer = AutoTokenizer.from_pretrained(ns.tokenizer or ns.target)
    except (OSError, ValueError):
        if ns.dataset is not None:
            raise
        tokenizer = None  # --data token files need none
    inputs = dataset_inputs(ns, target, tokenizer, regen) if ns.dataset is not None else files_inputs(ns, args.seq_len)
    stream, heldout, prompts, extra = inputs
    log = train_glide(
        target,
        glide,
        stream,
        args,
        evaluation=_evaluation(ns, args, glide, heldout, prompts, tokenizer),
        extra_log={**extra, **vanilla},
        custom_generate=custom_generate,
    )
    if log["steps"] and PartialState().is_main_process:
        last = log["steps"][-1]
        scores = ", ".join(f"{k} {v}" for k, v in log.get("eval", {}).items() if k != "step")
        print(
            f"GLIDE trained: {last['step']} steps, final loss {last['loss']}"
            f"{', held-out ' + scores if scores else ''}, saved to {args.output_dir}"
        )
    return 0
