"""Train GLIDE against a frozen target (GLIDE §4.1 "Block-wise Attention Mask", Appendices A and B).

The loss is :mod:`.objective`'s; a precomputed store (:class:`~.store.StoreWindows`) can stand in for the target.
Only GLIDE's parameters are optimised (AdamW, warmup + cosine decay, any number of processes through 🤗 accelerate);
``checkpoint-last/`` is what a restarted run continues from. Large targets and tensor parallelism: docs/multi-gpu.md.

    accelerate launch --num_processes 8 -m hf_specdraft train-glide --target ... --data ... --output-dir ...
    # on CPUs: ACCELERATE_USE_CPU=1 and --multi_gpu (accelerate 1.x's `--cpu --num_processes N` starts ONE process)
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import LoggerType
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm
from transformers import PreTrainedModel, get_cosine_with_min_lr_schedule_with_warmup

from ...core.validation import check_int, is_int
from ..model_card import check_license, push_checkpoint, save_glide_checkpoint
from .objective import glide_loss, window_source

TRACKERS = tuple(t.value for t in LoggerType if t != LoggerType.ALL)
CHECKPOINT = "checkpoint-last"  # OUTPUT_DIR/checkpoint-last: the state a restarted run continues from


@dataclass
class GlideTrainingArguments:
    """How to train GLIDE (defaults follow Appendix A where it says; batch sizes are per process)."""

    output_dir: str  # the checkpoint (model card included), training_log.json and checkpoint-last/
    max_steps: int = 1000  # optimizer steps; windows are drawn at random from the data
    seq_len: int = 256  # tokens per training window
    per_device_batch_size: int = 8  # windows per process per micro-batch
    gradient_accumulation_steps: int = 1  # micro-batches per optimizer step (Appendix A: effective batch 64)
    learning_rate: float = 5e-4  # peak AdamW learning rate (Appendix A)
    weight_decay: float = 0.0  # AdamW weight decay on matrices
    warmup_steps: int = 50  # linear warmup before the cosine decay
    min_lr_ratio: float = 0.1  # the cosine decays to min_lr_ratio * learning_rate
    max_grad_norm: float = 1.0  # gradient clipping
    # L of the block-wise mask (None: glide.config.block_size, §4.1); a tuple cycles L by step
    block_size: int | tuple[int, ...] | None = None
    distillation_weight: float = 0.0  # weight of KL(p || q) against cross-entropy (Appendix B); 0 = off, 1 = p alone
    distillation_temperature: float = 1.0  # temperature of both distributions in the KL term
    unrolled_steps: int | None = None  # draft steps trained per position (.unrolled); None: 2 with state_input, else 1
    mixed_precision: str = "auto"  # "auto" (bf16 on CUDA, none on CPU), "no", "bf16" or "fp16"
    seed: int = 0  # data order and initialisation seed (each process offsets it by its rank)
    logging_steps: int = 10
    # write checkpoint-last (what a killed run resumes from) every this many steps (0 = never): a kill loses at most
    # this many steps; each save writes GLIDE and AdamW's two moments
    save_steps: int = 500
    resume: bool | None = None  # None: from checkpoint-last if there is one; True: one is required; False: start over
    eval_every: int = 0  # run the held-out evaluation every this many steps and at the end (0 = never)
    report_to: str = "none"  # "none", "all" (every installed tracker) or comma-separated names among TRACKERS
    progress_bar: bool = True  # tqdm on the main process
    dataset_name: str | None = None  # what the data is, for the model card (a Hub dataset id or a description)
    license: str | None = None  # the weights' license for the model card, a Hub license id (e.g. "apache-2.0")
    push_to_hub: bool = False  # upload the checkpoint and card to hub_model_id ("user/repo") after training
    hub_model_id: str | None = None

    def __post_init__(self):
        if not self.output_dir:
            raise ValueError("output_dir must be a non-empty path")
        for name in ("max_steps", "per_device_batch_size", "logging_steps", "gradient_accumulation_steps"):
            check_int(name, getattr(self, name))
        check_int("save_steps", self.save_steps, 0, what="0 = never")
        check_int("eval_every", self.eval_every, 0, what="0 = never")
        check_int("seed", self.seed, 0)
        check_int("seq_len", self.seq_len, 2, what="a token and its successor")
        for rule, names, valid in (
            ("be > 0", "learning_rate max_grad_norm distillation_temperature", lambda v: v > 0),
            ("be >= 0", "warmup_steps weight_decay", lambda v: v >= 0),
            ("lie in [0, 1]", "min_lr_ratio distillation_weight", lambda v: 0 <= v <= 1),
        ):
            for name in names.split():
                if not valid(getattr(self, name)):
                    raise ValueError(f"{name} must {rule}, got {getattr(self, name)}")
        if isinstance(self.block_size, list):
            self.block_size = tuple(self.block_size)
        sizes = self.block_sizes(1)
        if not (isinstance(sizes, tuple) and sizes and all(is_int(s) and s >= 1 for s in sizes)):
            raise ValueError(
                f"block_size must be None, a positive int or a non-empty tuple of them, got {self.block_size!r}"
            )
        if self.unrolled_steps is not None and not (is_int(self.unrolled_steps) and 1 <= self.unrolled_steps <= 8):
            raise ValueError(f"unrolled_steps must be None or an int in [1, 8], got {self.unrolled_steps!r}")
        if self.mixed_precision not in ("auto", "no", "bf16", "fp16"):
            raise ValueError(f"mixed_precision must be 'auto', 'no', 'bf16' or 'fp16', got {self.mixed_precision!r}")
        if self.report_to not in ("none", "all") and not set(self.trackers) <= set(TRACKERS):
            raise ValueError(f"report_to must be 'none', 'all' or names among {list(TRACKERS)}, got {self.report_to!r}")
        if self.resume not in (None, True, False):
            raise ValueError(f"resume must be None (when there is a checkpoint), True or False, got {self.resume!r}")
        check_license(self.license)  # here, not after training, where the card is written
        if self.push_to_hub and not self.hub_model_id:
            raise ValueError("push_to_hub=True needs hub_model_id='user/repo'")

    def block_sizes(self, config_block_size: int) -> tuple[int, ...]:
        """The block-wise mask's L for each step in turn (step s takes ``[s % len]``); ``config_block_size`` if none."""
        if self.block_size is None:
            return (config_block_size,)
        return (self.block_size,) if isinstance(self.block_size, int) else self.block_size

    def trajectory(self) -> dict:
        """The arguments that decide the trained weights (not where they go, how often they are logged or saved): a run
        resumes only a state written under the same ones."""
        aside = (
            "output_dir logging_steps save_steps resume eval_every report_to progress_bar dataset_name license "
            "push_to_hub hub_model_id"
        ).split()
        kept = {k: v for k, v in asdict(self).items() if k not in aside and (k != "unrolled_steps" or v is not None)}
        return json.loads(json.dumps(kept))  # as trainer_state.json holds it

    @property
    def trackers(self):
        """``Accelerator(log_with=...)``: `None`, ``"all"`` or a list of tracker names."""
        names = [name.strip() for name in str(self.report_to).split(",")]
        return {"none": None, "all": "all"}.get(self.report_to, names)


