"""``python -m fakensq.lookupd``: the ``nsqlookupd`` command."""

from fakensq.cli import nsqlookupd_main

raise SystemExit(nsqlookupd_main())
