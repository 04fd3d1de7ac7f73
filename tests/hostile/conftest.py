"""Hostile peers, one test module per listening socket (issue 26).

The conformance harness (``conformance``, ``auth_server``) runs a scenario on
fakensq and on the real daemon where nsqd has a behaviour for the case.
"""

from ..conformance.conftest import (  # noqa: F401 - fixtures and the skip-reason hook
    auth_server,
    conformance,
    pytest_runtest_makereport,
)
