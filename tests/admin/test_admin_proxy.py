"""The admin's fault buttons for ``fakensq proxy``, end to end with the REAL nsqd:

    real nsqd  <-  fakensq proxy  <-  a trionsq consumer
                       ^
                 fakensq admin --proxy-http-address (its Faults page)

The page shows the proxy's buttons (only the wire's faults; the faults inside
nsqd greyed with the reason), its connections and its faults in force; the
request a button sends (``POST /api/action``, the button's data-* attributes as
the page's script sends them: strings) drops the consumer's connection, the
consumer reconnects and every message arrives.
"""

from __future__ import annotations

import re

import httpx
import pytest
import trio

import trionsq
from fakensq.admin import Admin
from fakensq.cli.nsqadmin import admin_flagset, admin_options_from_flags
from fakensq.testing.proxy import WIRE_KINDS, FaultProxy
from tests import reference
from tests.support.ports import free_address

from ..support.waiting import wait_until

needs_nsqd = pytest.mark.skipif(reference.binary("nsqd") is None, reason=reference.skip_reason())


async def _publish(address: str, topic: str, bodies: list[bytes]) -> None:
    """Publish as a correct producer does: retry what nsqd did not acknowledge."""
    with trio.fail_after(30):
        while True:
            try:
                async with trionsq.Producer(nsqd_tcp_addresses=[address]) as producer:
                    await producer.multi_publish(topic, bodies)
                return
            except trionsq.NSQError:
                await trio.sleep(0.1)


def _press(page: str, action: str, **match: str) -> dict[str, str]:
    """The request the page's script sends for the button ``action`` whose data-*
    attributes include ``match``: the button's data-* attributes, as strings."""
    for tag in re.findall(r"<button [^>]*>", page):
        data = dict(re.findall(r' data-([\w-]+)="([^"]*)"', tag))
        if data.get("action") != action or any(data.get(k) != v for k, v in match.items()):
            continue
        data.pop("confirm", None)
        return {re.sub(r"-(\w)", lambda m: m.group(1).upper(), k): v for k, v in data.items()}
    raise AssertionError(f"no button {action} {match} on the page")


async def _faults_page(http: httpx.AsyncClient) -> str:
    answer = await http.get("/timeline")
    assert answer.status_code == 200
    return answer.text


@needs_nsqd
async def test_the_admins_proxy_buttons_drop_a_consumer_that_gets_every_message() -> None:
    async with (
        reference.open_nsqd("--msg-timeout=2s") as nsqd,
        FaultProxy(nsqd.tcp_address) as proxy,
        Admin(
            nsqd_http_addresses=[nsqd.http_address],
            proxy_http_addresses=[str(proxy.http_address)],
            http_address="127.0.0.1:0",
        ) as admin,
        httpx.AsyncClient(base_url=admin.url, timeout=10) as http,
    ):
        page = await _faults_page(http)
        assert "<title>Faults and timeline" in page
        for kind in WIRE_KINDS:  # every fault a proxy can do, and only those
            assert f'data-action="fault/proxy-{kind}"' in page, kind
        assert "fault/kill-nsqd" not in page and "fault/timeout-in-flight" not in page
        for kind in ("restart", "time_out", "requeue_storm"):
            greyed = re.search(rf'<button [^>]*disabled [^>]*data-cannot="{kind}"', page)
            assert greyed is not None and "inside nsqd" in greyed.group(0), kind
        assert f"→ nsqd {nsqd.tcp_address}" in page

        first = [b"a%02d" % i for i in range(40)]
        second = [b"b%02d" % i for i in range(40)]
        await _publish(proxy.tcp_address, "admin_proxied", first)
        handled: list[bytes] = []

        async def handle(message: trionsq.Message) -> None:
            await trio.sleep(0.01)
            handled.append(message.body)

        async with trionsq.Consumer(
            "admin_proxied",
            "c",
            nsqd_tcp_addresses=[proxy.tcp_address],
            handler=handle,
            max_in_flight=5,
        ):
            await wait_until(lambda: len(handled) >= 10)
            page = await _faults_page(http)
            consumers = re.findall(r'<tr data-client="([^"]+)">.*?data-k="role">consumer<', page)
            assert len(consumers) == 1, page
            relayed = proxy.relayed

            body = _press(page, "fault/proxy-drop", role="consumer")
            assert body == {"action": "fault/proxy-drop", "proxy": "0", "role": "consumer"}
            answer = await http.post("/api/action", json=body)
            assert answer.json() == {
                "ok": True,
                "message": f"proxy {proxy.http_address}: dropped 1 connection(s) (consumers')",
            }
            await wait_until(lambda: proxy.relayed > relayed)  # the consumer came back
            await _publish(proxy.tcp_address, "admin_proxied", second)
            await wait_until(lambda: set(handled) >= set(first + second))
        assert set(handled) == set(first + second)

        # A lasting fault: on the page with its Heal button, healed by it.
        page = await _faults_page(http)
        answer = await http.post("/api/action", json=_press(page, "fault/proxy-stall"))
        assert answer.json()["ok"] and "stall #" in answer.json()["message"]
        [active] = proxy.faults.active
        page = await _faults_page(http)
        assert f'<tr data-fault="{active.id}"><td>#{active.id}</td><td>stall</td>' in page
        heal = _press(page, "fault/proxy-heal", fault=str(active.id))
        assert (await http.post("/api/action", json=heal)).json()["ok"]
        assert proxy.faults.active == []
        events = (await http.get("/api/live/timeline")).json()["sections"]["timeline"]
        assert "dropped 1 connection(s)" in events and f"healed #{active.id} stall" in events


