"""MLA's names on the wire and its default limit, shared by the part (:mod:`~feddg.flare.mla.part`, what a job
declares) and the exchange's contract (:mod:`~feddg.flare.mla.payloads`, what a payload may hold): a module of
plain values that both import, so that neither imports the other's side."""

from __future__ import annotations


class MLATask:
    """The tasks of MLA after the rounds."""

    MLA_FEATURES = "mla_features"  # the shared encoder in, the site's feature matrix out (training sites)
    MLA_EVALUATE = "mla_evaluate"  # the bundle in, metrics of the attention-combined model out (every site)


# Meta key of a training result: True when the site's own local/feddg_site.json lets the server keep its final local
# model (absent otherwise); only the site can set it.
SHARE_LOCAL_MODEL = "share_local_model"
DEFAULT_MAX_FEATURE_WIDTH = 512  # a site's cap when its policy names none: feature values per image (the jobs
# send 128; a 32 x 32 image would need 1024)
