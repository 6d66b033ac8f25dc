"""The draft pool R ← d_q: a suffix array over the request's full context (the CASD paper, Algorithm 1 line 1; REST,
He et al. 2024), sorted by each suffix's first ``max_suffix_length`` tokens, all a lookup compares (prefix doubling,
Manber & Myers 1993). Ids stay int64: the official retriever stored u16 and broke vocabularies above 65,535.

    >>> pool = DraftPool([1, 2, 3, 1, 2, 4, 1, 2, 3])
    >>> length, positions = pool.match([9, 1, 2], min_length=2, max_length=16)
    >>> length, sorted(positions.tolist())  # "1 2" occurs at 0, 3 and 6, each with a token after it
    (2, [0, 3, 6])
"""

from __future__ import annotations

import bisect

import numpy as np
import torch

from ..core.validation import check_int


def context_token_ids(context, argument: str = "context") -> np.ndarray:
    """Token ids (a tensor, array or list) as an int64 array `(n,)`, else a ``ValueError`` naming ``argument``."""
    if context is None:
        raise ValueError(
            f"{argument} is None: pass the context as text (with a tokenizer) or as token ids (a list, array or tensor)"
        )
    if isinstance(context, str):
        raise ValueError(f"{argument} is text; pass a tokenizer to turn it into token ids")
    if isinstance(context, torch.Tensor):
        if context.is_floating_point() or context.is_complex() or context.dtype == torch.bool:
            raise ValueError(f"{argument} must hold integer token ids, got a tensor of dtype {context.dtype}")
        context = context.detach().cpu()
    try:
        array = np.asarray(context)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{argument} must be a sequence of integer token ids: {error}") from None
    if array.ndim == 2 and array.shape[0] == 1:
        array = array[0]
    if array.ndim != 1:
        raise ValueError(
            f"{argument} must be one sequence of token ids (shape (n,) or (1, n)), got shape {array.shape}"
        )
    if array.size == 0:
        raise ValueError(f"{argument} is empty: CASD drafts from the request's context, so it needs at least one token")
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{argument} must hold integer token ids, got dtype {array.dtype}")
    array = array.astype(np.int64, copy=False)
    if int(array.min()) < 0:
        raise ValueError(f"{argument} holds a negative token id ({int(array.min())}); token ids are >= 0")
    return array


def _dense_rank(key: np.ndarray) -> np.ndarray:
    """1-based dense rank of each element of ``key`` `(n,)`."""
    return np.unique(key, return_inverse=True)[1] + 1


def build_suffix_array(tokens: np.ndarray, depth: int = 16) -> np.ndarray:
    """Start positions `(n,)` int64 of the suffixes of ``tokens`` `(n,)`, sorted by their first ``D >= depth`` tokens
    (``D = 2^⌈log2 depth⌉`` or the whole suffix; a suffix's end sorts before any token), ties by position."""
    n = tokens.size
    rank = _dense_rank(tokens)  # no assumption on the id range: any vocabulary size
    h = 1
    while h < depth and int(rank.max()) < n:  # stop early once every prefix is distinct
        # after this round, rank orders the first 2h tokens of each suffix
        second = np.zeros(n, dtype=np.int64)
        second[: n - h] = rank[h:]
        rank = _dense_rank(rank * (n + 1) + second)  # < (n + 1)^2: fits int64 for any realistic pool
        h *= 2
    return np.argsort((rank - 1) * n + np.arange(n))  # distinct keys: ties of equal prefixes by position


