"""The target's state handed to the drafters that ask for it, by transformers' protocol.

* A drafter that declares ``requires_model_outputs`` and ``model_kwargs_overrides={"output_hidden_states": [...]}``
  receives, over its calls, the named layers' hidden states of every position of its text exactly once and in order,
  equal to a plain forward over the final text: on one row and a padded batch, chains and trees (kept nodes), the
  DynamicCache and the static path (eager and compiled).
* transformers' own DFlash generator runs in the loop, losslessly, through ``draft_model=`` (a tiny drafter written to
  its contract) and as a plain ``candidate_generator=``.
* A drafter that asks for nothing pays nothing: no forward gets an extra argument and no state is gathered.
"""

from __future__ import annotations

import math
import sys

import pytest
import torch
from transformers import CompileConfig, GenerationConfig, PretrainedConfig, PreTrainedModel
from transformers.generation import PromptLookupCandidateGenerator
from transformers.generation.candidate_generator import DFlashTokenCandidateGenerator
from transformers.modeling_outputs import BaseModelOutput

from conftest import ARCHITECTURES, VOCAB, OracleDrafter, greedy_reference, tiny_model
from hf_specdraft import speculative_generate
from hf_specdraft.core import target_state
from hf_specdraft.core.state_drafting import StateReadingDrafter
from syncs import SyncCounter

EAGER_GRAPHS = CompileConfig(backend="eager", mode=None)  # the compiled path's graphs, without a compiler's minutes
# hidden_states entries of a 2-layer tiny target: the first layer's output and the last (after the norm)
LAYERS = [1, 2]


class StateOracle(OracleDrafter):
    """An oracle drafter (right, wrong or a tree whose accepted path is never the first child) that asks for the
    target's states and keeps what it is handed."""

    requires_model_outputs = True
    model_kwargs_overrides = {"output_hidden_states": LAYERS}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.handed: list = []  # (text length, first, matched, states or None)

    def propose(self, input_ids, target_cache=None, target_state=None):
        outputs = target_state.outputs
        self.handed.append(
            (
                input_ids.shape[1],
                target_state.first,
                target_state.matched,
                None if outputs is None else outputs.hidden_states,
            )
        )
        return super().propose(input_ids, target_cache)


def reference_states(target, text: torch.Tensor) -> tuple:
    with torch.no_grad():
        return target(text, output_hidden_states=True).hidden_states


def check_handed(target, drafter: StateOracle, text: torch.Tensor) -> None:
    """Every position of the row's text but its newest token was handed once, in order, equal to a plain forward's."""
    first = drafter.handed[0]
    assert first[1] and first[3] is None  # is_first_iteration: nothing yet
    later = [h for h in drafter.handed[1:]]
    assert later and not any(h[1] for h in later)
    for _, _, matched, states in later[1:]:  # (the first of them holds the prompt's too)
        assert states[LAYERS[0]].shape[1] == matched + 1  # the last token and the accepted path
    reference = reference_states(target, text)
    for layer in range(len(reference)):
        got = [h[3][layer] for h in later]
        if layer not in LAYERS:
            assert all(g is None for g in got)  # only the asked layers are computed
            continue
        got = torch.cat(got, dim=1)
        covered = got.shape[1]
        assert covered == later[-1][0] - 1  # positions 0 .. L - 2 of the text the last proposal saw
        torch.testing.assert_close(got[0], reference[layer][0, :covered], atol=2e-4, rtol=1e-3)


@pytest.mark.parametrize("mode", ["right", "wrong", "tree"])
@pytest.mark.parametrize(
    "arch, path",
    [
        (arch, path) if path != "compiled" or arch == "llama" else pytest.param(arch, path, marks=pytest.mark.slow)
        for arch in ARCHITECTURES
        for path in ("dynamic", "static", "compiled")
    ],
)
def test_states_at_the_kept_positions_one_row(arch, mode, path, one_thread):
    if path == "compiled" and mode == "wrong":
        pytest.skip("the compiled graphs are covered by the right and tree drafters")
    target = tiny_model(arch)
    x = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(3))
    reference = greedy_reference(target, x, 20)
    drafter = StateOracle(reference, mode)
    kwargs = {} if path == "dynamic" else {"cache_implementation": "static"}
    if path == "compiled":
        kwargs["compile_config"] = EAGER_GRAPHS
    out = speculative_generate(target, x, candidate_generator=drafter, max_new_tokens=20, **kwargs)
    assert torch.equal(out, reference)
    check_handed(target, drafter, out[:, :-1])


