"""fakensq: nsqd and nsqlookupd re-implemented in Trio, in-process."""

from .nsqd import NSQD, RegistryEvent
from .options import NSQDOptions

__all__ = ["NSQD", "NSQDOptions", "RegistryEvent"]

__version__ = "0.1.0"
