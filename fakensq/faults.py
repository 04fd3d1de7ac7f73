"""The old path of :mod:`fakensq.testing.faults`, kept for existing imports."""

from fakensq.testing.faults import (
    Direction,
    Fault,
    Faults,
    FaultyStream,
    NodeControl,
    Role,
    Tracer,
)

__all__ = ["Direction", "Fault", "Faults", "FaultyStream", "NodeControl", "Role", "Tracer"]
