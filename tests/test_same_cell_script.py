"""benchmarks/same_cell.py: one cell's runs compared on a committed run record and altered copies of it."""

from __future__ import annotations

import copy
import json
import shlex

import pytest

from benchmarks.same_cell import compare, main
from tests.conftest import REPOSITORY

RECORD = REPOSITORY / "benchmarks/results/loso_prostate_seeds/runs/prostate_fedavg_BIDMC_seed0/run.json"


@pytest.fixture(scope="module")
def record() -> dict:
    return json.loads(RECORD.read_text())


def _test_split(record: dict) -> dict:
    """The held-out site's test summary of the final model: per structure the mean, and ``cases`` (case -> scores)."""
    return record["report"]["models"]["final"]["sites"]["BIDMC"]["splits"]["test"]


def test_a_run_against_itself_differs_in_nothing(record):
    rows = compare([record, record], ["a", "b"])
    assert [r["differing_case_scores"] for r in rows] == [0, 0]
    assert rows[0]["case_scores"] > len(_test_split(record)["cases"])  # every model, site, split, case and metric
    assert rows[1]["dice_minus_reference"] == 0.0 and rows[1]["dice"] == rows[0]["dice"]


def test_a_changed_case_score_is_counted_and_moves_the_dice(record):
    other = copy.deepcopy(record)
    summary = _test_split(other)
    n = len(summary["cases"])
    next(iter(summary["cases"].values()))["prostate"]["dice"] += 0.5
    summary["prostate"]["dice"]["mean"] += 0.5 / n  # the report's mean follows its cases, as the evaluator writes it
    rows = compare([record, other], ["reference", "changed"])
    assert rows[1]["differing_case_scores"] == 1
    assert rows[1]["dice_minus_reference"] == pytest.approx(0.5 / n)


def test_another_cell_or_an_unfinished_run_is_refused(record, tmp_path):
    seed1 = copy.deepcopy(record)
    seed1["run"]["seed"] = 1
    with pytest.raises(ValueError, match="run.seed"):
        compare([record, seed1], ["reference", "seed 1"])
    failed = {**record, "status": "failed"}
    with pytest.raises(ValueError, match="did not finish"):
        compare([record, failed], ["reference", "failed"])
    with pytest.raises(ValueError, match="one --label per run"):
        compare([record, record], ["only one"])


def test_main_writes_the_table_and_its_json(tmp_path):
    assert main([str(RECORD), str(RECORD), "--label", "x", "--label", "y", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "same_cell.json").read_text())["rows"]
    assert [r["label"] for r in rows] == ["x", "y"]
    assert "| y | " in (tmp_path / "same_cell.md").read_text()
    assert main([str(RECORD), "--label", "x", "--label", "y", "--out", str(tmp_path)]) == 2


def test_the_command_the_table_states_runs_the_same_thing_when_pasted(tmp_path):
    """An argument with a space or a quote (a run folder, a label) is quoted, so the stated command splits back
    into the arguments given (``feddg.report.script_command``, which every script's output uses)."""
    args = [str(RECORD), str(RECORD), "--label", "the set's", "--label", "here now", "--out", str(tmp_path / "a b")]
    assert main(args) == 0
    stated = (tmp_path / "a b" / "same_cell.md").read_text().split("Made by `", 1)[1].split("`.", 1)[0]
    assert shlex.split(stated) == ["python", "benchmarks/same_cell.py", *args]


def test_main_names_a_record_that_lacks_a_field(record, tmp_path, capsys):
    torn = tmp_path / "run.json"
    torn.write_text(json.dumps({k: v for k, v in record.items() if k != "wall_s"}))
    assert main([str(RECORD), str(torn), "--label", "x", "--label", "y", "--out", str(tmp_path / "out")]) == 2
    assert f"{torn}: no 'wall_s'" in capsys.readouterr().err and not (tmp_path / "out" / "same_cell.json").exists()


def _short(record: dict, rounds: int) -> dict:
    """``record`` as a run of its cell's first ``rounds`` rounds (``--set train.rounds=N``)."""
    short = copy.deepcopy(record)
    short["config"]["train"]["rounds"] = rounds
    short["report"]["history"] = short["report"]["history"][:rounds]
    return short


def test_short_runs_of_a_cell_compare_their_first_rounds_losses(record, tmp_path):
    """--rounds: a run of the cell's first N rounds against the set's run tells in which round the losses part."""
    same, moved = _short(record, 3), _short(record, 3)
    site = sorted(moved["report"]["history"][1]["train_loss"])[0]
    moved["report"]["history"][1]["train_loss"][site] += 1e-6
    rows = compare([record, same, moved], ["set", "same", "moved"], rounds=3)
    assert [r["first_loss_difference"] for r in rows[:2]] == [None, None]
    assert rows[2]["first_loss_difference"].startswith(f"round 1: {site} ")
    assert "dice" not in rows[2] and rows[2]["rounds_compared"] == 3
    with pytest.raises(ValueError, match="not the reference's cell"):
        compare([record, same], ["set", "same"])  # train.rounds differs: a short run needs --rounds
    other = _short(record, 3)
    other["config"]["train"]["lr"] = 0.5
    with pytest.raises(ValueError, match="train.lr"):
        compare([record, other], ["set", "other lr"], rounds=3)
    with pytest.raises(ValueError, match="3 round\\(s\\) recorded, 5 to compare"):
        compare([record, same], ["set", "same"], rounds=5)
    paths = []
    for name, r in (("same", same), ("moved", moved)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(r))
    assert main([str(RECORD), *map(str, paths), "--label", "x", "--label", "y", "--label", "z", "--rounds", "3",
                 "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "same_cell.md").read_text()
    assert "| y | " in text and f"| z | {moved['code'][:12]} | round 1: {site} " in text


def test_a_full_run_names_the_first_round_whose_losses_differ(record):
    other = copy.deepcopy(record)
    site = sorted(other["report"]["history"][0]["train_loss"])[0]
    other["report"]["history"][0]["train_loss"][site] *= 1.0000001
    assert compare([record, other], ["a", "b"])[1]["first_loss_difference"].startswith(f"round 0: {site} ")
    assert compare([record, record], ["a", "b"])[1]["first_loss_difference"] is None
