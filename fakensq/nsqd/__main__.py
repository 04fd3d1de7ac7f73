"""``python -m fakensq.nsqd``: the ``nsqd`` command."""

from fakensq.cli import nsqd_main

raise SystemExit(nsqd_main())
