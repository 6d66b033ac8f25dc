"""Requests shaped like those people send a chat model, for the target to answer: the drafters' natural-language mix.

The shipped drafters first learned from Python source. A chat target is asked other things: conversation, translation,
summaries, questions, arithmetic word problems, questions about a passage (the six groups of Spec-Bench: Xia et al.
2024, "Unlocking Efficiency in Large Language Model Inference: A Comprehensive Survey of Speculative Decoding",
ACL Findings, arXiv:2401.07851), and code. The target's own greedy answers to these requests are what a draft is
judged against, so the drafters train on them (sequence-level self-distillation, Du et al. 2024, Appendix B).

Where the text comes from (nothing is downloaded; Spec-Bench's and MT-bench's questions are evaluation data and
never used):

- request templates, topics, places and follow-ups: written for this project (:data:`TOPICS`, :data:`ASKS`, …);
- passages to summarise, translate or answer from: docstrings of the local Python corpus's **train** split
  (the standard library, PSF licence, and the installed dependencies, permissive licences; split by file, as the
  corpus is), so no held-out file lends text to training;
- arithmetic word problems: templates filled with random numbers (:func:`math_problem`);
- code requests: train-split functions, as :mod:`recipes.distillation` already builds them;
- with ``--written``: requests the target writes itself, sampled, from project-written instructions
  (:data:`WRITING_ASKS`, :func:`writing_prompts`): other phrasings than the templates give.

    >>> from recipes.requests import training_requests
    >>> requests = training_requests(200, seed=0)         # [(group, [turn, ...]), ...]
"""

from __future__ import annotations

import ast
import random
import re

from hf_specdraft.defaults.corpus import Corpus, build_corpus
from hf_specdraft.defaults.tasks import chat_request, function_items

# a request's group, as Spec-Bench names its six, plus code; the share of each in the mix
GROUP_WEIGHTS = {
    "conversation": 0.2,
    "translation": 0.12,
    "summarization": 0.12,
    "qa": 0.18,
    "math": 0.14,
    "rag": 0.12,
    "code": 0.12,
}

TOPICS = """
photosynthesis, the water cycle, black holes, volcanoes, earthquakes, the immune system, vaccines, climate change,
renewable energy, solar panels, wind turbines, electric cars, the Roman Empire, the printing press, the Industrial
Revolution, ancient Egypt, the Silk Road, the Renaissance, democracy, inflation, interest rates, the stock market,
compound interest, budgeting, saving for retirement, healthy sleep, meditation, regular exercise, a balanced diet,
drinking enough water, learning a new language, public speaking, time management, remote work, job interviews, writing a
resume, teamwork, leadership, negotiation, the internet, how email works, encryption, passwords, machine learning,
neural networks, robots, smartphones, 3D printing, the moon landing, the solar system, Mars, comets, gravity, magnetism,
electricity, rainbows, thunderstorms, ocean tides, coral reefs, rainforests, deserts, bees, migrating birds, dolphins,
elephants, dinosaurs, evolution, DNA, bacteria, antibiotics, the human heart, the brain, memory, habits, happiness,
friendship, gardening, composting, baking bread, making coffee, a vegetarian diet, chess, football, the Olympic Games,
jazz, classical music, painting, photography, poetry, novels, libraries, museums, city parks, public transport,
recycling, plastic pollution, clean water, volunteering, first aid, fire safety, road safety, traveling on a budget,
packing for a trip, camping, hiking, cycling, running a marathon, yoga, board games, video games, social media, online
privacy, fake news, critical thinking, the scientific method, statistics, probability, prime numbers, fractions,
geometry, maps, time zones, calendars, the seasons, weather forecasts, airplanes, trains, bridges, skyscrapers
""".replace("\n", " ").split(", ")
TOPICS = [topic.strip() for topic in TOPICS if topic.strip()]

