"""NSQ topics as a PySpark streaming source and sink (``format("nsq")``).

::

    from trionsq.spark import NSQDataSource

    spark.dataSource.register(NSQDataSource)
    stream = (spark.readStream.format("nsq").option("topic", "clicks")
              .option("channel", "archive")
              .option("lookupd_http_addresses", "127.0.0.1:4161").load())

Needs PySpark 4.2 or later (``pip install 'trionsq[spark]'``); ``import trionsq``
alone never imports PySpark.  See ``docs/spark.md``.

The names below are imported on first use: the executors' agent
(:mod:`trionsq.spark.agent`) lives in this package and needs none of PySpark,
so it starts without paying for its import.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._options import NSQOptionError
    from .datasource import NSQDataSource
    from .sink import NSQCommitMessage
    from .source import SCHEMA, NSQInputPartition, NSQSourceError

_NEEDS = "trionsq.spark needs PySpark 4.2 or later with pyarrow: pip install 'trionsq[spark]'"

if importlib.util.find_spec("pyspark") is None or importlib.util.find_spec("pyarrow") is None:
    raise ImportError(_NEEDS)

_WHERE = {
    "SCHEMA": ".source",
    "NSQCommitMessage": ".sink",
    "NSQDataSource": ".datasource",
    "NSQInputPartition": ".source",
    "NSQOptionError": "._options",
    "NSQSourceError": ".source",
}

__all__ = [
    "SCHEMA",
    "NSQCommitMessage",
    "NSQDataSource",
    "NSQInputPartition",
    "NSQOptionError",
    "NSQSourceError",
]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(where, __name__), name)
    except ImportError as exc:  # an older PySpark: no streaming Python data sources
        raise ImportError(_NEEDS) from exc
    globals()[name] = value
    return value
