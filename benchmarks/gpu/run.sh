#!/usr/bin/env bash
# The benchmarks on a CUDA machine (the static cache, CUDA graphs, the bench on the embedded default), in steps.
# Nothing here has run on a GPU yet. docs/benchmarks.md, "Running the benchmarks on a CUDA machine", has the whole recipe.
#
#   bash benchmarks/gpu/stash.sh hide                      # optional, where you copy from: a smaller checkout (restore after)
#   bash benchmarks/gpu/prepare.sh                         # with internet: .whl/ and .gguf/ for a machine that lacks them
#   bash benchmarks/gpu/run.sh STEP [STEP ...]             # on the CUDA machine, from the repository root
#   bash benchmarks/gpu/run.sh --dry-run STEP [STEP ...]   # on a CPU: the same steps at toy sizes (mechanics)
#
# Every run first sources preamble.sh: wheels installed into /tmp/site, GGUF parts from .gguf/ kept and joined, inductor's
# cache under /tmp; results go to $OUT when it is set (else benchmarks/results/ and benchmarks/verification/static/). Steps:
#   first       the gpu-marked tests' CUDA-graph checks (recorded, replayed, never skipped), lossless checks on random
#               weights of SmolLM2-135M's shape (bf16, every default call eager and static against target-only greedy),
#               then the other gpu tests; installs the wheels from .whl/
#   control     the lossless checks in fp32
#   status      what the machine holds (the preamble's line); the preamble of any step keeps the GGUF parts it finds
#   overhead    the loop's own time per step on the static path (benchmarks/verification/static/loop_overhead.py) on the
#               real default target; needs the joined GGUF
#   completion  the bench on the embedded default (SmolLM2-135M-Instruct, bf16), one task; needs the GGUF
#   chat        the same
#   context     the same, with CASD
#   requests    the project's held-out requests of seven groups (hf_specdraft/defaults/spec_prompts.jsonl: conversation
#               with its second turn, translation, summaries, questions, math, retrieval, code), a per-group table beside
#               transformers' prompt lookup and assisted decoding
#   train       GLIDE and its vanilla twin, from the shipped pair, trained against the default target on the GPU on
#               its answers to requests of seven groups (templated, and written by the target itself) and on code, no
#               store, as many tokens as fit CALL_SECONDS, scored per group and at draft steps 1-3 beside the shipped
#               pair (benchmarks/gpu/train_default.py); train-default.json and the packed checkpoints to the results
#   report      BENCHMARKS.md regenerated (here, after copying the JSON into benchmarks/results/)
# Each step gets what is left of CALL_SECONDS (570 by default, for job runners that stop a command after 10 minutes;
# set it to what your machine allows), so a run cut short keeps the results written so far.
# NUM_PROMPTS / MAX_NEW_TOKENS override the gpu-default profile's 8 prompts x 128 tokens (a task that did not fit).
set -euo pipefail
DRY_RUN=0
if [ "${1:-}" = "--dry-run" ]; then DRY_RUN=1; shift; fi
export DRY_RUN
[ $# -gt 0 ] || set -- first
cd "$(dirname "$0")/../.."
source benchmarks/gpu/preamble.sh
CALL_SECONDS=${CALL_SECONDS:-570}
LOG="$FILES/log-$(IFS=-; echo "$*").txt"
exec > >(tee -a "$LOG") 2>&1
TEE=$!

left() { local s=$((CALL_SECONDS - SECONDS)); echo $((s > 1 ? s : 1)); }  # timeout 0 would mean no limit
need() {  # what a step needs: wheels, gguf, cuda
  for what in "$@"; do
    case $what in
      wheels) have_wheels || { echo "no transformers 5.23 in $SITE: copy .whl/ (bash benchmarks/gpu/prepare.sh) and run this again"; return 1; } ;;
      gguf) have_gguf || { echo "the GGUF is not joined: copy every part in .gguf/ (bash benchmarks/gpu/prepare.sh) and run this again"; return 1; } ;;
      cuda) [ "$DRY_RUN" = 1 ] || python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())" ;;
    esac
  done
}
lossless() {  # dtype, output, seconds
  local size=()
  [ "$DRY_RUN" = 1 ] && size=(--device cpu --layers 2 --new-tokens 8)
  timeout "$(( $3 > 1 ? $3 : 1 ))" python3 -m benchmarks.gpu.lossless_random --dtypes "$1" "${size[@]}" --output "$2"
}
bench() {  # task, extra methods
  local methods="target-only-static,glide+copy-auto,glide+copy-auto-static,glide+copy+cape-auto,glide+copy+cape-auto-static,max-gram-auto,max-gram-auto-static,draft-model-auto,draft-model-auto-static$2"
  local size=(--profile gpu-default ${NUM_PROMPTS:+--num-prompts $NUM_PROMPTS} ${MAX_NEW_TOKENS:+--max-new-tokens $MAX_NEW_TOKENS})
  [ "$DRY_RUN" = 1 ] && size=(--profile cpu --num-prompts 1 --max-new-tokens 4 --repeats 1)
  timeout "$(left)" python3 -m hf_specdraft bench "${size[@]}" --task "$1" --methods "$methods" --output "$RESULTS/gpu-default-$1.json"
}

