"""One row's share of a step after verification (:func:`accept_row`): accept a path of its tree by its rule, emit it and
the target's next token where ``generate`` would stop, and record the step.

``generate``'s stopping criteria each cost a device sync per emitted token; the two every call has (max length, eos)
need only host data, so :class:`HostStops` checks those on the host and calls the others only where the call has any.

Notation: p target distribution, q draft distribution (Leviathan et al. 2023).
"""

from __future__ import annotations

import time

import torch
from transformers import GenerationConfig, StoppingCriteriaList
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

from .acceptance import accept_tree, speculative_sampling, tree_rejection_sampling
from .drafting import DraftOutcome
from .host import to_device
from .rows import Row
from .stats import record_step
from .tree import DraftTree


class TargetRows:
    """The target's next-token scores at each verified position of one row, processed only when acceptance asks.

    Row 0 scores the token after the last accepted one; row ``1+i`` the token after tree node ``i``. Logits processors
    see the row's own prefix (the accepted text plus the node's path), as in transformers' assisted decoding.
    """

    def __init__(self, logits: torch.Tensor, row: Row, tree: DraftTree, do_sample: bool, choices: list[int] | None):
        # logits: (1+N, V) float32; the row's ids read only for processors
        self.logits, self.row, self.tree, self.do_sample = logits, row, tree, do_sample
        self.processor = row.processor if len(row.processor) else None
        self._scores, self._probs, self._prefixes = {}, {}, {}
        # greedy without processors: the argmax at every row, read with the step's one read (else chosen when asked)
        self._choice = {} if choices is None else dict(enumerate(choices))

    def scores(self, row: int) -> torch.Tensor:
        if self.processor is None:
            return self.logits[row]
        if row not in self._scores:
            self._scores[row] = self.processor(self.prefix(row), self.logits[row : row + 1].clone())[0]
        return self._scores[row]

    def prefix(self, row: int) -> torch.LongTensor:
        """`(1, L + depth)`: what the processors see at ``row``, the accepted text and the path down to node
        ``row - 1`` (each prefix built on its parent's)."""
        if row not in self._prefixes:
            if row == 0:
                self._prefixes[0] = self.row.ids
            else:
                above = self.prefix(self.tree.parent_list[row - 1] + 1)
                self._prefixes[row] = torch.cat([above, self.tree.tokens[None, row - 1 : row].to(above.device)], -1)
        return self._prefixes[row]

    def probs(self, row: int) -> torch.Tensor:
        if row not in self._probs:  # read by acceptance and again by the α statistics
            self._probs[row] = torch.softmax(self.scores(row), dim=-1)
        return self._probs[row]

    def choice(self, row: int) -> int:
        """The target's own token at this row: argmax, or a sample from p when sampling."""
        if row not in self._choice:
            choice = torch.multinomial(self.probs(row), 1) if self.do_sample else self.scores(row).argmax()
            self._choice[row] = int(choice)
        return self._choice[row]


class HostStops:
    """A call's stopping criteria (``None``: the config's ``max_length`` alone), split into host checks and the rest."""

    def __init__(self, stopping_criteria: StoppingCriteriaList | None, generation_config: GenerationConfig):
        criteria = list(stopping_criteria or [])
        self.max_length = min(
            [c.max_length for c in criteria if isinstance(c, MaxLengthCriteria)] + [generation_config.max_length]
        )
        eos = [c.eos_token_id for c in criteria if isinstance(c, EosTokenCriteria)]  # read once, before any step
        self.eos: set[int] = {token for ids in eos for token in torch.as_tensor(ids).reshape(-1).tolist()}
        self.others = StoppingCriteriaList(
            [c for c in criteria if not isinstance(c, (MaxLengthCriteria, EosTokenCriteria))]
        )

    def emit(self, row: Row, tokens: list[int], scores: list[torch.Tensor] | None) -> tuple[int, bool]:
        """How many of ``tokens`` the row appends, and whether it stops there: at ``max_length``, an eos token, or where
        another criterion says so (called on the sequence up to each token, with its scores ``scores[j]`` `(1, V)`)."""
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


