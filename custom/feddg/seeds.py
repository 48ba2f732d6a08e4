"""The seeds a site derives from the experiment's seeds: one function per derived seed.

Python's ``hash()`` of a string changes from process to process, and NVFlare runs a site's tasks in several
processes (the simulator starts one per task with ``-t`` smaller than the number of sites), so every seed that
depends on a site's name is computed here, from the name's bytes, the same way in every process.
"""

from __future__ import annotations

import hashlib
import zlib


def split_seed(seed: int, site: str) -> int:
    """The seed of a site's case-level train/validation split (``data.split_seed``): depends on the seed and the
    site's name only, so that a site's split is the same in every job of the experiment."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{site}".encode()).digest()[:8], "little")


def round_seed(seed: int, site: str, round_: int) -> int:
    """The seed of a site's local work in one round (``train.seed``): data order, augmentation, the method's own
    draws. Round 0's seed also draws a site's one-off subsets (ELCFS's amplitude bank images, MLA's feature
    images)."""
    return (seed * 1_000_003 + zlib.crc32(site.encode()) + round_ * 7919) % (2**31)