@pytest.mark.parametrize("path", ["dynamic", "static"])
@pytest.mark.parametrize("mode", ["right", "tree"])
def test_states_at_the_kept_positions_padded_batch(arch, path, mode, one_thread):
    target = tiny_model(arch)
    prompts = [torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(n)) for n in (9, 6)]
    references = [greedy_reference(target, p, 16) for p in prompts]
    x = torch.zeros(2, 9, dtype=torch.long)
    mask = torch.zeros(2, 9, dtype=torch.long)
    for r, p in enumerate(prompts):
        x[r, 9 - p.shape[1] :], mask[r, 9 - p.shape[1] :] = p[0], 1
    drafters = [StateOracle(ref, mode) for ref in references]
    kwargs = {} if path == "dynamic" else {"cache_implementation": "static"}
    out = speculative_generate(
        target, x, attention_mask=mask, candidate_generator=drafters, max_new_tokens=16, pad_token_id=0, **kwargs
    )
    for r, (p, ref, drafter) in enumerate(zip(prompts, references, drafters)):
        row = out[r, 9 - p.shape[1] :][: ref.shape[1]]
        assert torch.equal(row, ref[0])
        check_handed(target, drafter, row[None, :-1])


def forbid_everywhere(monkeypatch, function, replacement) -> list[str]:
    """Replace ``function`` in every loaded hf_specdraft module that holds it under its name (a module that imported it
    by name calls its own binding, which patching the defining module alone would miss). Returns those modules."""
    patched = []
    for name, module in list(sys.modules.items()):
        if name.startswith("hf_specdraft") and getattr(module, function.__name__, None) is function:
            monkeypatch.setattr(module, function.__name__, replacement)
            patched.append(name)
    return patched


def test_a_drafter_that_asks_for_nothing_pays_nothing(monkeypatch, one_thread):
    """No forward gets an extra argument or returns states, and no state is gathered, on every layout."""
    target = tiny_model("llama")
    x = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(0)).repeat(2, 1)
    reference = greedy_reference(target, x[:1], 12)
    calls = []

    def asked(module, args, kwargs):
        calls.append(sorted(k for k in kwargs if k.startswith(("output_", "return_"))))

    def returned(module, args, kwargs, out):
        assert getattr(out, "hidden_states", None) is None

    target.register_forward_pre_hook(asked, with_kwargs=True)
    target.register_forward_hook(returned, with_kwargs=True)
    patched = forbid_everywhere(monkeypatch, target_state.kept_states, lambda *a: pytest.fail("a state was gathered"))
    assert "hf_specdraft.core.loop" in patched, patched  # where the step calls it, not only where it is defined
    for kwargs in ({}, {"cache_implementation": "static"}):
        for mode in ("right", "tree"):
            speculative_generate(
                target, x[:1], candidate_generator=OracleDrafter(reference, mode), max_new_tokens=12, **kwargs
            )
        speculative_generate(
            target,
            x,
            candidate_generator=[OracleDrafter(reference, "wrong") for _ in range(2)],
            max_new_tokens=12,
            **kwargs,
        )
    assert calls and all(c == [] for c in calls), calls


def test_states_stay_on_the_device(one_thread):
    """Asking for states adds no host-device crossing to a step: they are sliced (a chain) or gathered with indices
    copied without a sync (a tree), never read."""
    target = tiny_model("llama")
    x = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(0))
    reference = greedy_reference(target, x, 16)
    counts = {}
    for name, drafter in (("plain", OracleDrafter(reference, "tree")), ("state", StateOracle(reference, "tree"))):
        with SyncCounter() as syncs:
            speculative_generate(
                target, x, candidate_generator=drafter, max_new_tokens=16, cache_implementation="static"
            )
        counts[name] = syncs.per_step[2:]
    assert max(counts["state"]) <= max(counts["plain"]), counts


