"""An nsqd as nsqlookupd describes it: the fields of nsqlookupd's ``peerInfo``
in its HTTP answers (``/lookup``'s producers, ``/nodes``), which nsqadmin's
``Producer`` carries again in its own API.

One declaration for both sides of that JSON: fakensq's nsqlookupd writes it,
fakensq's admin reads it and answers it again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Peer"]


@dataclass(kw_only=True)
class Peer:
    """An nsqd's ``peerInfo`` fields, in nsqlookupd's JSON order."""

    #: the address its lookupd connection came from
    remote_address: str = ""
    hostname: str = ""
    #: what clients should connect to (``--broadcast-address``)
    broadcast_address: str = ""
    tcp_port: int = 0
    http_port: int = 0
    version: str = ""

    def peer_json(self) -> dict[str, Any]:
        """The fields as nsqlookupd answers them, in its order."""
        return {
            "remote_address": self.remote_address,
            "hostname": self.hostname,
            "broadcast_address": self.broadcast_address,
            "tcp_port": self.tcp_port,
            "http_port": self.http_port,
            "version": self.version,
        }
