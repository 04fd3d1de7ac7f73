"""The client tests' fixtures: ``daemons`` (fakensq's or the real ones)."""

from .daemons import daemons

__all__ = ["daemons"]
