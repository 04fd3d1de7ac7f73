"""NSQ's own counts that no object outlives: reconnects and the non-fatal
errors nsqd answers (``E_FIN_FAILED``, ``E_REQ_FAILED``, ``E_TOUCH_FAILED``),
process-wide, by nsqd address.  Plain dictionaries (no OpenTelemetry): the
connections and consumers count whether or not anyone reads them; the
``messaging.nsq.client.reconnects`` and ``.errors`` metrics read them."""

from __future__ import annotations

from collections import Counter

__all__ = ["count_error", "count_reconnect", "errors", "reconnects"]

#: non-fatal error frames received, by (nsqd address, error code)
errors: Counter[tuple[str, str]] = Counter()
#: connections attempted again after one to the same nsqd ended, by address
reconnects: Counter[str] = Counter()


def count_error(address: str, code: str) -> None:
    errors[address, code] += 1


def count_reconnect(address: str) -> None:
    reconnects[address] += 1
