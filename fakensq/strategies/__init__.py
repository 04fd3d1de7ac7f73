"""``fakensq.strategies``: the hypothesis strategies for fault schedules, under
the short name issue 16 gives them (they live in :mod:`fakensq.testing.strategies`)."""

from fakensq.testing.strategies import fault_events, fault_schedules

__all__ = ["fault_events", "fault_schedules"]
