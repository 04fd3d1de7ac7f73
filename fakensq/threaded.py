"""The old path of :mod:`fakensq.testing.threaded`, kept for existing imports."""

from fakensq.testing.threaded import BackgroundNode

__all__ = ["BackgroundNode"]