ASKS = [
    "What is {t}?",
    "Explain {t} in simple terms.",
    "Why does {t} matter?",
    "Give me three interesting facts about {t}.",
    "What are the main advantages and disadvantages of {t}?",
    "How would you explain {t} to a ten-year-old?",
    "Write a short paragraph about {t}.",
    "What are common misconceptions about {t}?",
    "Can you give me a brief history of {t}?",
    "What should a beginner know about {t}?",
    "Summarize the key ideas behind {t} in a few bullet points.",
    "How has {t} changed over the last hundred years?",
    "I keep hearing about {t}. What is it, and should I care?",
    "Compare {t} with something most people already know.",
    "What questions should I ask an expert on {t}?",
    "Describe {t} in exactly three sentences.",
    "What is one surprising thing about {t}, and why is it surprising?",
    "How do scientists study {t}?",
    "My friend says {t} is overrated. What would you tell them?",
    "What are the first steps to get started with {t}?",
    "Explain {t} using an analogy.",
    "What are the biggest open questions about {t}?",
    "Write a short FAQ with three questions and answers about {t}.",
    "How does {t} affect everyday life?",
]
TASKS = [
    "Write a short, friendly email to a colleague about {t}.",
    "Write a haiku about {t}.",
    "Write a four-line poem about {t}.",
    "Give me five tips about {t}.",
    "Write a short story for children about {t}.",
    "Write a tweet about {t}.",
    "Plan a {n}-day trip to {p}, with one activity each day.",
    "Suggest a name and a slogan for a small business about {t}.",
    "Write a short dialogue between two friends discussing {t}.",
    "Write a product description for a book about {t}.",
    "Draft an agenda for a one-hour meeting about {t}.",
    "Write a thank-you note to a teacher who taught me about {t}.",
    "Write a short speech to open a school event about {t}.",
    "Write a limerick about {t}.",
    "Write a blog post introduction about {t}.",
    "Give me a weekly plan to learn about {t}.",
    "Write a job advertisement for someone who works on {t}.",
    "Create a short quiz with three questions about {t}.",
]
PLACES = [
    "Paris",
    "Tokyo",
    "Rome",
    "New York",
    "Cairo",
    "Lisbon",
    "Mexico City",
    "Sydney",
    "Cape Town",
    "Istanbul",
    "Vancouver",
    "Kyoto",
    "Barcelona",
    "Prague",
    "Buenos Aires",
    "Seoul",
    "Edinburgh",
    "Marrakesh",
    "Oslo",
    "Bangkok",
]
FOLLOW_UPS = [
    "Can you make that shorter?",
    "Please give me an example.",
    "Now explain it to a ten-year-old.",
    "Can you add two more points?",
    "Rewrite your answer in a more formal tone.",
    "What is the most important part of that, in one sentence?",
    "Translate your answer into French.",
    "Turn that into a numbered list.",
    "Why is that?",
    "Can you make it funnier?",
    "What would a critic say about that?",
    "Give me a concrete example from daily life.",
    "Can you summarize that in a table?",
    "Which of those points is the most important, and why?",
    "Thanks! Can you tell me more about the last point?",
]
LANGUAGES = ["French", "Spanish", "German", "Italian", "Portuguese", "Dutch", "Chinese", "Japanese"]
SUMMARY_ASKS = [
    "Summarize the following text in two sentences.",
    "Summarize the following text in one short paragraph.",
    "Give a one-sentence summary of this text.",
    "List the main points of the following text as bullet points.",
    "Write a brief summary of the text below for a busy reader.",
]
RAG_ASKS = [
    "What does the passage say about {k}?",
    "According to the passage, what is {k} used for?",
    "Based only on the passage, explain {k}.",
    "What does the passage tell us about {k}, and why does it matter?",
]


