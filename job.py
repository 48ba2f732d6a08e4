"""``python job.py JOB --env sim|poc|prod ...``: this project's jobs as NVFlare 2.9 Recipes, run the way NVFlare's
examples are (``python job.py --export --export-dir D`` writes the job folder ``D/JOB``).

The same command as ``python -m feddg.recipes`` (:mod:`feddg.recipes.main`); ``python job.py -h`` lists the jobs
and options. For example::

    python job.py prostate_ga --env sim -w /tmp/feddg/recipes --set train.rounds=2
"""

import sys

from feddg.recipes.main import main

if __name__ == "__main__":
    sys.exit(main(prog="python job.py"))
