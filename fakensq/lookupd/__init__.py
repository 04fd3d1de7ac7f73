"""The nsqlookupd daemon (:mod:`.daemon`).

``python -m fakensq.lookupd`` runs the ``nsqlookupd`` command.
"""

from .daemon import LookupdOptions, NSQLookupd

__all__ = ["LookupdOptions", "NSQLookupd"]