class TinyDFlashConfig(PretrainedConfig):
    model_type = "tiny_dflash_test"

    def __init__(self, hidden_size=32, target_layer_ids=(0, 1), block_size=4, mask_token_id=1, **kwargs):
        super().__init__(**kwargs)
        self.hidden_size, self.target_layer_ids = hidden_size, list(target_layer_ids)
        self.block_size, self.mask_token_id, self.num_hidden_layers = block_size, mask_token_id, 1


class TinyDFlash(PreTrainedModel):
    """A drafter written to DFlash's contract (what transformers' DFlashTokenCandidateGenerator calls): the fused target
    states of its layers fill its own cache as keys and values, and one forward drafts the block from
    ``[bonus token, mask × (block_size - 1)]`` (its output goes through the target's head). It records the context
    states it receives, to check the hand-off."""

    config_class = TinyDFlashConfig

    def __init__(self, config):
        super().__init__(config)
        width = config.hidden_size
        self.fuse = torch.nn.Linear(len(config.target_layer_ids) * width, width)
        self.query = torch.nn.Linear(width, width)
        self.post_init()
        self.contexts: list[torch.Tensor] = []

    def forward(
        self, noise_embeds, context_hidden_states, position_ids, attention_mask=None, past_key_values=None, cache=None
    ):
        self.contexts.append(context_hidden_states)
        states = torch.cat([self.fuse(context_hidden_states), noise_embeds], dim=1)[:, None]  # (1, 1, n + block, H)
        # transformers 5.24 passes cache=, 5.23 past_key_values=
        cache = cache if cache is not None else past_key_values
        keys, values = cache.update(states, states, 0)
        scores = self.query(noise_embeds)[:, None] @ keys.transpose(-1, -2) / math.sqrt(keys.shape[-1])
        return BaseModelOutput(last_hidden_state=(scores.softmax(-1) @ values)[:, 0] + noise_embeds)


def tiny_dflash(seed: int = 1) -> TinyDFlash:
    torch.manual_seed(seed)
    return TinyDFlash(TinyDFlashConfig()).eval()


@pytest.mark.parametrize("path", ["dynamic", "static"])
def test_dflash_drafter_through_draft_model_is_lossless(arch, path, one_thread):
    target = tiny_model(arch)
    x = torch.randint(0, VOCAB, (1, 10), generator=torch.Generator().manual_seed(5))
    reference = greedy_reference(target, x, 24)
    drafter = tiny_dflash()
    kwargs = {} if path == "dynamic" else {"cache_implementation": "static"}
    out = speculative_generate(
        target, x, draft_model=drafter, max_new_tokens=24, return_dict_in_generate=True, **kwargs
    )
    assert torch.equal(out.sequences, reference)
    # the context it was handed: the prompt, then each step's last token and accepted tokens, as a plain forward
    # computes the layers it names (hidden_states[i + 1] for target layer i)
    handed = torch.cat(drafter.contexts, dim=1)[0]
    states = reference_states(target, out.sequences)
    expected = torch.cat([states[i + 1][0, : handed.shape[0]] for i in drafter.config.target_layer_ids], dim=-1)
    torch.testing.assert_close(handed, expected, atol=2e-4, rtol=1e-3)
    assert handed.shape[0] >= reference.shape[1] - 2 - drafter.config.block_size


def test_dflash_drafter_in_a_batch_and_through_generate(one_thread):
    target = tiny_model("qwen2")
    x = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(2))
    drafter = tiny_dflash()
    out = target.generate(
        x, custom_generate=speculative_generate, draft_model=drafter, max_new_tokens=16, do_sample=False
    )
    for r in range(2):
        assert torch.equal(out[r : r + 1], greedy_reference(target, x[r : r + 1], 16))


def test_transformers_dflash_generator_as_a_candidate_generator(one_thread):
    """transformers' own generator, unchanged, as ``candidate_generator=`` (batch 1)."""
    target = tiny_model("llama")
    x = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(4))
    reference = greedy_reference(target, x, 20)
    config = target.generation_config
    config.max_length = reference.shape[1]
    generator = DFlashTokenCandidateGenerator(
        tiny_dflash(), target.get_input_embeddings(), target.get_output_embeddings(), config
    )
    out = speculative_generate(target, x, candidate_generator=generator, max_new_tokens=20)
    assert torch.equal(out, reference)


