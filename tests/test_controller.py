"""The draft-length controller: γ from measured acceptance and costs; explicit ints untouched; lossless."""

from __future__ import annotations

import random

import pytest
import torch

from conftest import VOCAB, OracleDrafter, greedy_reference, tiny_model
from hf_specdraft import DraftModelCandidateGenerator, GlideCandidateGenerator, speculative_generate
from hf_specdraft.core.controller import COPY_MATCH_BINS, DraftLengthController
from test_method_grid import glide_for


def settle(cost, accept: float, steps: int = 80, max_tokens: int = 8) -> int:
    """The γ a controller settles on when a forward over n tokens takes ``cost(n)`` s, a draft token 1 ms, and each
    drafted position is accepted with probability ``accept`` (seeded draws)."""
    draws = random.Random(0)
    controller = DraftLengthController(max_tokens)
    for _ in range(steps):
        gamma = controller.choose()
        accepted = 0
        while accepted < gamma and draws.random() < accept:
            accepted += 1
        controller.observe(gamma, [accepted], 0.001 * gamma, cost(gamma + 1), gamma + 1)
    return max(range(1, max_tokens + 1), key=lambda g: controller.rates(0)[g - 1])


def test_a_flat_cost_curve_and_high_acceptance_draft_long():
    assert settle(lambda n: 0.030, accept=0.9) >= 5  # a GPU: a 9-token forward costs what a 1-token one does


def test_a_steep_cost_curve_drafts_short():
    assert settle(lambda n: 0.030 * (1 + 0.5 * (n - 1)), accept=0.9) <= 2  # each verified token costs half a forward


def test_low_acceptance_drafts_short():
    assert settle(lambda n: 0.030 * (1 + 0.05 * (n - 1)), accept=0.2) == 1


def test_the_rule_is_the_stated_ratio():
    controller = DraftLengthController(4)
    controller.verify = {2: 0.02, 4: 0.03}
    controller.draft_per_token = 0.001
    # one width option: a chain drafter; the prior weighs nothing
    controller.tries, controller.hits = ([[1e6] * 4], [[0.5e6] * 4])
    assert controller.cost_curve()(3) == pytest.approx(0.025)  # on the line through the measured lengths
    assert controller.rates(0)[1] == pytest.approx((1 + 0.5 + 0.25) / (2 * 0.001 + 0.025))
    assert controller.rates(0)[2] == pytest.approx((1 + 0.5 + 0.25 + 0.125) / (3 * 0.001 + 0.03))


def test_explicit_ints_are_honoured_exactly():
    target = tiny_model()
    x = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(0))
    drafter = DraftModelCandidateGenerator(tiny_model(seed=3, num_hidden_layers=1), num_draft_tokens=3)
    out = speculative_generate(target, x, candidate_generator=drafter, max_new_tokens=24, return_dict_in_generate=True)
    assert not drafter.adaptive_draft_length and drafter.num_draft_tokens == 3
    assert "draft_lengths" not in out.speculative_stats.extra
    steps = out.speculative_stats.steps
    assert {s.drafted for s in steps[: len(steps) // 2]} == {3}  # the last steps may be cut by max_new_tokens


@pytest.mark.parametrize("bad", [0, -1, 2.5, "fast", True])
def test_a_bad_draft_length_is_named(bad):
    with pytest.raises(ValueError, match="num_draft_tokens must be a positive int or 'auto'"):
        DraftModelCandidateGenerator(tiny_model(), num_draft_tokens=bad)


@pytest.mark.parametrize("bad", [0, -2, 2.5, "8", True])
def test_the_controllers_bad_limits_are_named(bad):
    with pytest.raises(ValueError, match="max_draft_tokens must be a positive int"):
        DraftLengthController(bad)
    with pytest.raises(ValueError, match=r"max_copy_tokens must be None or a positive int \(None: max_draft_tokens\)"):
        DraftLengthController(4, max_copy_tokens=bad)
    assert (
        DraftLengthController(4).max_copy_tokens == 4
        and DraftLengthController(4, max_copy_tokens=16).max_copy_tokens == 16
    )


@pytest.mark.parametrize("kind", ["draft_model", "glide", "batch"])
def test_auto_is_the_default_and_lossless(arch, kind):
    target = tiny_model(arch)
    x = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(4))
    if kind == "batch":
        ids = torch.cat([x, torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(5))])
        out = speculative_generate(target, ids, draft_model=target, max_new_tokens=20, return_dict_in_generate=True)
        for r in range(2):
            assert torch.equal(out.sequences[r : r + 1], greedy_reference(target, ids[r : r + 1], 20))
    else:
        draft = tiny_model(arch, seed=3, num_hidden_layers=1) if kind == "draft_model" else glide_for(target)
        drafter = DraftModelCandidateGenerator(draft) if kind == "draft_model" else GlideCandidateGenerator(draft)
        assert drafter.adaptive_draft_length
        out = speculative_generate(
            target, x, candidate_generator=drafter, max_new_tokens=20, return_dict_in_generate=True
        )
        assert torch.equal(out.sequences, greedy_reference(target, x, 20))
    lengths = out.speculative_stats.extra["draft_lengths"]
    # two points of the cost curve first, then chosen
    assert lengths[:2] == [1, 3] and all(1 <= g <= 8 for g in lengths[:-1])
    # the last step drafts what room max_new_tokens leaves (a confidence-stopped one records it)
    assert 0 <= lengths[-1] <= 8


