"""benchmarks/ga_gaps.py: its diagnostics on hand-worked histories, and a run on the committed fundus result set."""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import numpy as np
import pytest

from benchmarks.ga_gaps import (by_training_site, departure, diagnose, lag1_correlation, main, sign_persistence,
                                smallest_mean_gap, summarise, weights_and_gaps)
from tests.conftest import REPOSITORY

FUNDUS = REPOSITORY / "benchmarks" / "results" / "loso_fundus_seeds"
GA_STEP = REPOSITORY / "benchmarks" / "results" / "ga_step_fundus"  # GA with ga.step_size=0.013, no uniform runs


def test_sign_persistence_counts_centred_gaps_that_keep_their_sign():
    steady = np.array([[1.0, 0.0, 0.0]] * 3)
    assert sign_persistence(steady) == 1.0
    # centred: [+2/3, -1/3, -1/3] then [-1/3, -1/3, +2/3]: only the second site keeps its sign
    assert sign_persistence(np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])) == pytest.approx(1 / 3)
    # round 0 has no gaps (NaN): left out; one complete round is not enough
    assert sign_persistence(np.array([[np.nan] * 3, [1.0, 0.0, 0.0]])) is None


def test_departure_and_lag1_correlation():
    weights = np.array([[1 / 3, 1 / 3, 1 / 3], [0.5, 0.25, 0.25]])
    assert departure(weights) == pytest.approx([0.0, 1 / 6])
    rising = np.array([[0.0, 1.0], [1.0, 3.0], [2.0, 5.0], [3.0, 7.0]])
    assert lag1_correlation(rising) == pytest.approx(1.0)
    assert lag1_correlation(rising[:2]) is None


def test_smallest_mean_gap_is_over_the_rounds_each_site_sent_one():
    gaps = np.array([[np.nan, np.nan, np.nan], [0.1, 0.3, np.nan], [0.5, 0.0, np.nan]])
    # A: (0.1 + 0.5) / 2 = 0.3, B: (0.3 + 0.0) / 2 = 0.15, C never sent one: left out
    assert smallest_mean_gap(["A", "B", "C"], gaps) == "B"
    assert smallest_mean_gap(["A", "B"], np.full((2, 2), np.nan)) is None


def test_weights_and_gaps_read_the_aggregators_history():
    record = {"report": {"history": [
        {"aggregation": {"ga_weights": {"B": 0.5, "A": 0.5}, "ga_gaps": {}, "ga_step": 0.05}},
        {"aggregation": {"ga_weights": {"A": 0.6, "B": 0.4}, "ga_gaps": {"A": 0.2, "B": 0.1}, "ga_step": 0.04}},
        {"aggregation": None}]}}
    sites, weights, gaps = weights_and_gaps(record)
    assert sites == ["A", "B"] and weights.tolist() == [[0.5, 0.5], [0.6, 0.4]]
    assert math.isnan(gaps[0, 0]) and gaps[1].tolist() == [0.2, 0.1]
    assert weights_and_gaps({"report": {"history": [{"aggregation": {"nr_aggregated": 3}}]}})[0] == []


def test_on_the_committed_fundus_set(tmp_path):
    from feddg.benchmark.scores import load_records, seed_dice

    records = load_records(FUNDUS)
    rows = diagnose(records, "ga", "uniform")
    ga_runs = [r for r in records if r["run"]["method"] == "ga" and r["status"] == "ok"]
    assert len(rows) == len(ga_runs) >= 5
    dice = seed_dice(records)
    first = rows[0]
    expected = (dice[("ga", first["held_out"])][first["seed"]] - dice[("uniform", first["held_out"])][first["seed"]])
    assert first["dice_minus_control"] == pytest.approx(expected)
    assert sum(first["final_weights"].values()) == pytest.approx(1.0, abs=1e-3)
    assert main([str(FUNDUS), "--out", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "ga_gaps.json").read_text())
    assert len(saved["runs"]) == len(rows) and (tmp_path / "ga_gaps.md").read_text().startswith("# What ga's")
    assert main([str(tmp_path), "--out", str(tmp_path / "x")]) == 2  # not a results folder


