"""NSQ topics as a PySpark streaming source and sink (``format("nsq")``).

::

    from trionsq.spark import NSQDataSource

    spark.dataSource.register(NSQDataSource)
    stream = (spark.readStream.format("nsq").option("topic", "clicks")
              .option("channel", "archive")
              .option("lookupd_http_addresses", "127.0.0.1:4161").load())

Needs PySpark 4.2 or later (``pip install 'trionsq[spark]'``); ``import trionsq``
alone never imports PySpark.  See ``docs/spark.md``.
"""

from __future__ import annotations

try:
    import pyspark.sql.datasource
    import pyspark.sql.streaming.datasource  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "trionsq.spark needs PySpark 4.2 or later with pyarrow: pip install 'trionsq[spark]'"
    ) from exc

from ._options import NSQOptionError
from .datasource import NSQDataSource
from .sink import NSQCommitMessage
from .source import SCHEMA, NSQInputPartition, NSQSourceError

__all__ = [
    "SCHEMA",
    "NSQCommitMessage",
    "NSQDataSource",
    "NSQInputPartition",
    "NSQOptionError",
    "NSQSourceError",
]
