"""OpenTelemetry is optional: ``import trionsq`` never imports it, and the
clients work without it (the trace context envelope included, with no context
in it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

#: run first in the child: any import of opentelemetry fails, as uninstalled
BLOCK = textwrap.dedent(
    """
    import sys

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name == "opentelemetry" or name.startswith("opentelemetry."):
                raise ImportError(f"blocked: {name}")
            return None

    sys.meta_path.insert(0, Block())
    """
)


def run(code: str, block: bool) -> str:
    program = (BLOCK if block else "") + textwrap.dedent(code)
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_import_trionsq_imports_no_opentelemetry() -> None:
    code = """
        import sys
        import trionsq, trionsq.telemetry, trionsq.tracecontext
        print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
    """
    assert run(code, block=False).strip() == "[]"
    assert run(code, block=True).strip() == "[]"


def test_the_clients_and_the_envelope_work_without_opentelemetry() -> None:
    code = """
        import trio, trionsq
        from fakensq.nsqd.node import NSQD

        async def main():
            async with trio.open_nursery() as nursery:
                node = NSQD()
                await nursery.start(node.run)
                address = [node.tcp_address]
                async with trionsq.Producer(address, trace_context=True) as producer:
                    await producer.publish("t", b"wrapped")
                async with trionsq.Producer(address) as producer:
                    await producer.publish("t", b"plain")
                got = []
                async with trionsq.Consumer(
                    "t", "c", nsqd_tcp_addresses=address, trace_context=True
                ) as consumer:
                    async for message in consumer:
                        got.append(message.body)
                        await message.finish()
                        if len(got) == 2:
                            break
                async with trionsq.Producer(address, trace_context=True) as producer:
                    await producer.publish("t", b"seen raw")
                async with trionsq.Consumer("t", "c", nsqd_tcp_addresses=address) as consumer:
                    async for message in consumer:
                        got.append(message.body)
                        await message.finish()
                        break
                print(got)
                nursery.cancel_scope.cancel()

        trio.run(main)
    """
    out = run(code, block=True).strip()
    # the consumer without the option sees the envelope (no context in it)
    assert out == repr([b"wrapped", b"plain", b"\x9dTC\x01\x00\x00\x00seen raw"])
