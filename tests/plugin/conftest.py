"""The plugin's tests run projects in pytester's in-process runs, which drop
the modules a run imported once it ends.  httpx imports httpcore at its first
request and keeps httpcore's exception classes from then on: imported here
first, httpcore stays one module across the runs (else a later run's refused
connection raises the dropped httpcore's ConnectError, which httpx no longer
maps to its TransportError: the real daemons' runner polls /ping through it)."""

from __future__ import annotations

import httpcore  # noqa: F401  (see above)
