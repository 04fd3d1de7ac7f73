"""The contract of ``fakensq proxy``'s HTTP API that its clients share.

The proxy (:mod:`fakensq.testing.proxy`) serves it and the admin's fault buttons
(:mod:`fakensq.admin.proxycontrols`) call it; both read the kinds from here, so
the admin, a daemon, never imports the test machinery.
"""

from __future__ import annotations

from typing import Final

__all__ = ["WIRE_KINDS"]

#: The faults a proxy can inject (``POST /faults/KIND``): what acts on the wire.
WIRE_KINDS: Final = (
    "drop",
    "delay",
    "stall",
    "swallow_heartbeats",
    "corrupt",
    "truncate",
    "partition",
)