def accept_row(
    step,
    row: Row,
    logits: torch.Tensor,
    tree: DraftTree,
    choices: list[int] | None,
    draft_seconds: float,
    forward_seconds: float,
) -> tuple[list[int], int]:
    """One row's share of a step: accept a path of its tree, emit it and the target's next token, record the step.

    ``logits`` `(1 + N, V)`: the target's scores at the row's last token and each node; ``choices``: its argmax there
    (greedy), or ``None``. Returns the columns the row keeps (0: its last token, ``1 + i``: node ``i``) and the count of
    tokens accepted.
    """
    started = time.perf_counter()
    rows = TargetRows(logits, row, tree, step.generation_config.do_sample, choices)
    path, next_token = select_accepted(rows, step.acceptance, step.stops.eos)
    verify_seconds = forward_seconds + time.perf_counter() - started
    emitted = emit_tokens(rows, path, next_token, step.stops, step.generation_config)
    if step.streamer is not None:
        step.streamer.put(torch.tensor(row.tokens[-emitted:]))
    kept_nodes = [0] + [i + 1 for i in path[: emitted - 1]]  # the last token's column and the accepted path's
    if row.traits.learns_from_outcome:  # a drafter that learns from the kept rows' scores (transformers' own do)
        index = slice(0, len(kept_nodes)) if kept_nodes == list(range(len(kept_nodes))) else kept_nodes
        outcome = DraftOutcome(row.text, logits[index][None], len(path), kept_nodes, draft_seconds, verify_seconds)
        row.generator.learn(outcome)
    record_step(row.stats, rows, tree, path, emitted, draft_seconds, verify_seconds)
    return kept_nodes, len(path)


def select_accepted(rows: TargetRows, acceptance, eos: set[int]) -> tuple[list[int], int]:
    """The accepted path and the target's next token: when sampling exactly, speculative sampling for a chain with q and
    multi-branch rejection sampling for a tree with q and ``sampled`` flags; otherwise the tree walk (CASD's condition
    reads p at the call's ``eos`` ids)."""
    tree = rows.tree
    exact_sampling = rows.do_sample and acceptance is None and len(tree)
    if exact_sampling and tree.is_chain and tree.draft_probs is not None:
        p = torch.stack([rows.probs(r) for r in range(len(tree) + 1)])
        n, next_token = speculative_sampling(p, tree.draft_probs.to(p.device).float(), tree.tokens.to(p.device))
        return list(range(n)), next_token
    if exact_sampling and tree.sampled is not None:
        return tree_rejection_sampling(rows.probs, tree)
    return accept_tree(rows, tree, acceptance, eos)


def emit_tokens(rows: TargetRows, path: list[int], next_token: int, stops: HostStops, config: GenerationConfig) -> int:
    """Append the accepted tokens and the target's token, stopping where ``generate`` would; sets ``row.done`` and
    returns how many tokens were appended."""
    row, tree = rows.row, rows.tree
    tokens = [tree.token_list[i] for i in path] if tree.token_list is not None else tree.tokens[path].tolist()
    tokens.append(next_token)
    row_of = [0] + [i + 1 for i in path]  # the verified row that scored each appended token
    emitted, row.done = stops.emit(row, tokens, [rows.scores(r)[None] for r in row_of] if stops.others else None)
    for j in range(emitted):
        if config.output_scores:
            row.scores.append(rows.scores(row_of[j])[None])
        if config.output_logits:
            row.logits.append(rows.logits[row_of[j]][None])
    row.tokens.extend(tokens[:emitted])  # row.ids follows when next read
    return emitted


def chain_accepted(tree: DraftTree, kept_nodes: list[int]) -> int:
    """How many tokens of the tree's first-child chain the kept path (``kept_nodes``: column ``1 + i`` is node ``i``)
    starts with: what the chain alone would have accepted under greedy verification."""
    pairs = list(zip(tree.chain_nodes(), kept_nodes[1:]))
    return next((i for i, (node, column) in enumerate(pairs) if column != node + 1), len(pairs))
