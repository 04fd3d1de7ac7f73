"""Which Spark executor this Python process works for, found from its ancestors.

A task's Python worker is forked by PySpark's daemon, which the executor's JVM
started (without the daemon, the JVM starts the worker itself).  The JVM's
command line names the executor (``--executor-id``), the address Spark reaches
it at (``--hostname``) and its task slots (``--cores``); in local mode the
"executor" is the driver's JVM, which has none of these.  Linux's ``/proc`` is
read when it is there; elsewhere only the defaults are known.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ExecutorIdentity",
    "driver_settings",
    "executor_cores",
    "identify",
    "parent_of",
    "process_alive",
    "process_start_time",
    "settings_of",
]


@dataclass(frozen=True, slots=True)
class ExecutorIdentity:
    #: Spark's executor id (``"driver"`` in local mode)
    executor_id: str
    #: the address other executors reach this one at
    host: str
    #: the executor's task slots
    cores: int
    #: the process whose life bounds the agent's: the daemon (or JVM) above the worker
    anchor_pid: int


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def parent_of(pid: int) -> int | None:
    """The parent process id of ``pid`` (Linux ``/proc``), if known."""
    if pid == os.getpid():
        return os.getppid()
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may itself hold spaces or parentheses.
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[1])


def process_start_time(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot, to tell a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def process_alive(pid: int, start: int | None) -> bool:
    """Whether process ``pid`` still runs and is the one that started at
    ``start`` (:func:`process_start_time`; ``None``: any process of that pid).
    A process of another user counts as alive (signalling it is refused, which
    says it exists)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return start is None or process_start_time(pid) in (None, start)


def _flag(argv: list[str], name: str) -> str | None:
    for index, part in enumerate(argv[:-1]):
        if part == name:
            return argv[index + 1]
    return None


def identify(worker_pid: int | None = None) -> ExecutorIdentity:
    """The executor that runs the Python worker ``worker_pid`` (default: this process)."""
    override = os.environ.get("TRIONSQ_SPARK_AGENT_ANCHOR")
    worker = os.getpid() if worker_pid is None else worker_pid
    anchor = parent_of(worker) or os.getppid()
    jvm = anchor
    if any("pyspark.daemon" in part or part.endswith("daemon.py") for part in _cmdline(anchor)):
        jvm = parent_of(anchor) or anchor
    argv = _cmdline(jvm)
    executor_id = _flag(argv, "--executor-id") or "driver"
    host = (
        _flag(argv, "--hostname")
        or os.environ.get("SPARK_LOCAL_IP")
        or os.environ.get("SPARK_LOCAL_HOSTNAME")
        or "127.0.0.1"
    )
    cores_flag = _flag(argv, "--cores")
    try:
        cores = int(cores_flag) if cores_flag is not None else (os.cpu_count() or 1)
    except ValueError:
        cores = os.cpu_count() or 1
    if override:
        anchor = int(override)
    return ExecutorIdentity(executor_id, host, max(1, cores), anchor)


def short_hostname() -> str:
    return socket.gethostname().split(".")[0]


def settings_of(argv: list[str]) -> dict[str, str]:
    """The Spark settings a ``SparkSubmit`` command line gives: its
    ``--properties-file`` (Kubernetes' driver pods have one), then ``--master`` and
    each ``--conf name=value`` (PySpark starts its JVM with the session builder's)."""
    found: dict[str, str] = {}
    for index, part in enumerate(argv[:-1]):
        if part == "--properties-file":
            found.update(_properties(argv[index + 1]))
    for index, part in enumerate(argv[:-1]):
        value = argv[index + 1]
        if part == "--master":
            found["spark.master"] = value
        elif part == "--conf" and "=" in value:
            name, _, setting = value.partition("=")
            found[name.strip()] = setting.strip()
    return found


def _properties(path: str) -> dict[str, str]:
    """The ``spark.*`` lines of a properties file (``name=value``, ``name value``)."""
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return {}
    found: dict[str, str] = {}
    for line in lines:
        match = _PROPERTY.match(line.strip())
        if match:
            found[match[1]] = match[2].strip()
    return found


#: ``name=value``, ``name: value`` or ``name value`` (Java's properties files)
_PROPERTY = re.compile(r"(spark\.[^\s=:]+)\s*[=:\s]\s*(.*)")


#: ``local``, ``local[4]``, ``local[*]``, ``local[4,2]`` (retries), ``local-cluster[2,1,1024]``
_LOCAL = re.compile(r"local(?:\[(\d+|\*)(?:,\s*\d+)?\])?$")
_LOCAL_CLUSTER = re.compile(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]$")


def executor_cores(settings: dict[str, str] | None) -> int | None:
    """How many tasks the application's executors run at once, as far as the
    driver's settings (:func:`driver_settings`) say: the master's own count in
    local and local-cluster mode, else ``spark.executor.instances`` times
    ``spark.executor.cores`` when both are set; None when unknown (dynamic
    allocation, a standalone worker's cores, ...)."""
    settings = settings or {}
    master = settings.get("spark.master", "").strip()
    if match := _LOCAL.match(master):
        count = match[1]
        if count is None:
            return 1
        return (os.cpu_count() or 1) if count == "*" else max(1, int(count))
    if match := _LOCAL_CLUSTER.match(master):
        return max(1, int(match[1]) * int(match[2]))
    try:
        instances = int(settings["spark.executor.instances"])
        cores = int(settings["spark.executor.cores"])
    except (KeyError, ValueError):
        return None
    return instances * cores if instances > 0 and cores > 0 else None


def driver_settings(pid: int | None = None) -> dict[str, str] | None:
    """The Spark settings of the driver JVM above process ``pid`` (default: this
    one, which runs the source's driver half as a child of that JVM), or None if
    no ``SparkSubmit`` JVM is found among its ancestors: spark-defaults.conf, then
    its command line (:func:`settings_of`); a master set nowhere is Spark's
    default, ``local[*]``."""
    current: int | None = os.getpid() if pid is None else pid
    for _ in range(4):
        current = parent_of(current) if current is not None else None
        if current is None or current <= 1:
            return None
        argv = _cmdline(current)
        if "org.apache.spark.deploy.SparkSubmit" in argv:
            folder = os.environ.get("SPARK_CONF_DIR") or os.path.join(
                os.environ.get("SPARK_HOME", ""), "conf"
            )
            found = _properties(os.path.join(folder, "spark-defaults.conf"))
            found.update(settings_of(argv))
            found.setdefault("spark.master", os.environ.get("MASTER") or "local[*]")
            return found
    return None
