"""fakensq: nsqd and nsqlookupd re-implemented in Trio, in-process.

The names below are imported on first use, so that ``python -m fakensq.nsqd``
(and ``fakensq.nsqlookupd``) can run a module that the package has not already
imported.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .version import FAKENSQ_VERSION

if TYPE_CHECKING:
    from .golang.net import ListenError
    from .lookupd.daemon import NSQLookupd
    from .lookupd.options import LookupdOptions
    from .nsqd.node import NSQD, RegistryEvent
    from .nsqd.options import NSQDOptions
    from .testing.cluster import Cluster
    from .testing.faults import Fault, Faults
    from .testing.simulation import SimCluster, SimNetwork

__all__ = [
    "NSQD",
    "Cluster",
    "Fault",
    "Faults",
    "ListenError",
    "LookupdOptions",
    "NSQDOptions",
    "NSQLookupd",
    "RegistryEvent",
    "SimCluster",
    "SimNetwork",
]

__version__ = FAKENSQ_VERSION

_MODULE_OF = {
    "NSQD": ".nsqd.node",
    "RegistryEvent": ".nsqd.node",
    "Cluster": ".testing.cluster",
    "Fault": ".testing.faults",
    "Faults": ".testing.faults",
    "ListenError": ".golang.net",
    "LookupdOptions": ".lookupd.options",
    "NSQLookupd": ".lookupd.daemon",
    "NSQDOptions": ".nsqd.options",
    "SimCluster": ".testing.simulation",
    "SimNetwork": ".testing.simulation",
}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'fakensq' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
