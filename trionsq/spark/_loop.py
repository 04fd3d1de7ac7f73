"""A Trio event loop on a daemon thread, driven from synchronous code.

Spark calls the source's methods (on the driver) and the sink's ``write`` (on
executors) from plain threads; the NSQ connections they need live in a Trio loop
of their own.  That loop is trionsq's one thread runner,
:class:`trionsq.hosting.trio_thread.TrioThread` (``run`` is the portal, ``start_service``
starts the long-lived tasks); this module keeps the names spark's code uses.
"""

from __future__ import annotations

from ..hosting.trio_thread import LoopStoppedError
from ..hosting.trio_thread import TrioThread as LoopThread

__all__ = ["LoopStoppedError", "LoopThread"]
