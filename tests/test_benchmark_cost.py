"""The full design's cost at the papers' size (feddg.benchmark.cost), from a round-time measurement."""

import json

import pytest

from feddg.benchmark.cost import PAPER_ROUND_TIME, cost_line, design_hours, design_runs, paper_size_cost


def _round_time(tmp_path, **changes):
    """A round_time.json as benchmarks/round_time.py --paper writes it (the fields the cost reads)."""
    measured = {"command": "python benchmarks/round_time.py --job prostate_ga --paper --rounds 4 -- -gpu 0",
                "machine": {"cpu": "AMD EPYC", "cores": 16, "gpu": "NVIDIA H100 80GB HBM3"}, "job": "prostate_ga",
                "rounds": 4, "paper": True, "federated_summary": {"round_s": 9.0}} | changes
    path = tmp_path / PAPER_ROUND_TIME
    path.write_text(json.dumps(measured))
    return path


def test_the_design_is_every_method_x_held_out_site_x_five_seeds():
    assert design_runs("prostate") == 8 * 6 * 5 == 240
    assert design_runs("fundus") == 8 * 4 * 5 == 160


def test_device_hours_are_runs_x_rounds_x_round_seconds():
    assert design_hours(240, 100, 9.0) == pytest.approx(60.0)  # 240 x 100 x 9 s = 216000 s
    assert design_hours(160, 100, 4.5) == pytest.approx(20.0)


def test_without_a_measurement_the_cost_is_not_measured_and_says_how_to_measure(tmp_path):
    cost = paper_size_cost("fundus", tmp_path / PAPER_ROUND_TIME)
    assert cost["hours"] is None and cost["design_runs"] == 160 and cost["rounds"] == 100
    line = cost_line(cost)
    assert "cost not measured" in line and "--job fundus_ga --paper" in line and PAPER_ROUND_TIME in line


def test_a_gpu_measurement_gives_gpu_hours_and_names_the_gpu_and_the_command(tmp_path):
    cost = paper_size_cost("prostate", _round_time(tmp_path))
    assert cost["hours"] == pytest.approx(60.0) and cost["gpu"] is True and cost["device"] == "NVIDIA H100 80GB HBM3"
    line = cost_line(cost)
    assert "240 runs" in line and "60 GPU-hours on NVIDIA H100 80GB HBM3" in line and "9.00 s a round" in line
    assert "--job prostate_ga --paper" in line


def test_a_cpu_measurement_is_counted_in_cpu_hours(tmp_path):
    cost = paper_size_cost("prostate", _round_time(tmp_path, machine={"cpu": "Intel Xeon", "cores": 2},
                                                   federated_summary={"round_s": 90.0}))
    assert cost["gpu"] is False and "600 CPU-hours on Intel Xeon (CPU)" in cost_line(cost)


@pytest.mark.parametrize("changes, message", [
    ({"paper": False}, "'paper' is False"),
    ({"job": "fundus_ga"}, "'job' is 'fundus_ga', not a prostate job"),
    ({"federated_summary": {}}, "'federated_summary.round_s' is None"),
    # a copied file with a negative, non-numeric or wrongly typed field gave negative or nan GPU-hours (and a bare
    # NaN in results.json) or a traceback
    ({"federated_summary": {"round_s": -9.0}}, "'federated_summary.round_s' is -9.0; a round time is a positive"),
    ({"federated_summary": {"round_s": 0}}, "'federated_summary.round_s' is 0;"),
    ({"federated_summary": {"round_s": "9 s"}}, "'federated_summary.round_s' is '9 s'"),
    ({"federated_summary": {"round_s": True}}, "'federated_summary.round_s' is True"),
    ({"federated_summary": {"round_s": float("nan")}}, "'federated_summary.round_s' is nan"),
    ({"federated_summary": {"round_s": float("inf")}}, "'federated_summary.round_s' is inf"),
    ({"federated_summary": [9.0]}, "'federated_summary.round_s' is None"),
    ({"machine": "H100"}, "'machine' is 'H100', not an object"),
    ({"machine": {"gpu": 7}}, "'machine.gpu' is 7, not a device's name"),
    ({"command": ["round_time.py"]}, "'command' is \\['round_time.py'\\]"),
    ({"job": None}, "'job' is None, not a prostate job"),
])
def test_a_file_that_is_not_a_paper_size_measurement_of_the_task_is_refused_by_name(tmp_path, changes, message):
    path = _round_time(tmp_path, **changes)
    with pytest.raises(ValueError, match=message) as e:
        paper_size_cost("prostate", path)
    assert str(path) in str(e.value)


@pytest.mark.parametrize("text, message", [("", "cannot read it as JSON"), ("[9.0]", "expected a JSON object"),
                                           ("{'paper': true}", "cannot read it as JSON")])
def test_a_file_that_is_not_json_is_refused_by_name(tmp_path, text, message):
    path = tmp_path / PAPER_ROUND_TIME
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as e:
        paper_size_cost("prostate", path)
    assert str(path) in str(e.value)
