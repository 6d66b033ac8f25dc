"""One rank of the tensor-parallel checks (``tests/test_tensor_parallel.py`` starts two over gloo on CPU)::

    PYTHONPATH=. torchrun --standalone --nproc_per_node 2 tests/tp_worker.py MODELS_DIR OUT_DIR llama qwen2

``MODELS_DIR/<arch>/`` holds ``target``, ``draft`` and ``glide`` checkpoints (``glide-uneven`` too for the refusals);
each rank writes ``OUT_DIR/rank<r>.json``: ``{arch: {check: {"ok", "tokens", "detail"}}}``. The target, GLIDE and a
second copy of the draft are split with ``tp_plan="auto"``; the plain draft is replicated on every rank.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.distributed import DistributedConfig

sys.path.insert(0, str(Path(__file__).parent))
from multi_device_checks import record, lossless_checks, prompt, sampled  # noqa: E402

# noqa: E402
from hf_specdraft import (
    CapeCandidateGenerator,
    DraftModelCandidateGenerator,
    GlideCandidateGenerator,
    speculative_generate,
)
from hf_specdraft.core.controller import DraftLengthController  # noqa: E402
from hf_specdraft.core.distributed import RankAgreement  # noqa: E402
from hf_specdraft.core.support import with_cache  # noqa: E402
from hf_specdraft.glide import GlideForCausalLM  # noqa: E402


def split() -> DistributedConfig:
    return DistributedConfig(tp_plan="auto")


def glide_logits(target, glide, single_target, single_glide) -> tuple[bool, list, str]:
    """GLIDE split over the ranks, on this rank's shard of the target cache, against whole GLIDE on the whole cache."""
    x = prompt(int(target.config.vocab_size), length=12, seed=9)
    shard, whole = DynamicCache(config=target.config), DynamicCache(config=single_target.config)
    target(input_ids=x[:, :-1], **with_cache(target, shard), use_cache=True)
    single_target(input_ids=x[:, :-1], **with_cache(single_target, whole), use_cache=True)
    per_rank = target.config.num_key_value_heads // dist.get_world_size()
    heads = slice(dist.get_rank() * per_rank, (dist.get_rank() + 1) * per_rank)
    cache_gap = max(float((s.keys - w.keys[:, heads]).abs().max()) for s, w in zip(shard.layers, whole.layers))
    split_logits = glide(input_ids=x, target_past_key_values=shard).logits
    whole_logits = single_glide(input_ids=x, target_past_key_values=whole).logits
    gap = float((split_logits - whole_logits).abs().max())
    ok = (
        cache_gap < 1e-5
        and torch.allclose(split_logits, whole_logits, atol=1e-5, rtol=1e-4)
        and split_logits.shape == whole_logits.shape
    )
    return ok, [], f"cache shard gap {cache_gap:.2e}, logits gap {gap:.2e}, logits {tuple(split_logits.shape)}"


def agreement(target) -> tuple[bool, list, str]:
    """The collectives themselves: rank-dependent seconds come back as the slowest rank's, a controller as rank 0's."""
    ranks, rank = RankAgreement.of(target), dist.get_rank()
    slowest = ranks.slowest(1.0 + rank, 5.0 - rank)
    controller = DraftLengthController(4)
    controller.verify, controller.draft_per_token = {2: 0.1 * (rank + 1)}, 0.01 * (rank + 1)
    ranks.align(controller)
    agreed = controller.agree_seconds(0.5 * rank, 1.0)
    ok = (
        slowest == (2.0, 5.0)
        and controller.verify == {2: 0.1}
        and controller.draft_per_token == 0.01
        and agreed == (0.5, 1.0)
    )
    return ok, [], f"slowest {slowest}, verify {controller.verify}, draft {controller.draft_per_token}, agreed {agreed}"


def refused(run, needle: str) -> tuple[bool, list, str]:
    try:
        run()
    except ValueError as error:
        return needle in str(error), [], str(error)
    return False, [], "no ValueError"


