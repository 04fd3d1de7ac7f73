"""The ``fakensq`` command, and ``nsqd``/``nsqlookupd`` stand-ins for the real binaries.

- ``fakensq nsqd [flags]``: nsqd v1.3's flags, Go flag semantics;
- ``fakensq nsqlookupd [flags]``: nsqlookupd v1.3's flags;
- ``fakensq cluster [-nsqd N] [-lookupd M] [-base-port P]``: a whole cluster, with
  its addresses printed on stdout;
- ``fakensq shims DIR``: writes executable ``nsqd`` and ``nsqlookupd`` into DIR,
  for test suites that start the binaries by name from ``PATH``.

The daemons log on stderr in the real ones' format
(``[nsqd] 2026/11/22 01:02:03.123456 INFO: TCP: listening on 127.0.0.1:4150``),
with the real port when port 0 was asked.  SIGTERM and SIGINT shut down cleanly
and exit 0.  Flag errors exit 2, start-up failures 1 (``FATAL: ...``).
"""

from ..golang.lg import GoLogFormatter, version_string
from ..lookupd.flags import nsqlookupd_command_defaults, nsqlookupd_flagset
from ..nsqd.flags import nsqd_cfg_fields, nsqd_command_defaults, nsqd_flagset
from .cluster import cluster_main
from .common import ConfigError
from .main import main
from .nsqd import check_nsqd_options, nsqd_main, nsqd_options_from_flags
from .nsqlookupd import nsqlookupd_main, nsqlookupd_options_from_flags

__all__ = [
    "ConfigError",
    "GoLogFormatter",
    "check_nsqd_options",
    "cluster_main",
    "main",
    "nsqd_cfg_fields",
    "nsqd_command_defaults",
    "nsqd_flagset",
    "nsqd_main",
    "nsqd_options_from_flags",
    "nsqlookupd_command_defaults",
    "nsqlookupd_flagset",
    "nsqlookupd_main",
    "nsqlookupd_options_from_flags",
    "version_string",
]
