"""A web view of an NSQ cluster, nsqadmin-like, served by fakensq.

It reads nsqlookupd's ``/nodes``, ``/topics`` and ``/lookup`` and nsqd's ``/stats``
(so it works against real daemons too), does nsqadmin's actions through their
HTTP APIs, and, given an in-process :class:`fakensq.Cluster`, adds fault controls
and a timeline of what happened.  Start it with ``fakensq admin`` or
``fakensq cluster -admin-http-address``, or in code with :class:`Admin`.
"""

from .actions import ActionError
from .server import Admin

__all__ = ["ActionError", "Admin"]
