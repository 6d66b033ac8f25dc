"""Experiment, not shipped: does a longer prompt let the default target follow CASD's pool?

Copies the embedded default to OUTPUT_DIR, continues its target on 1,024-token windows (the shipped one
trained on 256), then runs the context bench with the file's last 700 and 3,000 characters before the cut
in the prompt. Results (JSON) land next to this file. On 2 CPU cores: ≈ 18 minutes of training, ≈ 3 of bench.

    python -m benchmarks.experiments.context_window.run /tmp/longctx --steps 250
"""

import argparse
import dataclasses
import json
import shutil
import time
from pathlib import Path

import torch
from transformers import LlamaForCausalLM

from benchmarks import methods  # noqa: F401  (registers the casd-* rows run below)
from hf_specdraft.bench import BenchConfig, format_table, run_bench
import hf_specdraft.defaults
from hf_specdraft.defaults.loading import load_default

from recipes.evaluation import evaluate_perplexity, heldout_text_windows
from recipes.recipe import TrainSchedule, get_recipe
from recipes.training import prepare_data, train_lm

HERE = Path(__file__).parent
METHODS = ("target-only", "prompt-lookup", "casd-strict", "casd-strict+output", "casd-conditional")


def perplexities(model, windows: dict) -> dict:
    return {name: round(evaluate_perplexity(model, ids), 3) for name, ids in windows.items()}


# the 15.7M from-scratch default of earlier versions (recipes/training.py), no longer shipped
EARLIER_DEFAULT = Path(hf_specdraft.defaults.__file__).parent / "checkpoint"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_dir", type=Path, help="where the copy of the default is extended (about 60 MB)")
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--seq-len", type=int, default=1024)
    args = parser.parse_args()
    if not EARLIER_DEFAULT.is_dir():
        raise SystemExit(
            f"this experiment extends the earlier from-scratch default, which no longer ships: {EARLIER_DEFAULT}"
        )
    shutil.copytree(EARLIER_DEFAULT, args.output_dir, dirs_exist_ok=True)
    recipe = dataclasses.replace(get_recipe("default"), seq_len=args.seq_len)
    data = prepare_data(recipe, args.output_dir)
    windows = {
        f"heldout_ppl_{n}": heldout_text_windows(data.tokenizer, data.heldout_texts, n, 64, 0)
        for n in (256, args.seq_len)
    }
    model = LlamaForCausalLM.from_pretrained(args.output_dir / "target", dtype=torch.float32)
    log = {"before": perplexities(model, windows)}
    schedule = TrainSchedule(
        steps=args.steps, batch_size=8, micro_batch_size=8, learning_rate=6e-4, warmup_steps=20, checkpoint_every=10**6
    )
    start = time.time()
    log["steps"] = train_lm(
        model,
        data,
        recipe,
        schedule,
        args.output_dir / "target",
        "extend window",
        windows[f"heldout_ppl_{args.seq_len}"],
        seed_offset=7,
    )
    log["train_seconds"] = round(time.time() - start, 1)
    log["after"] = perplexities(
        LlamaForCausalLM.from_pretrained(args.output_dir / "target", dtype=torch.float32), windows
    )
    (HERE / "extension_log.json").write_text(json.dumps(log, indent=1) + "\n")
    bundle = load_default(args.output_dir)
    for chars in (700, 3000):
        config = BenchConfig(
            task="context", methods=METHODS, num_prompts=20, max_new_tokens=64, context_prompt_chars=chars
        )
        result = run_bench(bundle, config, output=HERE / f"context-{chars}.json")
        print(chars, result["task_statistics"], format_table(result["summary"]), sep="\n")


if __name__ == "__main__":
    main()
