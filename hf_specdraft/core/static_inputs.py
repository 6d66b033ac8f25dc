"""A compiled verification forward's inputs, one fixed set per bucket, edited in place from step to step (docs/static-cache.md).

SGLang's CUDA-graph runner keeps one input buffer per captured batch size and fills it before each replay. Here each
bucket ``Q`` of a target without windowed layers keeps ``input_ids``, ``position_ids``, the write columns (views of one
`(3, B, Q)` long buffer) and the additive mask `(B, 1, Q, L)`, and a step *edits* them rather than rebuilding them:
between two steps a row's mask changes only where its text grew (columns ``[old start, start)`` become visible to every
query) and in its tree block (columns ``[start, start + Q)``, :func:`tree_block`). The edits go through NumPy views of
host staging buffers (a NumPy slice assignment costs well under a microsecond of host time, a torch op 5-10 µs on a
CPU); the mask is edited as the bit patterns of its dtype (``0`` and ``finfo.min``), so bf16 needs no NumPy dtype.
On CUDA the staging buffers are pinned and reach the device in two non-blocking copies a step; on CPU they are the
inputs themselves. Nothing is read back.
"""

from __future__ import annotations

import torch

from .tree import tree_buffers

BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}  # a float dtype's item size -> the integer dtype of its bits
MAX_BLOCKS = 1024  # distinct tree shapes kept per bucket (a chain drafter has a handful, a CAPE tree a few hundred)


def blocked_bits(dtype: torch.dtype) -> int:
    """The bit pattern of ``finfo(dtype).min`` (a blocked mask entry) as a signed integer of the same width."""
    return int(torch.tensor(torch.finfo(dtype).min, dtype=dtype).view(BITS[dtype.itemsize]))


