"""The seam between an nsqd and whatever observes or disturbs it (fault injection).

An :class:`fakensq.NSQD` has a ``hooks`` attribute, ``None`` by default.  When set
(by :class:`fakensq.faults.Faults`), the node calls it at three points only:

- every connection it serves passes through :meth:`NodeHooks.wrap_stream` first
  (so transport faults and tracing see every byte, in TCP and in-memory mode);
- every publish (TCP ``PUB``/``MPUB``/``DPUB`` and HTTP ``/pub``/``/mpub``) calls
  :meth:`NodeHooks.before_put`, which may raise an NSQ error such as
  ``E_PUB_FAILED``;
- ``/stats`` adds :meth:`NodeHooks.report` as its top-level ``"faults"`` list.
"""

from __future__ import annotations

from typing import Any, Protocol

import trio

__all__ = ["NodeHooks"]


class NodeHooks(Protocol):
    """What an nsqd asks of its ``hooks`` object."""

    def wrap_stream(self, stream: trio.abc.Stream, remote: str | None) -> trio.abc.Stream:
        """The stream the node should serve instead of ``stream``."""
        ...

    def before_put(self, topic: str, count: int) -> None:
        """Called before ``count`` messages are put into ``topic``; may raise."""
        ...

    def report(self) -> list[dict[str, Any]]:
        """The faults active on the node, for ``/stats``."""
        ...
