"""The names trionsq's spans and metrics use: OpenTelemetry's messaging
semantic conventions (status "Development"; the names of schema 1.44.0, as
opentelemetry-semantic-conventions 0.66b2 spells them), and NSQ's own under
``messaging.nsq.*`` where the conventions have none.

Plain strings: importing this imports nothing of OpenTelemetry.
"""

from __future__ import annotations

#: the semantic conventions' schema these names follow
SCHEMA_URL = "https://opentelemetry.io/schemas/1.44.0"

SYSTEM = "nsq"

# attributes
MESSAGING_SYSTEM = "messaging.system"
DESTINATION_NAME = "messaging.destination.name"
SUBSCRIPTION_NAME = "messaging.destination.subscription.name"
OPERATION_TYPE = "messaging.operation.type"
OPERATION_NAME = "messaging.operation.name"
BATCH_MESSAGE_COUNT = "messaging.batch.message_count"
CONSUMER_GROUP_NAME = "messaging.consumer.group.name"
MESSAGE_ID = "messaging.message.id"
MESSAGE_BODY_SIZE = "messaging.message.body.size"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"
# NSQ's own
ATTEMPTS = "messaging.nsq.message.attempts"
OUTCOME = "messaging.nsq.message.outcome"
REQUEUE_DELAY = "messaging.nsq.message.requeue_delay"
DEFER_DELAY = "messaging.nsq.message.defer_delay"
ENVELOPE_PROBLEM = "messaging.nsq.envelope.problem"
#: the Spark executor a span or metric of the Spark source/sink comes from
SPARK_EXECUTOR_ID = "messaging.nsq.spark.executor_id"

# operation types (messaging.operation.type)
SEND = "send"
PROCESS = "process"

# outcomes of a process span (messaging.nsq.message.outcome)
FINISHED = "finished"
REQUEUED = "requeued"
GIVEN_UP = "given_up"
TIMED_OUT = "timed_out"
#: the span ended (the loop moved on, the consumer left) with no answer yet
UNANSWERED = "unanswered"

# metrics
SENT_MESSAGES = "messaging.client.sent.messages"
CONSUMED_MESSAGES = "messaging.client.consumed.messages"
OPERATION_DURATION = "messaging.client.operation.duration"
PROCESS_DURATION = "messaging.process.duration"
RDY = "messaging.nsq.client.rdy"
IN_FLIGHT = "messaging.nsq.client.in_flight"
BACKOFF_LEVEL = "messaging.nsq.client.backoff.level"
SETTLED_MESSAGES = "messaging.nsq.client.settled.messages"
RECONNECTS = "messaging.nsq.client.reconnects"
ERRORS = "messaging.nsq.client.errors"

#: the conventions' advised buckets for both duration histograms (seconds)
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10)


def server_attributes(address: str) -> dict[str, str | int]:
    """``server.address`` and ``server.port`` of an nsqd's ``host:port``
    (``[v6]:port`` too)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return {SERVER_ADDRESS: address}
    return {SERVER_ADDRESS: host.strip("[]"), SERVER_PORT: int(port)}
