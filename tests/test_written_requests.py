"""Requests the target writes itself (recipes.requests): the instructions drawn, and the writing made into requests."""

import pytest

from recipes.requests import GROUP_WEIGHTS, requests_from_written, writing_prompts


def test_writing_prompts_are_drawn_by_the_mix_and_repeat_with_their_seed():
    drawn = writing_prompts(400, seed=3)
    assert drawn == writing_prompts(400, seed=3) and drawn != writing_prompts(400, seed=4)
    groups = {group for group, _ in drawn}
    assert groups == set(GROUP_WEIGHTS)
    for group, instruction in drawn:
        assert (instruction == "") == (group == "math")  # math problems stay templated: no writing asked
        assert "{" not in instruction


def test_the_writing_becomes_requests_in_the_templated_shapes():
    drawn = [
        ("qa", "ask"),
        ("qa", "ask"),
        ("conversation", "ask"),
        ("translation", "ask"),
        ("summarization", "ask"),
        ("rag", "ask"),
        ("code", "ask"),
        ("math", ""),
        ("translation", "ask"),
    ]
    paragraph = "Bees carry pollen from flower to flower. " * 5
    written = [
        'A student might ask: "Why do bees dance in the hive?"',
        "Bees are small and very busy animals.",  # a question that is not one: skipped
        "Plan a picnic for six friends in the park.\nSure! Here is more text.",
        "The bakery opens at seven every morning.",
        paragraph,
        paragraph,
        "Write a function that reverses the words of a sentence.",
        "",
        "A teenager might say:",  # only the lead-in: skipped
    ]
    requests = requests_from_written(drawn, written, seed=0)
    assert [group for group, _ in requests] == [
        "qa",
        "conversation",
        "translation",
        "summarization",
        "rag",
        "code",
        "math",
    ]
    by_group = dict(requests)
    assert by_group["qa"] == ["Why do bees dance in the hive?"]
    assert (
        by_group["conversation"][0] == "Plan a picnic for six friends in the park."
        and len(by_group["conversation"]) == 2
    )
    assert by_group["translation"][0].startswith("Translate the following sentence into ")
    assert by_group["translation"][0].endswith("\n\nThe bakery opens at seven every morning.")
    assert by_group["summarization"][0].endswith(paragraph.strip())
    assert by_group["rag"][0].startswith("Answer the question using the passage below.\n\nPassage: Bees carry")
    assert by_group["code"] == ["Write a function that reverses the words of a sentence."]
    assert by_group["math"][0][0].isupper()


def test_bad_counts_and_mismatched_writing_are_refused():
    with pytest.raises(ValueError, match="count must be a positive int"):
        writing_prompts(0)
    with pytest.raises(ValueError, match="written has 1 texts for 2 instructions"):
        requests_from_written([("qa", "a"), ("qa", "b")], ["Why?"])
