"""Install the toy method as a plug-in for a test: a ``*.dist-info`` folder whose ``entry_points.txt`` names it in
the group ``feddg.methods``, the way ``pip install`` of a package declaring the entry point would leave it."""

from __future__ import annotations

from pathlib import Path

from feddg.flare.registry import ENTRY_POINT_GROUP

ENTRY_POINT = "median = tests.toy_method.part:METHOD"


def write_plugin(folder: Path) -> Path:
    """``folder`` with ``feddg_toy_method-0.0.dist-info`` in it; put ``folder`` on sys.path / PYTHONPATH."""
    info = Path(folder) / "feddg_toy_method-0.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: feddg-toy-method\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{ENTRY_POINT}\n")
    return Path(folder)
