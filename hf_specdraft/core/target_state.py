"""The target's state handed to the drafters that ask for it: the named layers' hidden states at the kept positions.

Drafters that read the target's hidden state (Gemma 4's assistant, DFlash, MTP heads, EAGLE) follow transformers'
protocol (``generation/candidate_generator.py``: ``requires_model_outputs``, ``model_kwargs_overrides``,
``get_candidates(..., model_outputs=, is_first_iteration=, n_last_matches=)``). :class:`StateRequest` merges what
they ask into the target's forwards (nothing when none asks), :func:`kept_states` gathers each asking row's states at
the columns it kept, and :class:`TargetOutputs` hands them on (an hf_specdraft drafter gets :class:`TargetState`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from transformers.utils import ModelOutput

from .host import to_device

HIDDEN = "output_hidden_states"
SHARED_KV = "return_shared_kv_states"  # Gemma 4: the keys and values of the last cached layer of each type


@dataclass
class TargetOutputs(ModelOutput):
    """The target's outputs at the positions a step kept, for one row (transformers' ``model_outputs``):
    ``hidden_states`` (entry 0 the embeddings, unrequested entries ``None``), each `(1, n, hidden_size)`."""

    hidden_states: tuple | None = None
    shared_kv_states: dict | None = None  # Gemma 4's: {layer type: (keys, values)} of the target's producer layers


@dataclass
class TargetState:
    """What a state-reading drafter is told before it proposes (the arguments of transformers' protocol)."""

    outputs: TargetOutputs | None  # the states of the positions added since its last proposal (None before a forward)
    first: bool  # is_first_iteration: nothing verified yet since the prefill
    matched: int  # n_last_matches: draft tokens the last step accepted
    position_ids: torch.LongTensor  # (1, L): positions of the row's text, its newest token included

    def model_kwargs(self) -> dict:
        """The ``model_kwargs`` transformers' generators read (an unpadded row: no attention mask)."""
        return {"position_ids": self.position_ids, "attention_mask": None}


class StateRequest:
    """What the call's drafters ask of the target's forwards, merged once per call into :attr:`kwargs`."""

    def __init__(self, model, drafters, traits):
        self.kwargs: dict = {}
        askers = [(d, t) for d, t in zip(drafters, traits, strict=True) if t.requires_model_outputs]
        layers = model.config.get_text_config().num_hidden_layers
        wanted: set[int] | bool = set()
        for drafter, declared in askers:
            for key, value in declared.model_kwargs_overrides.items():
                if key == HIDDEN:
                    wanted = _merge_layers(wanted, value, layers, drafter)
                elif key == SHARED_KV and value:  # read from the kept cache (not the forward's): the target must say
                    cache_producers(model)  # which layers produce them, or this refuses it at once
                elif key in self.kwargs and self.kwargs[key] != value:
                    raise ValueError(
                        f"the drafters ask the target's forward for {key}={self.kwargs[key]!r} and {value!r}: "
                        "give every row drafters that ask alike"
                    )
                elif key not in inspect.signature(model.forward).parameters:
                    raise ValueError(
                        f"{drafter.name} asks the target's forward for {key!r}, which "
                        f"{type(model).__name__}.forward does not take: this drafter needs another target model"
                    )
                else:
                    self.kwargs[key] = value
        if wanted:
            self.kwargs[HIDDEN] = True if wanted is True else sorted(wanted)
        self.hidden = HIDDEN in self.kwargs

    def __bool__(self) -> bool:
        return bool(self.kwargs)


def _merge_layers(wanted, value, layers: int, drafter):
    """``output_hidden_states`` values merged: ``True`` (every layer) wins; ints (``-1``: the last) and lists union."""
    if wanted is True or value is True:
        return True
    if value is False or value is None:
        return wanted
    values = [value] if isinstance(value, int) else list(value) if isinstance(value, (list, tuple)) else None
    if values is None or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ValueError(
            f"{drafter.name}.model_kwargs_overrides['output_hidden_states'] must be True, an int or a list "
            f"of ints (indices into hidden_states, 0 the embeddings, {layers} the last layer), got {value!r}"
        )
    bad = [v for v in values if not -layers - 1 <= v <= layers]
    if bad:
        raise ValueError(
            f"{drafter.name} asks for hidden_states[{bad[0]}] of a target with {layers} layers "
            f"(valid: 0 to {layers}, or negative from the end)"
        )
    return set(wanted) | {v % (layers + 1) for v in values}  # -1: the last layer's index


def kept_states(hidden_states: tuple, a: int, columns: list[int]) -> tuple:
    """Row ``a``'s entries of a forward's ``hidden_states`` at its kept ``columns`` (a chain's: a slice)."""
    if columns == list(range(len(columns))):
        return tuple(None if h is None else h[a : a + 1, : len(columns)] for h in hidden_states)
    index = to_device(columns, next(h.device for h in hidden_states if h is not None))
    return tuple(None if h is None else h[a : a + 1].index_select(1, index) for h in hidden_states)


def joined(before: tuple | None, after: tuple) -> tuple:
    """Two stretches of one row's states, in text order (the prefill's, then the first step's)."""
    if before is None:
        return after
    return tuple(None if x is None else torch.cat([x, y], dim=1) for x, y in zip(before, after))


def prefill_states(hidden_states: tuple, rows) -> None:
    """Each state-reading row keeps the prefill's states of its prompt (without padding), handed on with the first
    step's."""
    for a, row in enumerate(rows):
        if row.traits.requires_model_outputs:
            row.states = tuple(None if h is None else h[a : a + 1, row.pad :] for h in hidden_states)


def cache_producers(target) -> dict[str, int]:
    """The target layer whose cached keys and values a Gemma 4 assistant's layer of each type attends to: the last
    layer of that type before the target's KV-shared layers."""
    config = target.config.get_text_config()
    types = getattr(config, "layer_types", None)
    if types is None:
        raise ValueError(
            f"a Gemma 4 assistant attends to its target's cache by layer type, and {type(target).__name__}'s config "
            "names no layer_types: use the Gemma 4 (or 3n) model it was trained for"
        )
    unshared = len(types) - (getattr(config, "num_kv_shared_layers", 0) or 0)
    return {kind: max(i for i in range(unshared) if types[i] == kind) for kind in set(types[:unshared])}


def shared_kv(cache, producers: dict[str, int]) -> dict:
    """``{layer type: (keys, values)}`` of the producer layers of a row's view of the target cache (its kept text)."""
    return {kind: (cache.layers[i].keys, cache.layers[i].values) for kind, i in producers.items()}
