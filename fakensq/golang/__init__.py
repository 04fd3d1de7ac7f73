"""Go's formats, as the Go daemons write and read them: ``encoding/json``'s output
(:mod:`.json`), the ``flag`` package and ``time.Duration`` (:mod:`.flags`), and
``crypto/tls``'s cipher-suite names and preferences (:mod:`.tls`).

Shared by every part of fakensq; it imports nothing else of fakensq.
"""
