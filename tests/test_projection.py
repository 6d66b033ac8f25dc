"""The few-token linears (hf_specdraft.core.projection): same logits, applied only where safe, always restored."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hf_specdraft import speculative_generate
from hf_specdraft.core.projection import few_token_linears

from conftest import OracleDrafter, greedy_reference, tiny_model


@pytest.mark.parametrize("rows", [1, 2, 6, 17])
def test_logits_match_linear(rows):
    model = tiny_model("llama", vocab_size=4096)
    hidden = torch.randn(1, rows, model.config.hidden_size)
    head = model.get_output_embeddings()
    expected = nn.functional.linear(hidden, head.weight)
    with torch.no_grad(), few_token_linears(head, orientation="transposed") as applied:
        got = head(hidden)
    # laid out as linear's: models view and complex-view it
    assert applied == 1 and got.shape == expected.shape and got.is_contiguous()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
@pytest.mark.parametrize("rows", [1, 3, 6])
def test_every_linear_of_a_forward(model_type, rows):
    model = tiny_model(model_type, vocab_size=512)
    linears = [m for m in model.modules() if type(m) is nn.Linear]
    ids = torch.randint(0, 512, (1, 7 + rows), generator=torch.Generator().manual_seed(rows))
    with torch.no_grad():
        expected = model(ids).logits
        calls = []
        original = torch.matmul
        with few_token_linears(model, orientation="transposed") as swapped:
            torch.matmul = lambda a, b: calls.append(a.shape) or original(a, b)
            try:
                got = model(ids).logits
            finally:
                torch.matmul = original
    assert swapped == len(linears) > 7  # every projection of every layer and the head
    assert len(calls) == len(linears)  # each ran as W @ h.T
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert not any("forward" in vars(m) for m in linears)


def test_bias_and_restore_on_error():
    model = tiny_model("llama", vocab_size=300)
    head = model.get_output_embeddings()
    head.bias = nn.Parameter(torch.randn(300))
    hidden = torch.randn(1, 4, model.config.hidden_size)
    with pytest.raises(RuntimeError, match="boom"), torch.no_grad(), few_token_linears(head):
        torch.testing.assert_close(head(hidden), nn.functional.linear(hidden, head.weight, head.bias))
        raise RuntimeError("boom")
    assert "forward" not in vars(head)  # the class' own forward again


def test_not_applied_where_it_could_change_what_runs():
    model = tiny_model("llama")
    head = model.get_output_embeddings()
    head.forward = head.forward  # somebody else's wrapper (accelerate hooks, adapters) stays untouched
    with few_token_linears(head) as applied:
        assert not applied


def test_keeps_linear_under_autograd():
    model = tiny_model("llama").train()
    hidden = torch.randn(1, 4, model.config.hidden_size, requires_grad=True)
    with few_token_linears(model.lm_head):
        model.lm_head(hidden).sum().backward()
    assert hidden.grad is not None and model.lm_head.weight.grad is not None


def test_loop_uses_it_and_stays_lossless(monkeypatch):
    import hf_specdraft.core.projection as projection

    monkeypatch.setattr(projection, "transposed_is_faster", lambda weight, rows: True)  # as calibrated on the AMD VMs
    model = tiny_model("qwen2", vocab_size=2048)
    prompt = torch.randint(0, 2048, (1, 9), generator=torch.Generator().manual_seed(3))
    reference = greedy_reference(model, prompt, 24)
    rows_seen = []
    original = torch.matmul
    monkeypatch.setattr(torch, "matmul", lambda a, b: rows_seen.append(b.shape[-1]) or original(a, b))
    out = speculative_generate(
        model, prompt, candidate_generator=OracleDrafter(reference, "right", vocab_size=2048), max_new_tokens=24
    )
    assert torch.equal(out, reference)
    assert rows_seen and max(rows_seen) == 5  # [last token] + 4 drafts went through the transposed product
    assert len(rows_seen) > 2 * model.config.num_hidden_layers  # the decoder layers' projections too, not only the head
    assert not any("forward" in vars(m) for m in model.modules())


@pytest.mark.parametrize("faster", [True, False])
def test_auto_follows_the_calibration_per_row_count(monkeypatch, faster):
    import hf_specdraft.core.projection as projection

    asked = []
    monkeypatch.setattr(projection, "transposed_is_faster", lambda weight, rows: asked.append(rows) or faster)
    model = tiny_model("llama", vocab_size=512)
    ids = torch.randint(0, 512, (1, 9), generator=torch.Generator().manual_seed(0))
    calls = []
    original = torch.matmul
    with torch.no_grad():
        expected = model(ids).logits
        with few_token_linears(model) as wrapped:
            monkeypatch.setattr(torch, "matmul", lambda a, b: calls.append(a.shape) or original(a, b))
            got = model(ids).logits
            monkeypatch.setattr(torch, "matmul", original)
            # a prefill keeps linear, uncalibrated
            model(torch.randint(0, 512, (1, projection.MAX_CALIBRATED_ROWS + 1)))
    assert wrapped > 7 and set(asked) == {9} and bool(calls) == faster
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_each_input_shape_is_decided_once_per_block(monkeypatch):
    """A verification's linears look their decision up by input shape: the calibration is asked once per shape."""
    import hf_specdraft.core.projection as projection

    asked = []
    monkeypatch.setattr(projection, "transposed_is_faster", lambda weight, rows: asked.append(rows) or False)
    head = tiny_model("llama", vocab_size=512).get_output_embeddings()
    with torch.no_grad(), few_token_linears(head):
        for rows in (3, 3, 2, 3, 2):
            head(torch.randn(1, rows, head.in_features))
    assert asked == [3, 2]


