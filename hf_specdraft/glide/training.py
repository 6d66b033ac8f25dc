"""Train GLIDE against a frozen target (GLIDE §4.1 "Block-wise Attention Mask", Appendices A and B).

Each step the frozen target runs once over whole training windows and its KV cache becomes the memory
the draft's cross-attention reads; the block-wise mask (block length L = 5) lets a token see only the
target KV of earlier blocks, simulating at training time the KV-cache delay of inference (§4.1). The loss
is next-token cross-entropy, optionally mixed with distillation from the target's logits (Appendix B; the
paper used sequence-level distillation, this is its cheaper token-level form: the target forward already
produces the logits). Only GLIDE's parameters are optimised: AdamW, warmup + cosine decay, gradient
accumulation, bf16 mixed precision on GPU, any number of processes through 🤗 accelerate.

    # one process (CPU or one GPU)
    hf-specdraft train-glide --target meta-llama/Llama-3.2-1B --data corpus.txt --output-dir glide-llama --max-steps 2000
    # several processes / GPUs: the same command under accelerate
    accelerate launch --num_processes 8 -m hf_specdraft.glide.training --target ... --data ... --output-dir ...
    # several CPU processes (gloo). accelerate 1.x's `--cpu --num_processes N` starts ONE process unless
    # mpirun is set up; the torchrun launcher with ACCELERATE_USE_CPU starts N:
    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 -m hf_specdraft.glide.training ...

Large targets (Appendix A: 7B/13B targets with DeepSpeed ZeRO-2 on 8 GPUs, 33B with ZeRO-3 on 16). Not
tested here (no GPU was available); what to configure:

* ZeRO-2 — ``accelerate config`` → DeepSpeed, ``zero_stage: 2``, ``mixed_precision: bf16``. It shards
  GLIDE's optimizer state and gradients. The frozen target is not passed to ``accelerator.prepare``:
  every process holds its own bf16 copy (load it with ``dtype=torch.bfloat16``; 7B/13B fit one GPU).
* Targets that do not fit one GPU — either one process with the target loaded by
  ``device_map="auto"`` (``train_glide`` leaves a model that has an ``hf_device_map`` where it is; tested with a
  target spread over CPU and disk, ``tests/test_device_map.py``), or
  FSDP (``distributed_type: FSDP``, ``fsdp_sharding_strategy: FULL_SHARD``) with the target wrapped by
  your own code before calling ``train_glide``. GLIDE itself is small: plain data parallelism suffices.
  A target split by tensor parallelism (``tp_plan``) is refused: each rank's cache holds only its share of the KV
  heads; train against the ``device_map`` target and load the trained GLIDE with ``tp_plan="auto"`` to decode.
* The target forward dominates the training cost (Appendix F), not GLIDE.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from accelerate import Accelerator, PartialState
from tqdm.auto import tqdm
from transformers import DynamicCache, PreTrainedModel, get_cosine_with_min_lr_schedule_with_warmup

from .model_card import check_license, save_glide_checkpoint

TEXT_SUFFIXES = (".txt", ".md", ".py", ".rst")


@dataclass
class GlideTrainingArguments:
    """How to train GLIDE (defaults follow Appendix A where it says; batch sizes are per process).

    Args:
        output_dir: where the checkpoint (:func:`save_glide_checkpoint`: model card and CAPE's ``custom_generate/``
            included) and ``training_log.json`` go.
        max_steps: optimizer steps; windows are drawn at random from the data.
        seq_len: tokens per training window.
        per_device_batch_size: windows per process per micro-batch.
        gradient_accumulation_steps: micro-batches per optimizer step (Appendix A: effective batch 64).
        learning_rate: peak AdamW learning rate (Appendix A: 5e-4).
        weight_decay: AdamW weight decay on matrices.
        warmup_steps: linear warmup before the cosine decay.
        min_lr_ratio: the cosine decays to ``min_lr_ratio * learning_rate``.
        max_grad_norm: gradient clipping.
        block_size: L of the block-wise mask; `None` uses ``glide.config.block_size`` (5, §4.1).
        distillation_weight: weight of KL(p_target || q_glide) against cross-entropy (Appendix B); 0 = off.
        distillation_temperature: temperature of both distributions in the KL term.
        mixed_precision: ``"auto"`` (bf16 on CUDA, none on CPU), ``"no"``, ``"bf16"`` or ``"fp16"``.
        seed: data order and initialisation seed (each process offsets it by its rank).
        logging_steps: log every this many steps.
        progress_bar: show tqdm on the main process.
        dataset_name: what the data is, for the model card (a Hub dataset id or a description).
        license: the weights' license for the model card, a Hub license id (e.g. ``"apache-2.0"``); `None` = none.
        push_to_hub: upload the checkpoint and card to ``hub_model_id`` after training.
        hub_model_id: ``"user/repo"`` to push to.
    """

    output_dir: str
    max_steps: int = 1000
    seq_len: int = 256
    per_device_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    learning_rate: float = 5e-4
    weight_decay: float = 0.0
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1
    max_grad_norm: float = 1.0
    block_size: int | None = None
    distillation_weight: float = 0.0
    distillation_temperature: float = 1.0
    mixed_precision: str = "auto"
    seed: int = 0
    logging_steps: int = 10
    progress_bar: bool = True
    dataset_name: str | None = None
    license: str | None = None
    push_to_hub: bool = False
    hub_model_id: str | None = None

    def __post_init__(self):
        if not self.output_dir:
            raise ValueError("output_dir must be a non-empty path")
        for name in ("max_steps", "seq_len", "per_device_batch_size", "gradient_accumulation_steps", "logging_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.seq_len < 2:
            raise ValueError(f"seq_len must be at least 2 (a token and its successor), got {self.seq_len}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.warmup_steps < 0 or self.weight_decay < 0 or self.max_grad_norm <= 0:
            raise ValueError("warmup_steps and weight_decay must be >= 0 and max_grad_norm > 0")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must lie in [0, 1], got {self.min_lr_ratio}")
        if self.block_size is not None and (not isinstance(self.block_size, int) or self.block_size < 1):
            raise ValueError(f"block_size must be None or a positive int, got {self.block_size!r}")
        if not 0.0 <= self.distillation_weight <= 1.0:
            raise ValueError(f"distillation_weight must lie in [0, 1], got {self.distillation_weight}")
        if self.distillation_temperature <= 0:
            raise ValueError(f"distillation_temperature must be > 0, got {self.distillation_temperature}")
        if self.mixed_precision not in ("auto", "no", "bf16", "fp16"):
            raise ValueError(f"mixed_precision must be 'auto', 'no', 'bf16' or 'fp16', got {self.mixed_precision!r}")
        check_license(self.license)  # here, not after training, where the card is written
        if self.push_to_hub and not self.hub_model_id:
            raise ValueError("push_to_hub=True needs hub_model_id='user/repo'")


def token_stream(data, eos_token_id: int | None = None) -> torch.Tensor:
    """Training data as one 1-D LongTensor of token ids (documents joined by eos when there is one).

    Args:
        data: a 1-D tensor (already a stream), a 2-D tensor `(N, T)` (rows joined), a sequence of token-id
            sequences, or a mapping / 🤗 ``datasets.Dataset`` with an ``"input_ids"`` column.
    """
    if not isinstance(data, torch.Tensor) and hasattr(data, "__getitem__") and not isinstance(data, Sequence):
        try:
            data = data["input_ids"]
        except (KeyError, TypeError, IndexError) as error:
            raise TypeError(f"data has no 'input_ids' column: {error}") from error
    if isinstance(data, torch.Tensor):
        if data.dim() not in (1, 2) or data.is_floating_point():
            raise ValueError(f"data must be an integer tensor of shape (T,) or (N, T), got {data.dtype} {tuple(data.shape)}")
        return data.reshape(-1).long()
    if isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        pieces = []
        for document in data:
            pieces.append(torch.as_tensor(list(document), dtype=torch.long))
            if eos_token_id is not None:
                pieces.append(torch.tensor([eos_token_id]))
        if not pieces:
            raise ValueError("data is empty")
        return torch.cat(pieces)
    raise TypeError(f"data must be a token-id tensor, a sequence of token-id sequences or a dataset with input_ids, got {type(data).__name__}")


def sample_windows(stream: torch.Tensor, batch_size: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
    """``(batch_size, seq_len)`` random windows of ``stream``."""
    starts = torch.randint(0, stream.numel() - seq_len + 1, (batch_size,), generator=generator)
    return torch.stack([stream[s : s + seq_len] for s in starts.tolist()])


@torch.no_grad()
def target_memory(target: PreTrainedModel, input_ids: torch.Tensor, with_logits: bool):
    """Run the frozen target over whole windows: its per-layer ``(keys, values)`` and, optionally, logits.

    Returns:
        `(kv, logits)`: ``kv[l]`` = ``(keys, values)`` `(B, kv_heads, T, head_dim)` of target layer l (post-RoPE,
        exactly what the cache holds at inference), and `(B, T, V)` logits or `None`.
    """
    cache = DynamicCache(config=target.config)
    cache.activate_past_recording()  # sliding-window layers keep every position, as in assisted decoding
    outputs = target(input_ids=input_ids, past_key_values=cache, use_cache=True, logits_to_keep=0 if with_logits else 1)
    kv = tuple((getattr(layer, "keys", None), getattr(layer, "values", None)) for layer in cache.layers)
    return kv, outputs.logits if with_logits else None


def glide_loss(glide, input_ids, kv, target_logits, block_size: int, args: GlideTrainingArguments) -> tuple[torch.Tensor, dict]:
    """Next-token cross-entropy with the block-wise mask (§4.1), mixed with token-level distillation (Appendix B)."""
    outputs = glide(input_ids=input_ids, labels=input_ids, target_past_key_values=kv, cross_attention_block_size=block_size, use_cache=False)
    parts = {"ce": outputs.loss.detach()}
    if target_logits is None:
        return outputs.loss, parts
    tau = args.distillation_temperature
    log_q = torch.log_softmax(outputs.logits[:, :-1].float() / tau, dim=-1)
    log_p = torch.log_softmax(target_logits[:, :-1].float() / tau, dim=-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1).mean() * tau**2
    parts["kl"] = kl.detach()
    w = args.distillation_weight
    return (1 - w) * outputs.loss + w * kl, parts


def _check_pair(target: PreTrainedModel, glide: PreTrainedModel) -> None:
    if not isinstance(target, PreTrainedModel):
        raise TypeError(f"target must be a transformers PreTrainedModel, got {type(target).__name__}")
    if not isinstance(glide, PreTrainedModel) or getattr(glide.config, "model_type", None) != "glide":
        raise TypeError(f"glide must be a GLIDE model (config.model_type 'glide'), got {type(glide).__name__}")
    problems = glide.config.target_mismatches(target.config)
    if problems:
        raise ValueError("glide was built for a different target:\n  " + "\n  ".join(problems))
    if (getattr(target, "tp_size", None) or 1) > 1:
        raise ValueError(
            f"target is split over {target.tp_size} ranks by tensor parallelism (tp_plan): train_glide reads the whole target "
            "cache in one process. Load the target unsplit, spread over the devices of one process with device_map='auto' "
            "(GPUs, CPU, disk: accelerate's max_memory and offload_folder), train there, then load the trained GLIDE with "
            "tp_plan='auto' beside the split target for decoding (docs/multi-gpu.md)"
        )


def _setup(target, glide, args: GlideTrainingArguments):
    precision = ("bf16" if torch.cuda.is_available() else "no") if args.mixed_precision == "auto" else args.mixed_precision
    accelerator = Accelerator(mixed_precision=precision, gradient_accumulation_steps=args.gradient_accumulation_steps)
    target.eval().requires_grad_(False)
    if getattr(target, "hf_device_map", None) is None:
        target.to(accelerator.device)
    decay = [p for p in glide.parameters() if p.ndim >= 2]
    no_decay = [p for p in glide.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=args.learning_rate
    )
    scheduler = get_cosine_with_min_lr_schedule_with_warmup(optimizer, args.warmup_steps, args.max_steps, min_lr_rate=args.min_lr_ratio)
    glide.train()
    model, optimizer, scheduler = accelerator.prepare(glide, optimizer, scheduler)
    return accelerator, model, optimizer, scheduler


def train_glide(target: PreTrainedModel, glide: PreTrainedModel, data, args: GlideTrainingArguments, metrics: dict | None = None) -> dict:
    """Train ``glide`` in place against the frozen ``target`` and write a checkpoint to ``args.output_dir``.

    Args:
        target: the frozen target LM whose KV cache GLIDE reads (never updated; set to eval mode, no gradients,
            and moved to the accelerator's device for training unless it has an ``hf_device_map``). Both ``target`` and
            ``glide`` are moved back to the devices they were on when training ends.
        glide: a GLIDE model built for ``target`` (``GlideConfig.from_target_config``); the vanilla drafter
            (``cross_attention=False``) trains the same way without needing target KV.
        data: token ids (see :func:`token_stream`).
        args: :class:`GlideTrainingArguments`.
        metrics: measured results to put in the model card (e.g. ``{"acceptance_rate": 0.62, "speedup": 1.9}``).

    Returns:
        the training log (also ``output_dir/training_log.json``): per-step loss / lr / tokens, timing, arguments.
    """
    _check_pair(target, glide)
    if not isinstance(args, GlideTrainingArguments):
        raise TypeError(f"args must be a GlideTrainingArguments, got {type(args).__name__}")
    stream = token_stream(data, glide.config.eos_token_id if isinstance(glide.config.eos_token_id, int) else None)
    if stream.numel() < args.seq_len:
        raise ValueError(f"data holds {stream.numel()} tokens, fewer than seq_len={args.seq_len}")
    if int(stream.max()) >= glide.config.vocab_size or int(stream.min()) < 0:
        raise ValueError(f"data has token ids outside the target's vocabulary [0, {glide.config.vocab_size})")
    block_size = args.block_size or glide.config.block_size
    devices = [(m, m.device) for m in (target, glide) if getattr(m, "hf_device_map", None) is None]  # where the caller put them
    accelerator, model, optimizer, scheduler = _setup(target, glide, args)
    distill = args.distillation_weight > 0
    needs_target = glide.config.cross_attention or distill
    generator = torch.Generator().manual_seed(args.seed + 1000 * accelerator.process_index)
    steps, tokens, start = [], 0, time.time()
    bar = tqdm(range(1, args.max_steps + 1), desc="train GLIDE", disable=not (args.progress_bar and accelerator.is_main_process))
    for step in bar:
        totals = {}
        for _ in range(args.gradient_accumulation_steps):
            batch = sample_windows(stream, args.per_device_batch_size, args.seq_len, generator).to(accelerator.device)
            kv, logits = target_memory(target, batch, distill) if needs_target else (None, None)
            with accelerator.accumulate(model):
                loss, parts = glide_loss(model, batch, kv, logits, block_size, args)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            for name, value in {"loss": loss.detach(), **parts}.items():
                totals[name] = totals.get(name, 0.0) + float(accelerator.gather(value[None]).mean()) / args.gradient_accumulation_steps
            tokens += batch.numel() * accelerator.num_processes
        bar.set_postfix(loss=f"{totals['loss']:.3f}")
        if step % args.logging_steps == 0 or step in (1, args.max_steps):
            steps.append({"step": step, **{k: round(v, 4) for k, v in totals.items()}, "lr": scheduler.get_last_lr()[0],
                          "tokens": tokens, "seconds": round(time.time() - start, 2)})
    accelerator.wait_for_everyone()
    log = {"steps": steps, "train_seconds": round(time.time() - start, 2), "processes": accelerator.num_processes,
           "mixed_precision": accelerator.mixed_precision, "arguments": asdict(args), "train_tokens_available": int(stream.numel())}
    if accelerator.is_main_process:
        save_checkpoint(accelerator.unwrap_model(model), target, log, args, metrics)
    accelerator.wait_for_everyone()
    for module, device in devices:  # accelerate trained on its device (a visible GPU): hand both back where they came from
        module.to(device)
    glide.eval()
    return log


def save_checkpoint(glide, target, log: dict, args: GlideTrainingArguments, metrics: dict | None) -> None:
    """Write the Hub-ready checkpoint (:func:`save_glide_checkpoint`: weights, trust_remote_code files, ``README.md``,
    CAPE's ``custom_generate/``) and ``training_log.json``; push if asked."""
    output_dir = Path(args.output_dir)
    base_model = getattr(target.config, "_name_or_path", None) or glide.config.target_name_or_path
    card_info = {"dataset": args.dataset_name, "metrics": metrics, "training_log": log, "repo_id": args.hub_model_id,
                 "license": args.license}
    save_glide_checkpoint(glide, output_dir, target_name=base_model, card_info=card_info)
    (output_dir / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
    if args.push_to_hub:
        from huggingface_hub import HfApi

        api = HfApi()
        api.create_repo(args.hub_model_id, exist_ok=True)
        api.upload_folder(repo_id=args.hub_model_id, folder_path=str(output_dir), commit_message="Upload GLIDE draft model")


def load_data(paths: list[str], tokenizer_path: str | None) -> torch.Tensor:
    """Token ids from files: ``.safetensors`` / ``.pt`` tensors (``input_ids`` or the only tensor), or text
    files / directories of text files tokenized with the target's tokenizer."""
    tensors, texts = [], []
    for path in map(Path, paths):
        if not path.exists():
            raise ValueError(f"--data {path} does not exist")
        files = sorted(p for p in path.rglob("*") if p.suffix in TEXT_SUFFIXES) if path.is_dir() else [path]
        for file in files:
            if file.suffix == ".safetensors":
                from safetensors.torch import load_file

                loaded = load_file(file)
                tensors.append(loaded["input_ids"] if "input_ids" in loaded else next(iter(loaded.values())))
            elif file.suffix == ".pt":
                tensors.append(torch.load(file, weights_only=True))
            else:
                texts.append(file.read_text(encoding="utf-8", errors="replace"))
    if texts:
        from transformers import AutoTokenizer

        if tokenizer_path is None:
            raise ValueError("--data has text files: pass --tokenizer (defaults to --target)")
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
        tensors.append(token_stream(ids, tokenizer.eos_token_id))
    if not tensors:
        raise ValueError(f"--data {paths} holds no token files or text files ({', '.join(TEXT_SUFFIXES)})")
    return torch.cat([token_stream(t) for t in tensors])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-specdraft train-glide", description="Train a GLIDE draft model against a frozen target.")
    parser.add_argument("--target", required=True, help="target model: Hub id or local directory")
    parser.add_argument("--data", required=True, nargs="+", help="token files (.safetensors/.pt) or text files / directories")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--tokenizer", help="tokenizer for text data (default: --target)")
    parser.add_argument("--glide", help="start from this GLIDE checkpoint instead of a fresh model")
    parser.add_argument("--num-layers", type=int, default=1, help="N_D (Appendix E: 1 up to 13B targets)")
    parser.add_argument("--hidden-size", type=int, help="d_D (default: the target's hidden size)")
    parser.add_argument("--vanilla", action="store_true", help="train the vanilla drafter (no cross-attention)")
    parser.add_argument("--target-dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    defaults = GlideTrainingArguments(output_dir=".")
    for name, flag in (("max_steps", "--max-steps"), ("seq_len", "--seq-len"), ("per_device_batch_size", "--batch-size"),
                       ("gradient_accumulation_steps", "--grad-accum"), ("warmup_steps", "--warmup-steps"), ("seed", "--seed"),
                       ("logging_steps", "--logging-steps")):
        parser.add_argument(flag, dest=name, type=int, default=getattr(defaults, name))
    for name, flag in (("learning_rate", "--lr"), ("weight_decay", "--weight-decay"), ("min_lr_ratio", "--min-lr-ratio"),
                       ("distillation_weight", "--distillation-weight"), ("distillation_temperature", "--distillation-temperature")):
        parser.add_argument(flag, dest=name, type=float, default=getattr(defaults, name))
    parser.add_argument("--block-size", dest="block_size", type=int, help="block-wise mask L (default: the config's, 5)")
    parser.add_argument("--mixed-precision", default="auto", choices=["auto", "no", "bf16", "fp16"])
    parser.add_argument("--dataset-name", help="what the data is, for the model card")
    parser.add_argument("--license", help="the weights' license for the model card, a Hub license id such as apache-2.0")
    parser.add_argument("--metrics", help="JSON file of measured metrics for the model card")
    parser.add_argument("--push-to-hub", action="store_true")
    parser.add_argument("--hub-model-id")
    parser.add_argument("--no-progress", dest="progress_bar", action="store_false")
    return parser


def model_location_problem(value: str | None) -> str | None:
    """Why ``value`` can be neither a local checkpoint directory nor a Hub repo id (``None`` when it may be one)."""
    if value is None or Path(value).expanduser().is_dir():
        return None
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    local = value.startswith((".", "/", "~")) or Path(value).expanduser().exists()
    if not local:
        try:
            validate_repo_id(value)
            return None
        except HFValidationError:
            pass
    return f"{value!r} is not a directory (and not a Hub repo id like 'namespace/name')"


def main(argv: list[str] | None = None) -> int:
    """``hf-specdraft train-glide``: load the target, build or load GLIDE, train, write the checkpoint."""
    from transformers import AutoModelForCausalLM

    from .configuration_glide import GlideConfig
    from .modeling_glide import GlideForCausalLM

    parser = build_parser()
    ns = parser.parse_args(argv)
    for flag, value in (("--target", ns.target), ("--glide", ns.glide), ("--tokenizer", ns.tokenizer)):
        problem = model_location_problem(value)
        if problem:
            parser.error(f"{flag}: {problem}")
    for path in ns.data:
        if not Path(path).exists():
            parser.error(f"--data: {path!r} does not exist")
    if ns.metrics and not Path(ns.metrics).is_file():
        parser.error(f"--metrics: {ns.metrics!r} is not a file")
    arg_names = set(GlideTrainingArguments.__dataclass_fields__)
    args = GlideTrainingArguments(**{k: v for k, v in vars(ns).items() if k in arg_names})
    dtype = "auto" if ns.target_dtype == "auto" else getattr(torch, ns.target_dtype)
    try:
        target = AutoModelForCausalLM.from_pretrained(ns.target, dtype=dtype)
    except (OSError, ValueError) as error:
        parser.error(f"--target: cannot load a causal LM from {ns.target!r}: {str(error).splitlines()[0]}")
    if ns.glide:
        try:
            glide = GlideForCausalLM.from_pretrained(ns.glide)
        except (OSError, ValueError) as error:
            parser.error(f"--glide: cannot load a GLIDE checkpoint from {ns.glide!r}: {str(error).splitlines()[0]}")
    else:
        torch.manual_seed(args.seed)
        config = GlideConfig.from_target_config(target.config, num_hidden_layers=ns.num_layers, hidden_size=ns.hidden_size,
                                                cross_attention=not ns.vanilla, target_name_or_path=ns.target)
        glide = GlideForCausalLM(config)
    data = load_data(ns.data, ns.tokenizer or ns.target)
    metrics = json.loads(Path(ns.metrics).read_text()) if ns.metrics else None
    log = train_glide(target, glide, data, args, metrics=metrics)
    if log["steps"] and PartialState().is_main_process:
        print(f"GLIDE trained: {log['steps'][-1]['step']} steps, final loss {log['steps'][-1]['loss']}, saved to {args.output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
