"""How often a drafter's tokens agree with the target's, per group of requests, measured two ways.

For each request of a prompts file (Spec-Bench's format: ``question_id``, ``category``, ``turns``; Xia et al. 2024,
arXiv:2401.07851) the target answers its first turn greedily in its chat template; then, per ``category``:

- **teacher-forced**: the first draft token's greedy agreement at every position of the target's answer, the request
  and the answer fed as they are (:func:`benchmarks.studies.glide_glimpse.teacher_forced_alpha`, training's
  block-wise glimpse);
- **in the loop**: ``speculative_generate`` with the drafter at γ = 1 and copying off, every step judged by the
  target: accepted / judged draft tokens, the first draft token's agreement as decoding meets it.

    python -m benchmarks.studies.group_agreement --prompts prompts.jsonl \\
        --drafter shipped=hf_specdraft/defaults/checkpoint_smollm2/glide --output group-agreement.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from hf_specdraft import speculative_generate
from hf_specdraft.glide import GlideCandidateGenerator, GlideForCausalLM
from benchmarks.studies.glide_glimpse import teacher_forced_alpha
from hf_specdraft.glide.training.objective import TargetWindows
from benchmarks.studies.state_glide import conditional_agreement


def read_prompts(path: str | Path) -> list[dict]:
    """The requests of a Spec-Bench-format JSONL file (one JSON object a line)."""
    rows = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if line.strip():
            row = json.loads(line)
            if not isinstance(row.get("turns"), list) or not row["turns"] or "category" not in row:
                raise ValueError(f"{path}:{number}: each line needs 'category' and a non-empty list 'turns'")
            rows.append(row)
    return rows


@torch.no_grad()
def answers(target, tokenizer, rows: list[dict], max_new_tokens: int) -> list[tuple[str, list[int], int]]:
    """``(category, prompt + answer ids, prompt length)`` for every row's first turn, the target answering greedily."""
    out = []
    for row in tqdm(rows, desc="target answers"):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": row["turns"][0]}],
            add_generation_prompt=True,
            return_tensors="pt",
            return_dict=True,
        )["input_ids"].to(target.device)
        full = target.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
        out.append((row["category"], full[0].tolist(), ids.shape[1]))
    return out


@torch.no_grad()
def in_loop(target, glide, answered, max_new_tokens: int) -> dict[str, dict]:
    """Per category: accepted / judged draft tokens at γ = 1 with copying off, and whether every output was greedy's."""
    per: dict[str, list] = {}
    for category, ids, prompt_length in answered:
        prompt = torch.tensor([ids[:prompt_length]], device=target.device)
        drafter = GlideCandidateGenerator(glide, num_draft_tokens=1, copy_from_context=0)
        out = speculative_generate(
            target, prompt, candidate_generator=drafter, max_new_tokens=max_new_tokens, return_dict_in_generate=True
        )
        stats = out.speculative_stats
        entry = per.setdefault(category, [0, 0, True])
        entry[0] += stats.accepted_tokens
        entry[1] += stats.judged_tokens
        entry[2] &= out.sequences[0].tolist() == ids[: out.sequences.shape[1]]
    return {
        c: {"agreement": round(a / j, 4) if j else 0.0, "judged": j, "identical": same}
        for c, (a, j, same) in per.items()
    }


def teacher_forced(target, glide, answered) -> dict[str, dict]:
    """Per category: greedy agreement of the first draft token at the answer's positions, teacher-forced on the request
    and the target's answer (GLIDE glimpses with training's block-wise mask, Du et al. 2024, §4.1)."""
    per: dict[str, list[float]] = {}
    for category, ids, prompt_length in answered:
        if len(ids) - prompt_length < 2:
            continue
        scores = teacher_forced_alpha(
            target, glide, torch.tensor([ids]), block_size=5, batch_size=1, skip=prompt_length - 1
        )
        entry = per.setdefault(category, [0.0, 0])
        entry[0] += scores["greedy_agreement"] * scores["eval_positions"]
        entry[1] += scores["eval_positions"]
    return {c: {"agreement": round(a / n, 4) if n else 0.0, "positions": n} for c, (a, n) in per.items()}