def test_cape_over_an_auto_drafter_is_adaptive_and_lossless(arch):
    from hf_specdraft import CapeCandidateGenerator, CapeConfig

    assert (
        CapeConfig().budget == "auto" and CapeConfig().budget_for(3) == 6 and CapeConfig(budget=32).budget_for(3) == 32
    )
    target = tiny_model(arch)
    x = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(4))
    drafter = CapeCandidateGenerator(GlideCandidateGenerator(glide_for(target)))
    assert drafter.adaptive_draft_length
    requests, draft_tree = [], CapeCandidateGenerator.draft_tree
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            CapeCandidateGenerator,
            "draft_tree",
            lambda self, request: requests.append(request) or draft_tree(self, request),
        )
        out = speculative_generate(
            target, x, candidate_generator=drafter, max_new_tokens=20, return_dict_in_generate=True
        )
    assert torch.equal(out.sequences, greedy_reference(target, x, 20))
    lengths = out.speculative_stats.extra["draft_lengths"]
    assert lengths[:2] == [1, 3]
    # budget 'auto': at most twice the chain
    assert all(s.tree_size <= 2 * g for s, g in zip(out.speculative_stats.steps, lengths))
    assert drafter.adaptive_budget and len(requests) == len(lengths)  # each step's γ and budget, in its request
    assert all(r.budget in (r.num_draft_tokens, 2 * r.num_draft_tokens) for r in requests)
    fixed = CapeCandidateGenerator(GlideCandidateGenerator(glide_for(target), num_draft_tokens=2), budget=3)
    assert not fixed.adaptive_draft_length and fixed.num_draft_tokens == 2


def test_tree_budget_drops_expansions_that_do_not_pay():
    """Two width options: expansions (width 2) that raise acceptance little on a steep cost curve lose to the chain."""
    draws = random.Random(1)
    controller = DraftLengthController(6, widths=(1.0, 2.0))
    for _ in range(120):
        gamma = controller.choose()
        wide = controller.option == 1
        accept = 0.62 if wide else 0.6  # expansions add 2 points of acceptance
        accepted = 0
        while accepted < gamma and draws.random() < accept:
            accepted += 1
        nodes = controller.budget(gamma)
        assert nodes == (2 * gamma if wide else gamma)
        controller.observe(gamma, [accepted], 0.001 * gamma, 0.03 * (1 + 0.3 * nodes), nodes + 1)
    best = max(((g, o) for o in (0, 1) for g in range(1, 7)), key=lambda c: controller.rates(c[1])[c[0] - 1])
    assert best[1] == 0  # the chain alone
    flat = DraftLengthController(6, widths=(1.0, 2.0))
    for _ in range(120):  # a flat curve (a GPU) and expansions worth 15 points: the wide tree wins
        gamma = flat.choose()
        accept = 0.85 if flat.option == 1 else 0.7
        accepted = 0
        while accepted < gamma and draws.random() < accept:
            accepted += 1
        flat.observe(gamma, [accepted], 0.0001 * gamma, 0.03, flat.budget(gamma) + 1)
    assert max(((g, o) for o in (0, 1) for g in range(1, 7)), key=lambda c: flat.rates(c[1])[c[0] - 1])[1] == 1


class AdaptiveOracle(OracleDrafter):
    """An oracle chain drafter whose length the loop's controller chooses (each request's ``num_draft_tokens``), like
    an "auto" drafter."""

    adaptive_draft_length = True

    @property
    def num_draft_tokens(self) -> int:
        return self.k

    def draft_tree(self, request):
        self.k = request.num_draft_tokens or self.k
        return super().draft_tree(request)


@pytest.fixture
def steady_costs(monkeypatch):
    """Tests of what the controller decides, not of the clock: every step costs the same (a drafted token 2 % of a
    verification, a verification of any width 10 ms), so another process on the cores (the suite runs two workers)
    cannot make long drafts look dear."""
    observe = DraftLengthController.observe

    def steady(self, drafted, accepted, draft_seconds, verify_seconds, *args, **kwargs):
        return observe(self, drafted, accepted, 2e-4 * drafted, 1e-2, *args, **kwargs)

    monkeypatch.setattr(DraftLengthController, "observe", steady)


