"""fakensq: nsqd and nsqlookupd re-implemented in Trio, in-process.

The names below are imported on first use, so that ``python -m fakensq.nsqd``
(and ``fakensq.nsqlookupd``) can run a module that the package has not already
imported.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cluster import Cluster
    from .faults import Fault, Faults
    from .lookupd import LookupdOptions, NSQLookupd
    from .nsqd import NSQD, RegistryEvent
    from .options import NSQDOptions
    from .simulation import SimCluster, SimNetwork

__all__ = [
    "NSQD",
    "Cluster",
    "Fault",
    "Faults",
    "LookupdOptions",
    "NSQDOptions",
    "NSQLookupd",
    "RegistryEvent",
    "SimCluster",
    "SimNetwork",
]

__version__ = "0.1.0"

_MODULE_OF = {
    "NSQD": ".nsqd",
    "RegistryEvent": ".nsqd",
    "Cluster": ".cluster",
    "Fault": ".faults",
    "Faults": ".faults",
    "LookupdOptions": ".lookupd",
    "NSQLookupd": ".lookupd",
    "NSQDOptions": ".options",
    "SimCluster": ".simulation",
    "SimNetwork": ".simulation",
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