def math_problem(rng: random.Random) -> str:
    """A grade-school arithmetic word problem with random numbers, asking for the steps."""
    a, b, c = rng.randint(2, 60), rng.randint(2, 30), rng.randint(2, 12)
    name = rng.choice(["Maria", "Tom", "Aisha", "Ken", "Lena", "Omar", "Sofia", "Raj", "Emma", "Luis"])
    item = rng.choice(["apples", "books", "stickers", "cookies", "marbles", "pencils", "cards", "shells"])
    problems = [
        f"{name} has {a} {item}. She buys {b} more and then gives away {c}. How many {item} does she have now?",
        f"A box holds {c} {item}. {name} fills {b} boxes and has {a} {item} left over. "
        f"How many {item} are there in all?",
        f"{name} reads {b} pages a day. How many days does it take to read a book of {b * c + a} pages?",
        f"A shop sells {item} at {c} dollars each. {name} buys {b} of them "
        f"and pays with a {100 if b * c < 100 else 500} dollar note. "
        "How much change does {name} get?".replace("{name}", name),
        f"A train travels {a * 10} kilometres in {c} hours. What is its average speed?",
        f"{name} saves {b} dollars a week. After {c} weeks she spends {a} dollars. How much money is left?",
        f"A rectangle is {a} cm long and {b} cm wide. What are its area and its perimeter?",
        f"There are {a + b} students in a class and {b} of them walk to school. "
        "What percentage of the class walks to school?",
    ]
    return rng.choice(problems) + rng.choice(
        [" Solve it step by step.", " Show your reasoning.", " Explain each step.", ""]
    )


