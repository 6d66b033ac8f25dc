"""Held-out evaluation tasks built from the corpus's held-out files, with a fixed seed, scored by edit similarity
(Levenshtein ratio, as LongBench scores LCC).

- ``completion``: complete a function from its signature and docstring (GLIDE, CAPE, cascade).
- ``context``: complete the next lines of a file, like the LCC / RepoBench-P tasks of the CASD paper (§4): the prompt
  holds the code just before the cut, ``context`` the whole file minus the lines to predict (CASD's draft pool).
- ``chat``: a request written from a held-out function's signature and docstring, for instruction-tuned targets.
"""

from __future__ import annotations

import ast
import random
from dataclasses import dataclass

from ..core.validation import check_int
from .corpus import Corpus, build_corpus

TASKS = ("completion", "context", "chat")
PROMPT_CHARS = 700  # ≈ 190 tokens: prompts stay inside the 256-token windows the default target saw
REFERENCE_CHARS = 240


@dataclass(frozen=True)
class TaskItem:
    task: str
    source: str  # corpus file name
    prompt: str
    reference: str
    context: str = ""  # "context" task only: the file without the reference span


def edit_similarity(prediction: str, reference: str) -> float:
    """1 − Levenshtein(prediction, reference) / max(len): 1.0 for identical strings, 0.0 for disjoint."""
    if not prediction and not reference:
        return 1.0
    previous = list(range(len(reference) + 1))
    for i, a in enumerate(prediction, 1):
        current = [i]
        for j, b in enumerate(reference, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a != b)))
        previous = current
    return 1.0 - previous[-1] / max(len(prediction), len(reference))


def copyable_fraction(reference: list[int], source: list[int], n: int = 4) -> float:
    """Share of ``reference``'s tokens that lie inside an ``n``-gram also found in ``source``: how much of the true
    continuation a context-lookup drafter (CASD, prompt lookup) could copy.

        >>> copyable_fraction([1, 2, 3, 4, 9], [0, 1, 2, 3, 4], n=4)
        0.8
    """
    check_int("n", n)
    grams = {tuple(source[i : i + n]) for i in range(len(source) - n + 1)}
    covered = [False] * len(reference)
    for i in range(len(reference) - n + 1):
        if tuple(reference[i : i + n]) in grams:
            covered[i : i + n] = [True] * n
    return sum(covered) / len(reference) if reference else 0.0


def function_items(name: str, text: str) -> list[TaskItem]:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    lines = text.splitlines(keepends=True)
    items = []
    for node in ast.walk(tree):
        functions = (ast.FunctionDef, ast.AsyncFunctionDef)
        if not isinstance(node, functions) or len(node.body) < 2 or ast.get_docstring(node, clean=False) is None:
            continue
        doc = node.body[0]
        start = (node.decorator_list[0].lineno if node.decorator_list else node.lineno) - 1
        prompt = "".join(lines[start : doc.end_lineno])
        body = "".join(lines[doc.end_lineno : node.end_lineno])
        if 40 <= len(prompt) <= PROMPT_CHARS and len(body.strip()) >= 20:
            items.append(TaskItem("completion", name, prompt, body[:REFERENCE_CHARS]))
    return items


def chat_request(item: TaskItem) -> str:
    """The user message of a ``chat`` item built from a completion item (signature + docstring)."""
    return f"Write a Python function with this signature and docstring:\n\n```python\n{item.prompt.rstrip()}\n```"


def chat_prompt(tokenizer, request: str | list[dict]) -> str:
    """``request`` (one user turn, or chat messages) in ``tokenizer``'s chat template, ready for the assistant's
    answer."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("chat prompts need a tokenizer with a chat_template (an instruction-tuned target)")
    chat = [{"role": "user", "content": request}] if isinstance(request, str) else request
    return tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)


def _context_item(name: str, text: str, rng: random.Random, prompt_chars: int) -> TaskItem | None:
    lines = text.splitlines(keepends=True)
    if len(lines) < 40:
        return None
    cut = rng.randrange(len(lines) // 3, len(lines) - 6)
    reference = "".join(lines[cut : cut + 4])
    if len(reference.strip()) < 20:
        return None
    before, after = "".join(lines[:cut]), "".join(lines[cut + 4 :])
    prompt = before[-prompt_chars:]
    prompt = prompt[prompt.find("\n") + 1 :] if len(before) > prompt_chars else prompt  # start on a line boundary
    return TaskItem("context", name, prompt, reference[:REFERENCE_CHARS], context=before + after)


def build_tasks(
    task: str, count: int = 100, seed: int = 0, corpus: Corpus | None = None, context_prompt_chars: int = PROMPT_CHARS
) -> list[TaskItem]:
    """``count`` items of ``task`` from the held-out split, chosen with ``seed``.

    Args:
        context_prompt_chars: ``context`` task only: how much of the file before the cut the prompt holds (cut back
            to a line start; a large number: the whole file, as LCC's prompts). The items do not depend on it.

    Raises:
        ValueError: unknown task, ``context_prompt_chars`` not a positive int, or fewer than ``count`` items.
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose one of {TASKS}")
    check_int("context_prompt_chars", context_prompt_chars, what="characters of the file before the cut")
    corpus = corpus or build_corpus()
    rng = random.Random(seed)
    files = sorted(corpus.heldout, key=lambda f: f.name)
    rng.shuffle(files)
    items: list[TaskItem] = []
    for f in files:
        if task == "context":
            item = _context_item(f.name, f.read(), rng, context_prompt_chars)
        else:
            candidates = function_items(f.name, f.read())
            item = candidates and rng.choice(candidates)  # one per file: no file dominates the task
        if item and task == "chat":
            item = TaskItem("chat", item.source, chat_request(item), (item.prompt + item.reference)[:REFERENCE_CHARS])
        if item:
            items.append(item)
        if len(items) == count:
            return items
    raise ValueError(
        f"only {len(items)} {task!r} items could be built from {len(files)} held-out files; asked for {count}"
    )
