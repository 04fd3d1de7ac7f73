"""The HTTP side shared by nsqd, nsqlookupd and nsqadmin: a server that answers as
Go's ``net/http`` does (:mod:`.server`), httprouter's routing rules
(:mod:`.router`) and the ``/debug/pprof`` pages (:mod:`.pprof`).
"""
