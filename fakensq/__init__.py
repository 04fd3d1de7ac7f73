"""fakensq: nsqd and nsqlookupd re-implemented in Trio, in-process."""

from .cluster import Cluster
from .lookupd import LookupdOptions, NSQLookupd
from .nsqd import NSQD, RegistryEvent
from .options import NSQDOptions

__all__ = ["NSQD", "Cluster", "LookupdOptions", "NSQDOptions", "NSQLookupd", "RegistryEvent"]

__version__ = "0.1.0"
