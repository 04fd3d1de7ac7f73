"""Run other NSQ clients' own test suites against the real daemons and against
fakensq's stand-ins (``fakensq shims``), and compare what passes.

Not part of the suite (nothing here is collected by pytest): a check to run by
hand when the daemons change.  It never keeps the clients' code: each client
is installed into a virtualenv under a temporary folder, its tests come from
its source distribution (``pip download --no-binary :all:``) or, when the
sdist lacks them, from a checkout you point at, and the folder is removed at
the end::

    python tests/peer_suites.py gnsq
    python tests/peer_suites.py ansq --tests ~/src/ansq/tests      # conftest.py is not in its sdist
    python tests/peer_suites.py pynsq --tests ~/src/pynsq/tests    # no tests in its sdist

Each suite starts ``nsqd``/``nsqlookupd`` by name (most on nsqd's default
ports 4150/4151/4160/4161: run one suite at a time, on a machine where those
are free).  The real binaries come from ``tests/reference.py``.

Results seen with NSQ v1.3.0 (see the final report of issue 12):

- pynsq 0.9.1: 14/14 with the real daemons; with fakensq before the fix,
  ``LookupdReaderIntegrationTest::test_reader_messages`` failed (the
  ``nsqlookupd`` stand-in listened on free ports, not v1.3.0's 0.0.0.0:4160/4161);
- ansq 0.3.0: 107/107 with the real daemons (its lookupd tests are timing
  sensitive on a loaded machine, with either); with fakensq before the fix,
  ``test_reader_lookupd.py::test_restore_connection`` failed (a killed nsqd came
  back without its topics: nsqd.dat was not kept);
- gnsq 1.0.2: 108/108 with both.

Issue 26: pynsq's ``ReaderIntegrationTest`` (TLS and snappy: ``test_conn_subscribe``,
``test_conn_messages``, ``test_reader_messages``, ``test_reader_coro``) failed with
the real nsqd and passed with fakensq, which sent each answer as one TLS record;
nsqd writes an uncompressed snappy chunk's header and data as two records and
pynsq's ``SnappySocket`` closes the connection on a record that decompresses to
nothing.  Now they fail with both (``tests/conformance/test_pynsq_suite.py``
runs the four cases on both in the suite).  ``-k`` selects tests, as pytest's::

    python tests/peer_suites.py pynsq --tests ~/src/pynsq/tests -k ReaderIntegrationTest
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import reference  # noqa: E402

#: What each client's suite needs beside the client.
SUITES = {
    "gnsq": {"deps": ["pytest", "pytest-timeout", "python-snappy"], "args": []},
    "ansq": {
        "deps": ["pytest<8", "pytest-asyncio<0.22", "async_generator"],
        "args": ["-o", "asyncio_mode=auto"],
    },
    "pynsq": {"deps": ["pytest", "tornado"], "args": []},
}


def run_suite(name: str, tests: Path | None, work: Path, select: str = "") -> dict[str, str]:
    suite = SUITES[name]
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    sdist = work / "sdist"
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--no-binary",
            ":all:",
            "-d",
            str(sdist),
            name,
        ],
        check=True,
    )
    (archive,) = sdist.glob("*.tar.gz")
    shutil.unpack_archive(archive, work / "src")
    (source,) = (work / "src").iterdir()
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", str(source), *suite["deps"]], check=True
    )
    test_dir = work / "tests"
    shutil.copytree(tests if tests is not None else source / "tests", test_dir)
    shims = work / "shims"
    subprocess.run([sys.executable, "-m", "fakensq", "shims", str(shims)], check=True, cwd=ROOT)
    real_bin = reference.nsq_bin()
    if real_bin is None:
        raise SystemExit(reference.skip_reason())
    outcomes: dict[str, str] = {}
    for kind, folder in (("real", real_bin), ("fakensq", shims)):
        env = {
            **os.environ,
            "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": str(ROOT),  # for the shims: this checkout's fakensq
        }
        done = subprocess.run(
            [
                str(python),
                "-m",
                "pytest",
                "-q",
                "-rA",
                "-p",
                "no:cacheprovider",
                *suite["args"],
                *(["-k", select] if select else []),
                str(test_dir),
            ],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        outcomes[kind] = done.stdout.strip().splitlines()[-1] if done.stdout else done.stderr
        failed = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
        print(f"== {name} with {kind}: {outcomes[kind]}")
        for line in failed:
            print("   ", line)
    return outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("client", choices=sorted(SUITES))
    parser.add_argument("--tests", type=Path, help="the client's tests folder (a checkout's)")
    parser.add_argument("-k", dest="select", default="", help="pytest's -k: the tests to run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix=f"peer-{args.client}-") as work:
        run_suite(args.client, args.tests, Path(work), args.select)


if __name__ == "__main__":
    main()
