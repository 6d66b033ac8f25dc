"""Tiny random models and oracle drafters shared by the tests."""

from __future__ import annotations

import os
import subprocess
import sys

# few_token_linears' calibrations stay in memory during tests (no file shared between runs or with the user's cache);
# tests/test_projection.py checks the file itself with a temporary path
os.environ["HF_SPECDRAFT_CALIBRATION_FILE"] = ""
os.environ["HF_SPECDRAFT_CONTROLLER_FILE"] = (
    ""  # and so does what the controller learned (tests/test_controller.py checks the file)
)

import pytest  # noqa: E402
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config

from hf_specdraft.core.drafting import TreeCandidateGenerator
from hf_specdraft.core.tree import DraftTree

VOCAB = 96
ARCHITECTURES = ("llama", "mistral", "qwen2")
# for the compiled path's slowest tests (dynamo traces every bucket, seconds each): llama in the default suite, the
# other two under -m slow, which CI runs too (the README's test command stays within five minutes on 2 cores)
COMPILED_ARCHITECTURES = ["llama", *(pytest.param(a, marks=pytest.mark.slow) for a in ARCHITECTURES[1:])]


def tiny_config(arch: str, vocab_size: int = VOCAB, **overrides):
    common = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    common.update(overrides)
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "mistral":
        return MistralConfig(**{"sliding_window": 256, **common})
    if arch == "qwen2":
        return Qwen2Config(**common)
    raise ValueError(arch)


def tiny_model(arch: str = "llama", seed: int = 0, attn_implementation: str = "sdpa", **overrides):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, **overrides), attn_implementation=attn_implementation)
    return model.eval()


def greedy_reference(model, input_ids, max_new_tokens, **kwargs):
    return model.generate(input_ids, max_new_tokens=max_new_tokens, do_sample=False, **kwargs)


class OracleDrafter(TreeCandidateGenerator):
    """Knows the target's greedy continuation ``reference`` `(1, T)` and drafts from it.

    mode "right": the next ``k`` reference tokens (always accepted);
    mode "wrong": each reference token + 1 (never accepted);
    mode "tree": a multi-branch tree whose accepted path is never the first child, so verification
    must use the tree mask and the cache compaction must gather, not crop.
    """

    def __init__(self, reference: torch.Tensor, mode: str = "right", k: int = 4, vocab_size: int = VOCAB):
        super().__init__()
        self.reference, self.mode, self.k, self.vocab_size = reference[0], mode, k, vocab_size

    def propose(self, input_ids, target_cache=None):
        length = input_ids.shape[1]
        assert torch.equal(input_ids[0], self.reference[:length]), "the loop diverged from the target's greedy output"
        right = self.reference[length : length + self.k]
        wrong = (right + 1) % self.vocab_size
        if self.mode == "right":
            return DraftTree.chain(right)
        if self.mode == "wrong":
            return DraftTree.chain(wrong)
        tokens, parents, parent = [], [], -1
        for r, w in zip(right.tolist(), wrong.tolist()):
            tokens += [w, r]
            parents += [parent, parent]
            tokens.append((w + 1) % self.vocab_size)  # a child of the wrong branch: never reached
            parents.append(len(tokens) - 3)
            parent = len(tokens) - 2
        return DraftTree(torch.tensor(tokens), torch.tensor(parents))


@pytest.fixture
def one_thread():
    """Tiny models on a shared CPU: more than one intra-op thread only adds contention."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(params=ARCHITECTURES)
def arch(request):
    return request.param


def run_without_hf_specdraft(folder, script: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run ``folder/script`` in a fresh Python where hf_specdraft cannot be imported (a blocking module in the
    script's folder shadows it, even pip-installed), offline, one thread; assert it succeeded."""
    (folder / "hf_specdraft.py").write_text("raise ImportError('hf_specdraft is hidden from this process')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(
        HF_MODULES_CACHE=str(folder / "modules"),
        HF_HUB_OFFLINE="1",
        OMP_NUM_THREADS="1",
        TRANSFORMERS_VERBOSITY="error",
    )
    done = subprocess.run(
        [sys.executable, script, *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="session")
def corpus():
    from hf_specdraft.defaults.corpus import build_corpus

    return build_corpus()


@pytest.fixture(scope="session")
def tiny_default(tmp_path_factory, corpus):
    """The tiny recipe trained end to end (target, drafts, GLIDE, bigram table; seconds) once per test run:
    the embedded default's plumbing tests and the examples / notebooks share it. Returns (directory, log)."""
    from recipes.recipe import get_recipe
    from recipes.training import train_default

    out = tmp_path_factory.mktemp("tiny_default")
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_SPECDRAFT_CACHE", str(out / "cache"))
    try:
        log = train_default(get_recipe("tiny"), out / "run", corpus=corpus)
    finally:
        mp.undo()
    return out / "run", log
