"""Which of the heavy packages a piece of code imports, seen in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "nvflare", "monai", "ray")  # seconds to import each; light modules must not pull them in


def heavy_imports(code: str, packages: tuple[str, ...] = HEAVY) -> list[str]:
    """The ``packages`` loaded (sorted) once ``code`` has run in a fresh interpreter; ``code`` failing fails."""
    probe = (f"{code}\nimport json, sys\n"
             f"print('LOADED ' + json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({list(packages)!r}))))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"the probe failed: {proc.stderr[-2000:]}"
    marker = [line for line in proc.stdout.splitlines() if line.startswith("LOADED ")]
    return json.loads(marker[-1].removeprefix("LOADED "))
