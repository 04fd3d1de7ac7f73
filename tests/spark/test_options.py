"""Missing, unknown and bad options fail early, naming the option."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql.types import (
    BinaryType,
    DataType,
    IntegerType,
    StringType,
    StructField,
    StructType,
)

from fakensq import NSQD
from trionsq import NSQConnectionError
from trionsq.spark import SCHEMA, NSQDataSource, NSQOptionError
from trionsq.spark._options import (
    SourceOptions,
    parse_sink_options,
    parse_source_options,
)
from trionsq.spark.sink import NSQBatchWriter, _publisher

from .conftest import consume


def schema(**columns: DataType) -> StructType:
    """A StructType (``StructType.fromDDL`` would need a running SparkSession)."""
    return StructType([StructField(name, data_type) for name, data_type in columns.items()])


SOURCE = {"topic": "t", "channel": "c", "nsqd_tcp_addresses": "127.0.0.1:4150"}
SINK = {"topic": "t", "nsqd_tcp_addresses": "127.0.0.1:4150"}


def test_source_defaults_and_parsing() -> None:
    options = parse_source_options(
        {
            **SOURCE,
            "nsqd_tcp_addresses": " 127.0.0.1:4150, 127.0.0.1:4250 ,",
            "lookupd_http_addresses": "127.0.0.1:4161",
            "snappy": "TRUE",
            "max_in_flight": "5000",
            "max_bytes_in_flight": "256m",
            "connections_per_nsqd": "3",
            "max_messages_per_trigger": "10000",
            "num_partitions": "auto",
            "coordinator_host": "10.0.0.7",
            "coordinator_port": "7077",
            "msg_timeout": "30",
            "checkpointLocation": "/ignored",  # Spark's own options pass through
        }
    )
    assert isinstance(options, SourceOptions)
    assert options.connection.nsqd_tcp_addresses == ("127.0.0.1:4150", "127.0.0.1:4250")
    assert options.connection.lookupd_http_addresses == ("127.0.0.1:4161",)
    assert options.connection.snappy is True
    assert (options.max_in_flight, options.max_messages_per_trigger) == (5000, 10000)
    assert (options.connections_per_nsqd, options.num_partitions) == (3, None)
    assert options.max_bytes_in_flight == 256 << 20
    assert (options.coordinator_host, options.coordinator_port) == ("10.0.0.7", 7077)
    config = options.consumer_config()
    assert (config.max_in_flight, config.msg_timeout, config.max_attempts) == (5000, 30.0, 0)
    # Left out: automatic (what nsqd grants, everything held, one per executor core).
    defaults = parse_source_options(SOURCE)
    assert defaults.max_in_flight is defaults.max_messages_per_trigger is None
    assert defaults.num_partitions is None and defaults.connections_per_nsqd == 16
    assert (defaults.coordinator_host, defaults.coordinator_port) == (None, 0)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"channel": "c", "nsqd_tcp_addresses": "h:1"}, "option 'topic' is required"),
        ({"topic": "t", "nsqd_tcp_addresses": "h:1"}, "option 'channel' is required"),
        ({"topic": "t", "channel": "c"}, "give 'nsqd_tcp_addresses' or 'lookupd_http_addresses'"),
        ({**SOURCE, "topic": "bad topic!"}, "not a valid NSQ topic name"),
        ({**SOURCE, "channel": "x" * 65}, "not a valid NSQ channel name"),
        ({**SOURCE, "nsqd_tcp_addresses": "localhost"}, "expected 'host:port'"),
        ({**SOURCE, "lookupd_http_addresses": "ftp://x:1"}, "invalid lookupd address"),
        ({**SOURCE, "max_in_flight": "lots"}, "option 'max_in_flight' must be an integer"),
        ({**SOURCE, "max_in_flight": "0"}, "option 'max_in_flight' must be >= 1"),
        ({**SOURCE, "max_messages_per_trigger": "0"}, "must be >= 1"),
        ({**SOURCE, "num_partitions": "some"}, "option 'num_partitions' must be an integer"),
        ({**SOURCE, "connections_per_nsqd": "0"}, "must be between 1 and 64"),
        ({**SOURCE, "max_bytes_in_flight": "lots"}, "must be a size in bytes"),
        ({**SOURCE, "max_bytes_in_flight": "100"}, "must be at least 1k"),
        ({**SOURCE, "coordinator_port": "70000"}, "must be between 0 and 65535"),
        ({**SOURCE, "msg_timeout": "0.5"}, "option 'msg_timeout' must be >= 1 seconds"),
        ({**SOURCE, "max_batch_wait": "soon"}, "option 'max_batch_wait' must be a number"),
        ({**SOURCE, "tls": "maybe"}, "option 'tls' must be true or false"),
        ({**SOURCE, "tls_cert": "c.pem"}, "need tls=true"),
        (
            {**SOURCE, "tls": "true", "tls_cert": "/nonexistent.pem", "tls_key": "/k"},
            "no such file",
        ),
        ({**SOURCE, "snappy": "true", "deflate": "true"}, "mutually exclusive"),
        ({**SOURCE, "chanel": "c"}, "unknown option 'chanel' (did you mean 'channel'?)"),
        ({**SOURCE, "value_column": "v"}, "option 'value_column' only applies to writing"),
    ],
)
def test_bad_source_options(options: dict[str, str], message: str) -> None:
    with pytest.raises(NSQOptionError) as info:
        parse_source_options(options)
    assert message in str(info.value)
    assert str(info.value).startswith("nsq data source: ")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"nsqd_tcp_addresses": "h:1"}, "option 'topic' is required"),
        ({"topic": "t"}, "give 'nsqd_tcp_addresses' (the nsqds to publish to)"),
        ({**SINK, "lookupd_http_addresses": "ftp://x"}, "invalid lookupd address"),
        ({**SINK, "channel": "c"}, "option 'channel' only applies to reading"),
        ({**SINK, "batch_size": "-1"}, "option 'batch_size' must be >= 1"),
        ({**SINK, "topix": "t"}, "did you mean 'topic'?"),
    ],
)
def test_bad_sink_options(options: dict[str, str], message: str) -> None:
    with pytest.raises(NSQOptionError, match="nsq data source: ") as info:
        parse_sink_options(options)
    assert message in str(info.value)


def test_spark_reports_a_bad_option_at_load(spark: SparkSession) -> None:
    with pytest.raises(Exception, match="option 'topic' is required"):
        spark.readStream.format("nsq").option("channel", "c").load()
    with pytest.raises(Exception, match="option 'max_in_flight' must be an integer"):
        (spark.readStream.format("nsq").options(**SOURCE).option("max_in_flight", "many").load())


def test_bad_writes_fail_before_publishing() -> None:
    # What Spark calls on the driver when save() or start() is called.
    source = NSQDataSource({"topic": "t", "nsqd_tcp_addresses": "127.0.0.1:4150"})
    ints = schema(value=IntegerType())
    with pytest.raises(NSQOptionError, match="the nsq sink publishes binary or string values"):
        source.writer(ints, overwrite=False)
    with pytest.raises(NSQOptionError, match="the nsq sink publishes binary or string values"):
        source.streamWriter(ints, overwrite=False)
    with pytest.raises(NSQOptionError, match="has neither"):
        source.writer(schema(n=IntegerType(), text=StringType()), overwrite=False)
    with pytest.raises(NSQOptionError, match="no column 'missing'"):
        NSQDataSource({**SINK, "value_column": "missing"}).writer(ints, overwrite=False)
    with pytest.raises(NSQOptionError, match="NSQ topics are append-only"):
        source.writer(schema(value=StringType()), overwrite=True)
    with pytest.raises(NSQOptionError, match="NSQ has no offsets to read a batch between"):
        NSQDataSource(SOURCE).reader(SCHEMA)
    with pytest.raises(NSQOptionError, match="schema is fixed"):
        NSQDataSource(SOURCE).streamReader(schema(body=BinaryType()))


def test_writer_publishes_in_chunks_and_fails_loudly(nsqd: NSQD) -> None:
    writer = NSQBatchWriter(
        parse_sink_options(
            {"topic": "chunks", "nsqd_tcp_addresses": nsqd.tcp_address, "batch_size": "7"}
        ),
        schema(key=StringType(), body=BinaryType()),
    )
    assert writer.column == "body"
    batch = pa.RecordBatch.from_pydict(
        {"key": ["k"] * 20, "body": [b"b%02d" % i for i in range(20)]}
    )
    message = writer.write(iter([batch, batch]))
    assert (message.messages, message.bytes) == (40, 120)
    # Tasks in the same Python worker share one connection per set of options.
    assert _publisher(writer.options.connection) is _publisher(writer.options.connection)
    writer.commit([message, None])
    assert writer.totals == (1, 40, 120)
    assert sorted(consume(nsqd.tcp_address, "chunks", "c", 40)) == sorted(
        batch.column(1).to_pylist() * 2
    )
    with pytest.raises(ValueError, match="has a null value"):
        writer.write(iter([pa.RecordBatch.from_pydict({"key": ["k"], "body": [None]})]))
    dead = NSQBatchWriter(
        parse_sink_options(
            {"topic": "t", "nsqd_tcp_addresses": "127.0.0.1:9", "connect_timeout": "2"}
        ),
        schema(key=StringType(), body=BinaryType()),
    )
    with pytest.raises(NSQConnectionError, match=r"127\.0\.0\.1:9"):
        dead.write(iter([batch]))


def test_importing_trionsq_does_not_import_pyspark() -> None:
    code = (
        "import sys; import trionsq; assert 'pyspark' not in sys.modules\n"
        "sys.modules['pyspark'] = None\n"
        "try:\n    import trionsq.spark\nexcept ImportError as e:\n    print(e)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "pip install 'trionsq[spark]'" in result.stdout


option_names = st.sampled_from(
    [
        "topic",
        "channel",
        "nsqd_tcp_addresses",
        "lookupd_http_addresses",
        "max_in_flight",
        "max_bytes_in_flight",
        "connections_per_nsqd",
        "max_messages_per_trigger",
        "num_partitions",
        "max_batch_wait",
        "msg_timeout",
        "coordinator_host",
        "coordinator_port",
        "tls",
        "snappy",
        "deflate",
        "deflate_level",
        "connect_timeout",
        "value_column",
        "batch_size",
        "bogus",
    ]
)
option_values = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["1", "0", "-3", "auto", "true", "64m", "1e309", "nan", "h:1", "t#ephemeral"]),
)


@given(st.dictionaries(option_names, option_values, max_size=8))
def test_any_options_parse_or_fail_with_one_line_naming_the_problem(
    options: dict[str, str],
) -> None:
    for parse in (parse_source_options, parse_sink_options):
        try:
            parse(options)
        except NSQOptionError as exc:
            assert str(exc).startswith("nsq data source: ") and "\n" not in str(exc)
