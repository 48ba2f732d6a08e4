"""Which of the heavy packages a piece of code imports, seen in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence

HEAVY = ("torch", "nvflare", "monai", "ray")  # seconds to import each; light modules must not pull them in

# Prints the heavy packages loaded as one JSON line when the interpreter exits, a SystemExit included.
_MARKER = f"""
import atexit, json, sys
atexit.register(lambda: print("\\nLOADED " + json.dumps(sorted({{m.split(".")[0] for m in sys.modules}}
                                                               & set({list(HEAVY)!r})))))
"""


def probe(code: str, args: Sequence[str] = ()) -> tuple[subprocess.CompletedProcess, list[str]]:
    """(the process, the HEAVY packages loaded by its exit) of ``code`` run with ``args`` in a fresh interpreter."""
    proc = subprocess.run([sys.executable, "-c", _MARKER + code, *args], capture_output=True, text=True, timeout=120)
    marker = [line for line in proc.stdout.splitlines() if line.startswith("LOADED ")]
    assert marker, f"the probe did not finish: {proc.stderr[-2000:]}"
    return proc, json.loads(marker[-1].removeprefix("LOADED "))


def heavy_imports(code: str) -> list[str]:
    """The HEAVY packages loaded (sorted) once ``code`` has run in a fresh interpreter; ``code`` failing fails."""
    proc, loaded = probe(code)
    assert proc.returncode == 0, f"the probe failed: {proc.stderr[-2000:]}"
    return loaded
