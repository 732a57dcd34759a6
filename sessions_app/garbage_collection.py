"""The cyclic garbage collector of the long-lived server processes (Daphne, workers).

Python's collector runs a young-generation pass every 700 net allocations of container
objects, and a full pass walks every object the process holds. A server's heap is mostly
what it imported at startup (Django, its apps, their modules and classes: hundreds of
thousands of objects that live as long as the process), and each streamed chunk
allocates a few dozen short-lived containers (an envelope, its payload, the frame), so
under load the collector ran hundreds of times a second and every older pass walked the
startup heap again, for nothing: that heap is never garbage.

`tune_for_server()` is called once the process has finished starting (every module
imported, Django set up), just before it serves:

- `gc.freeze()` moves every object alive at that moment to the permanent generation,
  which no collection walks (the objects stay alive and correct; they are only not
  scanned for cycles, which they are not part of);
- the young generation's threshold goes from 700 to `SECTR_GC_THRESHOLD` (10,000),
  so collections run about fourteen times less often; each one walks more objects, but
  young objects are few and mostly dead already (reference counting freed them).

Reference counting still frees nearly everything at once; only reference cycles wait a
little longer for their collection. `SECTR_GC_THRESHOLD=0` leaves the collector as
Python sets it (no freeze, default thresholds).
"""

from __future__ import annotations

import gc
import logging

from django.conf import settings

log = logging.getLogger("sectr.gc")

_tuned = False


def tune_for_server() -> bool:
    """Freeze the startup heap and raise the young generation's threshold, once per
    process; False when SECTR_GC_THRESHOLD is 0 (Python's defaults kept)."""
    global _tuned
    threshold = int(getattr(settings, "SECTR_GC_THRESHOLD", 0))
    if threshold <= 0:
        return False
    if _tuned:
        return True
    _tuned = True
    # Collected first, so what is frozen is only what lives: garbage frozen would stay.
    gc.collect()
    gc.freeze()
    _gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(threshold, gen1, gen2)
    log.debug("garbage collector tuned: %d objects frozen, threshold %d", gc.get_freeze_count(), threshold)
    return True
