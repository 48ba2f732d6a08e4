"""NVFlare 2.9 Recipes of this project's jobs: one per registered method, run on the simulator, a POC or a
deployment, or exported as the job folders under ``jobs/``.

    python -m feddg.recipes prostate_ga --env sim -w /tmp/feddg/recipes     (python job.py ... does the same)
    python -m feddg.recipes prostate_ga --env poc --workspace /tmp/feddg/poc
    python -m feddg.recipes prostate_ga --env prod --kit ADMIN_KIT
    python -m feddg.recipes prostate_ga --export --export-dir jobs_out

:mod:`~feddg.recipes.recipe` builds the job (:class:`FedDGRecipe`); :mod:`~feddg.recipes.export` writes and checks
the job folders; :mod:`~feddg.recipes.sim`, :mod:`~feddg.recipes.poc` and :mod:`~feddg.recipes.prod` are the three
environments; :mod:`~feddg.recipes.main` the command. Importing this package imports NVFlare's ``nvflare.recipe``,
which takes ``--export`` and ``--export-dir`` out of ``sys.argv`` (a Recipe script's convention).
"""

import warnings

# NVFlare warns on every --export that a script must not define flags of these names; this package defines none.
warnings.filterwarnings("ignore", message="NVFlare reserves '--export'", category=UserWarning)

from feddg.recipes.recipe import FedDGRecipe, job_names, split_job  # noqa: E402 - after the filter

__all__ = ["FedDGRecipe", "job_names", "split_job"]
