"""``hf-specdraft bench --prompts FILE.jsonl``: Spec-Bench's question format (Xia et al., ACL Findings 2024,
arXiv:2401.07851), one JSON object a line with ``question_id``, ``category`` and ``turns``, run by the bench harness.
Every turn runs in the target's chat template after the earlier turns and target-only's greedy answers to them (so every
method sees the same context); the result has the harness's summary per category and overall (docs/benchmarks.md).

    {"question_id": 2, "category": "multi-turn", "turns": ["What is a tarball?", "Now say it in one sentence."]}
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from ..defaults import DefaultBundle
from ..defaults.tasks import TaskItem
from .harness import _BenchRun, _median_seconds, _speedup, bench_context, bench_result, chat_ids, check_methods
from .harness import summarize, time_prompt, warm_up
from .methods import FAST_BASELINE, BenchContext
from .timing import warning_text

DEFAULT_PROMPTS = Path(__file__).resolve().parent.parent / "defaults" / "spec_prompts.jsonl"
# the baselines each method's speedup is reported against, where they ran
BASELINES = ("target-only", FAST_BASELINE, "prompt-lookup", "stock-assisted")
# each required field: what it must be (in words, for errors) and the check
REQUIRED = {
    "question_id": ("an int or a string", lambda v: isinstance(v, (int, str)) and not isinstance(v, bool)),
    "category": ("a non-empty string", lambda v: isinstance(v, str) and bool(v.strip())),
    "turns": ("a non-empty list of non-empty strings", lambda v: isinstance(v, list) and bool(v)),
}


@dataclass(frozen=True)
class Question:
    """One line of a prompts file."""

    question_id: int | str
    category: str
    turns: tuple[str, ...]
    line: int  # 1-based line number in the file
    extra: dict = field(default_factory=dict, compare=False)  # the line's other fields
    file: str = "<prompts>"  # the file's path, for errors


def _invalid(where: str, what: str) -> ValueError:
    qid, category, turns = (words for words, _ in REQUIRED.values())
    return ValueError(
        f"{where}: {what}; each line must be a JSON object with 'question_id' ({qid}), 'category' ({category}) "
        f"and 'turns' ({turns}), as in Spec-Bench's question.jsonl"
    )


def parse_prompts(text: str, path: str | Path = "<prompts>") -> list[Question]:
    """The questions of a Spec-Bench-format JSONL text (blank lines skipped).

    Raises:
        ValueError: naming ``path``, the line and what would be valid, for a line that is not a JSON object, a missing
            or ill-typed field, empty ``turns``, a repeated ``question_id``, or a file with no question.
    """
    questions: list[Question] = []
    seen: dict = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise _invalid(where, f"not valid JSON ({err.msg} at column {err.colno})") from None
        if not isinstance(row, dict):
            raise _invalid(where, f"a JSON {type(row).__name__}, not an object")
        missing = [name for name in REQUIRED if name not in row]
        if missing:
            raise _invalid(where, f"missing field{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}")
        for name, (words, valid) in REQUIRED.items():
            if not valid(row[name]):
                raise _invalid(where, f"{name!r} is {row[name]!r}, not {words}")
        qid, category, turns = row["question_id"], row["category"], row["turns"]
        for index, turn in enumerate(turns):
            if not isinstance(turn, str) or not turn.strip():
                raise _invalid(where, f"turn {index + 1} of 'turns' is {turn!r}, not a non-empty string")
        if qid in seen:
            raise _invalid(where, f"'question_id' {qid!r} repeats line {seen[qid]}'s")
        seen[qid] = number
        extra = {k: v for k, v in row.items() if k not in REQUIRED}
        questions.append(Question(qid, category, tuple(turns), number, extra, str(path)))
    if not questions:
        raise _invalid(str(path), "no question in the file")
    return questions


def read_prompts(path: str | Path) -> list[Question]:
    """The questions of a Spec-Bench-format JSONL file; a `ValueError` if it cannot be read or is malformed."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"--prompts {str(path)!r} cannot be read: {err}") from None
    return parse_prompts(text, path)


def messages_for(question: Question, turn: int, answers: list[str]) -> list[dict]:
    """The chat of ``question``'s turn ``turn`` (0-based): every earlier turn with its answer, then this one."""
    chat = []
    for index in range(turn):
        chat += [{"role": "user", "content": question.turns[index]}, {"role": "assistant", "content": answers[index]}]
    return chat + [{"role": "user", "content": question.turns[turn]}]


def check_lengths(questions: list[Question], tokenizer, max_new_tokens: int, limit: int | None) -> None:
    """Raise a `ValueError` (file, line, tokens needed, the target's limit), before anything runs, for a question whose
    last turn could not fit the target's context: its user messages in the chat template and ``max_new_tokens`` per
    answer."""
    if limit is None:
        return
    for q in questions:
        chat = messages_for(q, len(q.turns) - 1, ["x"] * (len(q.turns) - 1))
        needed = chat_ids(tokenizer, chat).shape[1] + len(q.turns) * max_new_tokens
        if needed > limit:
            raise ValueError(
                f"{q.file}:{q.line}: question {q.question_id!r} needs up to {needed} tokens ({len(q.turns)} turn(s) in "
                f"the chat template and {max_new_tokens} new tokens per turn), more than the target's context of "
                f"{limit} tokens; shorten its turns or pass a smaller --max-new-tokens"
            )


def categories_in_order(questions: list[Question]) -> list[str]:
    return list(dict.fromkeys(q.category for q in questions))


