"""The admin's fault buttons for ``fakensq proxy``: faults on the wire in front
of a *real* nsqd.

A :class:`~fakensq.testing.proxy.FaultProxy` takes its faults over its own HTTP
API (``POST /faults/KIND``, ``DELETE /faults/ID``, ``GET /faults``); the admin,
given the proxies' HTTP addresses (``fakensq admin --proxy-http-address``),
reads each one's faults and connections for the Faults page and sends the
pressed button's fault to it.  Only what a proxy can do is offered (the kinds
of :data:`~fakensq.faultkinds.WIRE_KINDS`); what happens inside nsqd is
shown greyed, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import quote

import httpx

from ..faultkinds import KINDS, WIRE_KINDS, kinds_for
from .actions import ActionError
from .data import Endpoint

__all__ = ["INSIDE_NSQD", "ProxyControls", "ProxyState"]

#: Faults of fakensq's own nsqd a proxy cannot inject (shown greyed): label, kind
#: (those of the levels up to "harsh"; a kill is the restart's button too).
INSIDE_NSQD: Final = tuple((KINDS[k].label, k) for k in kinds_for("harsh") if k not in WIRE_KINDS)
#: Why they are greyed.
INSIDE_REASON: Final = "happens inside nsqd: a proxy only sees the wire (use fakensq's own nsqd)"
_PARAMS: Final = ("client", "role", "direction", "seconds", "count")


@dataclass
class ProxyState(Endpoint):
    """One proxy as last read: its faults in force and the connections it relays."""

    upstream: str = ""
    tcp_address: str = ""
    faults: list[dict[str, Any]] = field(default_factory=list)
    connections: list[dict[str, Any]] = field(default_factory=list)


class ProxyControls:
    """The fault buttons of the proxies at ``addresses`` (their HTTP ``host:port``)."""

    def __init__(self, addresses: list[str]) -> None:
        self.addresses = list(addresses)
        #: each proxy as last read (:meth:`refresh`), in ``addresses``' order
        self.states = [ProxyState(a) for a in self.addresses]

    async def refresh(self, client: httpx.AsyncClient) -> list[ProxyState]:
        """Read every proxy's ``GET /faults`` (one that does not answer is down)."""
        states = []
        for address in self.addresses:
            state = ProxyState(address)
            docs = await state.read(client, "/faults")
            if docs is not None:
                (doc,) = docs
                state.upstream = str(doc.get("upstream", ""))
                state.tcp_address = str(doc.get("tcp_address", ""))
                state.faults = list(doc.get("faults") or [])
                state.connections = list(doc.get("connections") or [])
            states.append(state)
        self.states = states
        return states

    def _address(self, args: dict[str, Any]) -> str:
        try:
            index = int(args.get("proxy", 0))
        except (TypeError, ValueError):
            raise ActionError("proxy must be a number") from None
        if not 0 <= index < len(self.addresses):
            raise ActionError(f"no proxy {index}")
        return self.addresses[index]

    async def do(
        self, client: httpx.AsyncClient, verb: str, args: dict[str, Any]
    ) -> tuple[bool, str]:
        """The fault ``verb`` (``proxy-drop``, ``proxy-stall``..., ``proxy-heal``)
        on proxy number ``args["proxy"]``, through its HTTP API.
        (all went well, what happened); :class:`ActionError` for a bad request."""
        kind = verb.removeprefix("proxy-")
        if kind != "heal" and kind not in WIRE_KINDS:
            raise ActionError(
                f"unknown proxy fault {kind!r} (a proxy can: {', '.join(WIRE_KINDS)})"
            )
        address = self._address(args)
        try:
            if kind == "heal":
                wanted = str(args.get("fault", ""))
                if not wanted:
                    raise ActionError("no fault given")
                url = f"http://{address}/faults"
                if wanted != "all":
                    url += "/" + quote(wanted, safe="")
                answer = await client.delete(url)
            else:
                params = {k: str(args[k]) for k in _PARAMS if args.get(k) not in (None, "")}
                answer = await client.post(f"http://{address}/faults/{kind}", params=params)
            doc = answer.json()
        except (httpx.HTTPError, ValueError) as exc:
            return False, f"proxy {address}: {exc or type(exc).__name__}"
        if not isinstance(doc, dict):
            return False, f"proxy {address}: unexpected answer {doc!r}"
        if answer.status_code == 400:
            # the proxy refused (what it cannot do, a malformed parameter)
            raise ActionError(f"proxy {address}: {doc.get('message', answer.text)}")
        if answer.status_code != 200:
            return False, f"proxy {address}: {doc.get('message', answer.status_code)}"
        return True, f"proxy {address}: " + _said(kind, args, doc)


def _said(kind: str, args: dict[str, Any], doc: dict[str, Any]) -> str:
    """What the proxy's answer says happened, in one line."""
    if kind == "heal":
        healed = doc.get("healed")
        if isinstance(healed, dict):
            return f"healed #{healed.get('id')} {healed.get('kind', '')}".strip()
        return f"healed {healed} fault(s)"
    if kind == "drop":
        who = args.get("client") or (f"{args['role']}s'" if args.get("role") else "every")
        return f"dropped {doc.get('dropped', 0)} connection(s) ({who})"
    fault = doc.get("fault") or {}
    where = " ".join(
        f"{k}={fault[k]}" for k in ("peer", "role", "direction", "seconds") if k in fault
    )
    text = f"{kind} #{fault.get('id')} {where}".strip()
    if doc.get("note"):
        text += f" ({doc['note']})"
    return text
