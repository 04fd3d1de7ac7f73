"""Archive an NSQ topic to Parquet with Spark: nsq_to_file at Spark scale.

Every message of the channel becomes a row (body, id, timestamp, attempts,
nsqd_address, topic) in Parquet files; a message is FINed only once the batch
holding it is committed, so a crash loses nothing (it may write a message twice).

Against a real cluster (the messages are read on the executors; the driver only
plans batches)::

    python examples/spark_archive.py --lookupd 127.0.0.1:4161 --topic clicks \\
        --channel archive --output /data/clicks --checkpoint /data/clicks.checkpoint \\
        [--master spark://host:7077] [--option msg_timeout=120 ...]

Started again with the same ``--checkpoint`` after a crash, it carries on where the
last committed batch ended: what the crashed run had not committed comes again
from nsqd.

With no arguments it starts an embedded fakensq nsqd, publishes a few thousand
messages, archives them (trigger availableNow) and prints what was written.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
from pathlib import Path

import trio
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

import trionsq
from trionsq.spark import NSQDataSource
from trionsq.stopping import EXIT_ABORTED, StopOnSignals


def archive(
    spark: SparkSession,
    *,
    topic: str,
    channel: str,
    output: str,
    checkpoint: str,
    connect: dict[str, str],
    once: bool = False,
    max_messages_per_trigger: int | None = None,
    every: str = "5 seconds",
    options: dict[str, str] | None = None,
) -> StreamingQuery:
    """Start the archiving query (``connect``: nsqd_tcp_addresses or lookupd_http_addresses;
    ``options``: more of the source's options)."""
    spark.dataSource.register(NSQDataSource)
    reader = (
        spark.readStream.format("nsq")
        .option("topic", topic)
        .option("channel", channel)
        .options(**connect)
        .options(**(options or {}))
    )
    if max_messages_per_trigger is not None:
        reader = reader.option("max_messages_per_trigger", str(max_messages_per_trigger))
    stream = reader.load()
    writer = (
        stream.selectExpr("*", "to_date(timestamp) AS date")
        .writeStream.format("parquet")
        .partitionBy("date")
        .option("checkpointLocation", checkpoint)
    )
    writer = writer.trigger(availableNow=True) if once else writer.trigger(processingTime=every)
    return writer.start(output)


def local_session(master: str = "local[2]") -> SparkSession:
    session = (
        SparkSession.builder.master(master)
        .appName("nsq-archive")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


def demo() -> None:
    """Archive 3000 messages published to an embedded fakensq nsqd."""
    from fakensq import NSQD
    from fakensq.testing.threaded import BackgroundNode

    async def publish(address: str) -> None:
        async with trionsq.Producer(nsqd_tcp_addresses=[address]) as producer:
            for start in range(0, 3000, 500):
                await producer.multi_publish(
                    "clicks", [b'{"click": %d}' % i for i in range(start, start + 500)]
                )

    node = BackgroundNode(lambda: NSQD(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0"))
    with node as nsqd, tempfile.TemporaryDirectory() as tmp:
        trio.run(publish, nsqd.tcp_address)
        spark = local_session()
        query = archive(
            spark,
            topic="clicks",
            channel="archive",
            output=str(Path(tmp, "clicks")),
            checkpoint=str(Path(tmp, "checkpoint")),
            connect={"nsqd_tcp_addresses": nsqd.tcp_address},
            once=True,
            max_messages_per_trigger=1000,
        )
        query.awaitTermination()
        archived = spark.read.parquet(str(Path(tmp, "clicks")))
        print(f"archived {archived.count()} messages in {len(query.recentProgress)} batches")
        archived.selectExpr(
            "CAST(body AS STRING) AS body", "id", "timestamp", "attempts", "nsqd_address"
        ).orderBy("timestamp").show(3, truncate=False)
        spark.stop()


def run_until_stopped(query: StreamingQuery) -> int:
    """Wait for the query to end, or stop it cleanly on the first SIGINT
    (Ctrl-C) or SIGTERM: what the last committed batch holds stays written and
    FINed, what was not committed comes again from nsqd at the next run.  A
    second signal stops at once (exit 130)."""
    stopping = threading.Event()
    try:
        with StopOnSignals(stopping.set) as signals:
            print("running (Ctrl-C to stop)", flush=True)
            # In slices: the signal handler runs between them, in this thread.
            while not stopping.is_set() and not query.awaitTermination(0.5):
                pass
            if signals.received:
                query.stop()
                batches = len(query.recentProgress)
                print(f"stopped on {signals.received} after {batches} batch(es)", flush=True)
    except KeyboardInterrupt:
        print("aborted", flush=True)
        return EXIT_ABORTED
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topic")
    parser.add_argument("--channel", default="archive")
    parser.add_argument("--nsqd", help="nsqd TCP addresses, comma-separated")
    parser.add_argument("--lookupd", help="nsqlookupd HTTP addresses, comma-separated")
    parser.add_argument("--output", help="where the Parquet files go")
    parser.add_argument("--checkpoint", help="the query's checkpoint directory")
    parser.add_argument("--once", action="store_true", help="archive what is there, then stop")
    parser.add_argument("--master", default="local[2]", help="Spark's master URL")
    parser.add_argument("--every", default="5 seconds", help="the trigger's interval")
    parser.add_argument("--max-per-trigger", type=int, help="messages per micro-batch at most")
    parser.add_argument(
        "--option", action="append", default=[], metavar="NAME=VALUE", help="a source option"
    )
    args = parser.parse_args(argv)
    if args.topic is None:
        demo()
        return 0
    if not args.output or not args.checkpoint or not (args.nsqd or args.lookupd):
        parser.error("--topic needs --output, --checkpoint and --nsqd or --lookupd")
    connect = {}
    if args.nsqd:
        connect["nsqd_tcp_addresses"] = args.nsqd
    if args.lookupd:
        connect["lookupd_http_addresses"] = args.lookupd
    options = dict(option.split("=", 1) for option in args.option)
    query = archive(
        local_session(args.master),
        topic=args.topic,
        channel=args.channel,
        output=args.output,
        checkpoint=args.checkpoint,
        connect=connect,
        once=args.once,
        max_messages_per_trigger=args.max_per_trigger,
        every=args.every,
        options=options,
    )
    return run_until_stopped(query)


if __name__ == "__main__":
    sys.exit(main())
