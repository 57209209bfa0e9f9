"""A RULER-style long-context suite, offline: RULER's synthetic tasks (``tasks``), answered from
an exact, a compressed or an evicted context cache (``run``), scored as RULER scores (``score``)."""
