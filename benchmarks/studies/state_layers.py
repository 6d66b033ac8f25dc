"""Which of the target's layers tell GLIDE's first draft step most (a probe, before building EAGLE-3's fused input).

The first draft step reads ``[embedding(x_t) ; h_{t-1}]`` and predicts the target's greedy token after ``x_t``. Today
``h`` is the target's last hidden state (after its final norm, ``hidden_states[-1]``); EAGLE-3 (Li et al. 2025, §3.3)
fuses a low, a middle and a high layer instead. This probe asks which input carries more, without the rest of a draft:
an MLP (norm, 576 × k → 1,024, SiLU, → GLIDE's 6,145 output rows) per input, trained with cross-entropy on the target's
argmax over train-split corpus windows (the CPU corpus store's), scored by greedy agreement on the CPU table's held-out
text (the target's own greedy text for 48 held-out prompts). Same data, steps and seed for every input; each training
size draws the first N windows. No context beyond what the states carry, so agreement is below a draft's: compare rows.

    python -m benchmarks.studies.state_layers --corpus-store store/corpus-state --heldout-store store/heldout-state \\
        --sizes 200,800 --output benchmarks/verification/state-layers-probe.json
"""

from __future__ import annotations

import argparse
import glob
import json
import platform
import sys
import time

import torch
from safetensors.torch import load_file

# hidden_states indices of SmolLM2-135M (30 layers): the output of layer l; 30 is the final norm's (today's state)
INPUTS = {
    "top (final norm: today's state GLIDE)": [30],
    "layer 27 (EAGLE-3's high)": [27],
    "3 + 15 + 27 (EAGLE-3's low, mid, high)": [3, 15, 27],
    "3 + 15 + 27 + top": [3, 15, 27, 30],
    "8 + 22 + top": [8, 22, 30],
}


def store_windows(path: str) -> torch.Tensor:
    """`(N, T)` the input ids of a store's shards, in order."""
    return torch.cat([load_file(f)["input_ids"] for f in sorted(glob.glob(f"{path}/shard-*.safetensors"))])


@torch.no_grad()
def features(target, windows: torch.Tensor, layers: list[int], to_row: torch.Tensor, batch: int = 8):
    """For every position t >= 1 of ``windows``: ``embedding(x_t)``, ``hidden_states[l]`` at t - 1 for each l in
    ``layers`` (bf16, `(P, 576)` each) and the output row of the target's argmax at t (`(P,)`)."""
    emb, states, labels = [], {layer: [] for layer in layers}, []
    for i in range(0, len(windows), batch):
        ids = windows[i : i + batch]
        out = target(ids, output_hidden_states=True)
        width = out.hidden_states[0].shape[-1]
        emb.append(target.get_input_embeddings()(ids[:, 1:]).reshape(-1, width).to(torch.bfloat16))
        for layer in layers:
            states[layer].append(out.hidden_states[layer][:, :-1].reshape(-1, width).to(torch.bfloat16))
        labels.append(to_row[out.logits.argmax(-1)[:, 1:].reshape(-1)])
    return torch.cat(emb), {layer: torch.cat(v) for layer, v in states.items()}, torch.cat(labels)


def probe(
    train, test, layers: list[int], rows: int, positions: int, epochs: int = 4, hidden: int = 1024, batch: int = 512
) -> float:
    """Held-out greedy agreement of an MLP trained on the first ``positions`` of ``train`` (an id outside GLIDE's
    vocabulary never counts as agreed)."""
    torch.manual_seed(0)
    width = train[0].shape[1] * (1 + len(layers))
    net = torch.nn.Sequential(
        torch.nn.LayerNorm(width), torch.nn.Linear(width, hidden), torch.nn.SiLU(), torch.nn.Linear(hidden, rows)
    )
    steps = epochs * (positions // batch)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, 1e-3, total_steps=steps)

    def inputs(data, index):
        return torch.cat([data[0][index].float(), *[data[1][layer][index].float() for layer in layers]], dim=-1)

    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        index = torch.randint(0, positions, (batch,), generator=generator)
        loss = torch.nn.functional.cross_entropy(net(inputs(train, index)), train[2][index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    with torch.no_grad():
        guess = torch.cat([net(inputs(test, index)).argmax(-1) for index in torch.arange(test[2].numel()).split(4096)])
    return round(((guess == test[2]) & (test[2] < rows - 1)).float().mean().item(), 4)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus-store", required=True, help="a store of train-split windows (recipes.distillation)")
    parser.add_argument("--heldout-store", required=True, help="the held-out store (the target's own text)")
    parser.add_argument("--sizes", default="200,800", help="training windows, comma-separated (each the first N)")
    parser.add_argument("--output", required=True)
    args = parser.parse_args(argv)
    try:
        sizes = sorted(int(s) for s in args.sizes.split(","))
    except ValueError:
        sizes = []
    if not sizes or sizes[0] < 1:
        parser.error(f"--sizes must be positive integers, comma-separated, got {args.sizes!r}")
    from hf_specdraft.bench.harness import cpu_model
    from hf_specdraft.defaults import SMOLLM2_DRAFTERS_DIR
    from hf_specdraft.defaults.smollm2 import load_smollm2
    from hf_specdraft.glide import GlideConfig

    torch.manual_seed(0)
    started = time.perf_counter()
    target, _ = load_smollm2(dtype=torch.float32, device="cpu")
    vocab = GlideConfig.from_pretrained(SMOLLM2_DRAFTERS_DIR / "glide").draft_token_ids
    to_row = torch.full((target.config.vocab_size,), len(vocab), dtype=torch.long)
    to_row[torch.tensor(vocab)] = torch.arange(len(vocab))
    layers = sorted({layer for ls in INPUTS.values() for layer in ls})
    windows = store_windows(args.corpus_store)[: sizes[-1]]
    if len(windows) < sizes[-1]:
        parser.error(f"--sizes: the corpus store holds {len(windows)} windows, fewer than {sizes[-1]}")
    train = features(target, windows, layers, to_row)
    test = features(target, store_windows(args.heldout_store), layers, to_row)
    per_window = windows.shape[1] - 1
    result = {
        "meta": {
            "cpu": cpu_model(),
            "threads": torch.get_num_threads(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "command": "python -m benchmarks.studies.state_layers "
            + " ".join(argv if argv is not None else sys.argv[1:]),
            "heldout_positions": test[2].numel(),
            "features_seconds": round(time.perf_counter() - started, 1),
        },
        "agreement": {},
    }
    for size in sizes:
        row = {"embedding only": probe(train, test, [], len(vocab) + 1, size * per_window)}
        for name, ls in INPUTS.items():
            row[name] = probe(train, test, ls, len(vocab) + 1, size * per_window)
            print(size, name, row[name], flush=True)
        result["agreement"][f"{size} windows ({size * per_window} positions)"] = row
        with open(args.output, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
