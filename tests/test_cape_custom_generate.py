"""The CAPE ``custom_generate/`` folder a checkpoint ships: the package's expansion, lossless, without hf_specdraft."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from hf_specdraft.cape import CapeConfig, expand_proposal, write_custom_generate
from hf_specdraft.cape import expansion_sets
from hf_specdraft.cape.custom_generate.generate import generate as cape_generate
from hf_specdraft.core.tree import DraftTree
from conftest import VOCAB, greedy_reference, tiny_config, tiny_model


def prompt(length=7, seed=1):
    return torch.randint(0, VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("budget", [5, 12, 32, 64])
def test_template_expansion_equals_expand_proposal(budget):
    gen = torch.Generator().manual_seed(budget)
    q = torch.softmax(torch.randn(5, 50, generator=gen) * torch.tensor([0.5, 2.0, 4.0, 8.0, 1.0])[:, None], dim=-1)
    chain = torch.multinomial(q, 1, generator=gen)[:, 0]  # sampled, so not always the argmax
    tree = expand_proposal(DraftTree.chain(chain, q), CapeConfig(budget=budget))
    tokens, parents = expansion_sets.expand(
        chain, q, expansion_sets.check_schedule(expansion_sets.DEFAULT_SCHEDULE), budget
    )
    assert tokens == tree.tokens.tolist() and parents == tree.parent_list


@pytest.mark.parametrize("draft_kind", ["random", "perfect"])
def test_template_loop_is_lossless(arch, draft_kind):
    target = tiny_model(arch)
    draft = target if draft_kind == "perfect" else tiny_model(arch, seed=3, num_hidden_layers=1)
    x = prompt()
    out = cape_generate(target, input_ids=x, assistant_model=draft, max_new_tokens=20, num_draft_tokens=4)
    assert torch.equal(out, greedy_reference(target, x, 20))


def test_template_loop_verifies_with_transposed_linears(monkeypatch):
    import hf_specdraft.core.projection as projection

    # a CPU where W @ h.T wins (the AMD VMs)
    monkeypatch.setattr(projection, "transposed_is_faster", lambda weight, rows: True)
    target = tiny_model("qwen2")
    x = prompt()
    rows_seen, original = [], torch.matmul
    monkeypatch.setattr(torch, "matmul", lambda a, b: rows_seen.append(b.shape[-1]) or original(a, b))
    out = cape_generate(
        target, input_ids=x, assistant_model=target, max_new_tokens=12, num_draft_tokens=3, verification_budget=5
    )
    assert torch.equal(out, greedy_reference(target, x, 12))
    assert rows_seen and max(rows_seen) > 1  # few-token verification forwards went through W @ h.T
    assert not any("forward" in vars(m) for m in target.modules())  # and every linear got its own forward back


def test_template_loop_stops_at_eos():
    target = tiny_model()
    x = prompt()
    eos = greedy_reference(target, x, 16)[0, x.shape[1] + 5].item()
    out = cape_generate(
        target, inputs=x, assistant_model=target, max_new_tokens=16, eos_token_id=eos, return_dict_in_generate=True
    )
    assert torch.equal(out.sequences, greedy_reference(target, x, 16, eos_token_id=eos))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"do_sample": True}, "greedy"),
        ({"attention_mask": torch.tensor([[0, 1, 1, 1, 1, 1, 1]])}, "padding"),
        ({"num_draft_token": 3}, "unsupported generate arguments"),
        ({"repetition_penalty": 1.3}, "repetition_penalty"),
        ({"verification_budget": 2}, "smaller than the drafted chain"),
        ({"expansion_schedule": ((0.5, 1), (1.0, 3))}, "must not grow"),
        ({"assistant_model": None}, "no draft model"),
    ],
)
def test_template_errors(kwargs, match):
    target = tiny_model()
    options = {"assistant_model": target, "max_new_tokens": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        cape_generate(target, input_ids=prompt(), **options)


def test_write_custom_generate_keeps_an_existing_model_card(tmp_path):
    (tmp_path / "README.md").write_text("my card")
    written = write_custom_generate(tmp_path)
    assert {"cape_draft.py", "expansion_sets.py", "generate.py", "loop.py", "tree.py"} <= {p.name for p in written}
    assert (tmp_path / "README.md").read_text() == "my card"
    assert "custom_generate" in (write_custom_generate(tmp_path / "fresh")[-1]).read_text()


def test_the_shipped_folder_is_made_of_the_core_s_own_files(tmp_path):
    """No drift: the folder's loop is the core's loop, file for file; only the entry point and the drafter are
    templates. It holds what generate.py imports, transitively, and nothing else."""
    import hf_specdraft.core.loop
    from hf_specdraft.cape.packaging import sibling_imports

    core = Path(hf_specdraft.core.loop.__file__).parent
    modules = {p.name for p in core.glob("*.py")} - {"__init__.py"}
    written = {p.name for p in write_custom_generate(tmp_path, readme=False)}
    shipped_core = written - {"expansion_sets.py", "generate.py", "cape_draft.py"}
    assert {"loop.py", "tree.py", "acceptance.py"} <= shipped_core <= modules
    folder = tmp_path / "custom_generate"
    for name in shipped_core:
        assert (folder / name).read_text() == (core / name).read_text(), (
            f"custom_generate/{name} drifted from hf_specdraft/core/{name}"
        )
    imported = {"generate.py"}  # every file reached from the entry point, and every file there is reached
    todo = ["generate.py"]
    while todo:
        for sibling in sibling_imports(folder / todo.pop()):
            assert f"{sibling}.py" in written, f"custom_generate/ lacks {sibling}.py, which the shipped loop imports"
            if f"{sibling}.py" not in imported:
                imported.add(f"{sibling}.py")
                todo.append(f"{sibling}.py")
    assert imported == written, f"shipped but never imported: {sorted(written - imported)}"
    entry = (folder / "generate.py").read_text()
    # the entry runs no forward: the core's loop does
    assert "speculative_generate" in entry and "past_key_values" not in entry


FRESH_PROCESS = r'''
import json, sys, torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig, Qwen2Config
try:
    import hf_specdraft
    sys.exit("hf_specdraft must not be importable here")
except ImportError:
    pass
CKPT = sys.argv[1]
CONFIGS = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config}
COMMON = COMMON_CONFIG


class ExpansionOracle:
    """Right up to position 1, wrong there with the right token second in q: every path ends in an expansion token."""
    def __init__(self, reference):
        self.reference = reference[0]
    def propose(self, input_ids, target_cache, num_tokens):
        right = self.reference[input_ids.shape[1]: input_ids.shape[1] + num_tokens]
        q = torch.full((right.numel(), COMMON["vocab_size"]), 0.01)
        chain = right.clone()
        chain[1:] = (right[1:] + 1) % COMMON["vocab_size"]
        q[torch.arange(right.numel()), chain] = 0.5
        q[torch.arange(1, right.numel()), right[1:]] = 0.3
        return chain, q / q.sum(-1, keepdim=True)


class OracleDraft(LlamaForCausalLM):
    def cape_drafter(self, target):
        return ExpansionOracle(self.reference)


results = {}
for arch, cls in CONFIGS.items():
    torch.manual_seed(0)
    target = AutoModelForCausalLM.from_config(cls(**COMMON)).eval()
    x = torch.randint(0, COMMON["vocab_size"], (1, 7), generator=torch.Generator().manual_seed(1))
    ref = target.generate(x, max_new_tokens=24, do_sample=False)
    run = lambda **kw: target.generate(
        input_ids=x, custom_generate=CKPT, trust_remote_code=True, max_new_tokens=24, **kw)
    draft = AutoModelForCausalLM.from_pretrained(CKPT)
    oracle = OracleDraft(draft.config).eval()
    oracle.reference = ref
    calls = []
    hook = target.register_forward_hook(lambda *args: calls.append(1))
    forced = run(assistant_model=oracle)
    hook.remove()
    results[arch] = {
        "explicit_draft": torch.equal(run(assistant_model=draft), ref),
        "draft_from_checkpoint": torch.equal(run(), ref),
        # one architecture is enough
        "perfect_draft": arch != "llama" or torch.equal(run(assistant_model=target, num_draft_tokens=3), ref),
        "forced_expansion": torch.equal(forced, ref),
        "target_forwards": len(calls),
    }
torch.manual_seed(0)  # a Mistral with a 6-token sliding window, generating past it through the folder
windowed = AutoModelForCausalLM.from_config(MistralConfig(**{**COMMON, "sliding_window": 6})).eval()
results["mistral_past_window"] = torch.equal(
    windowed.generate(
        input_ids=x, custom_generate=CKPT, trust_remote_code=True, max_new_tokens=24, assistant_model=draft),
    windowed.generate(x, max_new_tokens=24, do_sample=False))
results["imported"] = sorted(m for m in sys.modules if m.startswith("hf_specdraft"))
try:
    target.generate(input_ids=x, custom_generate=CKPT, assistant_model=draft, max_new_tokens=4)
    results["untrusted"] = "ran"
except ValueError as error:
    results["untrusted"] = "trust_remote_code" in str(error)
print("RESULTS" + json.dumps(results))
'''


def test_custom_generate_directory_runs_without_hf_specdraft(tmp_path):
    checkpoint = tmp_path / "cape-draft"
    tiny_model("llama", seed=3, num_hidden_layers=1).save_pretrained(checkpoint)
    write_custom_generate(checkpoint)
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "hf_specdraft.py").write_text("raise ImportError('hf_specdraft is blocked in this test')\n")
    common = {
        k: v
        for k, v in tiny_config("llama").to_dict().items()
        if k
        in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "intermediate_size",
            "max_position_embeddings",
        )
    }
    script = tmp_path / "run.py"
    script.write_text(
        textwrap.dedent(FRESH_PROCESS).replace(
            "COMMON_CONFIG", repr({**common, "eos_token_id": None, "bos_token_id": None, "pad_token_id": None})
        )
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        PYTHONPATH=str(blocker),
        HF_MODULES_CACHE=str(tmp_path / "modules"),
        HF_HUB_OFFLINE="1",
        OMP_NUM_THREADS="1",
        TRANSFORMERS_VERBOSITY="error",
    )
    done = subprocess.run(
        [sys.executable, "-P", str(script), str(checkpoint)],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.split("RESULTS", 1)[1])
    for arch in ("llama", "mistral", "qwen2"):
        outcome = results[arch]
        assert outcome["explicit_draft"] and outcome["draft_from_checkpoint"] and outcome["perfect_draft"], (
            arch,
            outcome,
        )
        assert outcome["forced_expansion"], (arch, outcome)
        assert outcome["target_forwards"] == 1 + 24 // 3  # prefill + steps of (chain token, expansion token, bonus)
    assert results["mistral_past_window"] is True  # on the transformers this runs on: the floor of the declared range
    assert results["imported"] == []
    assert results["untrusted"] is True


@pytest.mark.parametrize(
    "version, supported",
    [
        ("5.17.0", False),
        ("5.22.1", False),
        ("5.23.0", True),
        ("5.23.1.dev0", True),
        ("5.24.0", True),
        ("5.24.2", True),
        ("5.25.0", False),
        ("6.0.0", False),
    ],
)
def test_the_folder_refuses_a_transformers_version_outside_the_tested_range(version, supported):
    from hf_specdraft.cape.custom_generate.generate import check_transformers_version

    if supported:
        check_transformers_version(version)
    else:
        with pytest.raises(
            ImportError, match=rf"needs transformers>=5\.23,<5\.25; found transformers {re.escape(version)}"
        ):
            check_transformers_version(version)


def test_the_folder_s_range_is_the_package_s_declared_range():
    import tomllib

    from hf_specdraft.cape.custom_generate.generate import SUPPORTED_TRANSFORMERS

    declared = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["dependencies"]
    (low, high) = SUPPORTED_TRANSFORMERS
    assert f"transformers>={low[0]}.{low[1]},<{high[0]}.{high[1]}" in declared