def docstring_passages(corpus: Corpus, rng: random.Random, limit: int = 4000) -> list[str]:
    """Prose paragraphs (120-900 characters, mostly words) from docstrings of the corpus's train split."""
    files = sorted(corpus.train, key=lambda f: f.name)
    rng.shuffle(files)
    passages: list[str] = []
    for f in files:
        try:
            tree = ast.parse(f.read())
        except (SyntaxError, ValueError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(node) or ""
            for paragraph in re.split(r"\n\s*\n", doc):
                text = " ".join(paragraph.split())
                letters = sum(ch.isalpha() or ch == " " for ch in text)
                if 120 <= len(text) <= 900 and letters > 0.9 * len(text) and text[0].isupper() and text.endswith("."):
                    passages.append(text)
        if len(passages) >= limit:
            break
    return passages


def _keyword(passage: str, rng: random.Random) -> str:
    words = [w.strip(".,;:()") for w in passage.split() if len(w.strip(".,;:()")) > 6 and w.strip(".,;:()").isalpha()]
    return rng.choice(words).lower() if words else "its subject"


def training_requests(
    count: int, seed: int = 0, corpus: Corpus | None = None, tokenizer=None
) -> list[tuple[str, list[str]]]:
    """``count`` requests ``(group, turns)``: one user turn, or two for ``conversation`` (the second a follow-up that
    the target answers with its first answer in context), drawn by :data:`GROUP_WEIGHTS` from train-side text only."""
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be a positive int, got {count!r}")
    rng = random.Random(seed)
    corpus = corpus or build_corpus()
    passages = docstring_passages(corpus, rng)
    sentences = [s for p in passages for s in re.split(r"(?<=\.) ", p) if 40 <= len(s) <= 220]
    code_files = sorted(corpus.train, key=lambda f: f.name)
    rng.shuffle(code_files)
    groups, weights = zip(*GROUP_WEIGHTS.items())
    requests: list[tuple[str, list[str]]] = []
    while len(requests) < count:
        group = rng.choices(groups, weights)[0]
        topic = rng.choice(TOPICS)
        if group == "conversation":
            first = rng.choice(ASKS + TASKS).format(t=topic, n=rng.randint(2, 5), p=rng.choice(PLACES))
            turns = [first, rng.choice(FOLLOW_UPS)]
        elif group == "translation":
            turns = [f"Translate the following sentence into {rng.choice(LANGUAGES)}:\n\n{rng.choice(sentences)}"]
        elif group == "summarization":
            text = " ".join(rng.sample(passages, rng.randint(1, 3)))
            turns = [f"{rng.choice(SUMMARY_ASKS)}\n\n{text}"]
        elif group == "qa":
            turns = [rng.choice(ASKS).format(t=topic)]
        elif group == "math":
            turns = [math_problem(rng)]
        elif group == "rag":
            passage = rng.choice(passages)
            question = rng.choice(RAG_ASKS).format(k=_keyword(passage, rng))
            turns = [f"Answer the question using the passage below.\n\nPassage: {passage}\n\nQuestion: {question}"]
        else:
            items = function_items(
                code_files[len(requests) % len(code_files)].name, code_files[len(requests) % len(code_files)].read()
            )
            if not items:
                continue
            turns = [chat_request(rng.choice(items))]
        requests.append((group, turns))
    return requests


# Requests the target writes itself: the templates above give a few hundred phrasings, and people ask in many more.
# The target, sampled, writes the question, sentence or paragraph, then answers it greedily like any other request.
PEOPLE = [
    "a student",
    "a nurse",
    "a retired farmer",
    "a small business owner",
    "a parent of two",
    "a tourist",
    "a teenager",
    "a software engineer",
    "a chef",
    "a history teacher",
    "a truck driver",
    "a librarian",
    "a football coach",
    "a shy new employee",
    "a grandmother",
    "a musician",
]
WRITING_ASKS = {
    "qa": "Write one question about {t} that {p} might ask. Reply with the question only.",
    "conversation": "Write one request that {p} might send to a chat assistant about {t}. Reply with the request only.",
    "translation": "Write one everyday sentence that {p} might say about {t}. Reply with the sentence only.",
    "summarization": "Write a short paragraph of four sentences about {t}, as {p} would tell it.",
    "rag": "Write a short factual paragraph of three sentences about {t}.",
    "code": "Write one request that {p} might make for a small Python function. Reply with the request only.",
}


def writing_prompts(count: int, seed: int = 0) -> list[tuple[str, str]]:
    """``count`` instructions ``(group, instruction)`` asking the target to write a request, a sentence or a passage,
    drawn by :data:`GROUP_WEIGHTS` (math stays templated: its numbers must be random, not written)."""
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be a positive int, got {count!r}")
    rng = random.Random(seed)
    groups, weights = zip(*GROUP_WEIGHTS.items())
    drawn = []
    for _ in range(count):
        group = rng.choices(groups, weights)[0]
        ask = WRITING_ASKS.get(group)
        drawn.append((group, ask.format(t=rng.choice(TOPICS), p=rng.choice(PEOPLE)) if ask else ""))
    return drawn


def _written_text(text: str, group: str) -> str | None:
    """The target's writing made into request text, or ``None`` where it wrote nothing usable: a one-line request,
    question or sentence (its first line, quotes and labels off), or a paragraph (whole, 150-1,200 characters)."""
    text = text.strip()
    if group in ("summarization", "rag"):
        text = " ".join(text.split())
        return text if 150 <= len(text) <= 1200 else None
    line = text.split("\n")[0].strip()
    if '"' in line:  # "A tourist might ask: \"…\"": the quoted words are the request
        line = line.split('"', 1)[1]
    line = re.sub(r"^(question|request|sentence)\s*:\s*", "", line, flags=re.IGNORECASE).strip().strip('"“”').strip()
    if line.endswith(":") or (group == "qa" and "?" not in line):
        return None
    return line if 15 <= len(line) <= 300 else None


def requests_from_written(
    drawn: list[tuple[str, str]], written: list[str], seed: int = 0
) -> list[tuple[str, list[str]]]:
    """Requests ``(group, turns)`` from the target's writing (``written[i]`` answers ``drawn[i]``), in the shapes the
    templated requests take; a math slot gets a templated problem, an unusable writing is skipped."""
    if len(drawn) != len(written):
        raise ValueError(f"written has {len(written)} texts for {len(drawn)} instructions")
    rng = random.Random(seed)
    requests = []
    for (group, _), text in zip(drawn, written):
        if group == "math":
            requests.append((group, [math_problem(rng)]))
            continue
        text = _written_text(text, group)
        if text is None:
            continue
        if group == "conversation":
            turns = [text, rng.choice(FOLLOW_UPS)]
        elif group == "translation":
            turns = [f"Translate the following sentence into {rng.choice(LANGUAGES)}:\n\n{text}"]
        elif group == "summarization":
            turns = [f"{rng.choice(SUMMARY_ASKS)}\n\n{text}"]
        elif group == "rag":
            question = rng.choice(RAG_ASKS).format(k=_keyword(text, rng))
            turns = [f"Answer the question using the passage below.\n\nPassage: {text}\n\nQuestion: {question}"]
        else:
            turns = [text]
        requests.append((group, turns))
    return requests
