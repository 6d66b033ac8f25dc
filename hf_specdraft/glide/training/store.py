"""A distillation store: what the frozen target says about a set of windows, computed once and read by every run (a
target forward per step is too dear on a few CPU cores). Resumable safetensors shards (``write_store``) hold:

- ``input_ids`` `(N, T)` int32: the windows;
- ``keys.{l}`` / ``values.{l}`` `(N, kv_heads, T, head_dim)` bf16: the cached (post-RoPE) keys and values of the target
  layers GLIDE reads (§4.1);
- ``topk_ids`` / ``topk_probs`` `(N, T, k)` int32 / fp16: the target's k most likely next tokens and their
  probabilities (token-level distillation, Du et al. 2024, Appendix B);
- ``hidden`` `(N, T, hidden_size)` bf16: the target's last hidden state, a ``state_input`` GLIDE's input.

:class:`StoreWindows` reads it as a window source: ``train_glide(target, glide, StoreWindows(load_store(dir)), args)``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from .objective import GlideBatch, WindowSource, target_memory

TOP_K = 8  # the target's top-8 carry nearly all its probability mass on code
SHARD_WINDOWS = 16


@torch.inference_mode()
def target_answers(target: PreTrainedModel, input_ids: torch.Tensor, layer_ids: list[int], top_k: int = TOP_K) -> dict:
    """One frozen-target forward over ``input_ids`` `(B, T)`: a store's tensors for those windows (module docstring)."""
    kv, logits, hidden = target_memory(target, input_ids, with_logits=True, with_hidden=True)
    top = logits.float().softmax(-1).topk(top_k, dim=-1)
    answers = {
        "input_ids": input_ids.to(torch.int32),
        "topk_ids": top.indices.to(torch.int32),
        "topk_probs": top.values.to(torch.float16),
        "hidden": hidden.to(torch.bfloat16).contiguous(),
    }
    for i in layer_ids:
        answers[f"keys.{i}"] = kv[i][0].to(torch.bfloat16).contiguous()
        answers[f"values.{i}"] = kv[i][1].to(torch.bfloat16).contiguous()
    return answers


def write_store(
    target: PreTrainedModel,
    windows: torch.Tensor,
    output_dir: str | Path,
    layer_ids: list[int],
    top_k: int = TOP_K,
    shard_windows: int = SHARD_WINDOWS,
) -> Path:
    """Run the target over ``windows`` shard by shard into ``output_dir``; shards already there are kept (resume).

    Raises:
        ValueError: ``output_dir`` holds a store built with other settings (its ``store.json``).
    """
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    meta = {
        "num_windows": int(windows.shape[0]),
        "seq_len": int(windows.shape[1]),
        "layer_ids": list(layer_ids),
        "top_k": top_k,
        "shard_windows": shard_windows,
        "target": getattr(target.config, "_name_or_path", None),
    }
    meta_file = output_dir / "store.json"
    if meta_file.is_file() and json.loads(meta_file.read_text()) != meta:
        raise ValueError(f"{str(output_dir)!r} holds a store built with other settings: {meta_file.read_text()}")
    meta_file.write_text(json.dumps(meta, indent=1) + "\n")
    starts = range(0, windows.shape[0], shard_windows)
    for n, start in enumerate(tqdm(starts, desc="target answers (shards)")):
        path = output_dir / f"shard-{n:05d}.safetensors"
        if path.is_file():
            continue
        shard = target_answers(target, windows[start : start + shard_windows], layer_ids, top_k)
        save_file(shard, str(path.with_suffix(".tmp")))
        path.with_suffix(".tmp").rename(path)  # a killed run never leaves a torn shard
    return output_dir


def load_store(path: str | Path) -> dict[str, torch.Tensor]:
    """Every finished shard of a store, concatenated along the window axis."""
    shards = sorted(Path(path).glob("shard-*.safetensors"))
    if not shards:
        raise ValueError(
            f"{str(path)!r} holds no store shards (build one with write_store, e.g. python -m recipes.distillation)"
        )
    parts = [load_file(str(p)) for p in shards]
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


class StoreWindows(WindowSource):
    """A store as a window source (:func:`load_store`'s tensors; windows may repeat, e.g. a store mixed in several
    times to weigh it): the target's KV and top-k are read, the target never runs."""

    def __init__(self, store: dict[str, torch.Tensor]):
        missing = {"input_ids", "topk_ids", "topk_probs"} - set(store)
        if missing:
            raise ValueError(f"store lacks {sorted(missing)}: build it with write_store")
        self.store = store
        self.layer_ids = sorted(int(key.split(".")[1]) for key in store if key.startswith("keys."))
        self.seq_len = int(store["input_ids"].shape[1])
        self.tokens = int(store["input_ids"].numel())

    def __len__(self) -> int:
        return int(self.store["input_ids"].shape[0])

    def check(self, glide) -> None:
        ids = self.store["input_ids"]
        if int(ids.max()) >= glide.config.vocab_size or int(ids.min()) < 0:
            raise ValueError(f"the store has token ids outside the target's vocabulary [0, {glide.config.vocab_size})")
        missing = sorted(set(glide.config.target_layer_ids) - set(self.layer_ids))
        if missing and glide.config.cross_attention:
            raise ValueError(
                f"GLIDE reads target layers {missing} but the store holds the keys and values of {self.layer_ids} "
                "only: write a store with those layers (write_store's layer_ids)"
            )
        if glide.config.state_input and "hidden" not in self.store:
            raise ValueError(
                "GLIDE reads the target's hidden state (state_input=True) but the store holds none: write a new store "
                "(write_store keeps it since hf_specdraft 0.2)"
            )

    def batch(self, target, glide, rows: torch.Tensor, device, with_kv: bool, with_p: bool) -> GlideBatch:
        def take(key: str, dtype: torch.dtype) -> torch.Tensor:
            return self.store[key][rows].to(device=device, dtype=dtype)

        kv = None
        if with_kv:
            kv = [(None, None)] * glide.config.target_num_hidden_layers
            for i in set(glide.config.target_layer_ids):
                kv[i] = (take(f"keys.{i}", torch.float32), take(f"values.{i}", torch.float32))
        topk = (take("topk_ids", torch.long), take("topk_probs", torch.float32)) if with_p else (None, None)
        hidden = take("hidden", torch.float32) if glide.config.state_input else None
        return GlideBatch(take("input_ids", torch.long), kv, None, *topk, target_hidden=hidden)
