"""A streaming aggregation written back to NSQ: page views counted per page.

Reads JSON click events (``{"page": "/home", "user": "u1"}``) from a topic,
counts them per page, and publishes each updated count as JSON
(``{"page": "/home", "views": 42}``) to another topic, every micro-batch.

Against a real cluster::

    python examples/spark_aggregate.py --nsqd 127.0.0.1:4150 --checkpoint /tmp/agg

With no arguments it starts an embedded fakensq nsqd, publishes clicks, runs the
aggregation once (trigger availableNow) and prints the counts it published.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading

import trio
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

import trionsq
from trionsq.spark import NSQDataSource
from trionsq.stopping import EXIT_ABORTED, StopOnSignals

PAGES = ["/home", "/pricing", "/docs", "/blog"]


def aggregate(
    spark: SparkSession,
    *,
    nsqd: str,
    checkpoint: str,
    source_topic: str = "clicks",
    channel: str = "page-views",
    sink_topic: str = "page_views",
    once: bool = False,
) -> StreamingQuery:
    """Start the query: clicks in, per-page counts out.

    Output mode ``complete``: every micro-batch publishes the whole table of counts
    (Spark's Python data source sinks take append and complete, not update).
    """
    spark.dataSource.register(NSQDataSource)
    clicks = (
        spark.readStream.format("nsq")
        .option("topic", source_topic)
        .option("channel", channel)
        .option("nsqd_tcp_addresses", nsqd)
        .load()
        .select(F.from_json(F.col("body").cast("string"), "page string, user string").alias("c"))
    )
    counts = clicks.groupBy("c.page").agg(F.count("*").alias("views"))
    writer = (
        counts.select(F.to_json(F.struct("page", "views")).alias("value"))
        .writeStream.format("nsq")
        .outputMode("complete")
        .option("topic", sink_topic)
        .option("nsqd_tcp_addresses", nsqd)
        .option("checkpointLocation", checkpoint)
    )
    writer = (
        writer.trigger(availableNow=True) if once else writer.trigger(processingTime="5 seconds")
    )
    return writer.start()


async def publish_clicks(nsqd: str, count: int, topic: str = "clicks") -> None:
    async with trionsq.Producer(nsqd_tcp_addresses=[nsqd]) as producer:
        await producer.multi_publish(
            topic,
            [
                json.dumps({"page": PAGES[i % len(PAGES)], "user": f"u{i % 7}"}).encode()
                for i in range(count)
            ],
        )


async def latest_counts(nsqd: str, topic: str = "page_views") -> dict[str, int]:
    """Read the published counts until the topic is quiet; the last one per page wins."""
    counts: dict[str, int] = {}
    async with trionsq.Consumer(
        topic, "printer", nsqd_tcp_addresses=[nsqd], max_in_flight=100
    ) as consumer:
        while True:
            with trio.move_on_after(1.0) as quiet:
                message = await consumer.__anext__()
            if quiet.cancelled_caught:
                return counts
            update = json.loads(message.body)
            counts[update["page"]] = max(counts.get(update["page"], 0), update["views"])
            await message.finish()


def demo() -> None:
    from fakensq import NSQD
    from fakensq.testing.threaded import BackgroundNode

    node = BackgroundNode(lambda: NSQD(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0"))
    with node as nsqd, tempfile.TemporaryDirectory() as checkpoint:
        trio.run(publish_clicks, nsqd.tcp_address, 1000)
        spark = (
            SparkSession.builder.master("local[2]")
            .appName("nsq-aggregate")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        query = aggregate(spark, nsqd=nsqd.tcp_address, checkpoint=checkpoint, once=True)
        query.awaitTermination()
        for page, views in sorted(trio.run(latest_counts, nsqd.tcp_address).items()):
            print(f"{page:10} {views}")
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
    parser.add_argument("--nsqd", help="nsqd TCP address(es), comma-separated")
    parser.add_argument("--checkpoint", help="the query's checkpoint directory")
    args = parser.parse_args(argv)
    if args.nsqd is None:
        demo()
        return 0
    if not args.checkpoint:
        parser.error("--nsqd needs --checkpoint")
    spark = SparkSession.builder.appName("nsq-aggregate").getOrCreate()
    return run_until_stopped(aggregate(spark, nsqd=args.nsqd, checkpoint=args.checkpoint))


if __name__ == "__main__":
    sys.exit(main())
