"""A method added from outside the package: coordinate-wise median aggregation (FedMedian, Yin et al., ICML 2018)
after dropping the ``median.trim`` sites whose update moved furthest this round.

It exercises everything a method may add without touching the package: its own ``feddg.yaml`` section (``median``,
one setting), a site hook that sends one value (``median_update_norm``: the L2 norm of the site's weight change),
an aggregator, and a server file (``median_history.json``) that ``feddg resume-job`` carries forward and the
benchmark keeps. It is registered through the entry-point group ``feddg.methods`` (``tests.toy_method.part:METHOD``),
the way an installed plug-in would be; the rounds, the sites' training and evaluation, the report and the site
policy are the project's shared machinery."""