class DraftPool:
    """The retrieval index R (Algorithm 1) over ``context_ids``, the full context d_q `(n,)` or `(1, n)`."""

    def __init__(self, context_ids, max_suffix_length: int = 16):
        check_int("max_suffix_length", max_suffix_length)
        self.tokens = context_token_ids(context_ids)
        self.max_suffix_length = max_suffix_length
        self.max_token_id = int(self.tokens.max())
        self.suffix_array = build_suffix_array(self.tokens, max_suffix_length)
        self.rank = np.empty_like(self.suffix_array)  # inverse suffix array: position -> row
        self.rank[self.suffix_array] = np.arange(self.suffix_array.size)
        # big-endian fixed-width bytes compare like the id sequences they encode: one bytes comparison per lookup step
        self._dtype = np.dtype(">u4") if self.max_token_id < 2**32 else np.dtype(">u8")
        self._bytes = self.tokens.astype(self._dtype).tobytes()
        self._sorted = memoryview(self.suffix_array)  # indexes to plain ints, faster than numpy scalars

    def _hit(self, suffix: np.ndarray) -> tuple[int, int] | None:
        """Suffix-array rows ``[lo, hi)`` of the occurrences of ``suffix``, or None when none has a token after it."""
        pattern, width = suffix.astype(self._dtype).tobytes(), self._dtype.itemsize

        def key(start: int) -> bytes:
            return self._bytes[width * start : width * start + len(pattern)]

        lo = bisect.bisect_left(self._sorted, pattern, key=key)
        hi = bisect.bisect_right(self._sorted, pattern, lo=lo, key=key)
        count, n = hi - lo, self.tokens.size
        if count and suffix.size <= n and np.array_equal(self.tokens[n - suffix.size :], suffix):
            count -= 1  # the occurrence ending the pool has no continuation
        return (lo, hi) if count > 0 else None

    def match(self, sequence, min_length: int = 2, max_length: int = 16) -> tuple[int, np.ndarray]:
        """`(length, positions)` of the longest suffix of ``sequence`` `(L,)` in the pool (``min_length`` to
        ``max_length`` tokens; 0 when none) and the starts `(k,)` of its occurrences with a continuation. A hit of
        length L implies one of length L-1, so bisection over L finds it in ~4 lookups."""
        sequence = np.asarray(sequence, dtype=np.int64).reshape(-1)
        # ids the pool cannot hold (and must not wrap in the byte encoding)
        foreign = np.flatnonzero((sequence < 0) | (sequence > self.max_token_id))
        usable = sequence.size - (int(foreign[-1]) + 1 if foreign.size else 0)
        best, best_rows = 0, None
        lo_len, hi_len = min_length, min(max_length, self.max_suffix_length, usable)
        while lo_len <= hi_len:
            mid = (lo_len + hi_len) // 2
            rows = self._hit(sequence[sequence.size - mid :])
            if rows is None:
                hi_len = mid - 1
            else:
                best, best_rows, lo_len = mid, rows, mid + 1
        if best_rows is None:
            return 0, np.zeros(0, dtype=np.int64)
        return best, self._positions(best_rows, best)

    def _positions(self, rows: tuple[int, int], length: int) -> np.ndarray:
        positions = self.suffix_array[rows[0] : rows[1]]
        return positions[positions + length < self.tokens.size]

    def shorter_matches(self, sequence, longest: int, min_length: int):
        """Yield ``(length, positions)`` for suffixes shorter than ``longest`` (down to ``min_length``) occurring more
        often than the previous, longer one (whose occurrences it includes: an equal count, the same continuations)."""
        sequence = np.asarray(sequence, dtype=np.int64).reshape(-1)
        previous = None
        for length in range(longest, min_length - 1, -1):
            rows = self._hit(sequence[sequence.size - length :])  # never None: a suffix of a hit is a hit
            count = rows[1] - rows[0]
            if previous is not None and count > previous:
                yield length, self._positions(rows, length)
            previous = count

    def continuations(
        self, positions: np.ndarray, match_length: int, max_draft_length: int, max_matches: int
    ) -> np.ndarray:
        """The ``max_draft_length`` tokens after each occurrence at ``positions`` `(k,)` (past ``max_matches``: an even
        sample, keeping the frequencies), sorted: `(min(k, max_matches), max_draft_length)` int64, -1 past the end."""
        if positions.size > max_matches:
            positions = positions[np.linspace(0, positions.size - 1, max_matches).round().astype(np.int64)]
        starts = positions + match_length  # < the pool's size: match() only returns occurrences with a continuation
        index = starts[:, None] + np.arange(max_draft_length)[None, :]
        rows = np.where(index < self.tokens.size, self.tokens[np.minimum(index, self.tokens.size - 1)], -1)
        if max_draft_length <= self.max_suffix_length:
            return rows[np.argsort(self.rank[starts], kind="stable")]
        return rows[np.lexsort(rows.T[::-1])]  # lexsort's last key is the primary one
