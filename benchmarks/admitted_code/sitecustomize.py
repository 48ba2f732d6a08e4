"""Loaded by every Python process that has this folder on its ``PYTHONPATH`` (``benchmarks/admitted_sweep.py`` puts
it there): puts this checkout's simulator fixes into NVFlare's simulator process of a sweep that runs older code.

When ``FEDDG_SIMULATOR_FIXES`` names a file (this checkout's ``custom/feddg/flare/simulator.py``), that file is
loaded as the module ``feddg_simulator_fixes`` right after NVFlare's ``simulator_runner`` module is imported: its
``install()`` runs at import and gives each site's worker process its own thread's name and ports no other run on
the host draws (:mod:`feddg.flare.simulator`). It changes which name and port each worker gets, nothing a run
computes. Without the variable, or in a process that never imports the runner, it does nothing. The file needs
NVFlare only, not the package, so it works beside whichever ``feddg`` the process imports. Being first on the path,
it hides any other ``sitecustomize`` (the project's environments have none).
"""

import importlib.abc
import importlib.util
import os
import sys

RUNNER = "nvflare.private.fed.app.simulator.simulator_runner"
FIXES_ENV = "FEDDG_SIMULATOR_FIXES"
FIXES_MODULE = "feddg_simulator_fixes"


class _AfterRunner(importlib.abc.MetaPathFinder):
    """Finds NVFlare's runner module as the other finders do, and loads the fixes after the module's own code ran."""

    def __init__(self, fixes: str) -> None:
        self.fixes = fixes

    def find_spec(self, name, path, target=None):
        if name != RUNNER:
            return None
        sys.meta_path.remove(self)  # once; find_spec below then asks the other finders
        spec = importlib.util.find_spec(name)
        if spec is None:  # no NVFlare here: the import fails as it would without the shim
            return None
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            fixes = importlib.util.spec_from_file_location(FIXES_MODULE, self.fixes)
            loaded = importlib.util.module_from_spec(fixes)
            sys.modules[FIXES_MODULE] = loaded
            fixes.loader.exec_module(loaded)  # install() at import

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get(FIXES_ENV):
    sys.meta_path.insert(0, _AfterRunner(os.environ[FIXES_ENV]))
