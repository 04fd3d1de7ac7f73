"""What the Go daemons share below their own code: Go's formats as
``encoding/json`` writes them (:mod:`.json`), ``net``'s host:port (:mod:`.net`),
``crypto/tls``'s cipher-suite names and preferences (:mod:`.tls`) and client
auth types (:mod:`.tlsconfig`), where Go's writers cut their output
(:mod:`.bufio`, :mod:`.snappy`, :mod:`.flate`, :mod:`.tlsrecords`), and nsq's
``internal/lg`` and ``internal/version`` (:mod:`.lg`: log lines, levels, the
version string, the flags every daemon has).

Go's ``flag`` package and ``time.Duration``'s text are trionsq's
(:mod:`trionsq.tools.flags`), one FlagSet for the tools and the daemons alike.

Shared by every part of fakensq; it imports nothing else of fakensq but
:mod:`fakensq.version`.
"""
