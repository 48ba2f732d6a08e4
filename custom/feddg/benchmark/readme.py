"""Quote a result set's Dice tables in the benchmark page (``docs/benchmark.md``), generated from its
``results.md``, never typed.

    python -m feddg.benchmark.readme docs/benchmark.md benchmarks/results/loso_fundus_seeds [more result folders ...]

(run in the clone's root: the folders are relative to ``--root``, by default the current directory). The page holds,
for each quoted folder, a block between two markers::

    <!-- results: benchmarks/results/loso_fundus_seeds -->
    ...
    <!-- /results -->

and this rewrites the block with the folder's Dice sections (the Dice tables, each seed's values, the differences to
the baselines with their intervals and the generated sentences on what the evidence supports; HD95 and ASD stay in
``results.md``), under the protocol line, the note on how to read them and the runs still to run. A block opened by
``<!-- verdicts: FOLDER -->`` instead holds only the generated sentences (what they rest on and cost, then one
verdict per method and baseline): the front page's headline
(``python -m feddg.benchmark.readme README.md benchmarks/results/loso_fundus_seeds``). A block opened by
``<!-- ga_gaps: FOLDER -->`` holds what GA's weights did at each held-out site, from the folder's ``ga_gaps.md``
(written by ``python benchmarks/ga_gaps.py FOLDER``; its per-run table stays in the file). ``--check`` rewrites
nothing and exits 1 when a block differs from what its folder gives (the test suite runs it on the committed page
and README).
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

OPEN = "<!-- {kind}: {folder} -->"  # kind: a key of BLOCKS
CLOSE = "<!-- /results -->"
QUOTED = ("Dice", "Seed values", "What the evidence")  # the sections of results.md the page quotes, by the start
# of their title
VERDICTS = "What the evidence"  # the section of generated sentences, quoted alone in a verdicts block
BY_SITE = "## Per held-out site"  # the per-site table of benchmarks/ga_gaps.py's ga_gaps.md
BY_TRAINING_SITE = "## Per training site"  # and its table over the held-out sites together (where the file has one)


def dice_sections(results_md: str) -> str:
    """The sections of a ``results.md`` whose ``###`` title starts with one of ``QUOTED``, in their order, with
    the protocol line, the how-to-read line and the still-to-run line (a folder not yet complete) of its header."""
    header, *sections = re.split(r"^(?=### )", results_md, flags=re.MULTILINE)
    kept_header = [line for line in header.splitlines() if line.startswith(("Protocol", "How to read", "Still to run"))]
    kept = [s.rstrip() for s in sections if s[4:].startswith(QUOTED)]
    return "\n\n".join([*kept_header, *kept]).strip()


def verdicts(results_md: str) -> str:
    """The generated sentences of a ``results.md`` (the body of each section titled "What the evidence ...": what
    the verdicts rest on and cost, then the verdicts), without their titles: the headline the front page quotes."""
    _, *sections = re.split(r"^(?=### )", results_md, flags=re.MULTILINE)
    return "\n\n".join(s.split("\n", 1)[1].strip() for s in sections if s[4:].startswith(VERDICTS)).strip()


def weights_by_site(ga_gaps_md: str) -> str:
    """What GA's weights did, per held-out site, from a folder's ``ga_gaps.md`` (``python benchmarks/ga_gaps.py
    FOLDER``): the legend of its columns and the table of :data:`BY_SITE`, then, where the file has it, the section
    :data:`BY_TRAINING_SITE` (its paragraph and table), without their titles (the page's own section gives one) and
    without the per-run table."""
    if BY_SITE not in ga_gaps_md:
        return ""
    above, below = ga_gaps_md.split(BY_SITE, 1)
    legend = above.strip().rsplit("\n\n", 1)[-1]  # the paragraph right above the table's title
    if legend.startswith(("#", "`")):  # the file's title or its command line: a file written without a legend
        legend = ""
    table = below.split("\n## ", 1)[0].split("\n", 1)[1].strip()
    over_sites = ""
    if BY_TRAINING_SITE in ga_gaps_md:  # files written before it have none
        over_sites = ga_gaps_md.split(BY_TRAINING_SITE, 1)[1].split("\n## ", 1)[0].split("\n", 1)[1].strip()
    return "\n\n".join(part for part in (legend.strip(), table, over_sites) if part)


@dataclass(frozen=True)
class Block:
    """What a block of one kind quotes: ``extract`` of the folder's generated file ``source``, which ``made_by``
    writes; ``expects`` names what ``extract`` looks for, for the error when a file has none of it."""

    source: str
    extract: Callable[[str], str]
    made_by: str
    expects: str


BLOCKS = {  # block kind -> what it quotes
    "results": Block("results.md", dice_sections, "feddg benchmark --out {folder}",
                     f"### {' / '.join(QUOTED)} ..."),
    "verdicts": Block("results.md", verdicts, "feddg benchmark --out {folder}", f"### {VERDICTS} ..."),
    "ga_gaps": Block("ga_gaps.md", weights_by_site, "python benchmarks/ga_gaps.py {folder}", BY_SITE),
}
OPENER = re.compile(r"<!-- (?:" + "|".join(BLOCKS) + r"): ")  # the start of any block


def quote(readme: str, root: Path, folder: str) -> str:
    """The page text ``readme`` with every block of ``folder`` (a path relative to ``root``; blocks of any kinds of
    :data:`BLOCKS`) rewritten from the folder's generated files."""
    blocks = []
    for kind, block in BLOCKS.items():
        start = OPEN.format(kind=kind, folder=folder)
        at = readme.find(start)
        while at >= 0:
            stop = readme.find(CLOSE, at)
            # A block's closer comes before the next block opens: else the rewrite would take the next block's
            # text (and its closer) with it.
            following = OPENER.search(readme, at + len(start))
            if stop < 0 or (following is not None and following.start() < stop):
                line = readme.count("\n", 0, at) + 1
                raise ValueError(f"line {line}: the block {start!r} has no closing {CLOSE!r} before the next block "
                                 f"or the end of the page; nothing was rewritten")
            blocks.append((at, stop, start, block))
            at = readme.find(start, stop)
    if not blocks:
        starts = " or ".join(repr(OPEN.format(kind=kind, folder=folder)) for kind in BLOCKS)
        raise ValueError(f"the page has no block {starts} ... {CLOSE!r} to write {folder}'s tables into")
    texts: dict[str, str] = {}
    for *_, block in blocks:  # every file read, and checked, before anything is rewritten
        if block.source not in texts:
            path = root / folder / block.source
            if not path.is_file():
                raise ValueError(f"{path}: no {block.source} (make it with {block.made_by.format(folder=folder)})")
            texts[block.source] = path.read_text()
    for at, stop, start, block in sorted(blocks, key=lambda found: -found[0]):  # from the end: offsets hold
        quoted = block.extract(texts[block.source])
        if not quoted:  # an empty or truncated file: never an empty block that reads as "no results"
            raise ValueError(f"{root / folder / block.source}: none of the sections the block {start!r} quotes "
                             f"({block.expects}); regenerate it with {block.made_by.format(folder=folder)}; "
                             f"nothing was rewritten")
        readme = readme[:at] + f"{start}\n{quoted}\n" + readme[stop:]
    return readme


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m feddg.benchmark.readme", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("readme", type=Path, help="the page that quotes the tables (docs/benchmark.md)")
    parser.add_argument("folders", nargs="+", help="result folders, relative to --root")
    parser.add_argument("--root", type=Path, default=Path("."),
                        help="the folder the result folders are relative to (default: the current directory)")
    parser.add_argument("--check", action="store_true", help="rewrite nothing; exit 1 if a block is out of date")
    args = parser.parse_args(argv)
    try:
        if not args.readme.is_file():
            raise ValueError("is a folder, not a page" if args.readme.is_dir() else "no such page")
        text = args.readme.read_text()
        new = text
        for folder in args.folders:
            new = quote(new, args.root, folder)
    except ValueError as e:
        print(f"{args.readme}: {e}", file=sys.stderr)
        return 2
    if args.check:
        if new != text:
            print(f"{args.readme}: the quoted tables differ from {', '.join(args.folders)}'s; regenerate with "
                  + shlex.join(["python", "-m", "feddg.benchmark.readme", str(args.readme), *map(str, args.folders),
                               "--root", str(args.root)]),
                  file=sys.stderr)
            return 1
        return 0
    args.readme.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
