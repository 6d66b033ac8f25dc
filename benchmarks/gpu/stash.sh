#!/usr/bin/env bash
# Where you copy the checkout from, around a copy to a CUDA machine: what the GPU steps never read, moved out of the
# checkout, and back.
#
#   bash benchmarks/gpu/stash.sh hide       # before copying (then bash benchmarks/gpu/prepare.sh sizes the copies)
#   bash benchmarks/gpu/stash.sh restore    # once the copy is made, before any commit
#
# The checkout is about 64 MiB (the shipped drafters alone take 53); where a transfer caps what one copy may hold, that
# leaves no room for the wheels or a part of the GGUF. The GPU steps (benchmarks/gpu/run.sh) read none of what STASHED
# names: the exportable GLIDE (the export and its vLLM test run on a CPU), and the bench's stored results and plots (a
# run writes its own). `hide` moves them into
# .gpu-stash/ (git-ignored), `restore` moves them back. Meanwhile `git status` lists them as deleted: commit nothing with
# `git add -A` or `git commit -a` until they are restored.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
STASH=.gpu-stash
STASHED=(hf_specdraft/defaults/checkpoint_smollm2/glide_assistant benchmarks/legacy-15m benchmarks/plots benchmarks/results)
case "${1:-}" in
  hide)
    for path in "${STASHED[@]}"; do
      [ -e "$STASH/$path" ] && { echo "$STASH/$path exists already: restore first" >&2; exit 1; }
    done
    for path in "${STASHED[@]}"; do
      mkdir -p "$STASH/$(dirname "$path")"
      mv "$path" "$STASH/$path"
    done
    echo "hidden: ${STASHED[*]} (bash benchmarks/gpu/stash.sh restore brings them back)" ;;
  restore)
    for path in "${STASHED[@]}"; do
      if [ -e "$STASH/$path" ]; then
        [ -e "$path" ] && { echo "$path exists in the tree and in $STASH: move one away by hand" >&2; exit 1; }
        mkdir -p "$(dirname "$path")"
        mv "$STASH/$path" "$path"
      fi
    done
    if git diff --quiet -- "${STASHED[@]}"; then
      echo "restored: git sees no change under ${STASHED[*]}"
    else
      echo "restored, but git sees changes under ${STASHED[*]} (git status): were they made before 'hide'?"
    fi ;;
  *) echo "usage: bash benchmarks/gpu/stash.sh hide|restore" >&2; exit 2 ;;
esac