@torch.no_grad()
def by_step(target, glide, answered, steps: int = 3) -> dict[str, list[float]]:
    """Per category: greedy agreement at draft steps 1..``steps``, each given the earlier ones, over the answer's
    positions, teacher-forced (:func:`benchmarks.studies.state_glide.conditional_agreement`): what the model
    cards report."""
    per: dict[str, list[list[int]]] = {}
    for category, ids, prompt_length in answered:
        source = TargetWindows(torch.tensor(ids), seq_len=len(ids), stride=len(ids))
        batch = source.batch(target, glide, torch.tensor([0]), target.device, glide.config.cross_attention, True)
        totals = per.setdefault(category, [[0, 0] for _ in range(steps)])
        for k, (agreed, tried) in enumerate(conditional_agreement(glide, batch, steps, first=prompt_length - 1)):
            totals[k][0] += agreed
            totals[k][1] += tried
    return {c: [round(a / t, 4) if t else 0.0 for a, t in totals] for c, totals in per.items()}


def first_of_each(rows: list[dict], limit: int) -> list[dict]:
    """The first ``limit`` rows of each ``category``, in category order (0: all rows)."""
    if not limit:
        return rows
    kept: dict[str, list] = {}
    for row in rows:
        kept.setdefault(row["category"], []).append(row)
    return [row for group in kept.values() for row in group[:limit]]


def vocabulary_coverage(glide, answered) -> dict[str, dict]:
    """Per category: the share of the target's answer tokens that the drafter can propose at all, those among its
    draft vocabulary (``config.draft_token_ids``; every id when it scores the whole vocabulary): the ceiling of its
    agreement."""
    ids = glide.config.draft_token_ids
    inside = None if ids is None else set(ids)
    per: dict[str, list[int]] = {}
    for category, tokens, prompt_length in answered:
        answer = tokens[prompt_length:]
        entry = per.setdefault(category, [0, 0])
        entry[0] += len(answer) if inside is None else sum(token in inside for token in answer)
        entry[1] += len(answer)
    return {c: {"coverage": round(a / n, 4) if n else 0.0, "tokens": n} for c, (a, n) in per.items()}


def score(target, glide, answered, max_new_tokens: int, loop: bool = True) -> dict:
    """Every measure of one drafter per category: its vocabulary's coverage of the answers, teacher-forced step 1 and
    steps 1-3, and (``loop``) in the loop."""
    scores = {
        "draft_vocabulary_coverage": vocabulary_coverage(glide, answered),
        "teacher_forced_step_1": teacher_forced(target, glide, answered),
        "teacher_forced_steps_1_3": by_step(target, glide, answered),
    }
    if loop:
        scores["in_loop_step_1"] = in_loop(target, glide, answered, max_new_tokens)
    return scores


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--prompts", required=True, help="a Spec-Bench-format JSONL file (question_id, category, turns)"
    )
    parser.add_argument(
        "--drafter", action="append", required=True, metavar="NAME=PATH", help="a GLIDE-family checkpoint; may repeat"
    )
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--limit", type=int, default=0, help="use only the first N requests of each category (0: all)")
    parser.add_argument("--output", help="write the JSON here")
    ns = parser.parse_args(argv)
    drafters = {}
    for spec in ns.drafter:
        name, _, path = spec.partition("=")
        if not name or not path or not Path(path).is_dir():
            parser.error(f"--drafter must be NAME=PATH of a checkpoint directory, got {spec!r}")
        drafters[name] = path
    if ns.max_new_tokens < 1 or ns.limit < 0:
        parser.error("--max-new-tokens must be >= 1 and --limit >= 0")
    rows = first_of_each(read_prompts(ns.prompts), ns.limit)
    from hf_specdraft.defaults.smollm2 import load_smollm2

    torch.manual_seed(0)
    target, tokenizer = load_smollm2(dtype=torch.float32, device="cpu")
    start = time.time()
    answered = answers(target, tokenizer, rows, ns.max_new_tokens)
    result = {
        "meta": {
            "cpu": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads(),
            "dtype": "float32 target",
            "torch": torch.__version__,
            "prompts": str(ns.prompts),
            "requests": len(rows),
            "max_new_tokens": ns.max_new_tokens,
            "command": "python -m benchmarks.studies.group_agreement "
            + " ".join(sys.argv[1:] if argv is None else argv),
        },
        "drafters": {},
    }
    for name, path in drafters.items():
        glide = GlideForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        result["drafters"][name] = {"path": path, **score(target, glide, answered, ns.max_new_tokens)}
        print(name, json.dumps(result["drafters"][name], indent=1))
    result["meta"]["seconds"] = round(time.time() - start, 1)
    if ns.output:
        Path(ns.output).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