@needs_nsqd
async def test_the_admins_form_sends_any_wire_fault_and_refusals_come_back() -> None:
    async with (
        reference.open_nsqd() as nsqd,
        FaultProxy(nsqd.tcp_address) as proxy,
        Admin(
            nsqd_http_addresses=[nsqd.http_address],
            proxy_http_addresses=[str(proxy.http_address)],
            http_address="127.0.0.1:0",
        ) as admin,
        httpx.AsyncClient(base_url=admin.url, timeout=10) as http,
    ):
        page = await _faults_page(http)
        form = re.search(r'<form [^>]*data-action="fault/proxy"[^>]*>.*?</form>', page)
        assert form is not None
        # not in a live section: what is typed stays while the page refreshes
        live = (await http.get("/api/live/timeline")).json()["sections"]
        assert not any("<form" in html for html in live.values())
        for name in ("action", "client", "role", "direction", "seconds"):
            assert f'name="{name}"' in form.group(0), name
        # What the form sends: its data-* attributes, then its filled fields.
        body = {"action": "fault/proxy-delay", "proxy": "0", "seconds": "0.25", "direction": "in"}
        answer = (await http.post("/api/action", json=body)).json()
        assert answer["ok"], answer
        [delay] = proxy.faults.active
        assert delay.describe()["seconds"] == 0.25 and delay.direction == "in"

        refused = [
            ({"action": "fault/proxy-delay", "proxy": "0"}, "delay needs seconds"),
            ({"action": "fault/proxy-stall", "proxy": "0", "role": "x"}, "role must be"),
            ({"action": "fault/proxy-time_out", "proxy": "0"}, "unknown proxy fault"),
            ({"action": "fault/proxy-drop", "proxy": "3"}, "no proxy 3"),
            ({"action": "fault/proxy-heal", "proxy": "0", "fault": "99"}, "no fault '99'"),
            ({"action": "fault/kill-nsqd", "node": "0"}, "Cluster"),
        ]
        for body, why in refused:
            answer = await http.post("/api/action", json=body)
            assert answer.status_code in (400, 502) and not answer.json()["ok"], body
            assert why in answer.json()["message"], (body, answer.json())
        heal_all = {"action": "fault/proxy-heal", "proxy": "0", "fault": "all"}
        answer = (await http.post("/api/action", json=heal_all)).json()
        assert answer == {"ok": True, "message": f"proxy {proxy.http_address}: healed 1 fault(s)"}


async def test_a_proxy_that_does_not_answer_is_shown_down_and_its_buttons_fail() -> None:
    from fakensq import NSQD

    gone = free_address()  # nothing listens there
    async with (
        NSQD(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0") as nsqd,
        Admin(
            nsqd_http_addresses=[nsqd.http_address],
            proxy_http_addresses=[gone],
            http_address="127.0.0.1:0",
        ) as admin,
        httpx.AsyncClient(base_url=admin.url, timeout=10) as http,
    ):
        page = await _faults_page(http)
        assert f'Fault proxy <span data-k="proxy">{gone}</span>' in page
        assert 'class="badge down"' in page and 'data-k="proxy-error"' in page
        body = {"action": "fault/proxy-drop", "proxy": "0"}
        answer = await http.post("/api/action", json=body)
        assert answer.status_code == 502
        assert answer.json()["message"].startswith(f"proxy {gone}: ")


async def test_without_proxies_the_proxy_buttons_are_refused() -> None:
    from fakensq import NSQD

    async with (
        NSQD(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0") as nsqd,
        Admin(nsqd_http_addresses=[nsqd.http_address], http_address="127.0.0.1:0") as admin,
        httpx.AsyncClient(base_url=admin.url, timeout=10) as http,
    ):
        answer = await http.post("/api/action", json={"action": "fault/proxy-drop"})
        assert answer.status_code == 400
        assert answer.json()["message"] == "proxy faults need --proxy-http-address"
        assert "fault/proxy" not in await _faults_page(http)


def test_the_command_line_takes_proxy_http_addresses() -> None:
    values, _ = admin_flagset().parse(
        [
            "--nsqd-http-address=127.0.0.1:4151",
            "--proxy-http-address=127.0.0.1:4180",
            "--proxy-http-address",
            "127.0.0.1:4181",
        ]
    )
    options = admin_options_from_flags(values)
    assert options.proxy_http_addresses == ["127.0.0.1:4180", "127.0.0.1:4181"]
    options.validate()
    bad = options.replace(proxy_http_addresses=["http://127.0.0.1:4180"])
    with pytest.raises(Exception, match=r"--proxy-http-address \(http://127.0.0.1:4180\)"):
        bad.validate()
