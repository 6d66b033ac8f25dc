"""One shape for the methods' options: a validated ``<Method>Config`` dataclass and a candidate generator
that takes ``config=`` or the config's fields as keywords, never both, with the same checks and messages."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from conftest import tiny_model
from hf_specdraft import DraftModelCandidateGenerator
from hf_specdraft.cape import CapeCandidateGenerator, CapeConfig
from hf_specdraft.cascade import CascadeCandidateGenerator, CascadeConfig
from hf_specdraft.casd import CasdCandidateGenerator, CasdConfig
from hf_specdraft.glide import GlideCandidateGenerator, GlideDraftingConfig
from test_glide import make_glide


@pytest.fixture(scope="module")
def draft():
    return tiny_model(num_hidden_layers=1)


def builders(draft):
    """Per method: (config class, generator from a config or keywords, one valid non-default field)."""
    glide = make_glide(tiny_model())
    return {
        "glide": (GlideDraftingConfig, lambda **kw: GlideCandidateGenerator(glide, **kw), {"num_draft_tokens": 3}),
        "cape": (
            CapeConfig,
            lambda **kw: CapeCandidateGenerator(DraftModelCandidateGenerator(draft, 2), **kw),
            {"budget": 6},
        ),
        "cascade": (CascadeConfig, lambda **kw: CascadeCandidateGenerator([draft], **kw), {"lenience": 2.0}),
        "casd": (CasdConfig, lambda **kw: CasdCandidateGenerator(torch.arange(20), **kw), {"max_nodes": 8}),
    }


@pytest.mark.parametrize("method", ["glide", "cape", "cascade", "casd"])
def test_config_or_keywords_never_both(draft, method):
    config_class, build, field = builders(draft)[method]
    assert dataclasses.is_dataclass(config_class)
    by_config, by_keywords = build(config=config_class(**field)), build(**field)
    assert by_config.config == by_keywords.config == config_class(**field)
    with pytest.raises(ValueError, match="not both"):
        build(config=config_class(), **field)
    with pytest.raises(TypeError, match=f"config must be a {config_class.__name__}"):
        build(config=dict(field))
    with pytest.raises(TypeError, match="unexpected keyword"):
        build(num_draft_tokenz=3)


@pytest.mark.parametrize(
    "config_class, field",
    [
        (GlideDraftingConfig, "num_draft_tokens"),
        (CapeConfig, "budget"),
        (CascadeConfig, "max_gram_tokens"),
        (CasdConfig, "max_nodes"),
    ],
)
@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "4"])
def test_counts_are_checked_the_same_way(config_class, field, bad):
    with pytest.raises(ValueError, match=f"{field} must be .*a positive int"):
        config_class(**{field: bad})


def test_glide_takes_gamma_as_a_keyword():
    glide = make_glide(tiny_model())
    assert GlideCandidateGenerator(glide).num_draft_tokens == 5  # §5.1
    assert GlideCandidateGenerator(glide, num_draft_tokens=3).num_draft_tokens == 3
    with pytest.raises(TypeError, match="num_draft_tokens=3"):  # the old positional γ says how to pass it now
        GlideCandidateGenerator(glide, 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        GlideDraftingConfig().num_draft_tokens = 2


def test_cascade_config():
    assert (
        CascadeConfig().lenience == 1.0
        and CascadeConfig().max_gram_tokens == 10
        and CascadeConfig().num_draft_tokens == "auto"
    )
    with pytest.raises(ValueError, match="lenience"):
        CascadeConfig(lenience=0.5)
    with pytest.raises(ValueError, match="num_draft_tokens must be a positive int or 'auto'"):
        CascadeConfig(num_draft_tokens=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        CascadeConfig().lenience = 3.0
