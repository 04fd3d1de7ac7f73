"""The machinery that hosts trionsq's Trio clients on a thread, for the front ends.

:mod:`trionsq.blocking` and :mod:`trionsq.aio` are skins over these pieces:

- :mod:`~trionsq.hosting.trio_thread`: one ``trio.run`` on a thread of its own
  (:class:`~trionsq.hosting.trio_thread.TrioThread`), called from other threads,
  fork-aware; also what fakensq's threaded cluster and Spark run on.
- :mod:`~trionsq.hosting.handover`: handing work and outcomes between that
  thread and the threads or asyncio loop around it, a wake-up per batch.
- :mod:`~trionsq.hosting.producer`: a :class:`trionsq.Producer` hosted on the
  thread (:class:`~trionsq.hosting.producer.HostedProducer`), encoding and
  counting with the one publish core (:mod:`trionsq.publishing`).
- :mod:`~trionsq.hosting.consumer`: a :class:`trionsq.Consumer` hosted on the
  thread, its messages handed out and settled from any thread.

The core client (:mod:`trionsq.connection`, :mod:`trionsq.producer`,
:mod:`trionsq.consumer`...) knows nothing of this package.
"""
