"""MLA-BIN's model-level attention in NVFlare: the sites' kept local models (``local_models``), the feature bank,
the domain attention module and the MLA evaluation after the rounds (``workflow``, ``executor``), their payloads
(``payloads``) and site filter (``filter``), and the bundle a hospital loads (``bundle``); the math is in
:mod:`feddg.methods.mla`."""
