"""``hf-specdraft bench`` with the lab's rows registered (fixed γ, tree sizes and K matrices beside the library's
"auto" rows, and the settings tuned on the machines that measured them: :mod:`benchmarks.methods`). From the
repository root, with ``hf-specdraft bench``'s arguments::

    python -m benchmarks.bench --task completion --methods target-only,glide,glide-γ3,glide-auto,max-gram
"""

from __future__ import annotations

import sys

from hf_specdraft.cli import main as cli_main

from . import methods  # noqa: F401  (registers the lab's fixed-setting rows)


def main(argv: list[str] | None = None) -> int:
    return cli_main(["bench", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