def test_the_sites_whose_weight_ended_at_0_02_or_less_are_counted_as_the_table_prints_them():
    """Final weights as the per-run table shows them (two decimals): 0.024 prints 0.02 and counts, 0.026 prints 0.03
    and does not; per held-out site, each site counted once per seed."""
    rows = [{"held_out": "HK", "seed": 0, "final_weights": {"A": 0.024, "B": 0.5, "C": 0.476},
             "mean_departure": 0.1, "sign_persistence": 0.5, "lag1_correlation": 0.0, "smallest_mean_gap": "A"},
            {"held_out": "HK", "seed": 1, "final_weights": {"A": 0.0, "B": 0.974, "C": 0.026},
             "mean_departure": 0.2, "sign_persistence": 0.6, "lag1_correlation": 0.1, "smallest_mean_gap": "A"}]
    (hk,) = summarise(rows, [], "ga", "uniform")
    assert hk["dropped"] == {"A": 2} and hk["heaviest"] == {"B": 2} and hk["smallest_gap"] == {"A": 2}
    assert hk["difference"] is None and hk["mean_departure"] == pytest.approx(0.15)


def test_per_training_site_counts_every_run_a_site_trained_in_whatever_its_held_out_site():
    """Three runs, two held-out sites: A trains in all three (ends at 0.02 or less in two, as printed: 0.004 and
    0.024; the smallest mean gap in two; the heaviest in the third), C in all three (the heaviest in two), B in two
    (the smallest mean gap in one), D in one."""
    rows = [{"held_out": "D", "seed": 0, "final_weights": {"A": 0.004, "B": 0.3, "C": 0.696}, "smallest_mean_gap": "A"},
            {"held_out": "D", "seed": 1, "final_weights": {"A": 0.024, "B": 0.2, "C": 0.776}, "smallest_mean_gap": "B"},
            {"held_out": "B", "seed": 0, "final_weights": {"A": 0.6, "C": 0.1, "D": 0.3}, "smallest_mean_gap": "A"}]
    a, b, c, d = by_training_site(rows)
    assert (a["site"], a["runs"], a["dropped"], a["smallest_gap"], a["heaviest"]) == ("A", 3, 2, 2, 1)
    assert a["mean_final_weight"] == pytest.approx((0.004 + 0.024 + 0.6) / 3)
    assert (b["site"], b["runs"], b["dropped"], b["smallest_gap"], b["heaviest"]) == ("B", 2, 0, 1, 0)
    assert (c["site"], c["runs"], c["dropped"], c["smallest_gap"], c["heaviest"]) == ("C", 3, 0, 0, 2)
    assert (d["site"], d["runs"], d["mean_final_weight"], d["heaviest"]) == ("D", 1, 0.3, 0)
    assert by_training_site([]) == []


@pytest.mark.parametrize("report", sorted((REPOSITORY / "benchmarks" / "results").rglob("ga_gaps.md")),
                         ids=lambda p: str(p.parent.relative_to(REPOSITORY / "benchmarks" / "results")))
def test_each_committed_ga_gaps_report_is_what_the_script_writes_from_its_folder(tmp_path, report):
    """The page quotes these files (``<!-- ga_gaps: FOLDER -->``): a GA run added to a folder without running the
    script again fails here. The file's own command is run again, into a temporary folder."""
    command = shlex.split(report.read_text().split("`python benchmarks/ga_gaps.py ", 1)[1].split("`", 1)[0])
    args = [str(REPOSITORY / a) if a.startswith("benchmarks/") else a for a in command]
    assert main(args + ["--out", str(tmp_path)]) == 0
    fresh, committed = (tmp_path / "ga_gaps.md").read_text(), report.read_text()
    without_command = [t.split("\n", 3)[3] for t in (fresh, committed)]  # line 3 names the command and its --out
    assert without_command[0] == without_command[1], f"{report}: run its command again (line 3 of the file)"


