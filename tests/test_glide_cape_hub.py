"""A saved GLIDE checkpoint runs GLIDE+CAPE from ``target.generate(custom_generate=<dir>)`` with only transformers
(Du et al. 2024, §4.1-4.2): GLIDE's CAPE drafter glimpses the target's live cache, the output equals greedy, and
the model card shows both ways to decode."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard

from conftest import VOCAB, greedy_reference, run_without_hf_specdraft, tiny_model
from hf_specdraft.cape.custom_generate.cape_draft import CausalLMDrafter, make_drafter
from hf_specdraft.cape.custom_generate.generate import generate as cape_generate
from hf_specdraft import write_glide_custom_generate
from hf_specdraft.glide import save_glide_checkpoint
from test_glide import briefly_trained_glide, make_glide, prompt, target_cache

HUB_ARCHITECTURES = ("llama", "qwen2")
MAX_NEW_TOKENS = 24


pytestmark = pytest.mark.usefixtures("one_thread")


# --- GLIDE's CAPE drafter, in process ---------------------------------------------------------------------


def test_cape_drafter_returns_a_greedy_chain_with_q():
    target = tiny_model("llama")
    drafter = make_drafter(make_glide(target), target)
    assert isinstance(drafter, CausalLMDrafter) and drafter.glimpses
    x = prompt(9, seed=3)
    tokens, q = drafter.propose(x, target_cache(target, x), 4)
    assert tokens.shape == (4,) and q.shape == (4, VOCAB) and q.dtype == torch.float32
    torch.testing.assert_close(q.sum(-1), torch.ones(4))
    assert torch.equal(tokens, q.argmax(-1))
    own = drafter.generator  # its own cache: the text + the fed draft tokens
    assert own.cache.get_seq_length() == own.seen.numel() == 9 + 3


def test_cape_drafter_glimpses_the_target_cache():
    target = tiny_model("llama")
    glide = make_glide(target)
    x = prompt(9, seed=4)
    _, q = make_drafter(glide, target).propose(x, target_cache(target, x), 3)
    changed = target_cache(target, x)
    changed.layers[glide.config.target_layer_ids[0]].keys.normal_()
    _, q_changed = make_drafter(glide, target).propose(x, changed, 3)
    assert not torch.allclose(q, q_changed)


def test_cape_drafter_rejects_bad_input():
    target = tiny_model("llama")
    glide = make_glide(target)
    drafter = make_drafter(glide, target)
    x = prompt(6)
    with pytest.raises(ValueError, match=r"must cover input_ids\[:, :-1\]"):
        drafter.propose(x, target_cache(target, x[:, :-1]), 3)  # one token short of the verified prefix
    with pytest.raises(ValueError, match="live transformers Cache"):
        drafter.propose(x, None, 3)
    with pytest.raises(ValueError, match="num_tokens"):
        drafter.propose(x, target_cache(target, x), 0)
    with pytest.raises(ValueError, match=r"shape \(1, L\)"):
        drafter.propose(x.repeat(2, 1), target_cache(target, x), 3)
    with pytest.raises(ValueError, match="num_hidden_layers"):
        make_drafter(glide, tiny_model("llama", num_hidden_layers=3))


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
def test_template_loop_with_glide_is_lossless(arch):
    """The CAPE loop with GLIDE's drafter equals greedy, including a 1-token prompt (empty target cache)."""
    target = tiny_model(arch)
    glide = make_glide(target)
    for length in (1, 7):
        x = prompt(length, seed=length)
        out = cape_generate(target, input_ids=x, assistant_model=glide, max_new_tokens=16, num_draft_tokens=4)
        assert torch.equal(out, greedy_reference(target, x, 16))


# --- the saved checkpoint ---------------------------------------------------------------------------------


def test_save_glide_checkpoint_rejects_bad_input(tmp_path):
    target = tiny_model("llama")
    glide = make_glide(target)
    with pytest.raises(ValueError, match="card_info"):
        save_glide_checkpoint(glide, tmp_path, card_info={"datasets": "typo"})
    with pytest.raises(ValueError, match="target_name"):
        save_glide_checkpoint(glide, tmp_path, target_name="")
    with pytest.raises(TypeError, match="GLIDE model"):
        save_glide_checkpoint(target, tmp_path)
    with pytest.raises(TypeError, match="custom_generate"):
        save_glide_checkpoint(glide, tmp_path, custom_generate="custom_generate/")


