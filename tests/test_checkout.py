"""The test suite refuses to run against a feddg installed from somewhere else than its own checkout
(tests/conftest.py, ``pytest_configure``): such a run would test other code, and write into this checkout's jobs/
where the package's guard protects the other copy's."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPOSITORY, foreign_package


def test_own_source_is_accepted():
    assert foreign_package(REPOSITORY, REPOSITORY / "custom" / "feddg" / "__init__.py") is None


def test_another_checkout_is_named_with_this_one(tmp_path):
    other = tmp_path / "other-clone" / "custom" / "feddg" / "__init__.py"
    reason = foreign_package(REPOSITORY, other)
    assert str(REPOSITORY) in reason and str(other.parent) in reason
    assert f"pip install -e {REPOSITORY}" in reason


def test_an_installed_copy_is_refused(tmp_path):
    wheel = tmp_path / "lib" / "python3.11" / "site-packages" / "feddg" / "__init__.py"
    assert str(wheel.parent) in foreign_package(REPOSITORY, wheel)


def test_a_suite_whose_checkout_is_not_the_installed_one_stops_before_any_test(tmp_path):
    # Another checkout's tests, as pytest sees them: its conftest with a test beside it, while Python imports
    # feddg from this checkout (installed with `pip install -e`).
    tests = tmp_path / "tests"
    tests.mkdir()
    shutil.copy(Path(__file__).with_name("conftest.py"), tests / "conftest.py")
    marker = tmp_path / "ran"
    (tests / "test_writes.py").write_text(f"def test_writes():\n    open({str(marker)!r}, 'w').close()\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 4, done.stdout + done.stderr  # pytest's usage error
    assert f"these tests are {tmp_path}'s" in done.stdout + done.stderr
    assert not marker.exists()
