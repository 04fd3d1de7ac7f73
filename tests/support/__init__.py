"""What the tests share: one module per concept, each used by every folder
that needs it (a helper is written here once, not again in a test module).

- :mod:`.waiting`: bounded waits for a condition (Trio, blocking, asyncio).
- :mod:`.nodes`: an nsqd or nsqlookupd of either kind (fakensq's, the real
  v1.3.0), restartable; for Trio code and, on a thread, for blocking code.
- :mod:`.authserver`: nsqd's HTTP auth server, with grants a test sets.
- :mod:`.ports`: loopback ports free to listen on, or refusing connections.
- :mod:`.tls`: a CA of the tests' own, nsqd's certificate files, client
  certificates and contexts.
"""
