"""Greedy generation in vLLM for ``benchmarks.serving.vllm_check``; runs under the vLLM virtualenv's own python.

It imports vLLM only (not hf_specdraft, which that environment does not have). The request is a JSON file; the result,
a JSON file, because vLLM logs to stdout and stderr::

    VENV/bin/python benchmarks/serving/vllm_worker.py request.json result.json

request: ``target`` (a directory vLLM loads), ``draft`` (an exported assistant directory, or null: no speculation),
``num_speculative_tokens``, ``prompts`` (lists of token ids), ``max_new_tokens``, ``max_model_len``.

result: per prompt ``token_ids`` (the generated ids, EOS included when it stopped there), ``seconds`` (wall time of
that prompt's ``generate``) and the speculative counters it added (``drafts``, ``draft_tokens``, ``accepted_tokens``);
``versions``. Prompts run one at a time (batch size 1, as hf_specdraft's loop), after one warm-up call.
"""

from __future__ import annotations

import json
import os
import sys
import time

COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
}


def counters(llm) -> dict[str, int]:
    """The engine's cumulative speculative-decoding counters (0 where absent: no speculation)."""
    totals = dict.fromkeys(COUNTERS, 0)
    for metric in llm.get_metrics():
        for key, name in COUNTERS.items():
            if metric.name == name:
                totals[key] += int(metric.value)
    return totals


def build_llm(request: dict):
    from vllm import LLM

    speculative = None
    if request["draft"] is not None:
        speculative = {
            "method": "mtp",
            "model": request["draft"],
            "num_speculative_tokens": request["num_speculative_tokens"],
        }
    # the LLM class turns stats off by default; get_metrics needs them
    return LLM(
        model=request["target"],
        speculative_config=speculative,
        dtype="float32",
        enforce_eager=True,
        max_model_len=request["max_model_len"],
        max_num_seqs=1,
        seed=0,
        disable_log_stats=False,
    )


def generate(llm, request: dict) -> list[dict]:
    """Each prompt alone: its ids, seconds and the counters' increase over its call."""
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=request["max_new_tokens"])
    # warm-up: the first call pays one-time allocations
    llm.generate(
        [TokensPrompt(prompt_token_ids=request["prompts"][0])],
        SamplingParams(temperature=0.0, max_tokens=4),
        use_tqdm=False,
    )
    rows = []
    for ids in request["prompts"]:
        before = counters(llm)
        start = time.perf_counter()
        out = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)
        seconds = time.perf_counter() - start
        after = counters(llm)
        rows.append(
            {
                "token_ids": list(out[0].outputs[0].token_ids),
                "seconds": seconds,
                **{key: after[key] - before[key] for key in COUNTERS},
            }
        )
    return rows


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit("usage: vllm_worker.py REQUEST.json RESULT.json")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: the default asks for more than a small CPU box has
    with open(sys.argv[1]) as f:
        request = json.load(f)
    import torch
    import transformers
    import vllm

    llm = build_llm(request)
    result = {
        "prompts": generate(llm, request),
        "threads": torch.get_num_threads(),
        "versions": {"vllm": vllm.__version__, "torch": torch.__version__, "transformers": transformers.__version__},
    }
    with open(sys.argv[2], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":  # required: vLLM starts worker processes that re-import this module
    main()
