#!/usr/bin/env bash
# Here, around a GPU session's calls: what those calls never read, moved out of the working tree that travels, and back.
#
#   bash benchmarks/gpu/stash.sh hide       # before the first call (then bash benchmarks/gpu/prepare.sh sizes the calls)
#   bash benchmarks/gpu/stash.sh restore    # after the last one, before any commit
#
# A call sends the checkout's files, tracked ones and untracked ones git does not ignore, at most 64 MiB with what it
# carries. The tree is 64 MiB now (the shipped drafters alone take 53), so no call could carry the wheels or a part of the
# GGUF. The GPU steps (benchmarks/gpu/run.sh) read none of what STASHED names: the exportable GLIDE (the export and its
# vLLM test run here), and the bench's stored results and plots (a call writes its own to $OUT). `hide` moves them into
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
