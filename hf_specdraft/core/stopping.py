"""Stopping where ``generate`` would, on host tokens: the step's stop checks read nothing back from the device.

``generate`` hands a custom decoding loop its ``StoppingCriteriaList``: ``MaxLengthCriteria`` (always),
``EosTokenCriteria`` (with an eos token), and whatever else the call asked for (``max_time``, ``stop_strings``, the
user's own criteria). Called on the device's ``input_ids`` once per emitted token, each returns a device bool that
``bool()`` reads back: a sync per token. The two that every call has only need the sequence's length and its newest
token, which the loop holds on the host (``row.tokens``), so :class:`HostStops` checks those there and calls the
others, as ``generate`` would, only where the call has any.
"""

from __future__ import annotations

import torch
from transformers import GenerationConfig, StoppingCriteriaList
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

from .rows import Row
from .host import to_device


class HostStops:
    """A call's stopping criteria, split into host checks and the rest.

    Args:
        stopping_criteria: what ``generate`` prepared (``None``: the config's max length alone).
        generation_config: the call's (its ``max_length`` bounds every call).
    """

    def __init__(self, stopping_criteria: StoppingCriteriaList | None, generation_config: GenerationConfig):
        criteria = list(stopping_criteria or [])
        self.max_length = min([c.max_length for c in criteria if isinstance(c, MaxLengthCriteria)] + [generation_config.max_length])
        self.eos: set[int] = set()
        for criterion in criteria:
            if isinstance(criterion, EosTokenCriteria):  # read once, before any step
                self.eos.update(torch.as_tensor(criterion.eos_token_id).reshape(-1).tolist())
        self.others = StoppingCriteriaList([c for c in criteria if not isinstance(c, (MaxLengthCriteria, EosTokenCriteria))])

    @property
    def reads_scores(self) -> bool:
        """Whether a criterion of the call's own is called (it is handed each token's scores, as in ``generate``)."""
        return len(self.others) > 0

    def emit(self, row: Row, tokens: list[int], scores: list[torch.Tensor] | None) -> tuple[int, bool]:
        """How many of ``tokens`` row ``row`` appends (``row.tokens`` holds its sequence so far), and whether it stops
        there: at ``max_length``, an eos token, or where another criterion says so (called on the sequence up to each
        token, with that token's scores ``scores[j]`` `(1, V)`)."""
        length, extended = len(row.tokens), None
        for j, token in enumerate(tokens):
            if length + j + 1 >= self.max_length or token in self.eos:
                return j + 1, True
            if self.others:
                if extended is None:
                    extended = torch.cat([row.ids, to_device(tokens, row.ids.device)[None]], dim=-1)
                if bool(self.others(extended[:, : length + j + 1], scores[j]).all()):
                    return j + 1, True
        return len(tokens), False
