"""The benchmark page's tables (docs/benchmark.md) are generated from the committed results.md, never typed."""

from __future__ import annotations

import shlex

import pytest

from feddg.benchmark.readme import CLOSE, OPEN, dice_sections, main, quote, weights_by_site
from tests.conftest import REPOSITORY

PAGE = REPOSITORY / "docs" / "benchmark.md"
RESULTS = """# Leave-one-site-out benchmark: fundus

Protocol (every run): `{}`; 2 of 2 runs finished; scores of the held-out site's test cases.

How to read: seeds are the unit.

Cells whose seeds were made by more than one code version: none here.

Still to run, 1 run, each on a machine of the CPU family that holds its seed: **AMD avx2** (seed 1, 1 run).
### Dice, disc

| method | Domain1 | average |
|---|---|---|
| fedavg | 0.900 | - |

### HD95 (px), disc

| method | Domain1 | average |
|---|---|---|
| fedavg | 3.00 | - |

### Dice difference to fedavg (paired per case, 95% bootstrap interval; * the interval excludes 0)

| method | Domain1 | average | Holm p (average) |
|---|---|---|---|
| elcfs | +0.010 [-0.001, +0.020] | - | - |

### What the evidence supports (generated from the table above)

- **elcfs** vs fedavg: not resolved.
"""


def test_the_dice_sections_and_the_protocol_are_quoted_and_nothing_else():
    quoted = dice_sections(RESULTS)
    assert quoted.startswith("Protocol (every run)") and "How to read: seeds are the unit." in quoted
    assert "- **elcfs** vs fedavg: not resolved." in quoted  # the generated verdicts are quoted with the tables
    assert "### Dice, disc" in quoted and "### Dice difference to fedavg" in quoted and "| elcfs | +0.010" in quoted
    assert "Still to run, 1 run" in quoted  # where a folder made a part at a time stands
    assert "HD95" not in quoted and "# Leave-one-site-out" not in quoted and "Cells whose" not in quoted


def test_a_block_is_rewritten_between_its_markers_and_the_rest_is_kept(tmp_path):
    (tmp_path / "res").mkdir()
    (tmp_path / "res" / "results.md").write_text(RESULTS)
    page = tmp_path / "docs" / "benchmark.md"
    page.parent.mkdir()
    page.write_text("intro\n<!-- results: res -->\n| typed | 0.999 |\n<!-- /results -->\nafter\n")
    root = ["--root", str(tmp_path)]  # the folders are relative to the root, not to the page's folder
    assert main([str(page), "res", *root, "--check"]) == 1  # a typed number is caught
    assert main([str(page), "res", *root]) == 0
    text = page.read_text()
    assert text.startswith("intro\n<!-- results: res -->\nProtocol") and text.endswith("<!-- /results -->\nafter\n")
    assert "0.999" not in text and "| fedavg | 0.900 | - |" in text
    assert main([str(page), "res", *root, "--check"]) == 0
    assert main([str(page), "res", "--root", str(page.parent), "--check"]) == 2  # docs/res/results.md: none


def test_an_out_of_date_page_is_told_the_command_that_regenerates_it(tmp_path, capsys):
    """The command is quoted for a shell (a root with a space in it): pasted, it rewrites the block."""
    root = tmp_path / "a b"
    (root / "res").mkdir(parents=True)
    (root / "res" / "results.md").write_text(RESULTS)
    page = root / "benchmark.md"
    page.write_text("<!-- results: res -->\n| typed | 0.999 |\n<!-- /results -->\n")
    assert main([str(page), "res", "--root", str(root), "--check"]) == 1
    stated = shlex.split(capsys.readouterr().err.split("regenerate with ", 1)[1])
    assert stated[:3] == ["python", "-m", "feddg.benchmark.readme"]
    assert main(stated[3:]) == 0 and main([str(page), "res", "--root", str(root), "--check"]) == 0