def _check_pair(target: PreTrainedModel, glide: PreTrainedModel) -> None:
    if not isinstance(target, PreTrainedModel):
        raise TypeError(f"target must be a transformers PreTrainedModel, got {type(target).__name__}")
    if not isinstance(glide, PreTrainedModel) or getattr(glide.config, "model_type", None) != "glide":
        raise TypeError(f"glide must be a GLIDE model (config.model_type 'glide'), got {type(glide).__name__}")
    glide.check_target(target)
    if (getattr(target, "tp_size", None) or 1) > 1:
        raise ValueError(
            f"target is split over {target.tp_size} ranks by tensor parallelism (tp_plan): train_glide reads the whole "
            "target cache in one process. Load the target unsplit, spread over the devices of one process with "
            "device_map='auto' (GPUs, CPU, disk: accelerate's max_memory and offload_folder), train there, then load "
            "the trained GLIDE with tp_plan='auto' beside the split target for decoding (docs/multi-gpu.md)"
        )


def _release_precision(precision: str) -> None:
    """Let a second run in one process (a notebook) train at another precision: accelerate keeps one precision per
    process and refuses a new ``Accelerator`` with another. A single process only: a launched run's processes share
    the state accelerate's launcher set up, which stays as it is."""
    held = AcceleratorState._shared_state.get("_mixed_precision")
    if held is not None and str(held) != precision and PartialState().num_processes == 1:
        AcceleratorState._reset_state()


