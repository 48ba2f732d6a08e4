"""ELCFS's names on the wire and its default limit, shared by the part (:mod:`~feddg.flare.elcfs.part`, what a
job declares) and the exchange's contract (:mod:`~feddg.flare.elcfs.payloads`, what a payload may hold): a module
of plain values that both import, so that neither imports the other's side."""

from __future__ import annotations


class ELCFSTask:
    """The tasks of the amplitude exchange."""

    AMPLITUDE_SPECTRA = "amplitude_spectra"  # nothing in, the site's amplitude windows out (training sites)
    AMPLITUDE_BANK = "amplitude_bank"  # the distribution bank in, an acknowledgement out


DEFAULT_MAX_HALF_WIDTH = 8  # a site's cap when its policy names none: at most 17 x 17 values per channel
# (alpha 0.01 of an 800 px image)
