"""fakensq: nsqd and nsqlookupd re-implemented in Trio, in-process."""

__version__ = "0.1.0"
