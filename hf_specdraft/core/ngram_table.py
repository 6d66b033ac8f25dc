"""What most often followed each short context in the target's own text: a table a drafter copies from where the
request's text offers no copy of its own (a GLIDE checkpoint carries one as ``copy_table_keys`` / ``copy_table_tokens``,
built by ``python -m recipes.copy_table``).

A context of ``k`` tokens is stored as one int64 key (:func:`context_key`, a hash: two contexts that collide only make
a draft wrong, which the target then rejects) with the token that followed it most often. A chain looks each next token
up by the longest context the table holds, as Max-Gram matches the longest suffix (Chen et al. 2024, §3.3).

    >>> keys, tokens = build_ngram_table([[5, 6, 7, 8], [5, 6, 7, 8], [1, 6, 7, 9]], orders=(2,), min_count=2)
    >>> NGramTable(keys, tokens, orders=(2,)).chain([4, 5, 6])  # "5 6" -> 7, then "6 7" -> 8 (twice, against 9 once)
    [7, 8]
"""

from __future__ import annotations

import collections
import weakref
from collections.abc import Iterable, Sequence

import torch

CHAIN_TOKENS = 8  # the longest chain proposed at once
INTS = (torch.int32, torch.int64)  # a table's tokens: int32 halves what a checkpoint carries for them
_PRIME, _MASK = 1_000_003, (1 << 63) - 1
_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (its keys buffer's id, NGramTable)


def _check_orders(orders) -> None:
    if not orders or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in orders):
        raise ValueError(f"orders must be positive context lengths, got {orders!r}")


def context_key(context: Sequence[int]) -> int:
    """One int64 key for a context of token ids (its length mixed in, so no two orders share a key)."""
    key = len(context)
    for token in context:
        key = (key * _PRIME + int(token) + 1) & _MASK
    return key


def build_ngram_table(
    texts: Iterable[Sequence[int]], orders: Sequence[int] = (4, 3), min_count: int = 4, min_share: float = 0.5
) -> tuple[torch.LongTensor, torch.IntTensor]:
    """``(keys, tokens)``, both `(N,)`, int64 and int32: for every context of ``orders`` tokens in ``texts`` that
    occurred at least ``min_count`` times, the token that followed it most often, kept where it did at least
    ``min_share`` of the time."""
    _check_orders(orders)
    if not isinstance(min_count, int) or min_count < 1 or not 0 < min_share <= 1:
        raise ValueError(f"min_count must be an int >= 1 and min_share in (0, 1], got {min_count!r}, {min_share!r}")
    counts: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for text in texts:
        text = list(text)
        for i in range(1, len(text)):
            for k in orders:
                if i >= k:
                    counts[context_key(text[i - k : i])][text[i]] += 1
    kept = []
    for key, followers in counts.items():
        token, n = followers.most_common(1)[0]
        total = followers.total()
        if total >= min_count and n >= min_share * total:
            kept.append((key, token))
    kept.sort()
    keys = torch.tensor([k for k, _ in kept], dtype=torch.long)
    return keys, torch.tensor([t for _, t in kept], dtype=torch.int32)


class NGramTable:
    """A built table, looked up on the host.

    Args:
        keys (`torch.LongTensor` of shape `(N,)`): :func:`context_key` of each context.
        tokens (`torch.IntTensor` of shape `(N,)`): the token that followed it (int32 or int64).
        orders: the context lengths the keys were built for, looked up longest first.
    """

    def __init__(self, keys: torch.Tensor, tokens: torch.Tensor, orders: Sequence[int]):
        if keys.dim() != 1 or keys.shape != tokens.shape or keys.dtype != torch.long or tokens.dtype not in INTS:
            raise ValueError(
                f"keys and tokens must be 1-D tensors of one length, int64 and int32/int64, got {tuple(keys.shape)} "
                f"{keys.dtype} and {tuple(tokens.shape)} {tokens.dtype}"
            )
        _check_orders(orders)
        self.orders = tuple(sorted(set(orders), reverse=True))
        self.next = dict(zip(keys.tolist(), tokens.tolist()))

    def __len__(self) -> int:
        return len(self.next)

    def chain(self, text: Sequence[int], max_tokens: int = CHAIN_TOKENS) -> list[int]:
        """Up to ``max_tokens`` tokens to follow ``text``, each by the longest context the table holds; `[]`: none."""
        chain, tail = [], list(text[-self.orders[0] :])
        for _ in range(max_tokens):
            token = self._after(tail)
            if token is None:
                break
            chain.append(token)
            tail.append(token)
        return chain

    def _after(self, tail: list[int]) -> int | None:
        """The token that followed the longest context of ``tail`` the table holds, or `None`."""
        for k in self.orders:
            if len(tail) >= k:
                token = self.next.get(context_key(tail[-k:]))
                if token is not None:
                    return token
        return None


def copy_table_of(model) -> NGramTable | None:
    """The :class:`NGramTable` a drafter's checkpoint carries (``copy_table_keys``, ``copy_table_tokens`` buffers and
    ``config.copy_table_orders``), built once per model and buffer (moving the model builds it again); `None` without
    one."""
    keys = getattr(model, "copy_table_keys", None)
    if keys is None:
        return None
    built = _TABLES.get(model)
    if built is None or built[0] != id(keys):
        built = _TABLES[model] = (
            id(keys),
            NGramTable(keys.cpu(), model.copy_table_tokens.cpu(), model.config.copy_table_orders),
        )
    return built[1]