def _setup(target, glide, args: GlideTrainingArguments, resume_from: Path | None):
    """Accelerate's objects, the window sampler and the progress so far (restored from ``resume_from``, if given)."""
    precision = (
        ("bf16" if torch.cuda.is_available() else "no") if args.mixed_precision == "auto" else args.mixed_precision
    )
    logging = {"log_with": args.trackers, "project_dir": str(Path(args.output_dir) / "runs")} if args.trackers else {}
    _release_precision(precision)
    accelerator = Accelerator(
        mixed_precision=precision, gradient_accumulation_steps=args.gradient_accumulation_steps, **logging
    )
    target.eval().requires_grad_(False)
    if getattr(target, "hf_device_map", None) is None:
        target.to(accelerator.device)
    trained = [p for p in glide.parameters() if p.requires_grad]  # a frozen part (e.g. the target's embeddings) stays
    optimizer = torch.optim.AdamW(
        [
            {"params": [p for p in trained if p.ndim >= 2], "weight_decay": args.weight_decay},
            {"params": [p for p in trained if p.ndim < 2], "weight_decay": 0.0},
        ],
        lr=args.learning_rate,
    )
    scheduler = get_cosine_with_min_lr_schedule_with_warmup(
        optimizer, args.warmup_steps, args.max_steps, min_lr_rate=args.min_lr_ratio
    )
    glide.train()
    model, optimizer, scheduler = accelerator.prepare(glide, optimizer, scheduler)
    if args.trackers is not None:
        # trackers take scalars only
        config = {k: v for k, v in asdict(args).items() if isinstance(v, (int, float, str, bool))}
        accelerator.init_trackers("train_glide", config=config)
    generator = torch.Generator().manual_seed(args.seed + 1000 * accelerator.process_index)
    progress = {"step": 0, "tokens": 0, "steps": [], "evaluations": [], "seconds": 0.0}
    if resume_from is not None:
        # what save_training_state wrote, into the prepared objects
        accelerator.load_state(str(resume_from))
        sampler = resume_from / f"sampler_{accelerator.process_index}.safetensors"
        if not sampler.is_file():
            raise ValueError(f"{str(resume_from)!r} was saved by a run with fewer processes: it has no {sampler.name}")
        generator.set_state(load_file(str(sampler))["state"])
        progress = json.loads((resume_from / "trainer_state.json").read_text())
        progress["resumed_from_step"] = progress["step"]
    progress["arguments"] = args.trajectory()
    return accelerator, model, optimizer, scheduler, generator, progress


def save_training_state(
    accelerator: Accelerator, args: GlideTrainingArguments, progress: dict, generator: torch.Generator
) -> None:
    """Write ``output_dir/checkpoint-last``: accelerate's state, each process's window sampler and
    ``trainer_state.json`` (``progress``). Written beside it, then swapped in whole: a kill mid-save keeps the last."""
    final = Path(args.output_dir) / CHECKPOINT
    staging, previous = final.with_name(CHECKPOINT + ".partial"), final.with_name(CHECKPOINT + ".previous")
    accelerator.wait_for_everyone()
    accelerator.save_state(str(staging))
    save_file({"state": generator.get_state()}, str(staging / f"sampler_{accelerator.process_index}.safetensors"))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (staging / "trainer_state.json").write_text(json.dumps(progress, indent=1) + "\n")
        if final.exists():
            os.replace(final, previous)
        os.replace(staging, final)
        shutil.rmtree(previous, ignore_errors=True)
    accelerator.wait_for_everyone()