class BucketInputs:
    """The inputs of one bucket's forward on a static cache of ``batch`` rows x ``length`` columns.

    Args:
        width: the bucket ``Q`` (tokens verified per row). dtype: the mask's (the model's). device: where the forward runs.

    Attributes:
        input_ids, position_ids (`(B, Q)` long), write_index (`(B, 1, Q, 1)` long), attention_mask (`(B, 1, Q, L)`):
            the forward's inputs, at fixed addresses (CUDA graphs replay on them).
    """

    def __init__(self, batch: int, width: int, length: int, dtype: torch.dtype, device: torch.device):
        self.batch, self.width, self.length, self.device = batch, width, length, torch.device(device)
        cuda = self.device.type == "cuda"
        self.blocked = blocked_bits(dtype)
        self.host_mask = torch.zeros(batch, 1, width, length, dtype=dtype, pin_memory=cuda)
        self.host_packed = torch.zeros(3, batch, width, dtype=torch.long, pin_memory=cuda)  # ids, positions, write columns
        self.mask_bits, self.packed = self.host_mask.view(BITS[dtype.itemsize]).numpy(), self.host_packed.numpy()
        self.attention_mask = self.host_mask.to(device) if cuda else self.host_mask
        self.all_packed = self.host_packed.to(device) if cuda else self.host_packed
        self.input_ids, self.position_ids = self.all_packed[0], self.all_packed[1]
        self.write_index = self.all_packed[2].view(batch, 1, width, 1)
        for tensor in (self.attention_mask, self.all_packed, self.input_ids, self.position_ids, self.write_index):
            torch._dynamo.mark_static_address(tensor)
        self.slots: list = [None] * batch  # what each slot's mask holds: (pad, start), "dummy", or None (rebuild it)
        self.blocks: dict[tuple, tuple] = {}  # tree shape -> (tree_block, depths): see tree_block
        self.copied = None  # CUDA: an event after the last step's copies (the staging buffers are free again)

    def inputs(self) -> dict:
        return {"input_ids": self.input_ids, "position_ids": self.position_ids, "attention_mask": self.attention_mask}

    def _ready(self) -> None:
        """Wait until the last copies out of the staging buffers have run (at once: a step reads back before the next)."""
        if self.copied is not None:
            self.copied.synchronize()

    def _send(self) -> None:
        if self.device.type == "cuda":
            self.attention_mask.copy_(self.host_mask, non_blocking=True)
            self.all_packed.copy_(self.host_packed, non_blocking=True)
            self.copied = torch.cuda.Event()
            self.copied.record()

    def fill(self, rows, trees) -> None:
        """Every slot's inputs for one step: ``rows`` (``row.index`` its slot, ``row.tokens`` its host text, ``row.pad``)
        each verifying ``[last token] + tree``; slots of no row (finished) verify dummies written into their own first
        columns, each seeing only itself. Trees whose tokens are still on the device are copied there, device to device."""
        self._ready()
        bits, packed, width = self.mask_bits, self.packed, self.width
        on_device, active = [], {row.index: (row, tree) for row, tree in zip(rows, trees)}
        for b in range(self.batch):
            if b not in active:
                self._dummy_slot(b)
                continue
            row, tree = active[b]
            n, start, pad = len(tree), len(row.tokens) - 1, row.pad
            block, depths = self.tree_block(tree.parent_list)
            held = self.slots[b]
            if held is None or held == "dummy" or held[0] != pad or held[1] > start:  # another call's row, or none yet
                bits[b] = self.blocked
                bits[b, 0, :, pad:start] = 0
            elif held[1] < start:  # the text grew: every query now sees the columns the last step accepted
                bits[b, 0, :, held[1] : start] = 0
            bits[b, 0, :, start : start + width] = block
            self.slots[b] = (pad, start)
            ids = packed[0, b]
            ids[0] = row.tokens[-1]
            if tree.token_list is not None:
                ids[1 : 1 + n] = tree.token_list
            elif n:
                on_device.append((b, tree))
            ids[1 + n :] = 0
            cached = start - pad
            packed[1, b] = [cached + d for d in depths]
            packed[2, b] = range(start, start + width)
        self._send()
        for b, tree in on_device:
            self.input_ids[b, 1 : 1 + len(tree)].copy_(tree.tokens)

    def _dummy_slot(self, b: int) -> None:
        if self.slots[b] == "dummy":
            return
        bits, packed, width = self.mask_bits, self.packed, self.width
        bits[b] = self.blocked
        bits[b, 0, range(width), range(width)] = 0
        packed[0, b], packed[1, b], packed[2, b] = 0, 0, range(width)
        self.slots[b] = "dummy"

    def fill_warm_up(self) -> None:
        """Dummies at the last ``Q`` columns of every row (past any row's text and step), each seeing only itself at
        position 0: a warm-up forward that compiles (and captures) the bucket without touching a row's state."""
        self._ready()
        bits, packed, width, length = self.mask_bits, self.packed, self.width, self.length
        bits[:] = self.blocked
        columns = range(length - width, length)
        bits[:, 0, range(width), columns] = 0
        packed[0], packed[1], packed[2] = 0, 0, columns
        self.slots = [None] * self.batch  # the next step rebuilds every slot
        self._send()

    def tree_block(self, parents: list[int]) -> tuple:
        """The mask block of a tree over its own columns, as bits `(Q, Q)`, and each query's depth (``Q`` entries).

        Query 0 is the last accepted token, query ``1 + i`` node ``i``: each sees its ancestors-or-self (SpecInfer);
        a dummy query ``j > N`` sees only its own column. Depths: 0 for the last token, ``1 + depth(i)`` for node ``i``,
        0 for dummies. Kept per tree shape: a drafter repeats its shapes."""
        key = tuple(parents)
        found = self.blocks.get(key)
        if found is not None:
            return found
        width, n = self.width, len(parents)
        ancestors, depths = tree_buffers([-1] + [0 if p < 0 else p + 1 for p in parents])  # the last token as the root
        block = torch.full((width, width), self.blocked, dtype=BITS[self.host_mask.element_size()])
        block[: 1 + n, : 1 + n].masked_fill_(ancestors, 0)
        block.diagonal()[1 + n :] = 0
        depths += [0] * (width - 1 - n)
        if len(self.blocks) >= MAX_BLOCKS:
            self.blocks.clear()
        self.blocks[key] = found = (block.numpy(), depths)
        return found
