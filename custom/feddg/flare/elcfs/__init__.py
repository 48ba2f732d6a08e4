"""ELCFS (Liu et al., CVPR 2021) in NVFlare: the amplitude exchange before the rounds (``exchange``), its payloads
(``payloads``) and their site filter (``filter``), and the episodic local training at the sites (``executor``);
the math is in :mod:`feddg.methods.frequency`, :mod:`feddg.methods.boundary` and :mod:`feddg.methods.episodic`."""
