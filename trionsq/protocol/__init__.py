"""The NSQ TCP protocol V2, sans-IO: no sockets, no Trio.

Shared by the client (:mod:`trionsq`) and the server (:mod:`fakensq`):

- :mod:`.commands`: encoders for every command, and the server's incremental parser;
- :mod:`.frames`: frames and the message layout, and the client's incremental parser;
- :mod:`.identify`: IDENTIFY's body and answer (the feature negotiation), AUTH's answer;
- :mod:`.names`: topic and channel name validation;
- :mod:`.peers`: an nsqd as nsqlookupd's HTTP answers describe it (its ``peerInfo``);
- :mod:`.states`: the connection state machine: which command is valid in which
  state, the transitions, and nsqd's error for each violation;
- :mod:`.errors`: the error codes as a typed exception hierarchy;
- :mod:`.codecs`: the deflate and snappy stream codecs.
"""

from . import codecs, commands, frames, identify, names, states
from .commands import MAGIC_V2, Command, CommandParser
from .errors import *  # noqa: F403 - the hierarchy is the public API
from .errors import __all__ as _errors_all
from .frames import (
    HEARTBEAT,
    MSG_ID_LENGTH,
    OK,
    Error,
    Frame,
    FrameParser,
    MessageFrame,
    Response,
)
from .names import is_ephemeral, is_valid_channel_name, is_valid_name, is_valid_topic_name

__all__ = [
    "codecs",
    "commands",
    "frames",
    "identify",
    "names",
    "states",
    "MAGIC_V2",
    "Command",
    "CommandParser",
    "HEARTBEAT",
    "MSG_ID_LENGTH",
    "OK",
    "Error",
    "Frame",
    "FrameParser",
    "MessageFrame",
    "Response",
    "is_ephemeral",
    "is_valid_channel_name",
    "is_valid_name",
    "is_valid_topic_name",
    *_errors_all,
]
