"""fakensq: nsqd and nsqlookupd re-implemented in Trio, in-process."""

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