@pytest.mark.parametrize("mode", ["right", "wrong"])
def test_adaptive_drafts_always_right_and_always_wrong_stay_lossless(arch, mode, steady_costs):
    target = tiny_model(arch)
    x = torch.randint(0, VOCAB, (1, 7), generator=torch.Generator().manual_seed(6))
    reference = greedy_reference(target, x, 40)
    drafter = AdaptiveOracle(reference, mode)
    out = speculative_generate(target, x, candidate_generator=drafter, max_new_tokens=40, return_dict_in_generate=True)
    assert torch.equal(out.sequences, reference)
    lengths = out.speculative_stats.extra["draft_lengths"]
    # the oracle drafts what it is told
    assert [s.drafted for s in out.speculative_stats.steps[:2]] == lengths[:2] == [1, 3]
    if mode == "right":  # every draft accepted: the controller drafts long
        assert max(lengths) >= 4 and all(s.accepted == s.drafted for s in out.speculative_stats.steps)
    else:  # nothing accepted: it settles on the shortest draft
        # probes aside
        assert max(set(lengths[2:]), key=lengths[2:].count) == 1 and out.speculative_stats.accepted_tokens == 0


def test_a_rarely_drafted_position_is_read_near_the_one_before_it():
    controller = DraftLengthController(4)
    # position 2 drafted once, rejected
    controller.tries, controller.hits = ([[100.0, 100.0, 1.0, 0.0]], [[90.0, 90.0, 0.0, 0.0]])
    a = controller.acceptance()
    assert a[1] == pytest.approx(0.9, abs=0.01)
    assert a[2] == pytest.approx(a[1] / 2)  # one rejection against a prior of one pseudo-count at a_1: not 0
    assert a[3] == pytest.approx(a[2])  # never drafted: the position before it
    fresh = DraftLengthController(3).acceptance()
    assert fresh == pytest.approx([0.6, 0.6, 0.6])


def test_a_tree_step_also_measures_the_chain_alone():
    """CAPE's chain option learns from the tree steps too: how much of the first-child chain the accepted path kept."""
    controller = DraftLengthController(4, widths=(1.0, 2.0))
    controller.verify = {3: 0.03, 5: 0.04}  # past the two probing steps
    controller.option = 1
    for _ in range(20):
        controller.observe(2, [2], 0.002, 0.04, 5, on_chain=[0])  # the tree accepted 2, its chain would have accepted 0
    assert controller.acceptance(1)[0] > 0.9 and controller.acceptance(0)[0] < 0.1
    chain_only = DraftLengthController(4)
    chain_only.observe(2, [2], 0.002, 0.03, 3, on_chain=[0])  # a chain drafter has one option: on_chain changes nothing
    assert chain_only.acceptance()[0] > 0.6


def test_chain_accepted_reads_the_first_child_path():
    from hf_specdraft.core.emission import chain_accepted
    from hf_specdraft.core.tree import DraftTree

    tree = DraftTree(torch.tensor([5, 6, 7, 8]), torch.tensor([-1, 0, -1, 0]))  # chain 5 -> 6; 7 beside 5, 8 beside 6
    assert tree.chain_nodes() == [0, 1]
    assert chain_accepted(tree, [0, 1, 2]) == 2  # columns are 1 + node
    assert chain_accepted(tree, [0, 1, 4]) == 1  # the path left the chain at its second token
    assert chain_accepted(tree, [0, 3]) == 0
    assert chain_accepted(tree, [0]) == 0


def test_a_second_call_starts_from_what_the_first_learned(steady_costs):
    from hf_specdraft.core.controller_store import forget

    target = tiny_model()
    x = torch.randint(0, VOCAB, (1, 7), generator=torch.Generator().manual_seed(6))
    reference = greedy_reference(target, x, 40)
    first = speculative_generate(
        target,
        x,
        candidate_generator=AdaptiveOracle(reference, "right"),
        max_new_tokens=40,
        return_dict_in_generate=True,
    )
    assert first.speculative_stats.extra["controller_resumed"] is False
    assert first.speculative_stats.extra["draft_lengths"][:2] == [1, 3]
    second = speculative_generate(
        target,
        x,
        candidate_generator=AdaptiveOracle(reference, "right"),
        max_new_tokens=40,
        return_dict_in_generate=True,
    )
    assert torch.equal(second.sequences, reference)
    lengths = second.speculative_stats.extra["draft_lengths"]
    assert second.speculative_stats.extra["controller_resumed"] is True
    assert lengths[0] >= 4  # no probing: it drafts long from the first step, as the first call had learned
    other = tiny_model(seed=1)  # another target learns apart
    assert (
        speculative_generate(
            other,
            x,
            candidate_generator=AdaptiveOracle(greedy_reference(other, x, 8), "right"),
            max_new_tokens=8,
            return_dict_in_generate=True,
        ).speculative_stats.extra["controller_resumed"]
        is False
    )
    # another batch size: its own costs
    batch = speculative_generate(
        target,
        torch.cat([x, x]),
        candidate_generator=AdaptiveOracle(reference, "right"),
        max_new_tokens=8,
        return_dict_in_generate=True,
    )
    assert batch.speculative_stats.extra["controller_resumed"] is False
    forget(target)
    third = speculative_generate(
        target,
        x,
        candidate_generator=AdaptiveOracle(reference, "right"),
        max_new_tokens=8,
        return_dict_in_generate=True,
    )
    assert third.speculative_stats.extra["controller_resumed"] is False


