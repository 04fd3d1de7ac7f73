"""The NSQ release fakensq reproduces, shared by nsqd, nsqlookupd and nsqadmin,
and what fakensq says it is where the real binaries name their build."""

import platform

__all__ = ["BUILD", "FAKENSQ_VERSION", "VERSION"]

#: The NSQ version fakensq reproduces (IDENTIFY, /info, /ping's peers, --version).
VERSION = "1.3.0"
#: fakensq's own release (the package's ``fakensq.__version__``).
FAKENSQ_VERSION = "0.1.0"
#: The build note of ``--version``, the start-up log line and the text ``/stats``,
#: where the real binaries write ``built w/go1.21.5``: a fake never claims to be
#: a Go build.  The line still starts ``nsqd v1.3.0``, what scripts look for.
BUILD = f"fakensq {FAKENSQ_VERSION}, Python {platform.python_version()}"
