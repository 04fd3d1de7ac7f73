"""trionsq: an NSQ client built on Trio's structured concurrency."""

from .protocol.errors import *  # noqa: F403
from .protocol.errors import __all__ as _errors_all

__version__ = "0.1.0"

__all__ = ["__version__", *_errors_all]