def test_calibration_times_each_shape_once_and_is_recorded(monkeypatch):
    import hf_specdraft.core.projection as projection

    monkeypatch.setattr(projection, "_FASTER_TRANSPOSED", {})
    weight = torch.randn(96, 32)
    first = projection.transposed_is_faster(weight, 3)
    timed = []
    monkeypatch.setattr(projection.timeit.Timer, "timeit", lambda timer, number: timed.append(timer) or 0.0)
    # same shape, dtype, rows: cached
    assert projection.transposed_is_faster(torch.randn(96, 32), 3) == first and not timed
    assert projection.transposed_is_faster(weight, 4) is False  # equal times: linear stays (W @ h.T must win by 10 %)
    assert len(timed) == 2 * (projection.CALIBRATION_REPEATS + 1)  # a warm-up run of each, then the timed ones
    assert projection.calibrated_choices() == [
        {"weight": [96, 32], "dtype": "float32", "rows": 3, "threads": torch.get_num_threads(), "transposed": first},
        {"weight": [96, 32], "dtype": "float32", "rows": 4, "threads": torch.get_num_threads(), "transposed": False},
    ]


def test_linear_orientation_changes_nothing_and_a_bad_one_is_refused():
    model = tiny_model("llama")
    with few_token_linears(model, orientation="linear") as wrapped:
        assert wrapped == 0 and not any("forward" in vars(m) for m in model.modules())
    with pytest.raises(ValueError, match="orientation must be one of"):
        with few_token_linears(model, orientation="fast"):
            pass


