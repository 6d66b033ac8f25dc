"""What the loop keeps per request: a batch row and its outputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from transformers import LogitsProcessorList
from transformers.generation import CandidateGenerator

from .host import copy_to_device, host_tensor
from .stats import SpeculativeStats
from .target_state import TargetOutputs, TargetState

if TYPE_CHECKING:  # the drafters' module reaches the rows through the cache helpers it imports
    from .drafting import DrafterTraits


@dataclass
class Row:
    """One request of the batch (batch 1 is one row)."""

    index: int  # its row in the caller's batch
    prompt: torch.LongTensor  # (1, P): the padded prompt row, on the target's device
    pad: int  # left padding of the prompt
    generator: CandidateGenerator
    processor: LogitsProcessorList  # generate's processors with this row's state (inputs.row_processors)
    done: bool = False
    tokens: list[int] = field(default_factory=list)  # ids on the host: read once before the loop, then by emission
    traits: DrafterTraits | None = None  # what its drafter declares (set once the call binds the drafter, setup_call)
    # a state-reading drafter's: the states not yet handed to it, whether it proposed yet, the last accepted count
    states: tuple | None = None
    proposed: bool = False
    matched: int = 0
    # what the loop accumulates for the row besides its tokens: its statistics, and scores and logits where asked
    stats: SpeculativeStats = field(default_factory=SpeculativeStats)
    scores: list = field(default_factory=list)
    logits: list = field(default_factory=list)

    def __post_init__(self):
        # the device copy of `tokens`, written only when `ids` is read, into a buffer that grows by doubling
        self._buffer = self.prompt.new_empty(1, self.prompt.shape[1] + 256)
        self._buffer[:, : self.prompt.shape[1]] = self.prompt
        self._written = self.prompt.shape[1]

    @property
    def ids(self) -> torch.LongTensor:
        """`(1, P + n)`: the padded prompt row and the accepted tokens (what generate's criteria see), on the device."""
        length = len(self.tokens)
        if length > self._written:
            if length > self._buffer.shape[1]:
                grown = self._buffer.new_empty(1, 2 * length)
                grown[:, : self._written] = self._buffer[:, : self._written]
                self._buffer = grown
            new = self.tokens[self._written : length]
            if self._buffer.device.type == "cpu":
                self._buffer.numpy()[0, self._written : length] = new  # no torch op: a NumPy view of the same memory
            else:
                copy_to_device(self._buffer[0, self._written : length], host_tensor(new))
            self._written = length
        return self._buffer[:, :length]

    def target_state(self) -> TargetState | None:
        """What a state-reading drafter is told before it proposes: nothing on its first proposal
        (``is_first_iteration``), afterwards the states of every position added since its last one."""
        if not self.traits.requires_model_outputs:
            return None
        first, outputs = not self.proposed, None
        if not first:
            outputs, self.states = TargetOutputs(hidden_states=self.states), None
        self.proposed = True
        return TargetState(
            outputs, first, self.matched, torch.arange(len(self.tokens) - self.pad, device=self.device)[None]
        )

    @property
    def device(self) -> torch.device:
        return self.prompt.device

    @property
    def text(self) -> torch.LongTensor:
        """`(1, L + n)`: the row without its padding, what its drafter sees."""
        return self.ids[:, self.pad :]

    @property
    def cached(self) -> int:
        """Columns of the target cache this row uses: its text but the newest token."""
        return len(self.tokens) - 1 - self.pad


def call_rows(input_ids: torch.LongTensor, lengths, drafters: list, processors: list) -> list[Row]:
    """One :class:`Row` per prompt row of ``input_ids`` `(B, P)` (``lengths``: each row's unpadded length), its tokens
    read to the host once: from here on the loop extends them there."""
    host, padded = input_ids.tolist(), input_ids.shape[1]
    return [
        Row(r, input_ids[r : r + 1], padded - int(lengths[r]), g, p, False, host[r])
        for r, (g, p) in enumerate(zip(drafters, processors))
    ]