def test_what_a_process_learned_is_kept_on_disk_for_the_next(tmp_path, monkeypatch):
    """The controller's state is saved per machine and pair: a new process (here: the in-process memory cleared) starts
    from it without probing; forget(model) drops its entries; an unreadable file or entry is measured afresh."""
    import json

    from hf_specdraft.core import controller_store as store
    from hf_specdraft.core.controller_store import MAX_ENTRIES, describe

    path = tmp_path / "cache" / "controller.json"
    monkeypatch.setenv("HF_SPECDRAFT_CONTROLLER_FILE", str(path))
    monkeypatch.setattr(store, "_MEMORY", type(store._MEMORY)())
    monkeypatch.setattr(store, "_SAVED", {})
    monkeypatch.setattr(store, "_PENDING", {})
    target = tiny_model()
    x = torch.randint(0, VOCAB, (1, 7), generator=torch.Generator().manual_seed(6))
    reference = greedy_reference(target, x, 40)

    def run(tokens=40):
        out = speculative_generate(
            target,
            x,
            candidate_generator=AdaptiveOracle(reference, "right"),
            max_new_tokens=tokens,
            return_dict_in_generate=True,
        )
        assert torch.equal(out.sequences, reference[:, : x.shape[1] + tokens])
        return out.speculative_stats.extra

    assert run()["controller_resumed"] is False
    saved = json.loads(path.read_text())
    assert len(saved) == 1 and describe(target) in next(iter(saved)) and "AdaptiveOracle" in next(iter(saved))
    assert json.loads(json.dumps(saved)) == saved and MAX_ENTRIES >= 64
    ((key, entry),) = saved.items()
    # an idle machine's costs: the
    entry["state"]["verify"] = {n: 0.01 + 0.0005 * int(n) for n in entry["state"]["verify"]}
    # first run timed them under this suite's load
    entry["state"]["verify_samples"] = {n: 4 for n in entry["state"]["verify"]}
    entry["state"]["draft_per_token"] = 0.0005
    path.write_text(json.dumps(saved))
    store._MEMORY.clear()  # a new process
    resumed = run()
    # no probing: long from the first step
    assert resumed["controller_resumed"] is True and resumed["draft_lengths"][0] == 8
    assert list(store._PENDING) == list(saved)  # saved again within SAVE_EVERY: kept for the process's exit
    store._save_pending()
    assert not store._PENDING and json.loads(path.read_text()) != saved  # the newer state
    store.forget(target)
    assert json.loads(path.read_text()) == {}
    assert run(8)["draft_lengths"][:2] == [1, 3]  # measured afresh
    ((key, entry),) = json.loads(path.read_text()).items()
    wrong = {
        "verify": None,
        "verify_samples": [1],
        "draft_per_token": "fast",
        "tries": [[None] * 8],
        "bin_hits": [],
        "stop_seconds": {"0": 1.0},
        "hits": [[True] * 8],
    }
    broken = ["{not json", "[]", json.dumps({key: {"state": {"verify": {"x": 1}}}}), json.dumps({key: "state"})]
    broken += [json.dumps({key: {**entry, "state": {**entry["state"], name: value}}}) for name, value in wrong.items()]
    for text in broken:  # another version's file, or an edited one: measured afresh, never a crash
        path.write_text(text)
        store._MEMORY.clear()
        assert run(8)["controller_resumed"] is False
    path.write_text(json.dumps({key: entry}))
    store._MEMORY.clear()
    assert run(8)["controller_resumed"] is True  # the intact entry is read
    other = {"another CPU | torch 0.0 | 2 CPUs" + key[key.index(" || ") :]: entry}
    path.write_text(json.dumps({key: entry, **other}))
    store.forget()
    assert json.loads(path.read_text()) == other  # another machine's entries in a shared file stay
    monkeypatch.setenv("HF_SPECDRAFT_CONTROLLER_FILE", "")
    path.unlink()
    store._MEMORY.clear()
    store._SAVED.clear()
    run(8)
    assert not path.exists()  # nothing on disk when the variable is set empty


def test_a_trees_confidences_are_judged_by_its_chain():
    """For a widened tree, the confidence bins count its chain's tokens by what the chain alone accepted (``on_chain``),
    not by the accepted path, which may run through an expansion token."""
    controller = DraftLengthController(4, widths=(1.0, 2.0))
    controller.option = 1
    # the path left the chain at once
    controller.observe(2, [2], 0.002, 0.03, 5, on_chain=[0], confidences=[[0.95, 0.95]])
    assert controller.bin_tries[9] == 1 and controller.bin_hits[9] == 0
    chain = DraftLengthController(4)
    chain.observe(2, [2], 0.002, 0.03, 3, confidences=[[0.95, 0.95]])  # a chain: its accepted tokens are its own
    assert chain.bin_tries[9] == 2 and chain.bin_hits[9] == 2


