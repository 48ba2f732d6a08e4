"""`feddg.poc.server_errors`: what a failed rehearsal shows of the server's log."""

from __future__ import annotations

from pathlib import Path

from feddg import poc as poc_module
from feddg.poc import POC, RehearsalError, server_errors

LOG = """2026-11-23 21:00:02,314 - Fed - INFO - round 1
2026-11-23 21:00:03,000 - LeaveOneSiteOutFedAvg - ERROR - round 2: only 0 usable update(s)
Traceback (most recent call last):
2026-11-23 21:00:04,000 - ServerRunner - WARNING - nothing to see
"""


def _poc(tmp_path: Path) -> POC:
    return POC(workspace=tmp_path, prod=tmp_path, server="server", clients=["A"], lead="lead@a")


def test_the_error_lines_of_the_downloaded_server_log(tmp_path, monkeypatch):
    def fake_admin(poc, args, timeout, step, user=None):
        out = Path(args[args.index("-o") + 1]) / "job-1" / "workspace"
        out.mkdir(parents=True)
        (out / "log.txt").write_text(LOG)
        return ""

    monkeypatch.setattr(poc_module, "admin", fake_admin)
    text = server_errors(_poc(tmp_path), "job-1", tmp_path / "dl")
    assert text.splitlines() == [LOG.splitlines()[1], LOG.splitlines()[2]]


def test_a_failed_download_is_said_not_raised(tmp_path, monkeypatch):
    def failing_admin(poc, args, timeout, step, user=None):
        raise RehearsalError("job download failed (exit 1)")

    monkeypatch.setattr(poc_module, "admin", failing_admin)
    assert "could not be downloaded: job download failed" in server_errors(_poc(tmp_path), "job-1", tmp_path / "dl")


def test_the_cpu_pin_reaches_every_participant_the_poc_starts(tmp_path, monkeypatch):
    """FEDDG_CPU_PIN=avx2 in the caller's environment: the server and every hospital start with the variables that
    pin the kernels (their job processes inherit them), the hospitals also with their share of the cores."""
    started: dict[str, dict[str, str]] = {}

    class Running:
        returncode = None

        def poll(self):
            return None

    def fake_start(kit, log, env=None, prefix=None):
        started[Path(kit).name] = dict(env or {})
        return Running()

    monkeypatch.setenv("FEDDG_CPU_PIN", "avx2")
    monkeypatch.setattr(poc_module, "start_participant", fake_start)
    monkeypatch.setattr(poc_module, "_wait_for_port", lambda *a, **k: None)
    monkeypatch.setattr(poc_module.time, "sleep", lambda s: None)
    poc = POC(workspace=tmp_path, prod=tmp_path, server="server", clients=["A", "B"], lead="lead@a")
    monkeypatch.setattr(poc_module.socket.socket, "connect_ex", lambda self, addr: 1)  # the port is free
    poc_module.start(poc)
    assert sorted(started) == ["A", "B", "server"]
    for name, env in started.items():
        assert env["ONEDNN_MAX_CPU_ISA"] == "AVX2" and env["ATEN_CPU_CAPABILITY"] == "avx2", name
    assert started["A"]["FEDDG_SITE_PROCESSES"] == "2" and "FEDDG_SITE_PROCESSES" not in started["server"]