def _checkpoint_to_resume(args: GlideTrainingArguments) -> Path | None:
    """``checkpoint-last`` (or, after a kill between a save's two renames, ``checkpoint-last.previous``) to resume."""
    final = Path(args.output_dir) / CHECKPOINT
    found = [p for p in (final, final.with_name(CHECKPOINT + ".previous")) if (p / "trainer_state.json").is_file()]
    if args.resume is False or (args.resume is None and not found):
        return None
    if not found:
        raise ValueError(f"resume=True but {str(final)!r} holds no saved training state")
    saved = json.loads((found[0] / "trainer_state.json").read_text()).get("arguments")  # None: an older save
    changed = sorted(k for k, v in args.trajectory().items() if saved is not None and saved.get(k) != v)
    if changed:
        raise ValueError(
            f"{str(found[0])!r} was written with other training arguments ("
            + ", ".join(f"{k}: {saved.get(k)!r} then, {getattr(args, k)!r} now" for k in changed)
            + "): pass resume=False (--no-resume) or another output_dir to start over"
        )
    return found[0]


def train_glide(
    target: PreTrainedModel,
    glide: PreTrainedModel,
    data,
    args: GlideTrainingArguments,
    metrics: dict | None = None,
    evaluation=None,
    extra_log: dict | None = None,
    custom_generate=None,
) -> dict:
    """Train ``glide`` in place against the frozen ``target`` and write a checkpoint to ``args.output_dir``.

    Args:
        target: the frozen target LM whose KV cache GLIDE reads (eval mode, no gradients; moved to the accelerator's
            device unless it has an ``hf_device_map``). Both models go back to their devices when training ends.
        glide: a GLIDE model built for ``target`` (``GlideConfig.from_target_config``); the vanilla drafter
            (``cross_attention=False``) trains the same way without target KV.
        data: token ids (see :func:`~.objective.token_stream`), whose windows the target runs over every step, or a
            window source such as a precomputed store's (:class:`~.store.StoreWindows`).
        args: :class:`GlideTrainingArguments`.
        metrics: measured results for the model card (e.g. ``{"acceptance_rate": 0.62, "speedup": 1.9}``).
        evaluation: called as ``evaluation(target, glide) -> dict`` every ``args.eval_every`` steps and at the end
            (a :class:`~.evaluation.HeldOutEvaluation`); the last result is the log's ``eval`` and goes on the card.
        extra_log: more for ``training_log.json`` and the card (e.g. ``{"regeneration": {...}}``).
        custom_generate (`Callable`, *optional*): the checkpoint's ``custom_generate/`` writer, as
            :func:`save_glide_checkpoint` takes it (``hf_specdraft.write_glide_custom_generate``: CAPE's; `None`: none).

    Returns:
        the training log (also ``output_dir/training_log.json``): per-step loss / lr / tokens, evaluations, timing,
        arguments.
    """
    _check_pair(target, glide)
    if not isinstance(args, GlideTrainingArguments):
        raise TypeError(f"args must be a GlideTrainingArguments, got {type(args).__name__}")
    if evaluation is not None and not callable(evaluation):
        raise TypeError(
            f"evaluation must be callable as evaluation(target, glide) or None, got {type(evaluation).__name__}"
        )
    if args.eval_every and evaluation is None:
        raise ValueError(
            f"eval_every={args.eval_every} needs held-out data: pass evaluation (e.g. a HeldOutEvaluation)"
        )
    source = window_source(data, glide, args.seq_len)
    # where the caller put them
    devices = [(m, m.device) for m in (target, glide) if getattr(m, "hf_device_map", None) is None]
    accelerator, model, optimizer, scheduler, generator, progress = _setup(
        target, glide, args, _checkpoint_to_resume(args)
    )
    progress = _run(accelerator, model, optimizer, scheduler, target, source, generator, args, evaluation, progress)
    log = {
        "steps": progress["steps"],
        "train_seconds": round(progress["seconds"], 2),
        "processes": accelerator.num_processes,
        "mixed_precision": accelerator.mixed_precision,
        "arguments": asdict(args),
        "train_tokens_available": source.tokens,
    }
    if progress["evaluations"]:
        log.update(eval=progress["evaluations"][-1], evaluations=progress["evaluations"])
    if progress.get("resumed_from_step"):
        log["resumed_from_step"] = progress["resumed_from_step"]
    log.update(extra_log or {})
    if accelerator.is_main_process:
        save_checkpoint(accelerator.unwrap_model(model), target, log, args, metrics, custom_generate)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    # accelerate trained on its device (a visible GPU): hand both back where they came from
    for module, device in devices:
        module.to(device)
    glide.eval()
    return log


