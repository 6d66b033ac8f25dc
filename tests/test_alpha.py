"""Acceptance rate α (Du et al. 2024, §5.1 after Leviathan et al. 2023): 1 - TV(p, q) per judged position."""

from __future__ import annotations

import pytest
import torch
from transformers.generation import PromptLookupCandidateGenerator

from hf_specdraft import DraftModelCandidateGenerator, speculative_generate
from hf_specdraft.bench.harness import summarize
from hf_specdraft.core.stats import SpeculativeStats, StepRecord, expected_speedup, overlap
from conftest import VOCAB, OracleDrafter, greedy_reference, tiny_model


def alpha_by_position(stats: SpeculativeStats) -> list[float]:
    """Entry ``i``: the paper's α at draft position ``i``, over steps that judged position ``i`` with q."""
    overlaps = [s.overlaps for s in stats.steps if s.overlaps]
    positions = [[o[i] for o in overlaps if len(o) > i] for i in range(max(map(len, overlaps), default=0))]
    return [sum(values) / len(values) for values in positions]


class RecordingDrafter(DraftModelCandidateGenerator):
    """A plain draft-model drafter that keeps every proposal with the text it followed."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.proposals = []

    def propose(self, input_ids, target_cache=None):
        tree = super().propose(input_ids, target_cache)
        self.proposals.append((input_ids.clone(), tree))
        return tree


def prompt(length=7, seed=1):
    return torch.randint(0, VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))


def test_overlap_is_one_minus_total_variation():
    p, q = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.1, 0.6, 0.3])
    assert float(overlap(p, q)) == pytest.approx(1 - 0.5 * float((p - q).abs().sum()))
    assert float(overlap(p, p)) == pytest.approx(1.0)


def test_alpha_is_one_minus_tv_at_every_judged_position():
    """Recompute p with a plain forward over each proposal: the loop's overlaps must match position by position,
    and the judged positions are the accepted ones plus the first rejected one."""
    target, draft = tiny_model(), tiny_model(seed=9, num_hidden_layers=1)
    x = prompt()
    drafter = RecordingDrafter(draft, num_draft_tokens=4)
    out = speculative_generate(target, x, candidate_generator=drafter, max_new_tokens=24, return_dict_in_generate=True)
    stats = out.speculative_stats
    assert torch.equal(out.sequences, greedy_reference(target, x, 24))
    assert len(drafter.proposals) == stats.num_steps
    expected_all = []
    for (ids, tree), step in zip(drafter.proposals, stats.steps):
        tree = tree.truncate_depth(step.drafted)  # the loop cuts the last proposals to the length budget
        full = torch.cat([ids, tree.tokens[None]], dim=-1)
        with torch.no_grad():
            p = target(full).logits[0, ids.shape[1] - 1 :].float().softmax(-1)  # row i scores drafted token i
        matches = (p[: len(tree)].argmax(-1) == tree.tokens).long().cumprod(0)
        accepted = int(matches.sum())
        if step.emitted == accepted + 1:  # not cut by max_length: every judged position is in the record
            assert step.accepted == accepted
            assert step.judged == min(accepted + 1, len(tree))
        if not step.judged:
            assert step.overlaps is None
            continue
        expected = overlap(p[: step.judged], tree.draft_probs[: step.judged]).tolist()
        assert step.overlaps == pytest.approx(expected, abs=1e-5)
        expected_all += expected
    assert stats.alpha == pytest.approx(sum(expected_all) / len(expected_all), abs=1e-6)
    assert stats.alpha_positions == stats.judged_tokens == len(expected_all)
    by_position = alpha_by_position(stats)
    firsts = [s.overlaps[0] for s in stats.steps if s.overlaps]
    assert by_position[0] == pytest.approx(sum(firsts) / len(firsts), abs=1e-6)


def test_position_acceptance_counts_judged_positions_only():
    """Accepted / drafted counts positions after a rejection as failures; accepted / judged does not."""
    target = tiny_model()
    x = prompt()
    ref = greedy_reference(target, x, 20)
    wrong = speculative_generate(
        target, x, candidate_generator=OracleDrafter(ref, "wrong", k=4), max_new_tokens=20, return_dict_in_generate=True
    ).speculative_stats
    # the last steps are cut to the length budget
    assert wrong.num_steps == 20 and wrong.drafted_tokens == 16 * 4 + 3 + 2 + 1
    assert wrong.judged_tokens == 19  # one judged (rejected) position a step, not four; the last step drafts nothing
    assert wrong.position_acceptance_rate == wrong.accepted_per_drafted == 0.0
    right = speculative_generate(
        target, x, candidate_generator=OracleDrafter(ref, "right", k=4), max_new_tokens=20, return_dict_in_generate=True
    ).speculative_stats
    assert right.position_acceptance_rate == 1.0
    assert right.judged_tokens == right.accepted_tokens


def test_alpha_needs_a_chain_with_q():
    target = tiny_model()
    x = prompt()
    ref = greedy_reference(target, x, 16)
    tree = speculative_generate(
        target, x, candidate_generator=OracleDrafter(ref, "tree", k=3), max_new_tokens=16, return_dict_in_generate=True
    ).speculative_stats
    assert tree.alpha is None and tree.alpha_positions == 0 and alpha_by_position(tree) == []
    # still defined for trees, per depth
    assert tree.position_acceptance_rate == tree.accepted_tokens / tree.judged_tokens > 0
    repetitive = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7]])
    lookup = speculative_generate(
        target,
        repetitive,
        candidate_generator=PromptLookupCandidateGenerator(num_output_tokens=3),
        max_new_tokens=12,
        return_dict_in_generate=True,
    ).speculative_stats
    assert lookup.alpha is None
    assert lookup.summary()["alpha"] is None


def _record(
    method: str, alpha: float | None, positions: int, accepted: int, judged: int, drafted: int, steps: int
) -> dict:
    stats = {
        "steps": steps,
        "new_tokens": accepted + steps,
        "drafted_tokens": drafted,
        "accepted_tokens": accepted,
        "judged_tokens": judged,
        "alpha": alpha,
        "alpha_positions": positions,
        "verification_tokens_per_step": 5.0,
        "draft_seconds": 0.01 * drafted,
        "verify_seconds": 0.1 * steps,
        "drafter_calls": {"draft": drafted},
    }
    return {
        "method": method,
        "seconds": 1.0,
        "new_tokens": accepted + steps,
        "target_calls": steps,
        "tokens": [1],
        "edit_similarity": 1.0,
        "stats": stats,
    }


def test_bench_summary_weights_alpha_by_positions_and_feeds_it_to_expected_speedup():
    records = [
        {
            "method": "target-only",
            "prompt": 0,
            "seconds": 2.0,
            "new_tokens": 10,
            "target_calls": 10,
            "tokens": [1],
            "edit_similarity": 1.0,
        },
        {
            "method": "target-only",
            "prompt": 1,
            "seconds": 2.0,
            "new_tokens": 10,
            "target_calls": 10,
            "tokens": [1],
            "edit_similarity": 1.0,
        },
        {**_record("glide-auto", 0.5, 10, accepted=6, judged=10, drafted=20, steps=4), "prompt": 0},
        {**_record("glide-auto", 0.8, 30, accepted=24, judged=30, drafted=40, steps=8), "prompt": 1},
    ]
    from benchmarks.swi import summary_fields  # c and E(speedup) are the lab's fields

    summary = summarize(records, ("target-only", "glide-auto"))
    summary_fields(summary, records, {})
    s = summary["glide-auto"]
    assert s["alpha"] == pytest.approx((0.5 * 10 + 0.8 * 30) / 40)
    assert s["position_acceptance_rate"] == pytest.approx(30 / 40)
    assert s["accepted_per_drafted"] == pytest.approx(30 / 60)
    c = s["cost_coefficient"]
    assert c == pytest.approx(0.01 / 0.1)
    assert s["expected_speedup"] == pytest.approx(expected_speedup(s["alpha"], 5, c))
    assert s["expected_speedup_position"] == pytest.approx(expected_speedup(30 / 40, 5, c))
    assert summarize(records[:2], ("target-only",))["target-only"]["alpha"] is None


def test_merge_keeps_judged_positions_and_overlaps():
    a, b = SpeculativeStats(), SpeculativeStats()
    a.steps.append(StepRecord(3, 3, 1, 2, 0, 0, judged=2, overlaps=[0.9, 0.2]))
    b.steps.append(StepRecord(3, 3, 3, 4, 0, 0, judged=3, overlaps=[1.0, 0.8, 0.6]))
    merged = SpeculativeStats.merge([a, b])
    assert merged.alpha == pytest.approx(3.5 / 5)
    assert alpha_by_position(merged) == pytest.approx([0.95, 0.5, 0.6])
    assert merged.position_acceptance_rate == pytest.approx(4 / 5)


def test_report_shows_older_files_accepted_per_drafted_under_its_own_name():
    from benchmarks.report.render import bench_section

    meta = {
        "hardware": "CPU",
        "dtype": "float32",
        "batch_size": 1,
        "task": "completion",
        "num_prompts": 1,
        "max_new_tokens": 8,
        "seed": 0,
        "versions": {"torch": "2", "transformers": "5"},
        "target_parameters": 1e6,
    }
    old = bench_section("old", {"meta": meta, "summary": {"glide": {"acceptance_rate": 0.123}}})
    row = next(line for line in old.splitlines() if line.startswith("| glide"))
    # α, acc/pos, acc/drafted (after tok/s, speedup, per-prompt range, vs +linears)
    assert row.split(" | ")[6:9] == ["–", "–", "0.123"]
