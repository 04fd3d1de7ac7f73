"""``NSQDataSource``: the ``nsq`` format, for ``readStream``, ``write`` and ``writeStream``."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from ._options import NSQOptionError, parse_sink_options, parse_source_options
from ._phases import mark
from .source import SCHEMA, NSQStreamReader

__all__ = ["NSQDataSource"]


class NSQDataSource(DataSource):
    """NSQ topics as a PySpark data source (format ``"nsq"``).

    Register it, then read a channel as a stream, or publish a DataFrame::

        spark.dataSource.register(NSQDataSource)
        stream = (spark.readStream.format("nsq").option("topic", "clicks")
                  .option("channel", "archive")
                  .option("nsqd_tcp_addresses", "127.0.0.1:4150").load())
        df.write.format("nsq").option("topic", "events")
            .option("nsqd_tcp_addresses", "127.0.0.1:4150").mode("append").save()

    Reading yields :data:`~trionsq.spark.SCHEMA` rows, at least once; writing
    publishes the ``value`` (or ``body``, or ``value_column``) column, binary or
    UTF-8 string.  Options are described in ``docs/spark.md``; a missing or bad
    one raises :class:`~trionsq.spark.NSQOptionError`.
    """

    @classmethod
    def name(cls) -> str:
        return "nsq"

    def schema(self) -> StructType:
        # Spark asks for the schema when load() is called: check the options then.
        parse_source_options(self.options)
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        mark("source.stream_reader")
        options = parse_source_options(self.options)
        if schema != SCHEMA:
            raise NSQOptionError(
                f"the nsq source's schema is fixed ({SCHEMA.simpleString()}); "
                "drop .schema(...) and select or cast columns after load()"
            )
        return NSQStreamReader(options)

    def reader(self, schema: StructType) -> DataSourceReader:
        raise NSQOptionError(
            "NSQ has no offsets to read a batch between: read a topic with "
            "spark.readStream.format('nsq') (trigger availableNow=True for a one-off run)"
        )

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        options = parse_sink_options(self.options)
        if overwrite:
            raise NSQOptionError("NSQ topics are append-only: use mode('append')")
        from .sink import NSQBatchWriter  # a query that only reads never imports the sink

        return NSQBatchWriter(options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        # Complete/update output modes publish each batch's rows as they are.
        from .sink import NSQStreamWriter

        return NSQStreamWriter(parse_sink_options(self.options), schema)
