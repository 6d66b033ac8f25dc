"""Options of CASD's context-aware drafting (the CASD paper, §3), whose retrieval is REST's (He et al. 2024)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..core.drafting import AUTO
from ..core.validation import check_bool, check_int

PAPER_MAX_NODES = 64  # the CASD paper, §3 / REST: "choices=64" draft tokens verified per step


@dataclass(frozen=True)
class CasdConfig:
    """How the draft pool is searched and how the draft tree 𝕋 (the CASD paper, eq. 2) is built.

    Args:
        max_nodes: most nodes of the draft tree. ``"auto"`` (the default): the loop's controller picks the tree's
            depth and node budget every step; elsewhere (a direct ``propose``) the paper's 64.
        max_suffix_length, min_suffix_length: the longest and shortest suffix of the text looked up in the pool.
        max_draft_length: continuation length taken after each occurrence (the tree's depth m, eq. 2).
        max_matches: most occurrences merged per step (beyond it an evenly spaced sample, which keeps the
            continuations' frequencies).
        fill_from_shorter_suffixes: top a tree smaller than ``max_nodes`` up with the continuations of ever
            shorter suffixes.
        draft_from_output: also retrieve from the tokens generated so far (a second pool, rebuilt each step), as
            prompt lookup decoding does; the longer match's tree comes first.
    """

    max_nodes: int | str = AUTO  # the CASD paper and REST fix 64 ("choices=64"); "auto": the loop picks it per step
    max_suffix_length: int = 16  # REST token spans 16 ... 2, first hit wins
    min_suffix_length: int = 2  # a 1-token match is too weak a signal to spend verification on
    max_draft_length: int = 10  # REST's continuation length ("long=10")
    max_matches: int = 5000  # REST retrieves at most 5000 occurrences per lookup
    fill_from_shorter_suffixes: bool = False  # the CASD paper / REST: first hit wins, its tree alone is drafted
    draft_from_output: bool = False  # the CASD paper: the pool is the context alone

    def __post_init__(self):
        for name in ("max_nodes", "max_suffix_length", "min_suffix_length", "max_draft_length", "max_matches"):
            if not (name == "max_nodes" and self.max_nodes == AUTO):
                check_int(name, getattr(self, name))
        for name in ("fill_from_shorter_suffixes", "draft_from_output"):
            check_bool(name, getattr(self, name))
        if self.min_suffix_length > self.max_suffix_length:
            raise ValueError(
                f"min_suffix_length ({self.min_suffix_length}) must not exceed max_suffix_length "
                f"({self.max_suffix_length})"
            )

    def to_dict(self) -> dict:
        return asdict(self)