def test_a_missing_block_or_results_file_is_named(tmp_path):
    with pytest.raises(ValueError, match="no block '<!-- results: res -->'"):
        quote("no markers here", tmp_path, "res")
    with pytest.raises(ValueError, match="res/results.md: no results.md"):
        quote("<!-- results: res -->\n<!-- /results -->", tmp_path, "res")


def test_the_committed_benchmark_page_quotes_the_committed_result_sets():
    page = PAGE.read_text()
    folders = [line.split("results: ", 1)[1].split(" -->")[0] for line in page.splitlines()
               if line.startswith("<!-- results: ")]
    assert "benchmarks/results/loso_fundus_seeds" in folders
    assert not [f for f in folders if "/archive/" in f], "superseded result sets are not quoted"
    assert main([str(PAGE), *folders, "--root", str(REPOSITORY), "--check"]) == 0


def test_a_verdicts_block_quotes_only_the_generated_sentences(tmp_path):
    (tmp_path / "res").mkdir()
    (tmp_path / "res" / "results.md").write_text(RESULTS)
    readme = tmp_path / "README.md"
    readme.write_text("head\n<!-- verdicts: res -->\n- typed: resolved\n<!-- /results -->\ntail\n")
    assert main([str(readme), "res", "--root", str(tmp_path), "--check"]) == 1
    assert main([str(readme), "res", "--root", str(tmp_path)]) == 0
    assert readme.read_text() == ("head\n<!-- verdicts: res -->\n- **elcfs** vs fedavg: not resolved.\n"
                                  "<!-- /results -->\ntail\n")


def test_the_front_page_headline_is_generated_from_a_committed_seeded_result_set():
    readme = (REPOSITORY / "README.md").read_text()
    folders = [line.split("verdicts: ", 1)[1].split(" -->")[0] for line in readme.splitlines()
               if line.startswith("<!-- verdicts: ")]
    assert folders and not [f for f in folders if "/archive/" in f]
    for folder in folders:
        block = readme.split(f"<!-- verdicts: {folder} -->\n", 1)[1].split("<!-- /results -->", 1)[0]
        assert block.startswith("From ") and "\n- **" in block, "the basis of the verdicts, then the verdicts"
        assert main([str(REPOSITORY / "README.md"), folder, "--root", str(REPOSITORY), "--check"]) == 0


def test_a_block_without_its_closer_never_takes_the_next_block_with_it(tmp_path):
    """The generator used to rewrite from an unclosed block to the next block's closer, deleting the text between
    (and the next block's opener) with exit status 0."""
    (tmp_path / "res").mkdir()
    (tmp_path / "res" / "results.md").write_text(RESULTS)
    page = tmp_path / "README.md"
    text = ("<!-- verdicts: res -->\nold verdicts\n\nA paragraph a person wrote.\n\n"
            "<!-- results: other -->\nother tables\n<!-- /results -->\n")
    page.write_text(text)
    assert main([str(page), "res", "--root", str(tmp_path)]) == 2
    assert page.read_text() == text
    with pytest.raises(ValueError, match=r"line 1: the block '<!-- verdicts: res -->' has no closing"):
        quote(text, tmp_path, "res")


@pytest.mark.parametrize("content", ["", "# Leave-one-site-out benchmark\n\nProtocol (every run): `{}`\n"])
def test_an_empty_or_truncated_results_file_is_refused_and_the_page_kept(tmp_path, capsys, content):
    (tmp_path / "res").mkdir()
    (tmp_path / "res" / "results.md").write_text(content)
    page = tmp_path / "README.md"
    text = "<!-- verdicts: res -->\n- **elcfs** vs fedavg: not resolved.\n<!-- /results -->\n"
    page.write_text(text)
    assert main([str(page), "res", "--root", str(tmp_path)]) == 2
    assert "res/results.md: none of the sections the block" in capsys.readouterr().err
    assert page.read_text() == text