def _run(accelerator, model, optimizer, scheduler, target, source, generator, args, evaluation, progress) -> dict:
    """The loop from ``progress["step"] + 1`` to ``max_steps``: an optimizer step over ``gradient_accumulation_steps``
    micro-batches, the mean losses logged, the held-out evaluation, ``checkpoint-last`` saved."""
    start = time.time() - progress["seconds"]
    glide = accelerator.unwrap_model(model)
    block_sizes = args.block_sizes(glide.config.block_size)
    with_kv, with_p = glide.config.cross_attention, args.distillation_weight > 0
    bar = tqdm(
        range(progress["step"] + 1, args.max_steps + 1),
        desc="train GLIDE",
        initial=progress["step"],
        total=args.max_steps,
        disable=not (args.progress_bar and accelerator.is_main_process),
    )
    for step in bar:
        totals = {}
        for _ in range(args.gradient_accumulation_steps):
            rows = torch.randint(0, len(source), (args.per_device_batch_size,), generator=generator)
            batch = source.batch(target, glide, rows, accelerator.device, with_kv, with_p)
            with accelerator.accumulate(model):
                loss, parts = glide_loss(model, batch, block_sizes[step % len(block_sizes)], args)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            for name, value in {"loss": loss.detach(), **parts}.items():
                mean = float(accelerator.gather(value[None]).mean())
                totals[name] = totals.get(name, 0.0) + mean / args.gradient_accumulation_steps
            progress["tokens"] += batch.input_ids.numel() * accelerator.num_processes
        bar.set_postfix(loss=f"{totals['loss']:.3f}")
        if step % args.logging_steps == 0 or step in (1, args.max_steps):
            losses = {k: round(v, 4) for k, v in totals.items()}
            lr, seconds = scheduler.get_last_lr()[0], round(time.time() - start, 2)
            progress["steps"].append(
                {"step": step, **losses, "lr": lr, "tokens": progress["tokens"], "seconds": seconds}
            )
            accelerator.log({f"train/{k}": v for k, v in progress["steps"][-1].items() if k != "step"}, step=step)
        # the held-out evaluation runs on the main process; the others wait
        if args.eval_every and (step % args.eval_every == 0 or step == args.max_steps):
            if accelerator.is_main_process:
                result = {"step": step, **evaluation(target, glide)}
                accelerator.log({f"eval/{k}": v for k, v in result.items() if k != "step"}, step=step)
                progress["evaluations"].append(result)
            accelerator.wait_for_everyone()
        progress["step"], progress["seconds"] = step, time.time() - start
        if args.save_steps and (step % args.save_steps == 0 or step == args.max_steps):
            save_training_state(accelerator, args, progress, generator)
    accelerator.wait_for_everyone()
    progress["seconds"] = time.time() - start
    return progress


def save_checkpoint(glide, target, log: dict, args: GlideTrainingArguments, metrics: dict | None, custom_generate):
    """Write the Hub-ready checkpoint (:func:`save_glide_checkpoint`) and ``training_log.json``; push if asked (the
    resume state ``checkpoint-last/``, the ``regenerated/`` data and the tracker ``runs/`` stay local)."""
    output_dir = Path(args.output_dir)
    card_info = dict(
        dataset=args.dataset_name, metrics=metrics, training_log=log, repo_id=args.hub_model_id, license=args.license
    )
    base_model = getattr(target.config, "_name_or_path", None) or glide.config.target_name_or_path
    save_glide_checkpoint(
        glide, output_dir, target_name=base_model, card_info=card_info, custom_generate=custom_generate
    )
    (output_dir / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
    if args.push_to_hub:
        push_checkpoint(output_dir, args.hub_model_id)