def category_table(
    records: list[dict], units: list[tuple[int, int]], questions: list[Question], methods: tuple[str, ...]
) -> dict:
    """Per category and ``overall``: the harness's summary of its prompts, with each method's speedup against every
    baseline that ran (``speedup_vs``) and its MAL (``mal``)."""
    groups = {
        c: {i for i, (q, _) in enumerate(units) if questions[q].category == c} for c in categories_in_order(questions)
    }
    groups["overall"] = set(range(len(units)))
    table = {}
    for name, prompts in groups.items():
        chosen = [r for r in records if r["prompt"] in prompts]
        summary = summarize(chosen, methods)
        seconds = {m: _median_seconds([r for r in chosen if r["method"] == m]) for m in methods}
        for m in methods:
            summary[m]["speedup_vs"] = {b: _speedup(seconds[b], seconds[m]) or None for b in BASELINES if b in methods}
            # MAL: the loop's mean accepted length, else new tokens per target forward (transformers' generate)
            loop = summary[m]["mean_accepted_length"]
            summary[m]["mal"] = loop if loop is not None else summary[m]["tokens_per_target_call"]
        table[name] = {"prompts": len(prompts), "questions": len({units[i][0] for i in prompts}), "methods": summary}
    return table


def run_prompts_bench(
    bundle: DefaultBundle,
    config,
    prompts: str | Path | list[Question],
    output: str | Path | None = None,
    warn: bool = True,
) -> dict:
    """Run ``config.methods`` on every turn of every question of ``prompts`` (a path, or :func:`parse_prompts`'s
    questions); return (and write to ``output``) the result: the harness's meta, ``categories``
    (:func:`category_table`), the timing verdict, and every record (``prompt`` indexes ``units``: ``[question, turn]``).
    """
    questions = prompts if isinstance(prompts, list) else read_prompts(prompts)
    path = questions[0].file
    check_methods(bundle, config.methods, "chat")
    limit = getattr(bundle.target.config.get_text_config(), "max_position_embeddings", None)  # the target's context
    check_lengths(questions, bundle.tokenizer, config.max_new_tokens, limit)

    def context(question: Question, turn: int, answers: list[str]) -> BenchContext:
        ids = chat_ids(bundle.tokenizer, messages_for(question, turn, answers))
        item = TaskItem("chat", str(question.question_id), question.turns[turn], "")
        return bench_context(bundle, item, ids, config)

    units = [(q, turn) for q, question in enumerate(questions) for turn in range(len(question.turns))]
    answers: list[str] = []  # the target's own answers to the question's earlier turns
    with _BenchRun(bundle.target) as run:
        # untimed warm-up on the longest first turns (later turns are longer still: a static cache may grow there)
        run.warmup = warm_up([context(q, 0, []) for q in questions] if config.warmup else [], config, run)
        bar = tqdm(units, desc=f"bench {Path(str(path)).name}", unit="turn")
        for index, (q, turn) in enumerate(bar):
            question, answers = questions[q], answers[:turn]
            first = time_prompt(context(question, turn, answers), index, config, run, bar, f"{question.category}, ")
            answers.append(bundle.tokenizer.decode(first["target-only"]["tokens"], skip_special_tokens=True))
    categories = category_table(run.records, units, questions, tuple(config.methods))
    meta = {"prompts": str(path), "questions": len(questions), "turns": len(units)}
    meta["categories"] = categories_in_order(questions)
    body = {"categories": categories, "units": [list(unit) for unit in units]}
    return bench_result(bundle, config, run, meta, body, categories["overall"]["methods"], output, warn)


def format_category_table(result: dict) -> str:
    """Spec-Bench's leaderboard layout: one row per method; its speedup against target-only, MAL and token identity
    with target-only per category and overall; then the overall speedup against every baseline that ran."""
    categories = result["categories"]
    names = list(categories)
    methods = list(categories["overall"]["methods"])
    pad = max(len(m) for m in methods) + 2

    def block(title: str, columns: list[str], widths: list[int], cell) -> list[str]:
        """A blank line, a header, and one row per method ``m``: ``cell(m, column)`` under each column."""
        header = f"{title:<{pad}}" + "".join(f"{c:>{w}}" for c, w in zip(columns, widths))
        return ["", header, "-" * len(header)] + [
            f"{m:<{pad}}" + "".join(f"{cell(m, c):>{w}}" for c, w in zip(columns, widths)) for m in methods
        ]

    def of(m: str, name: str) -> dict:
        return categories[name]["methods"][m]

    def ratio(v):
        return "-" if v is None else f"{v:.2f}x"

    widths = [max(10, *(len(n) + 2 for n in names))] * len(names)
    rows = block("speedup", names, widths, lambda m, n: ratio(of(m, n)["speedup_vs_target_only"]))[1:]
    rows += block("MAL", names, widths, lambda m, n: f"{of(m, n)['mal']:.2f}")
    rows += block("=target", names, widths, lambda m, n: f"{of(m, n)['equals_target_only']:.0%}")
    baselines = [b for b in BASELINES if b in methods]
    widths = [max(len(b) + 2, 10) for b in baselines]
    rows += block("overall vs", baselines, widths, lambda m, b: ratio(of(m, "overall")["speedup_vs"].get(b)))
    counts = ", ".join(f"{n} {c['questions']}" for n, c in categories.items() if n != "overall")
    meta = result["meta"]
    rows.append(f"\nquestions per category: {counts}; {meta['turns']} turns, {meta['max_new_tokens']} new tokens each")
    timing = result["timing"]
    rows.append(
        f"speedup: wall time of the baseline / the method's, median of {timing['repeats']} interleaved runs per turn; "
        "MAL: new tokens per decoding step (target forward); =target: turns whose tokens equal target-only's"
    )
    if not timing["reliable"]:
        rows.insert(0, warning_text(timing))
    return "\n".join(rows)