status=0
for step in "$@"; do
  echo "== $step ($(left) s left of this run)"
  case $step in
    first)  # cheapest first: each part's output comes back even if a later one runs out of time
      need wheels cuda || { status=1; continue; }
      python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
      # the CUDA-graph tests on tiny models (a killed pytest writes no XML: at most 4 minutes of the run)
      timeout "$(( $(left) < 240 ? $(left) : 240 ))" python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py \
        -k cuda_graphs --junitxml "$FILES/gpu-graph-tests.xml" || status=1
      lossless bf16 "$FILES/lossless-random-gpu.json" $(( $(left) - 90 )) || status=1  # its JSON grows call by call
      timeout "$(left)" python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py -k "not cuda_graphs" \
        --junitxml "$FILES/gpu-tests.xml" || status=1 ;;
    control) need wheels cuda && lossless fp32 "$FILES/lossless-random-gpu-fp32.json" "$(left)" || status=1 ;;
    status) ;;
    overhead)
      need wheels gguf cuda || { status=1; continue; }
      if [ "$DRY_RUN" = 1 ]; then  # loop_overhead.py compiles with inductor: minutes on a CPU; here only the target's load
        python3 -c "from hf_specdraft.defaults import load_default; print(load_default().target.config.num_hidden_layers, 'layers')"
      else
        timeout "$(left)" python3 benchmarks/verification/static/loop_overhead.py --label gpu --device cuda --dtype bf16 --target default --output "$FILES/loop-overhead-gpu.json" || status=1
      fi ;;
    completion|chat) need wheels gguf cuda && bench "$step" "" || status=1 ;;
    context) need wheels gguf cuda && bench context ",casd-strict-auto,casd-strict-auto-static" || status=1 ;;
    requests)
      need wheels gguf cuda || { status=1; continue; }
      size=(--profile gpu-default ${MAX_NEW_TOKENS:+--max-new-tokens $MAX_NEW_TOKENS})
      [ "$DRY_RUN" = 1 ] && size=(--profile cpu --max-new-tokens 4 --repeats 1 --warmup 0)
      timeout "$(left)" python3 -m hf_specdraft bench "${size[@]}" --prompts default --output "$RESULTS/gpu-default-requests.json" \
        --methods "target-only,target-only-static,glide+copy-auto,glide+copy-auto-static,draft-model-auto,max-gram-auto,prompt-lookup,stock-assisted" \
        || status=1 ;;
    report) python3 -m benchmarks.report --results-dir benchmarks/results || status=1 ;;
    train)
      need wheels gguf cuda || { status=1; continue; }
      size=(--seconds $(( $(left) - 20 )))
      [ "$DRY_RUN" = 1 ] && size=(--device cpu --seconds 500 --windows 16 --self-generated 4 --requests 4 --written 4 --heldout-windows 2 --group-prompts 1 --batch 2)
      timeout "$(left)" python3 -m benchmarks.gpu.train_default --output "$FILES" --work "$TMP_ROOT/glide-gpu" "${size[@]}" || status=1 ;;
    *) echo "unknown step '$step': first, control, status, overhead, completion, chat, context, requests, train or report" >&2; exit 2 ;;
  esac
done
echo "== done in $SECONDS s; files in $RESULTS and $FILES"
exec >&- 2>&-
wait "$TEE" 2>/dev/null || true  # the log's last lines written before the run returns
exit $status