def test_a_draft_model_s_state_is_its_own():
    target = tiny_model()
    x = torch.randint(0, VOCAB, (1, 7), generator=torch.Generator().manual_seed(6))
    draft = tiny_model(seed=3, num_hidden_layers=1)
    runs = [
        speculative_generate(target, x, draft_model=d, max_new_tokens=12, return_dict_in_generate=True)
        for d in (draft, draft, tiny_model(seed=4, num_hidden_layers=1))
    ]
    assert [r.speculative_stats.extra["controller_resumed"] for r in runs] == [False, True, False]
    assert all(torch.equal(r.sequences, greedy_reference(target, x, 12)) for r in runs)


def measured(controller: DraftLengthController, cost) -> DraftLengthController:
    """``controller`` with the cost curve ``cost(n)`` (seconds of an n-token forward) measured twice at every width."""
    controller.verify = {n: cost(n) for n in range(1, controller.max_draft_tokens + 2)}
    controller.verify_samples = dict.fromkeys(controller.verify, 2)
    controller.draft_per_token = 0.001
    controller.confidence_stops = True
    return controller


def test_a_draft_stops_on_its_confidence():
    """keep_drafting: confident tokens draft on where the cost curve is flat; a doubtful one stops the draft; a steep
    curve stops even a confident draft early."""
    flat = measured(DraftLengthController(8), lambda n: 0.030)
    assert flat.choose() == 8  # the cap; the draft itself decides where to stop
    assert flat.keep_drafting([0.95]) and flat.keep_drafting([0.95] * 5)
    assert not flat.keep_drafting([0.95] * 8)  # the cap
    assert not flat.keep_drafting([0.95, 0.02])  # the path is almost surely dead: another token is wasted
    steep = measured(DraftLengthController(8), lambda n: 0.030 * (1 + 0.5 * (n - 1)))
    steep.choose()
    assert not steep.keep_drafting([0.6])
    fresh = DraftLengthController(8)
    fresh.confidence_stops = True
    assert fresh.choose() == 1 and fresh.keep_drafting([0.01])  # before the curve is measured, the chosen γ is drafted


def test_the_confidence_bins_learn_what_a_confidence_is_worth():
    controller = measured(DraftLengthController(4), lambda n: 0.030)
    assert controller.accepted_given(0.95) == pytest.approx(0.95)  # the prior: a calibrated draft
    for _ in range(50):  # tokens drafted at 0.95 are always rejected: this draft is overconfident
        controller.choose()
        # what the drafter asks after its token (the answer is not what this test checks)
        controller.keep_drafting([0.95])
        controller.observe(1, [0], 0.001, 0.03, 2, confidences=[[0.95]])
    assert controller.accepted_given(0.95) < 0.1 and controller.accepted_given(0.5) == pytest.approx(0.55)
    controller.choose()
    assert not controller.keep_drafting([0.95])
    assert controller.choices[-2] == 1  # a confidence-stopped step records what it drafted, not its cap


@pytest.mark.parametrize("kind", ["draft_model", "glide", "cape"])
def test_confidence_stops_stay_lossless(arch, kind):
    from hf_specdraft import CapeCandidateGenerator

    target = tiny_model(arch)
    x = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(7))
    draft = tiny_model(arch, seed=3, num_hidden_layers=1) if kind == "draft_model" else glide_for(target)
    drafter = DraftModelCandidateGenerator(draft) if kind == "draft_model" else GlideCandidateGenerator(draft)
    drafter = CapeCandidateGenerator(drafter) if kind == "cape" else drafter  # its chain stops, then is widened
    assert drafter.stops_on_confidence
    asked = []
    keep_drafting = DraftLengthController.keep_drafting

    def spy(self, confidences):
        asked.append(list(confidences))
        return keep_drafting(self, confidences)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(DraftLengthController, "keep_drafting", spy)
        for _ in range(2):  # the second call starts measured: its drafts stop on confidence from the first step
            out = speculative_generate(
                target, x, candidate_generator=drafter, max_new_tokens=24, return_dict_in_generate=True
            )
            assert torch.equal(out.sequences, greedy_reference(target, x, 24))
    steps, lengths = out.speculative_stats.steps, out.speculative_stats.extra["draft_lengths"]
    assert out.speculative_stats.extra["controller_resumed"] and not hasattr(drafter, "stop_rule")  # in each request
    assert asked and all(0.0 <= c <= 1.0 for cs in asked for c in cs)  # the draft asked, with its tokens' probabilities
    assert [s.drafted for s in steps[:-1]] == lengths[: len(steps) - 1]  # the lengths recorded are the ones drafted
    drafted = [s.drafted for s in steps[:-1] if not s.copied]  # a copy from the text may run to 16 (copy_length)
    # stopped before the cap
    assert all(1 <= d <= 8 for d in drafted) and min(drafted) < 8 and all(s.drafted <= 16 for s in steps)