def test_a_page_that_is_missing_or_a_folder_is_named(tmp_path, capsys):
    assert main([str(tmp_path / "README.md"), "res"]) == 2
    assert "README.md: no such page" in capsys.readouterr().err
    assert main([str(tmp_path), "res"]) == 2
    assert "is a folder, not a page" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


GA_GAPS = """# What ga's weights did

`python benchmarks/ga_gaps.py res` (generated from the folder's run.json files).

Departure: max_i |a_i - 1/K|.

## Per held-out site (means over seeds)

| held-out | seeds | Dice - uniform |
|---|---|---|
| HK | 3 | -0.081 |

## Per run

| held-out | seed | final weights |
|---|---|---|
| HK | 0 | A 0.00, B 1.00 |
"""


def test_a_ga_gaps_block_quotes_the_legend_and_the_per_site_table_of_ga_gaps_md(tmp_path):
    (tmp_path / "res").mkdir()
    page = tmp_path / "benchmark.md"
    page.write_text("GA:\n<!-- ga_gaps: res -->\n| HK | 3 | -0.050 |\n<!-- /results -->\nend\n")
    with pytest.raises(ValueError, match=r"res/ga_gaps.md: no ga_gaps.md \(make it with python benchmarks/ga_gaps.py "
                                         r"res\)"):
        quote(page.read_text(), tmp_path, "res")
    (tmp_path / "res" / "ga_gaps.md").write_text(GA_GAPS.split("## Per held-out")[0])  # no per-site table
    with pytest.raises(ValueError, match="none of the sections the block '<!-- ga_gaps: res -->' quotes"):
        quote(page.read_text(), tmp_path, "res")
    (tmp_path / "res" / "ga_gaps.md").write_text(GA_GAPS)
    assert main([str(page), "res", "--root", str(tmp_path), "--check"]) == 1  # the typed -0.050 is caught
    assert main([str(page), "res", "--root", str(tmp_path)]) == 0
    assert page.read_text() == ("GA:\n<!-- ga_gaps: res -->\nDeparture: max_i |a_i - 1/K|.\n\n"
                                "| held-out | seeds | Dice - uniform |\n|---|---|---|\n| HK | 3 | -0.081 |\n"
                                "<!-- /results -->\nend\n")  # no title, no per-run table
    # The legend is the paragraph above the table, whatever its words; a file without one quotes the table alone.
    assert weights_by_site(GA_GAPS.replace("Departure: max_i |a_i - 1/K|.", "Columns: x.")).startswith(
        "Columns: x.\n\n| held-out")
    assert weights_by_site(GA_GAPS.replace("Departure: max_i |a_i - 1/K|.\n\n", "")).startswith("| held-out")
    # A file with the table over the training sites quotes it after the per-site table, with its paragraph.
    over_sites = GA_GAPS.replace("## Per run", "## Per training site (every run it trained in)\n\nOver the sites.\n\n"
                                               "| training site | runs |\n|---|---|\n| A | 3 |\n\n## Per run")
    assert weights_by_site(over_sites).endswith("| HK | 3 | -0.081 |\n\nOver the sites.\n\n"
                                                "| training site | runs |\n|---|---|\n| A | 3 |")


def test_the_committed_benchmark_page_quotes_what_gas_weights_did_on_prostate():
    # The page's --check (test_the_committed_benchmark_page_quotes_the_committed_result_sets) holds the block to
    # the file; this holds it to what GA's section needs: the legend and the per-site table, not an empty quote.
    page = PAGE.read_text()
    start = OPEN.format(kind="ga_gaps", folder="benchmarks/results/loso_prostate_seeds")
    assert start in page
    block = page.split(start, 1)[1].split(CLOSE, 1)[0]
    assert block.lstrip().startswith("Departure: max_i |a_i - 1/K|")
    assert "| held-out | seeds | mean departure |" in block and "| BIDMC |" in block
