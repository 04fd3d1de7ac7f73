"""The fault controls of the admin's pages, over an in-process fakensq Cluster
(reached through :class:`~fakensq.admin.clusterhandle.InProcessCluster`).

Each control calls the cluster's fault injector (``cluster.faults``) and reports
on the timeline the effects it knows for sure, read around the fault itself: the
timeouts it caused (from the channels' counters just before and just after),
the node it took down or brought back.  So the timeline has them whenever the
admin's next read of the cluster happens to run.
"""

from __future__ import annotations

from typing import Any

import trio

from .actions import ActionError
from .clusterhandle import InProcessCluster
from .timeline import Timeline

__all__ = ["FaultControls"]


class FaultControls:
    """The faults the pages offer, on ``cluster``, reported on ``timeline``."""

    def __init__(self, cluster: InProcessCluster, timeline: Timeline) -> None:
        self.cluster = cluster
        self.timeline = timeline

    def _timeout_counts(self, topic: str, channel: str) -> dict[tuple[str, str, str], int]:
        """Each live nsqd's timeout count of ``topic/channel``, read in-process."""
        counts: dict[tuple[str, str, str], int] = {}
        for i, address in enumerate(self.cluster.nsqd_http_addresses):
            try:
                nsqd = self.cluster.nsqd(i)
            except RuntimeError:
                continue
            t = nsqd.topics.get(topic)
            ch = t.channels.get(channel) if t is not None else None
            if ch is not None:
                counts[(address, topic, channel)] = ch.timeout_count
        return counts

    async def do(self, verb: str, args: dict[str, Any]) -> tuple[bool, str]:
        """The fault ``verb`` (``kill-nsqd``, ``timeout-in-flight``...); nodes are
        named ``nsqd-N``/``lookupd-N`` in ``cluster.faults``, the page sends the
        index or the HTTP address.  (all went well, what happened)"""
        cluster = self.cluster
        faults = cluster.faults
        if verb == "heal":
            wanted = str(args.get("fault", ""))
            healed = [f for f in list(faults.active) if wanted in ("all", str(f.id))]
            if not healed:
                raise ActionError(f"no active fault {wanted!r}")
            for fault in healed:
                fault.heal()
            return True, "healed " + ", ".join(_describe_fault(f.describe()) for f in healed)
        if verb == "timeout-in-flight":
            topic, channel = str(args.get("topic", "")), str(args.get("channel", ""))
            if not topic or not channel:
                raise ActionError("no topic or channel given")
            # The effect comes from the counters around the fault itself, not from
            # whichever poll happens to come next.
            before = self._timeout_counts(topic, channel)
            count = faults.time_out_in_flight(topic=topic, channel=channel)
            after = self._timeout_counts(topic, channel)
            self.timeline.timeouts({k: (before.get(k, 0), n) for k, n in after.items()})
            return True, f"timed out {count} in-flight message(s) of {topic}/{channel}"
        if verb in ("partition-client", "drop-client"):
            client = str(args.get("client", ""))
            node = cluster.node_name_at(str(args.get("nodeAddress", "")))
            if not client or not node.startswith("nsqd-"):
                raise ActionError("no client or nsqd given")
            if verb == "drop-client":
                count = await faults.drop(node=node, client=client)
                return True, f"dropped {count} connection(s) of client {client} on {node}"
            faults.partition(node, client)
            return True, f"partitioned client {client} from {node}"

        kind, _, target = verb.rpartition("-")
        addresses = {"nsqd": cluster.nsqd_http_addresses, "lookupd": cluster.lookupd_http_addresses}
        if target not in addresses:
            raise ActionError(f"unknown fault {verb!r}")
        try:
            index = int(args.get("node", -1))
        except (TypeError, ValueError):
            raise ActionError("node must be a number") from None
        if not 0 <= index < len(addresses[target]):
            raise ActionError(f"no node {index}")
        name = f"{target}-{index}"
        address = addresses[target][index]
        where = f"{name} ({address})"
        try:
            if kind == "kill":
                await faults.kill(name)
                self._report_state(target, address, False, "killed")
                return True, f"killed {where}"
            if kind == "stop":
                await faults.stop(name)
                self._report_state(target, address, False, "stopped")
                return True, f"stopped {where}"
            if kind == "restart":
                await faults.start(name)
                self._report_state(target, address, True, "")
                return True, f"started {where}"
        except (RuntimeError, OSError, ValueError, trio.TooSlowError) as exc:
            return False, f"{kind} {where} failed: {exc or type(exc).__name__}"
        if target != "nsqd":
            raise ActionError(f"unknown fault {verb!r}")
        if kind == "partition":
            lookupds = [f"lookupd-{j}" for j in range(len(cluster.lookupd_http_addresses))]
            for lookupd in lookupds:
                faults.partition(name, lookupd)
            return True, f"partitioned {where} from {', '.join(lookupds) or 'no lookupd'}"
        if kind == "swallow_heartbeats":
            faults.swallow_heartbeats(node=name)
            return True, f"{where}: heartbeats to its clients swallowed"
        if kind == "stall":
            faults.stall(node=name)
            return True, f"stalled every connection of {where}"
        raise ActionError(f"unknown fault {verb!r}")

    def _report_state(self, target: str, address: str, up: bool, why: str) -> None:
        """A fault's known effect on a node, on the timeline now."""
        if target == "nsqd":
            self.timeline.node_state(address, up, why)
        else:
            self.timeline.lookupd_state(address, up)

    def active(self) -> list[dict[str, Any]]:
        """The faults in force (``cluster.faults.active``), described."""
        return [f.describe() for f in self.cluster.faults.active]


def _describe_fault(doc: dict[str, Any]) -> str:
    where = " ".join(
        f"{k}={doc[k]}" for k in ("node", "peer", "topic", "channel", "direction") if k in doc
    )
    return f"#{doc['id']} {doc['kind']} {where}".strip()