def test_the_stop_rule_goes_with_its_call_and_under_cape_stops_the_chain_alone():
    from hf_specdraft import CapeCandidateGenerator

    target = tiny_model()
    x = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(7))
    glide = GlideCandidateGenerator(glide_for(target))
    # measured: the next call's drafts stop
    speculative_generate(target, x, candidate_generator=glide, max_new_tokens=12)
    calls = []

    def fail(self, request):
        calls.append(request.stop_rule)
        raise RuntimeError("a draft forward failed")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(GlideCandidateGenerator, "draft_tree", fail)
        with pytest.raises(RuntimeError, match="a draft forward failed"):
            speculative_generate(target, x, candidate_generator=glide, max_new_tokens=12)
    assert calls[0] is not None and not hasattr(glide, "stop_rule")  # in the step's request, never left on the drafter
    inner = GlideCandidateGenerator(glide_for(target))
    cape = CapeCandidateGenerator(inner)
    assert cape.stops_on_confidence and not CapeCandidateGenerator(inner, budget=6).stops_on_confidence
    seen, chains = [], []  # per step: the rule, budget and γ the loop chose for CAPE; what CAPE asked its chain drafter
    cape_tree, glide_tree = CapeCandidateGenerator.draft_tree, GlideCandidateGenerator.draft_tree
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            CapeCandidateGenerator,
            "draft_tree",
            lambda self, request: (
                seen.append((request.stop_rule, request.budget, request.num_draft_tokens)) or cape_tree(self, request)
            ),
        )
        mp.setattr(
            GlideCandidateGenerator,
            "draft_tree",
            lambda self, request: chains.append(request) or glide_tree(self, request),
        )
        steps = []
        for _ in range(3):
            out = speculative_generate(
                target, x, candidate_generator=cape, max_new_tokens=12, return_dict_in_generate=True
            )
            assert torch.equal(out.sequences, greedy_reference(target, x, 12))
            steps += out.speculative_stats.steps
    assert len(seen) == len(steps) == len(chains)
    assert all(
        c.budget is None and (c.stop_rule, c.num_draft_tokens) == (rule, gamma)
        for c, (rule, _, gamma) in zip(chains, seen)
    )
    stopped = [(budget, gamma, step) for (rule, budget, gamma), step in zip(seen, steps) if rule is not None]
    assert len(stopped) >= len(steps) - 2  # every step but the first call's two probes stops on its confidence
    alone = [step for budget, gamma, step in stopped if budget == gamma]
    widened = [step for budget, gamma, step in stopped if budget == 2 * gamma]
    # both widths run, each a tree of its own size
    assert len(alone) + len(widened) == len(stopped) and alone and widened
    assert all(step.tree_size == step.drafted for step in alone)  # the chain alone: no expansion set
    # sets fill twice the stopped chain
    assert all(step.drafted <= step.tree_size <= 2 * step.drafted for step in widened)


def test_a_tree_drafters_widths_are_weighed_by_what_their_stopped_steps_realized():
    """With confidence stops, a tree drafter's width is the one whose steps gave the most tokens per second; the other
    width still runs every EXPLORE_EVERY steps, and the stop rule reads the widened tree's cost."""
    for wide_accepts, expect in ((1, 0), (2, 1)):  # the chain alone accepts 1 a step; the wider tree costs 12 % more
        controller = measured(DraftLengthController(6, widths=(1.0, 2.0)), lambda n: 0.030 + 0.002 * n)
        options = []
        for _ in range(64):
            assert controller.choose() == 6 and controller.stops_this_step
            options.append(controller.option)
            controller.keep_drafting([0.9])
            accepted = wide_accepts if controller.option == 1 else 1
            controller.observe(2, [accepted], 0.002, 0.034 + 0.004 * controller.option, 3 + 2 * controller.option)
        assert 0.75 < options.count(expect) / len(options) < 0.95 and options[-8:].count(1 - expect) == 1
        controller.choose()  # the stop rule reads the chosen width's cost: 2 chain tokens, 2 or 4 nodes
        assert controller._draft_costs[2] == pytest.approx(
            2 * 0.001 + controller.cost_curve()(3 + 2 * controller.option)
        )
        assert controller.option == expect


def test_a_drafter_that_never_asks_is_given_gamma_again():
    controller = measured(DraftLengthController(8), lambda n: 0.030)
    assert controller.choose() == 8 and controller.stops_this_step
    controller.observe(8, [2], 0.008, 0.03, 9)  # drafted the cap without asking keep_drafting once
    assert not controller.confidence_stops
    controller.choose()
    assert not controller.stops_this_step  # γ is chosen by the rate again, drafted whole


def test_a_width_timed_once_is_not_read_above_the_curve():
    controller = DraftLengthController(8)
    for _ in range(3):
        for n in (2, 3):
            controller.observe(n - 1, [0], 0.001, 0.030 + 0.001 * n, n)
    controller.observe(4, [0], 0.001, 2.0, 5)  # a first 5-token forward that carried a one-time set-up
    assert controller.cost_curve()(5) < 0.05 and controller.cost_curve()(8) < 0.05
    controller.observe(4, [0], 0.001, 0.036, 5)  # timed again: the smaller of the two stands
    assert controller.verify[5] == pytest.approx(0.036)