def arch_checks(folder: Path, arch: str) -> dict:
    target = AutoModelForCausalLM.from_pretrained(folder / "target", distributed_config=split()).eval()
    glide = GlideForCausalLM.from_pretrained(
        folder / "glide", tp_plan="auto"
    ).eval()  # the spelling tensor parallelism was first asked with (deprecated)
    draft = AutoModelForCausalLM.from_pretrained(folder / "draft").eval()  # replicated: every rank holds it whole
    results = lossless_checks(target, glide, draft)
    reference = results["target-only"]["tokens"]
    x = prompt(int(target.config.vocab_size))
    split_draft = AutoModelForCausalLM.from_pretrained(folder / "draft", distributed_config=split()).eval()
    record(
        results,
        "draft-model-split",
        lambda: (lambda out: (out[0].tolist() == reference, out[0].tolist(), str(out[0].tolist())))(
            speculative_generate(target, x, draft_model=split_draft, max_new_tokens=len(reference) - x.shape[1])
        ),
    )

    def gamma_choices():  # γ "auto": what every step drafted, compared across ranks by the parent
        out = speculative_generate(
            target, x, draft_model=glide, max_new_tokens=len(reference) - x.shape[1], return_dict_in_generate=True
        )
        return (
            out.sequences[0].tolist() == reference,
            out.speculative_stats.extra.get("draft_lengths"),
            str(out.speculative_stats.extra.get("draft_lengths")),
        )

    record(results, "controller/glide", gamma_choices)
    single_target = AutoModelForCausalLM.from_pretrained(folder / "target").eval()

    def self_drafted():  # the whole target as its own draft: always right, so γ "auto" grows and follows the clock
        out = speculative_generate(
            target,
            x,
            draft_model=single_target,
            max_new_tokens=len(reference) - x.shape[1],
            return_dict_in_generate=True,
        )
        lengths = out.speculative_stats.extra.get("draft_lengths")
        return out.sequences[0].tolist() == reference and max(lengths) > 1, lengths, str(lengths)

    record(results, "controller/self-draft", self_drafted)
    record(results, "controller/agreement", lambda: agreement(target))
    single_glide = GlideForCausalLM.from_pretrained(folder / "glide").eval()
    single_draft = AutoModelForCausalLM.from_pretrained(folder / "draft").eval()
    with torch.no_grad():
        record(results, "glide-logits", lambda: glide_logits(target, glide, single_target, single_glide))
    samplers = {
        "glide": lambda g, d: GlideCandidateGenerator(g, num_draft_tokens=3),
        "draft-model": lambda g, d: DraftModelCandidateGenerator(d, 3),
        "cape+glide": lambda g, d: CapeCandidateGenerator(GlideCandidateGenerator(g, num_draft_tokens=2), budget=4),
    }
    for name, make in samplers.items():  # the split run against one process's run of the same models from the same seed
        record(
            results,
            f"sample/{name}",
            lambda: (
                lambda split_tokens, whole_tokens: (
                    split_tokens == whole_tokens,
                    split_tokens,
                    f"{split_tokens} vs {whole_tokens}",
                )
            )(sampled(target, make(glide, draft)), sampled(single_target, make(single_glide, single_draft))),
        )
    if (folder / "glide-uneven").exists():
        record(
            results,
            "refuse/uneven-glide",
            lambda: refused(
                lambda: GlideForCausalLM.from_pretrained(folder / "glide-uneven", distributed_config=split()),
                "cannot be split over tp_size=2",
            ),
        )
        record(
            results,
            "refuse/whole-glide",
            lambda: refused(
                lambda: speculative_generate(target, x, draft_model=single_glide, max_new_tokens=4), "glide over 1"
            ),
        )

        def seeded_apart():
            torch.manual_seed(dist.get_rank())
            speculative_generate(target, x, draft_model=draft, num_draft_tokens=2, max_new_tokens=4, do_sample=True)

        record(results, "refuse/seeds-apart", lambda: refused(seeded_apart, "same random state on every rank"))
    return results


def main(models: str, out: str, *archs: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    results = {}
    for arch in archs:
        try:
            results[arch] = arch_checks(Path(models) / arch, arch)
        except Exception:  # noqa: BLE001 - the parent test shows it
            results[arch] = {"load": {"ok": False, "tokens": None, "detail": traceback.format_exc()[-3000:]}}
    Path(out, f"rank{dist.get_rank()}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
