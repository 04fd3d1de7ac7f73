"""The nsqd daemon, one module per part of it.

- :mod:`.node`: the daemon (:class:`NSQD`): listeners, topics, the queue scan;
- :mod:`.options`: its options and defaults (``nsqd --help``);
- :mod:`.client`: one client's TCP connection and the V2 protocol;
- :mod:`.topic`, :mod:`.channel`, :mod:`.message`: where messages live;
- :mod:`.diskqueue`, :mod:`.persist`: the disk queue and ``nsqd.dat``;
- :mod:`.http_api`: the HTTP API; :mod:`.stats`, :mod:`.statsd`: ``/stats`` and statsd;
- :mod:`.auth`: the auth server client; :mod:`.lookup_peer`: registration with
  nsqlookupd; :mod:`.listeners`: TCP/HTTP/HTTPS/unix sockets;
- :mod:`.hooks`: the seam that fault injection plugs into.

``python -m fakensq.nsqd`` runs the ``nsqd`` command.
"""

from .node import NSQD, RegistryEvent
from .options import NSQDOptions

__all__ = ["NSQD", "NSQDOptions", "RegistryEvent"]