def test_controls_from_another_folder_are_paired_by_seed(tmp_path):
    from feddg.benchmark.scores import load_records, seed_dice

    assert main([str(GA_STEP), "--out", str(tmp_path / "alone")]) == 0
    alone = json.loads((tmp_path / "alone" / "ga_gaps.json").read_text())
    assert all(r["dice_minus_control"] is None for r in alone["runs"])  # no uniform run in that folder

    assert main([str(GA_STEP), "--controls", str(FUNDUS), "--out", str(tmp_path / "paired")]) == 0
    paired = json.loads((tmp_path / "paired" / "ga_gaps.json").read_text())
    ga, uniform = seed_dice(load_records(GA_STEP)), seed_dice(load_records(FUNDUS))
    for row in paired["runs"]:
        site, seed = row["held_out"], row["seed"]
        assert row["dice_minus_control"] == pytest.approx(ga[("ga", site)][seed] - uniform[("uniform", site)][seed])
    (site,) = paired["summary"]
    difference = site["difference"]
    assert difference["n_seeds"] == 5 and difference["low"] <= difference["mean"] <= difference["high"]
    assert difference["mean"] == pytest.approx(np.mean([r["dice_minus_control"] for r in paired["runs"]]))


def _controls(tmp_path: Path, keep_evidence: bool = True, **change) -> Path:
    """A copy of the fundus set's sweep.json and its uniform runs at Domain4, each with ``change`` (dotted key ->
    value) made to its config."""
    out = tmp_path / "controls"
    sweep = json.loads((FUNDUS / "sweep.json").read_text())
    if not keep_evidence:
        sweep.pop("code_evidence", None)
    (out / "runs").mkdir(parents=True)
    (out / "sweep.json").write_text(json.dumps(sweep))
    for path in sorted(FUNDUS.glob("runs/fundus_uniform_Domain4_seed*/run.json")):
        record = json.loads(path.read_text())
        for key, value in change.items():
            *parents, leaf = key.split(".")
            node = record["config"]
            for parent in parents:
                node = node[parent]
            node[leaf] = value
        (out / "runs" / path.parent.name).mkdir()
        (out / "runs" / path.parent.name / "run.json").write_text(json.dumps(record))
    return out


@pytest.mark.parametrize("why, expected", [
    ("another setting", "train.lr"),
    ("code the controls folder does not admit", "does not admit"),
    ("no control run", "no finished uniform run"),
    ("no results folder", "not a benchmark results folder"),
])
def test_controls_that_cannot_be_paired_are_refused_naming_why(tmp_path, capsys, why, expected):
    if why == "another setting":
        controls = _controls(tmp_path, **{"train.lr": 0.01})
    elif why == "code the controls folder does not admit":
        controls = _controls(tmp_path, keep_evidence=False)  # ga_step_fundus's code was admitted by a check there
    elif why == "no control run":
        controls = _controls(tmp_path)
        for path in controls.glob("runs/*/run.json"):
            path.unlink()
    else:
        controls = tmp_path / "nowhere"
    assert main([str(GA_STEP), "--controls", str(controls), "--out", str(tmp_path / "x")]) == 2
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_every_benchmark_script_is_run_or_imported_by_a_test():
    """A benchmark script nobody runs breaks unseen: each ``benchmarks/<name>.py`` is named by some test, as a
    script (``"<name>.py"``) or a module (``benchmarks.<name>``)."""
    tests = "\n".join(p.read_text() for p in sorted((REPOSITORY / "tests").rglob("test_*.py")))
    scripts = sorted(p.stem for p in (REPOSITORY / "benchmarks").glob("*.py") if p.stem != "__init__")
    untested = [s for s in scripts if f"{s}.py" not in tests and f"benchmarks.{s}" not in tests]
    assert scripts and not untested, f"benchmark scripts no test runs: {untested}"