def test_one_row_runs_as_two(monkeypatch):
    """A one-row W @ h.T is linear's own matrix-vector product: computed as a two-column GEMM, first column kept."""
    import hf_specdraft.core.projection as projection

    model = tiny_model("llama", vocab_size=1024)
    head = model.get_output_embeddings()
    hidden = torch.randn(1, 1, model.config.hidden_size)
    columns, original = [], torch.matmul
    with torch.no_grad(), few_token_linears(head, orientation="transposed"):
        monkeypatch.setattr(torch, "matmul", lambda a, b: columns.append(b.shape[-1]) or original(a, b))
        got = head(hidden)
        monkeypatch.setattr(torch, "matmul", original)
    assert columns == [2] and got.shape == (1, 1, 1024) and got.is_contiguous()
    torch.testing.assert_close(got, nn.functional.linear(hidden, head.weight), rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(projection, "transposed_is_faster", lambda weight, rows: False)
    with torch.no_grad(), few_token_linears(model):  # auto, calibrated slower: linear's own path
        monkeypatch.setattr(torch, "matmul", lambda a, b: columns.append(b.shape[-1]) or original(a, b))
        head(hidden)
    assert columns == [2]


def test_calibration_streams_copies_of_the_weight(monkeypatch):
    import hf_specdraft.core.projection as projection

    monkeypatch.setattr(projection, "_FASTER_TRANSPOSED", {})
    monkeypatch.setattr(projection, "CALIBRATION_BYTES", 96 * 32 * 4 * 3)  # three copies of a (96, 32) fp32 weight
    seen = []
    original = nn.functional.linear
    monkeypatch.setattr(nn.functional, "linear", lambda h, w: seen.append(w.data_ptr()) or original(h, w))
    weight = torch.randn(96, 32)
    projection.transposed_is_faster(weight, 1)
    # each pass reads three distinct copies, as a forward reads its layers
    assert len(set(seen)) == 3 and weight.data_ptr() not in seen
    assert len(seen) == 3 * (1 + projection.CALIBRATION_REPEATS)


def test_report_renders_one_verification_table_per_cpu():
    from benchmarks.report.render import verification_section

    def run(hardware, one, two):
        meta = {
            "hardware": hardware,
            "dtype": "float32",
            "prefix": 96,
            "repeats": 15,
            "command": "python -m benchmarks.studies.projection",
        }
        return {
            "meta": meta,
            "milliseconds": {"model's own": {"1": one, "2": two}},
            "ratio_to_one_token": {"model's own": {"1": 1.0, "2": two / one}},
        }

    text = verification_section(
        [run("CPU: AMD EPYC, 2 threads", 56.0, 84.0), run("CPU: Intel(R) Xeon(R), 2 threads", 30.0, 31.5)]
    )
    assert (
        text.count("| linear layers | n=1 | n=2 |") == 2
        and "| model's own | 1.00 | 1.50 |" in text
        and "| model's own | 1.00 | 1.05 |" in text
    )
    assert "AMD EPYC" in text and "Xeon" in text and "model's own 56.0" in text
    assert text.count("before the one-row path") == 2  # neither run recorded a one-row calibration


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize("mode", ["right", "wrong"])
def test_every_row_count_transposed_stays_lossless(monkeypatch, arch, mode):
    """With W @ h.T forced for every row count (one row as two), the loop's greedy output and plain greedy
    generate inside few_token_linears both equal target-only greedy, with drafts always right and always wrong."""
    import hf_specdraft.core.projection as projection

    monkeypatch.setattr(projection, "transposed_is_faster", lambda weight, rows: True)
    model = tiny_model(arch, vocab_size=1024)
    prompt = torch.randint(0, 1024, (1, 7), generator=torch.Generator().manual_seed(11))
    reference = greedy_reference(model, prompt, 20)
    out = speculative_generate(
        model, prompt, candidate_generator=OracleDrafter(reference, mode, vocab_size=1024), max_new_tokens=20
    )
    assert torch.equal(out, reference)
    with few_token_linears(model) as wrapped:
        plain = model.generate(prompt, max_new_tokens=20, do_sample=False)
    assert wrapped and torch.equal(plain, reference)


def test_calibrations_persist_per_machine_across_processes(monkeypatch, tmp_path):
    """A later process on the same machine measures nothing again; another CPU or torch build does."""
    import json

    import hf_specdraft.core.projection as projection

    path = tmp_path / "few_token_linears.json"
    monkeypatch.setenv("HF_SPECDRAFT_CALIBRATION_FILE", str(path))
    monkeypatch.setattr(projection, "_FASTER_TRANSPOSED", {})
    monkeypatch.setattr(projection, "_ON_DISK", {"loaded": False})
    weight = torch.randn(80, 24)
    first = projection.transposed_is_faster(weight, 5)
    stored = json.loads(path.read_text())
    assert stored == {projection.machine_id(): {"80x24 float32 rows=5 threads=%d" % torch.get_num_threads(): first}}
    monkeypatch.setattr(projection, "_FASTER_TRANSPOSED", {})  # a new process: nothing in memory
    monkeypatch.setattr(projection, "_ON_DISK", {"loaded": False})
    timed = []
    monkeypatch.setattr(projection.timeit.Timer, "timeit", lambda timer, number: timed.append(timer) or 0.0)
    assert projection.transposed_is_faster(weight, 5) == first and not timed  # read from the file
    monkeypatch.setattr(projection, "_FASTER_TRANSPOSED", {})
    monkeypatch.setattr(projection, "_ON_DISK", {"loaded": False})
    monkeypatch.setattr(projection, "machine_id", lambda: "another CPU | torch 0.0")
    # measured anew
    assert projection.transposed_is_faster(weight, 5) is False
    assert len(timed) == 2 * (projection.CALIBRATION_REPEATS + 1)
    assert set(json.loads(path.read_text())) == {"another CPU | torch 0.0", stored and next(iter(stored))}
    monkeypatch.setenv("HF_SPECDRAFT_CALIBRATION_FILE", "")
    assert projection.calibration_file() is None