def test_dflash_under_sampling_is_lossless_in_distribution(one_thread):
    """q is what DFlash sampled from: the first token's distribution matches the target's (chi-square, 400 draws)."""
    from scipy.stats import chisquare

    target = tiny_model("llama")
    x = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        p = target(x).logits[0, -1].softmax(-1)
    drafter = tiny_dflash()
    torch.manual_seed(0)
    counts = torch.zeros(VOCAB)
    for _ in range(400):
        out = speculative_generate(target, x, draft_model=drafter, max_new_tokens=2, do_sample=True, top_k=0)
        counts[out[0, 6]] += 1
    keep = p * 400 >= 5
    expected = torch.cat([p[keep] * 400, (p[~keep] * 400).sum()[None]])
    observed = torch.cat([counts[keep], counts[~keep].sum()[None]])
    expected = expected * observed.sum() / expected.sum()
    assert chisquare(observed.numpy(), expected.numpy()).pvalue > 1e-3


def test_bad_state_requests_are_refused_by_name():
    target = tiny_model("llama")
    x = torch.randint(0, VOCAB, (1, 6))
    reference = greedy_reference(target, x, 4)

    class Asks(StateOracle):
        model_kwargs_overrides = {"output_hidden_states": [7]}

    with pytest.raises(ValueError, match=r"hidden_states\[7\] of a target with 2 layers"):
        speculative_generate(target, x, candidate_generator=Asks(reference), max_new_tokens=4)

    class AsksOther(StateOracle):
        model_kwargs_overrides = {"output_router_logits": True}

    with pytest.raises(ValueError, match="output_router_logits.*LlamaForCausalLM.forward does not take"):
        speculative_generate(target, x, candidate_generator=AsksOther(reference), max_new_tokens=4)
    with pytest.raises(ValueError, match="num_draft_tokens must be 'auto' or the DFlash drafter's block_size 4"):
        StateReadingDrafter(tiny_dflash(), num_draft_tokens=2)
    with pytest.raises(ValueError, match="Gemma 4 assistant or a DFlash drafter"):
        StateReadingDrafter(target)
    with pytest.raises(ValueError, match="reads the target's hidden states.*speculative_generate"):
        StateReadingDrafter(tiny_dflash()).propose(x)


@pytest.mark.parametrize("kind", ["assisted-random", "assisted-same", "prompt-lookup", "dflash"])
def test_transformers_assisted_decoding_checks_on_the_loop(kind, one_thread):
    """transformers' own assisted-decoding checks (``tests/generation/test_utils.py``: assisted or prompt-lookup output
    equals greedy, 4 new tokens, 2 drafted a step, an assistant that is random or the model itself), plus its DFlash
    generator, run on this loop over three architectures and five prompts each: 0 mismatches."""
    mismatches = []
    for arch in ("llama", "mistral", "qwen2"):
        target = tiny_model(arch)
        assistant = target if kind == "assisted-same" else tiny_model(arch, seed=9, num_hidden_layers=1)
        for seed in range(5):
            x = torch.randint(0, VOCAB, (1, 7), generator=torch.Generator().manual_seed(seed))
            x[0, 4:] = x[0, :3]  # a repeated stretch, so that prompt lookup finds a match
            reference = greedy_reference(target, x, 4)
            if kind.startswith("assisted"):
                out = speculative_generate(target, x, draft_model=assistant, num_draft_tokens=2, max_new_tokens=4)
            elif kind == "prompt-lookup":
                lookup = PromptLookupCandidateGenerator(num_output_tokens=2, max_length=x.shape[1] + 4)
                out = speculative_generate(target, x, candidate_generator=lookup, max_new_tokens=4)
            else:
                config = GenerationConfig(max_length=x.shape[1] + 4)
                generator = DFlashTokenCandidateGenerator(
                    tiny_dflash(seed), target.get_input_embeddings(), target.get_output_embeddings(), config
                )
                out = speculative_generate(target, x, candidate_generator=generator, max_new_tokens=4)
            if not torch.equal(out, reference):
                mismatches.append((arch, seed, out.tolist(), reference.tolist()))
    assert mismatches == []
