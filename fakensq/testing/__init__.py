"""The test machinery around the daemons.

- :mod:`.cluster`: a local cluster (nsqds and nsqlookupds on free ports);
- :mod:`.simulation`: the deterministic simulation (virtual time, in-memory network);
- :mod:`.threaded`: a node served on a background thread, for synchronous code;
- fault injection: :mod:`.faults` (the faults themselves), :mod:`.stream` (a
  connection as the faults see it), :mod:`.tracer` (the trace), :mod:`.schedule` (seeded
  schedules of them), :mod:`.faultplayer` (playing one on a cluster),
  :mod:`.restartable` (a lone nsqd restartable in place), :mod:`.strategies`
  (hypothesis strategies), :mod:`.atleastonce` (the at-least-once checker) and
  :mod:`.pytest_faults` (pytest's ``--nsq-faults``).

The daemons (``fakensq.nsqd``, ``fakensq.lookupd``, ``fakensq.admin``) never import
this package, not even for annotations; it drives them from outside.  The fault
kinds themselves (names, levels, what each needs) are :mod:`fakensq.faultkinds`,
which the admin reads too.
"""