class ChainOracle(DraftModelCandidateGenerator):
    """A chain drafter that goes through ``draft_chain`` (so its drafts stop on confidence) and costs next to nothing:
    it drafts the target's greedy continuation ``reference`` (``shift=0``: always accepted) or each of its tokens + 1
    (``shift=1``: never accepted), at probability 0.9."""

    def __init__(self, target, reference, shift: int):
        super().__init__(target)
        self.reference, self.shift = reference[0], shift

    def draft_tree(self, request):
        from hf_specdraft.core.drafting import draft_chain

        input_ids = request.input_ids
        start, fed = input_ids.shape[1], []

        def next_logits(feed):
            position = start + len(fed)
            fed.append(position)
            logits = torch.full((1, VOCAB), -30.0)
            token = int(self.reference[position]) if position < self.reference.numel() else 0
            logits[0, (token + self.shift) % VOCAB] = 0.0
            logits[0, (token + self.shift + 1) % VOCAB] = -2.2  # the rest of q: the drafted token has q ≈ 0.9
            return logits

        return draft_chain(self, request, next_logits, input_ids.device)


@pytest.mark.parametrize("cape", [False, True])
@pytest.mark.parametrize("mode", ["right", "wrong"])
def test_confidence_stops_with_drafts_always_right_and_always_wrong(arch, mode, cape):
    from hf_specdraft import CapeCandidateGenerator

    target = tiny_model(arch)
    x = torch.randint(0, VOCAB, (1, 7), generator=torch.Generator().manual_seed(8))
    reference = greedy_reference(target, x, 40)
    drafter = ChainOracle(target, reference, shift=0 if mode == "right" else 1)
    drafter = CapeCandidateGenerator(drafter) if cape else drafter  # CAPE: the stopped chain, then widened
    asked = []
    keep_drafting, observe = DraftLengthController.keep_drafting, DraftLengthController.observe

    def steady_costs(self, drafted, accepted, draft_seconds, verify_seconds, *args, **kwargs):
        # the costs of a GPU-like target: a drafted token 2 % of a verification (measured clocks on two busy CPU cores
        # can make drafting look dear for a while, and the test is about the confidence rule, not the clock)
        return observe(self, drafted, accepted, 2e-4 * drafted, 1e-2, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            DraftLengthController, "keep_drafting", lambda self, c: asked.append(len(c)) or keep_drafting(self, c)
        )
        mp.setattr(DraftLengthController, "observe", steady_costs)
        for _ in range(3):  # later calls start measured: every step's draft stops on its confidence
            out = speculative_generate(
                target, x, candidate_generator=drafter, max_new_tokens=40, return_dict_in_generate=True
            )
            assert torch.equal(out.sequences, reference)
    assert asked  # the drafts did stop on confidence
    steps = out.speculative_stats.steps[:-1]  # the last step drafts what room is left
    if mode == "right":  # every draft accepted and nearly free: drafts run long
        assert all(s.accepted == s.drafted for s in steps) and max(s.drafted for s in steps) >= 4
    elif not cape:  # confident but never accepted: the bins learn it, one token a step
        assert out.speculative_stats.accepted_tokens == 0
        assert [s.drafted for s in steps].count(1) >= len(steps) - 1
    else:  # the chain is never accepted (an expansion token may be): its drafts shrink to one token all the same
        assert [s.drafted for s in steps].count(1) >= len(steps) - 2


@pytest.mark.parametrize("bad", [3, "model", object()])
def test_forget_names_a_bad_model(bad):
    from hf_specdraft.core.controller_store import forget

    with pytest.raises(TypeError, match="forget\\(model\\) takes a model"):
        forget(bad)


def test_a_copy_is_sized_by_how_often_copies_were_right():
    """copy_length: copies that ran on are copied long where verification is cheap, each match bin learns its own rates,
    copies that were always wrong are declined for the model's draft (but every EXPLORE_EVERY-th is tried again)."""
    from hf_specdraft.core.controller import COPY_START, EXPLORE_EVERY

    unmeasured = DraftLengthController(8, max_copy_tokens=16)
    # no cost curve yet; the text's end
    assert unmeasured.copy_length(12, 40) == COPY_START and unmeasured.copy_length(3, 2) == 2
    cost = lambda n: 0.030 + 0.004 * n  # noqa: E731 (seconds of an n-token forward)
    controller = measured(DraftLengthController(8, max_copy_tokens=16), cost)
    controller.verify.update({n: cost(n) for n in range(10, 18)})
    for _ in range(30):  # long matches: copies always right
        controller.choose()
        n = controller.copy_length(20, 40)
        controller.observe(n, [n], 0.0, cost(n + 1), n + 1, copied=True)
    # the longest copy, or what the text has
    assert controller.copy_length(20, 40) == 16 and controller.copy_length(20, 5) == 5
    for _ in range(30):  # short matches: the first copied token right, the second never
        controller.choose()
        n = controller.copy_length(3, 40)
        controller.observe(n, [min(n, 1)], 0.0, cost(n + 1), n + 1, copied=True)
    assert controller.copy_length(3, 40) == 1 and controller.copy_length(20, 40) == 16  # each bin its own rates
    for _ in range(40):  # matches of 5-7: copies always wrong
        controller.choose()
        n = controller.copy_length(6, 40)
        if n:
            controller.observe(n, [0], 0.0, cost(n + 1), n + 1, copied=True)
    taken = [controller.copy_length(6, 40) for _ in range(EXPLORE_EVERY * 2)]
    assert taken.count(0) == 2 * (EXPLORE_EVERY - 1) and all(t >= 1 for t in taken if t)  # declined, but tried again


