"""A Flask app whose views publish to NSQ through one long-lived blocking Producer.

The producer is made lazily, by the first request that needs it in each process,
shared by all the threads of that process, and closed at exit: the recipe for
any WSGI app (Flask, Django, Pyramid).  Made lazily, it is never made in a
gunicorn or uwsgi master that preloads the app, so each forked worker has its
own connection (a producer started before a fork would reconnect in the child
anyway: ``after_fork="reconnect"``, see docs/frontends.md).

    NSQD_TCP_ADDRESSES=127.0.0.1:4150 flask --app examples/flask_publish.py run

then ``curl -X POST --data-binary 'hello' localhost:5000/publish/clicks``.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable

from flask import Flask, Response, current_app, jsonify, request

import trionsq
from trionsq import blocking

_lock = threading.Lock()


def get_producer() -> blocking.Producer:
    """This process's producer for the current app, started on first use."""
    producer: blocking.Producer | None = current_app.extensions.get("nsq_producer")
    if producer is None:
        with _lock:  # two first requests at once make one producer
            producer = current_app.extensions.get("nsq_producer")
            if producer is None:
                producer = blocking.Producer(current_app.config["NSQD_TCP_ADDRESSES"]).start()
                atexit.register(producer.close)
                current_app.extensions["nsq_producer"] = producer
    return producer


def create_app(nsqd_tcp_addresses: list[str] | None = None) -> Flask:
    app = Flask(__name__)
    app.config["NSQD_TCP_ADDRESSES"] = nsqd_tcp_addresses or os.environ.get(
        "NSQD_TCP_ADDRESSES", "127.0.0.1:4150"
    ).split(",")

    @app.post("/publish/<topic>")
    def publish(topic: str) -> tuple[Response, int]:
        # Returns once nsqd acknowledged: the client knows the message is stored.
        return answer(lambda: get_producer().publish(topic, request.get_data(), timeout=5), topic)

    @app.post("/publish-many/<topic>")
    def publish_many(topic: str) -> tuple[Response, int]:
        bodies = [line.encode() for line in request.get_data(as_text=True).splitlines()]
        if not bodies:
            return jsonify(error="no lines"), 400
        return answer(lambda: get_producer().multi_publish(topic, bodies, timeout=5), len(bodies))

    return app


def answer(publish: Callable[[], None], published: object) -> tuple[Response, int]:
    """Every view's answer to a publish: 201, or the error mapped to a status
    (the client's mistake 400, NSQ unreachable or too slow 503)."""
    try:
        publish()
    except trionsq.BadTopicError as exc:
        return jsonify(error=str(exc)), 400
    except (trionsq.NSQError, TimeoutError) as exc:
        return jsonify(error=str(exc)), 503
    return jsonify(published=published), 201


def close_producer(app: Flask) -> None:
    """Close the app's producer now (tests; at exit, atexit does it)."""
    producer = app.extensions.pop("nsq_producer", None)
    if producer is not None:
        producer.close()


if __name__ == "__main__":
    create_app().run()