def test_save_glide_checkpoint_writes_the_custom_generate_it_is_given(tmp_path):
    """The folder's writer is an argument (CAPE's, another, or none: the default, as the glide package imports no other
    method)."""
    glide = make_glide(tiny_model("llama"))
    written = []
    save_glide_checkpoint(glide, tmp_path / "none")
    save_glide_checkpoint(glide, tmp_path / "mine", custom_generate=written.append)
    save_glide_checkpoint(glide, tmp_path / "cape", custom_generate=write_glide_custom_generate)
    assert not (tmp_path / "none" / "custom_generate").exists() and written == [tmp_path / "mine"]
    assert "custom_generate" not in ModelCard.load(tmp_path / "none" / "README.md").data.tags
    assert "custom_generate" in ModelCard.load(tmp_path / "mine" / "README.md").data.tags
    assert (tmp_path / "cape" / "custom_generate" / "generate.py").is_file()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Per architecture: a stock target and a briefly trained GLIDE saved by ``save_glide_checkpoint``."""
    root = tmp_path_factory.mktemp("glide_hub")
    torch.set_num_threads(1)
    for arch in HUB_ARCHITECTURES:
        target = tiny_model(arch)
        # train_glide writes its own checkpoint there
        glide = briefly_trained_glide(target, root / f"{arch}_trained", custom_generate=write_glide_custom_generate)
        target.save_pretrained(root / f"{arch}_target")
        card_info = {
            "dataset": "the target's greedy text",
            "metrics": {"acceptance_rate": 0.5},
            "repo_id": f"my-org/glide-{arch}",
        }
        save_glide_checkpoint(
            glide,
            root / f"{arch}_glide",
            target_name=f"my-org/tiny-{arch}",
            card_info=card_info,
            custom_generate=write_glide_custom_generate,
        )
    torch.save(prompt(7, seed=1), root / "inputs.pt")
    return root


FRESH_PROCESS = textwrap.dedent(
    """
    import json, sys, torch
    try:
        import hf_specdraft  # noqa: F401
        sys.exit("hf_specdraft must not be importable here")
    except ImportError:
        pass
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    x = torch.load("inputs.pt")


    def run(arch, target):
        # the call under test; also returns the cache object of every target forward
        caches = []
        hook = target.register_forward_pre_hook(
            lambda m, args, kwargs: caches.append(kwargs.get("cache", kwargs.get("past_key_values"))), with_kwargs=True
        )
        out = target.generate(
            input_ids=x, custom_generate=arch + "_glide", trust_remote_code=True, max_new_tokens=MAX_NEW_TOKENS
        )
        hook.remove()
        return out, caches


    results = {}
    for arch in sys.argv[1:]:
        target = AutoModelForCausalLM.from_pretrained(arch + "_target").eval()
        reference = target.generate(x, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
        first, _ = run(arch, target)  # loads GLIDE from the checkpoint
        cape_draft = [
            m for name, m in sys.modules.items()
            if name.startswith("transformers_modules") and name.endswith(".cape_draft")
        ]
        module = next(m for m in cape_draft if any(key[0] == arch + "_glide" for key in m._LOADED_DRAFTS))
        glide = next(draft for key, draft in module._LOADED_DRAFTS.items() if key[0] == arch + "_glide")
        drafter_class = module.CausalLMDrafter
        seen, propose = [], drafter_class.propose

        def recording_propose(self, input_ids, target_cache, num_tokens):
            seen.append((input_ids.shape[1], target_cache.get_seq_length(), id(target_cache)))
            return propose(self, input_ids, target_cache, num_tokens)

        drafter_class.propose = recording_propose
        second, caches = run(arch, target)
        drafter_class.propose = propose
        assistant = AutoModelForCausalLM.from_pretrained(arch + "_glide", trust_remote_code=True).eval()
        assistant.attach(target)
        assisted = target.generate(x, assistant_model=assistant, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
        assistant.detach()
        results[arch] = {
            "draft_class": type(glide).__module__ + "." + type(glide).__name__,
            "custom_generate_equals_greedy": torch.equal(first, reference) and torch.equal(second, reference),
            "target_forwards": len(caches),
            "proposals": len(seen),
            "glimpsed_verified_prefix": all(covered == length - 1 for length, covered, _ in seen),
            "glimpsed_live_cache": all(cache_id == id(caches[-1]) for _, _, cache_id in seen),
            "assistant_keeps_own_generate": "generate" not in vars(assistant),
            "assisted_equals_greedy": torch.equal(assisted, reference),
        }
    results["imported"] = sorted(m for m in sys.modules if m.startswith("hf_specdraft"))
    print("RESULTS" + json.dumps(results))
    """
).replace("MAX_NEW_TOKENS", str(MAX_NEW_TOKENS))


@pytest.fixture(scope="module")
def fresh_process_results(checkpoints):
    """Run the checkpoints in a new Python where hf_specdraft cannot be imported (a blocking module comes first)."""
    (checkpoints / "check.py").write_text(FRESH_PROCESS)
    done = run_without_hf_specdraft(checkpoints, "check.py", *HUB_ARCHITECTURES)
    return json.loads(done.stdout.split("RESULTS", 1)[1])


@pytest.mark.parametrize("arch", HUB_ARCHITECTURES)
def test_custom_generate_runs_glide_cape_without_hf_specdraft(fresh_process_results, arch):
    outcome = fresh_process_results[arch]
    assert outcome["draft_class"].startswith("transformers_modules.") and outcome["draft_class"].endswith(
        "GlideForCausalLM"
    )
    assert outcome["custom_generate_equals_greedy"], outcome
    assert outcome["proposals"] > 0 and outcome["glimpsed_verified_prefix"] and outcome["glimpsed_live_cache"], outcome
    assert outcome["target_forwards"] < MAX_NEW_TOKENS, outcome  # drafts were accepted: GLIDE+CAPE did the work
    assert fresh_process_results["imported"] == []


@pytest.mark.parametrize("arch", HUB_ARCHITECTURES)
def test_checkpoint_loaded_with_trust_remote_code_still_drafts_for_assisted_decoding(fresh_process_results, arch):
    """transformers installs a checkpoint's custom_generate/ as the loaded model's generate; GLIDE keeps its own."""
    outcome = fresh_process_results[arch]
    assert outcome["assistant_keeps_own_generate"] and outcome["assisted_equals_greedy"], outcome


def test_model_card_shows_both_calls_and_metadata(checkpoints):
    directory = checkpoints / "llama_glide"
    assert {
        "config.json",
        "model.safetensors",
        "modeling_glide.py",
        "configuration_glide.py",
        "target_binding.py",
        "README.md",
    } <= {p.name for p in directory.iterdir()}
    from hf_specdraft.cape.packaging import shipped_files

    assert sorted(p.name for p in (directory / "custom_generate").iterdir()) == sorted(shipped_files())
    assert (
        json.loads((directory / "config.json").read_text())["auto_map"]["AutoModelForCausalLM"]
        == "modeling_glide.GlideForCausalLM"
    )
    card = ModelCard.load(directory / "README.md")
    assert {"custom_generate", "speculative-decoding"} <= set(card.data.tags)
    assert (card.data.base_model, card.data.library_name, card.data.pipeline_tag) == (
        "my-org/tiny-llama",
        "transformers",
        "text-generation",
    )
    assert 'target.generate(**inputs, custom_generate="my-org/glide-llama", trust_remote_code=True' in card.text
    assert "glide.attach(target)" in card.text and "target.generate(**inputs, assistant_model=glide" in card.text
    assert "acceptance rate: 0.5" in card.text


def test_training_writes_the_same_hub_ready_checkpoint(checkpoints):
    directory = checkpoints / "llama_trained"
    assert (directory / "custom_generate" / "generate.py").is_file() and (directory / "training_log.json").is_file()
    assert "custom_generate" in ModelCard.load(directory / "README.md").data.tags


def test_no_checkpoint_ships_a_training_module(checkpoints):
    """A checkpoint's trust_remote_code files and custom_generate/ hold inference only: nothing of glide/training/."""
    import hf_specdraft.glide.training as training

    modules = {p.name for p in Path(training.__file__).parent.glob("*.py")} - {"__init__.py", "__main__.py"}
    assert {"trainer.py", "objective.py", "store.py"} <= modules
    for directory in (checkpoints / "llama_glide", checkpoints / "llama_trained"):
        shipped = [p.relative_to(directory) for p in directory.rglob("*.py")]
        assert shipped and not [p for p in shipped if p.name in modules or "training" in p.parts], shipped
        text = "\n".join(p.read_text() for p in directory.rglob("*.py"))
        assert (
            not [m for m in modules if f"from .{m.removesuffix('.py')} import" in text]
            and "training import" not in text
        )


# --- the model card's snippet is code users copy: it runs as written ------------------------------------------


def _word_tokenizer(directory):
    """A word-level tokenizer over the tiny vocabulary (the card's snippet loads one from the target's directory)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "The", "quick", "brown", "fox"] + [f"w{i}" for i in range(VOCAB - 5)]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>").save_pretrained(directory)


def test_model_card_snippet_runs_as_written(checkpoints):
    """The README's python block, its Hub ids pointed at the local checkpoints, in a process without hf_specdraft."""
    arch = HUB_ARCHITECTURES[0]
    _word_tokenizer(checkpoints / f"{arch}_target")
    card = (checkpoints / f"{arch}_glide" / "README.md").read_text()
    snippet = card.split("```python\n", 1)[1].split("```", 1)[0]
    assert (
        "dtype=torch.float32" in snippet and f'"my-org/glide-{arch}"' in snippet and f'"my-org/tiny-{arch}"' in snippet
    )
    snippet = snippet.replace(f"my-org/glide-{arch}", f"{arch}_glide").replace(f"my-org/tiny-{arch}", f"{arch}_target")
    check = snippet.replace(
        "out = target.generate(**inputs, custom_generate", "cape_out = target.generate(**inputs, custom_generate"
    )
    check += textwrap.dedent("""
        reference = target.generate(**inputs, max_new_tokens=128, do_sample=False)
        print("SNIPPET", torch.equal(cape_out, reference), torch.equal(out, reference))
    """)
    (checkpoints / "card_snippet.py").write_text(check)
    done = run_without_hf_specdraft(checkpoints, "card_snippet.py")
    assert done.stdout.split("SNIPPET", 1)[1].split() == ["True", "True"]