def test_a_copied_step_teaches_only_the_copy_rates_and_the_cost_curve():
    """A copy costs no draft forward and says nothing of the draft model: its step leaves the model's acceptance counts,
    draft cost and confidence bins as they were, and times the verification forward like any other."""
    controller = measured(DraftLengthController(8, max_copy_tokens=16), lambda n: 0.030)
    controller.choose()
    controller.keep_drafting([0.9])
    controller.observe(2, [1], 0.004, 0.03, 3, confidences=[[0.9, 0.5]])  # a model step, stopped on its confidence
    before = (
        controller.tries,
        controller.hits,
        controller.draft_per_token,
        controller.bin_tries,
        controller.stop_seconds,
    )
    controller.choose()
    n = controller.copy_length(9, 30)
    controller.observe(n, [n], 0.0, 0.05, 13, copied=True)
    assert (
        controller.tries,
        controller.hits,
        controller.draft_per_token,
        controller.bin_tries,
        controller.stop_seconds,
    ) == before
    # COPY_MATCH_BINS.index(8): the 8-15 bin
    assert (
        controller.verify[13] == 0.05
        and sum(controller.copy_tries[COPY_MATCH_BINS.index(8)]) == n
        and controller.confidence_stops
    )
    assert controller.choices[-1] == n


def test_a_state_saved_before_copies_were_learned_is_still_read():
    """A controller file written before the copy rates existed resumes the rest of what it learned."""
    from hf_specdraft.core.controller import _CARRIED
    from hf_specdraft.core.controller_store import _restore

    old = measured(DraftLengthController(8), lambda n: 0.030)
    state = {name: getattr(old, name) for name in _CARRIED if not name.startswith("copy_")}
    fresh = DraftLengthController(8)
    assert _restore(fresh, json_round_trip(state)) and fresh.verify == old.verify and fresh.copy_tries == old.copy_tries
    # a broken field still fails
    assert not _restore(DraftLengthController(8), json_round_trip({**state, "copy_hits": [[1.0]]}))


def json_round_trip(state: dict) -> dict:
    import json

    return json.loads(json.dumps(state))


def test_one_slow_forward_does_not_make_every_longer_draft_look_dear():
    """Timing noise only slows a forward: a width timed slow (another process on the cores, kept in the controller file)
    is read at a longer width's cost, the curve still never decreases, and one spike moves a width's average by 30 % at
    the most."""
    controller = measured(DraftLengthController(8), lambda n: 0.030 + 0.002 * n)
    controller.verify[3] = 1.6
    curve = [controller.cost_curve()(n) for n in range(1, 13)]
    # v(3) read at v(4)'s; v(6) as measured
    assert curve[2] == pytest.approx(0.038) and curve[5] == pytest.approx(0.042)
    assert curve == sorted(curve) and curve[11] >= curve[8]  # past the longest measured width: the line, never below it
    controller.confidence_stops = False
    assert controller.choose() >= 2  # the slow 3-token forward no longer keeps γ at 1
    before = controller.verify[5]
    controller.observe(4, [0], 0.004, 5.0, 5)
    assert before < controller.verify[5] <= 1.3 * before


def test_a_checkpoint_retrained_in_place_keeps_no_earlier_state():
    """The disk key names a model's weights too: a drafter retrained under the same name and shape (a new release of a
    shipped drafter, a fine-tune saved over the old one) does not resume the acceptance its earlier weights earned."""
    from hf_specdraft.core.controller_store import entry_key, identity

    target = tiny_model("llama")
    first, again = tiny_model("llama", seed=1), tiny_model("llama", seed=1)
    retrained = tiny_model("llama", seed=2)
    for model in (first, again, retrained):
        model.config._name_or_path = "org/drafter"
    assert identity(first) == identity(again)  # the same weights, another object: the same entry
    assert identity(first) != identity(retrained)
    assert entry_key(target, first, "Drafter", ()) == entry_key(target, again, "Drafter", ())
    assert entry_key(target, first, "Drafter", ()) != entry_key(target, retrained, "Drafter", ())
