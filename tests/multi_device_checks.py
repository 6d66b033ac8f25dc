"""Every method against target-only greedy on one target, wherever it lives: split by tensor parallelism over torchrun
ranks (``tests/tp_worker.py``) or spread over CPU and disk by ``device_map="auto"`` (``tests/test_device_map.py``).

:func:`lossless_checks` returns ``{check: {"ok": bool, "tokens": [...], "detail": str}}``: plain data, so a worker
process can hand it to the parent test as JSON.
"""

from __future__ import annotations

import traceback

import torch

from hf_specdraft import (
    CapeCandidateGenerator,
    CascadeCandidateGenerator,
    CasdCandidateGenerator,
    DraftModelCandidateGenerator,
    GlideCandidateGenerator,
    MaxGramCandidateGenerator,
    speculative_generate,
)

NEW_TOKENS = 20
BATCH_LENGTHS = (7, 3)  # a left-padded batch: rows of different lengths


def prompt(vocab: int, length: int = 9, seed: int = 4) -> torch.LongTensor:
    return torch.randint(1, vocab, (1, length), generator=torch.Generator().manual_seed(seed))


def padded_batch(vocab: int, lengths=BATCH_LENGTHS, seed: int = 5):
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(1, vocab, (n,), generator=g) for n in lengths]
    width = max(lengths)
    ids, mask = torch.zeros(len(rows), width, dtype=torch.long), torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - row.numel() :], mask[i, width - row.numel() :] = row, 1
    return rows, ids, mask


class StateCountingDrafter(DraftModelCandidateGenerator):
    """The plain draft, asking for the target's last hidden state and checking what it is handed: after its
    first proposal, every position the loop cached since, of the target's full width (a split target's states come back
    whole)."""

    requires_model_outputs = True
    model_kwargs_overrides = {"output_hidden_states": [-1]}

    def propose(self, input_ids, target_cache=None, target_state=None):
        if not target_state.first:
            states = target_state.outputs.hidden_states[-1]
            cached = input_ids.shape[1] - 1
            expected = cached if self.handed == 0 else target_state.matched + 1
            assert states.shape[1] == expected and states.shape[-1] == self.width, (
                tuple(states.shape),
                expected,
                self.width,
            )
            self.handed += states.shape[1]
        return super().propose(input_ids, target_cache)

    def prepare(self, target, generation_config):
        super().prepare(target, generation_config)
        self.handed, self.width = 0, target.config.hidden_size


def greedy_drafters(glide, draft, x: torch.LongTensor, vocab: int) -> dict:
    """name -> a zero-argument builder of a fresh drafter: every method, default options (γ "auto" where it has it)."""
    table = torch.arange(vocab).roll(1)  # a bigram table for Max-Gram's fallback (random targets repeat little)
    return {
        "draft-model": lambda: DraftModelCandidateGenerator(draft),
        "glide": lambda: GlideCandidateGenerator(glide),
        "glide-fixed": lambda: GlideCandidateGenerator(glide, num_draft_tokens=3),
        "cape+glide": lambda: CapeCandidateGenerator(GlideCandidateGenerator(glide)),
        "cape-beam+glide": lambda: CapeCandidateGenerator(
            GlideCandidateGenerator(glide, num_draft_tokens=2), mode="beam", beam_width=2
        ),
        "cape+draft-model": lambda: CapeCandidateGenerator(DraftModelCandidateGenerator(draft)),
        "cascade": lambda: CascadeCandidateGenerator([draft], bigram_table=table),
        "max-gram": lambda: MaxGramCandidateGenerator(table),
        "casd": lambda: CasdCandidateGenerator(torch.cat([x[0], x[0]]), min_suffix_length=1),
        "state+draft-model": lambda: StateCountingDrafter(draft),
    }


def record(results: dict, name: str, run) -> None:
    """``run()`` returns ``(ok, tokens, detail)``; an exception is a failed check carrying its traceback."""
    try:
        ok, tokens, detail = run()
        results[name] = {"ok": bool(ok), "tokens": tokens, "detail": detail}
    except Exception:  # noqa: BLE001 - the parent test shows it
        results[name] = {"ok": False, "tokens": None, "detail": traceback.format_exc()[-3000:]}


def lossless_checks(target, glide, draft, static: bool = True, batch: bool = True) -> dict:
    """Every method's greedy output against ``target.generate(do_sample=False)``: batch 1 (each drafter), a left-padded
    batch (GLIDE, the draft model) and the static cache (GLIDE, CAPE over GLIDE, the draft model; eager on CPU)."""
    vocab = int(target.config.vocab_size)
    device = target.device
    x = prompt(vocab).to(device)
    reference = target.generate(x, max_new_tokens=NEW_TOKENS, do_sample=False)
    results = {"target-only": {"ok": True, "tokens": reference[0].tolist(), "detail": ""}}

    def same(out: torch.Tensor):
        return torch.equal(out.cpu(), reference.cpu()), out[0].tolist(), f"{out[0].tolist()} vs {reference[0].tolist()}"

    builders = greedy_drafters(glide, draft, x, vocab)
    for name, build in builders.items():
        record(
            results,
            name,
            lambda: same(speculative_generate(target, x, candidate_generator=build(), max_new_tokens=NEW_TOKENS)),
        )
    if static:
        for name in ("draft-model", "glide", "cape+glide", "state+draft-model"):
            record(
                results,
                f"static/{name}",
                lambda: same(
                    speculative_generate(
                        target,
                        x,
                        candidate_generator=builders[name](),
                        max_new_tokens=NEW_TOKENS,
                        cache_implementation="static",
                    )
                ),
            )
    if batch:
        rows, ids, mask = padded_batch(vocab)
        references = [
            target.generate(r[None].to(device), max_new_tokens=NEW_TOKENS, do_sample=False)[0].cpu() for r in rows
        ]

        def rows_match(out: torch.Tensor):
            width = ids.shape[1]
            got = [out[i, width - r.numel() :].cpu() for i, r in enumerate(rows)]
            return (
                all(torch.equal(g, e) for g, e in zip(got, references)),
                out.tolist(),
                f"{[g.tolist() for g in got]} vs {[e.tolist() for e in references]}",
            )

        for name, make in (
            ("draft-model", lambda: DraftModelCandidateGenerator(draft)),
            ("glide", lambda: GlideCandidateGenerator(glide)),
            ("state+draft-model", lambda: StateCountingDrafter(draft)),
        ):
            record(
                results,
                f"batch/{name}",
                lambda: rows_match(
                    speculative_generate(
                        target,
                        ids.to(device),
                        attention_mask=mask.to(device),
                        candidate_generator=[make() for _ in rows],
                        max_new_tokens=NEW_TOKENS,
                    )
                ),
            )
    return results


def sampled(target, drafter, seed: int = 7) -> list[int]:
    """One ``do_sample=True`` call from ``torch.manual_seed(seed)`` (fixed γ inside ``drafter``: a sampled run draws as
    many numbers as its steps ask for, and γ "auto" follows each process's clock)."""
    x = prompt(int(target.config.vocab_size)).to(target.device)
    torch.manual_seed(seed)
    out = speculative_generate(
        target, x, candidate_generator=drafter, max_new_tokens=NEW_TOKENS, do_sample=True, top_k=0
    )
    return out[0].tolist()
