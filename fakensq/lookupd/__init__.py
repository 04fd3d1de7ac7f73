"""The nsqlookupd daemon, one module per part of it.

- :mod:`.daemon`: the daemon (:class:`NSQLookupd`): its TCP protocol and HTTP API;
- :mod:`.registry`: the registration database (producers, tombstones);
- :mod:`.options`, :mod:`.flags`: its options and command-line flags;
- :mod:`.protocol`: the TCP protocol's constants, shared with nsqd's registration
  (:mod:`fakensq.nsqd.lookup_peer`).

``python -m fakensq.lookupd`` runs the ``nsqlookupd`` command.
"""

from .daemon import NSQLookupd
from .options import LookupdOptions

__all__ = ["LookupdOptions", "NSQLookupd"]
