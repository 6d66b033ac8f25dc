"""A GLIDE checkpoint's copy table: what followed each short context in the target's own text, copied from where the
request's text offers no copy. Built, written into a checkpoint, loaded back, used by the default call, lossless."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import VOCAB, greedy_reference, tiny_model
from hf_specdraft import speculative_generate
from hf_specdraft.core.ngram_table import NGramTable, build_ngram_table, copy_table_of
from hf_specdraft.glide import GlideCandidateGenerator, GlideConfig, GlideForCausalLM
from recipes.copy_table import write_copy_table

pytestmark = pytest.mark.usefixtures("one_thread")
NEW_TOKENS = 40


def test_the_longest_context_held_picks_the_most_frequent_follower():
    texts = [[1, 2, 3, 4], [1, 2, 3, 4], [9, 2, 3, 5], [9, 2, 3, 5], [7, 3, 5]]
    keys, tokens = build_ngram_table(texts, orders=(2, 1), min_count=2, min_share=0.5)
    table = NGramTable(keys, tokens, orders=(1, 2))
    assert table.chain([1, 2, 3]) == [4]  # "2 3": 4 and 5 twice each (the first seen); nothing followed "3 4" or "4"
    assert table.chain([8, 3]) == [5]  # "8 3" unseen: "3" alone, followed by 5 three times and 4 twice
    assert table.chain([1, 2]) == [3, 4] and table.chain([1, 2], max_tokens=1) == [3]
    assert table.chain([6]) == []
    rare = NGramTable(*build_ngram_table(texts, orders=(2,), min_count=3), orders=(2,))
    assert rare.chain([8, 2, 3]) == [4] and rare.chain([5, 1, 2]) == []  # "2 3" occurred 4 times, "1 2" only twice


def test_bad_tables_are_refused_by_name():
    with pytest.raises(ValueError, match="orders"):
        build_ngram_table([[1, 2]], orders=(0,))
    with pytest.raises(ValueError, match="min_share"):
        build_ngram_table([[1, 2]], min_share=0)
    with pytest.raises(ValueError, match="1-D tensors of one length"):
        NGramTable(torch.zeros(3), torch.zeros(3, dtype=torch.long), orders=(2,))
    target = tiny_model("llama")
    with pytest.raises(ValueError, match="copy_table_size"):
        GlideConfig.from_target_config(target.config, hidden_size=32, copy_table_size=-1)
    with pytest.raises(ValueError, match="copy_table_orders"):
        GlideConfig.from_target_config(target.config, hidden_size=32, copy_table_size=4)


def test_the_default_call_copies_from_the_checkpoints_table_losslessly(tmp_path):
    target = tiny_model("llama")
    torch.manual_seed(1)
    GlideForCausalLM(GlideConfig.from_target_config(target.config, hidden_size=32)).save_pretrained(tmp_path)
    plain = GlideForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(3))[:24][None]  # no token twice
    reference = greedy_reference(target, ids, NEW_TOKENS)
    # the table knows the target's own continuation, as a table of its answers knows its phrasing
    assert write_copy_table(tmp_path, [reference[0].tolist()], orders=(3, 2), min_count=1) > 0
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["copy_table_orders"] == [3, 2] and config["copy_table_size"] > 0
    tabled = GlideForCausalLM.from_pretrained(tmp_path).eval()
    assert copy_table_of(plain) is None and len(copy_table_of(tabled)) == config["copy_table_size"]
    assert copy_table_of(tabled) is copy_table_of(tabled)  # built once per loaded buffer
    runs = {}
    for name, glide in (("plain", plain), ("tabled", tabled)):
        out = speculative_generate(
            target, ids, draft_model=glide, max_new_tokens=NEW_TOKENS, return_dict_in_generate=True
        )
        assert torch.equal(out.sequences, reference)
        runs[name] = out.speculative_stats.steps
    assert len(runs["tabled"]) < len(runs["plain"]) and sum(s.copied for s in runs["tabled"]) > 0
    off = speculative_generate(
        target,
        ids,
        candidate_generator=GlideCandidateGenerator(tabled, copy_from_table=False),
        max_new_tokens=NEW_TOKENS,
        return_dict_in_generate=True,
    )
    assert torch.equal(off.sequences, reference) and len(off.speculative_stats.steps) > len(runs["tabled"])
    fixed = speculative_generate(target, ids, draft_model=tabled, num_draft_tokens=2, max_new_tokens=NEW_TOKENS)
    assert torch.equal(fixed, reference)  # a fixed γ never copies from the table (no controller weighs it)
    with pytest.raises(TypeError, match="copy_from_table must be a bool"):
        GlideCandidateGenerator(tabled, copy_from_table="no")


@pytest.mark.parametrize("cross_attention", [True, False], ids=["glide", "vanilla-twin"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("table_is", ["right", "wrong"])
def test_a_table_that_is_always_right_or_always_wrong_stays_lossless(tmp_path, arch, table_is, cross_attention):
    """Whatever the table proposes, the target judges it: its greedy text comes out, on more than one architecture,
    for GLIDE and for its vanilla twin."""
    target = tiny_model(arch)
    torch.manual_seed(2)
    config = GlideConfig.from_target_config(target.config, hidden_size=32, cross_attention=cross_attention)
    GlideForCausalLM(config).save_pretrained(tmp_path)
    ids = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(5))[:20][None]
    reference = greedy_reference(target, ids, NEW_TOKENS)[0].tolist()
    shift = 0 if table_is == "right" else 1  # "wrong": every context the text has, followed by another token
    windows = [reference[i - 3 : i] + [(reference[i] + shift) % VOCAB] for i in range(3, len(reference))]
    write_copy_table(tmp_path, windows, orders=(3,), min_count=1)
    glide = GlideForCausalLM.from_pretrained(tmp_path).eval()
    out = speculative_generate(target, ids, draft_model=glide, max_new_tokens=NEW_TOKENS, return_dict_in_generate=True)
    assert out.sequences[0].tolist() == reference
    copied = [s for s in out.speculative_stats.steps if s.copied]
    if table_is == "wrong":  # every copy the table makes is rejected at its first token (context copies aside)
        assert copied and min(s.accepted for s in copied) == 0


def test_the_recipe_refuses_what_is_not_a_glide_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="GLIDE checkpoint directory"):
        write_copy_table(tmp_path, [[1, 2, 3]])
    tiny_model("llama").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="model_type 'llama'"):
        write_copy_table(tmp_path, [[1, 2, 3]])


def test_a_twin_takes_the_table_of_a_glide_of_the_same_target(tmp_path):
    """recipes.copy_table --table-from: the vanilla twin (no cross-attention) copies from the same table, losslessly."""
    from recipes.copy_table import copy_table_from

    target = tiny_model("llama")
    torch.manual_seed(1)
    glide_dir, twin_dir, other_dir = tmp_path / "glide", tmp_path / "twin", tmp_path / "other"
    GlideForCausalLM(GlideConfig.from_target_config(target.config, hidden_size=32)).save_pretrained(glide_dir)
    config = GlideConfig.from_target_config(target.config, hidden_size=32, cross_attention=False)
    GlideForCausalLM(config).save_pretrained(twin_dir)
    with pytest.raises(ValueError, match="carries no copy table"):
        copy_table_from(twin_dir, glide_dir)
    with pytest.raises(ValueError, match="--table-from must be a GLIDE checkpoint directory"):
        copy_table_from(twin_dir, tmp_path / "missing")
    ids = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(3))[:24][None]
    reference = greedy_reference(target, ids, NEW_TOKENS)
    size = write_copy_table(glide_dir, [reference[0].tolist()], orders=(3, 2), min_count=1)
    plain = GlideForCausalLM.from_pretrained(twin_dir).eval()
    assert copy_table_from(twin_dir, glide_dir) == size
    twin = GlideForCausalLM.from_pretrained(twin_dir).eval()
    assert not twin.config.cross_attention and twin.config.copy_table_orders == [3, 2]
    assert torch.equal(twin.copy_table_keys, GlideForCausalLM.from_pretrained(glide_dir).copy_table_keys)
    steps = {}
    for name, drafter in (("plain", plain), ("tabled", twin)):
        out = speculative_generate(
            target, ids, draft_model=drafter, max_new_tokens=NEW_TOKENS, return_dict_in_generate=True
        )
        assert torch.equal(out.sequences, reference)
        steps[name] = len(out.speculative_stats.steps)
    assert steps["tabled"] < steps["plain"]
    other = tiny_model("llama", vocab_size=VOCAB + 8)  # another target: its token ids mean other tokens
    GlideForCausalLM(GlideConfig.from_target_config(other.config, hidden_size=32)).save_pretrained(other_dir)
    with pytest.raises(ValueError, match="a copy table holds one target's token ids"):
        copy_table_from(other_dir, glide_dir)
