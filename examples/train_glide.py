r"""Train a GLIDE draft for a Hub target: the paper's recipe (Du et al. 2024, §5.1, Appendix A), not run here.

    pip install datasets deepspeed
    accelerate launch --config_file examples/accelerate_deepspeed_zero2.yaml examples/train_glide.py \
        --target lmsys/vicuna-7b-v1.5 --dataset DKYoon/SlimPajama-6B --output-dir glide-vicuna-7b-v1.5
    python examples/train_glide.py --tiny    # the repository's tiny recipe (recipes/training.py): seconds on a CPU

Appendix A: one GLIDE layer (N_D = 1) as wide as the target (d_D = 4096), frozen target, AdamW at 5e-4,
batch 64 (8 GPUs x 8 windows), one epoch, DeepSpeed ZeRO-2 on 8 GPUs. The data is held in memory as one
token stream per process, so ``--max-tokens`` caps how much of SlimPajama-6B is tokenized; ``--max-steps``
defaults to one pass over those tokens. The checkpoint gets the model card and CAPE's ``custom_generate/``.
"""

import argparse
from pathlib import Path

import torch
from accelerate import PartialState
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_specdraft import write_glide_custom_generate
from hf_specdraft.glide import GlideConfig, GlideForCausalLM, GlideTrainingArguments, train_glide
from hf_specdraft.glide.training import load_data


def hub_tokens(dataset: str, tokenizer, max_tokens: int) -> torch.Tensor:
    """The first ``max_tokens`` tokens of a Hub text dataset, streamed, documents joined by eos."""
    from datasets import load_dataset

    chunks, total = [], 0
    for batch in load_dataset(dataset, split="train", streaming=True).iter(batch_size=1000):
        for ids in tokenizer(batch["text"], add_special_tokens=False).input_ids:
            chunks.append(torch.tensor(ids + [tokenizer.eos_token_id], dtype=torch.int32))
            total += chunks[-1].numel()
        if total >= max_tokens:
            break
    return torch.cat(chunks)[:max_tokens]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="lmsys/vicuna-7b-v1.5")
    parser.add_argument("--dataset", default="DKYoon/SlimPajama-6B", help="Hub dataset with a 'text' column")
    parser.add_argument("--output-dir")
    parser.add_argument("--max-tokens", type=int, default=500_000_000, help="tokens of --dataset to train on")
    parser.add_argument("--max-steps", type=int, help="default: one pass over the tokens")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8, help="windows per process (8 processes: 64, Appendix A)")
    parser.add_argument("--hub-model-id", help="push the checkpoint to this Hub repo")
    parser.add_argument(
        "--tiny", action="store_true", help="use the repository's tiny recipe (recipes/training.py; a source checkout)"
    )
    args = parser.parse_args()
    if args.tiny:  # the tiny target, trained on hf_specdraft's own source for a few steps
        from _tiny import tiny_default_dir

        import hf_specdraft

        tiny = tiny_default_dir()
        args.target, tokenizer_dir = str(tiny / "target"), str(tiny / "tokenizer")
        args.max_steps, args.seq_len, args.batch_size = args.max_steps or 5, 64, 4
        args.output_dir = args.output_dir or str(tiny / "glide-example")  # beside the tiny run, replaced on each run
        data = load_data([str(Path(hf_specdraft.__file__).parent)], tokenizer_dir)
    else:
        data = hub_tokens(args.dataset, AutoTokenizer.from_pretrained(args.target), args.max_tokens)
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype)  # frozen; every process holds a copy
    torch.manual_seed(0)
    glide = GlideForCausalLM(
        GlideConfig.from_target_config(target.config, num_hidden_layers=1, target_name_or_path=args.target)
    )
    windows = args.batch_size * PartialState().num_processes
    training_args = GlideTrainingArguments(
        output_dir=args.output_dir or "glide-" + args.target.rstrip("/").split("/")[-1],
        max_steps=args.max_steps or max(1, data.numel() // (windows * args.seq_len)),
        seq_len=args.seq_len,
        per_device_batch_size=args.batch_size,
        learning_rate=5e-4,
        dataset_name=None if args.tiny else args.dataset,
        push_to_hub=bool(args.hub_model_id),
        hub_model_id=args.hub_model_id,
    )
    log = train_glide(target, glide, data, training_args, custom_generate=write_glide_custom_generate)
    if PartialState().is_main_process:
        print(f"final loss {log['steps'][-1]['loss']}; checkpoint and model card in {training_args.output_dir}")


if __name__ == "__main__":
    main()
