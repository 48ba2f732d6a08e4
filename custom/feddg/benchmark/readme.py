"""Quote a result set's Dice tables in the README, generated from its ``results.md``, never typed.

    python -m feddg.benchmark.readme README.md benchmarks/results/loso_prostate [more result folders ...]

The README holds, for each quoted folder, a block between two markers::

    <!-- results: benchmarks/results/loso_prostate -->
    ...
    <!-- /results -->

and this rewrites the block with the folder's Dice sections (the Dice tables, each seed's values, the differences to
the baselines with their intervals and the generated sentences on what the evidence supports; HD95 and ASD stay in
``results.md``), under the protocol line and the note on how to read them. ``--check`` rewrites nothing and exits 1
when a block differs from what its folder gives (the test suite runs it on the committed README).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

OPEN = "<!-- results: {folder} -->"
CLOSE = "<!-- /results -->"
QUOTED = ("Dice", "Seed values", "What the evidence")  # the sections of results.md the README quotes, by the start
# of their title


def dice_sections(results_md: str) -> str:
    """The sections of a ``results.md`` whose ``###`` title starts with one of ``QUOTED``, in their order, with
    the protocol line and the how-to-read line of its header."""
    header, *sections = re.split(r"^(?=### )", results_md, flags=re.MULTILINE)
    kept_header = [line for line in header.splitlines() if line.startswith(("Protocol", "How to read"))]
    kept = [s.rstrip() for s in sections if s[4:].startswith(QUOTED)]
    return "\n\n".join([*kept_header, *kept]).strip()


def quote(readme: str, root: Path, folder: str) -> str:
    """``readme`` with the block of ``folder`` (a path relative to ``root``) rewritten from its results.md."""
    start, end = OPEN.format(folder=folder), CLOSE
    at = readme.find(start)
    if at < 0:
        raise ValueError(f"the README has no block {start!r} ... {end!r} to write {folder}'s tables into")
    stop = readme.find(end, at)
    if stop < 0:
        raise ValueError(f"the README's block {start!r} has no closing {end!r}")
    results = root / folder / "results.md"
    if not results.is_file():
        raise ValueError(f"{results}: no results.md (run the benchmark into {folder} first)")
    body = dice_sections(results.read_text())
    return readme[:at] + f"{start}\n{body}\n" + readme[stop:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m feddg.benchmark.readme", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("readme", type=Path)
    parser.add_argument("folders", nargs="+", help="result folders, relative to the README's folder")
    parser.add_argument("--check", action="store_true", help="rewrite nothing; exit 1 if a block is out of date")
    args = parser.parse_args(argv)
    text = args.readme.read_text()
    new = text
    try:
        for folder in args.folders:
            new = quote(new, args.readme.parent, folder)
    except ValueError as e:
        print(f"{args.readme}: {e}", file=sys.stderr)
        return 2
    if args.check:
        if new != text:
            print(f"{args.readme}: the quoted tables differ from {args.folders}; regenerate with "
                  f"python -m feddg.benchmark.readme {args.readme} {' '.join(args.folders)}", file=sys.stderr)
            return 1
        return 0
    args.readme.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
