"""The router example end to end: good, bad and edge-case records."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from examples import router
from tests.conftest import DriverFactory


def order(
    n: int,
    total: float,
    country: str = "NL",
    express: bool = False,
    test: bool = False,
) -> dict[str, Any]:
    return {
        "order": {"id": f"o{n}", "total": total, "express": express},
        "customer": {"id": f"c{n}", "email": f"U{n}@Example.com", "country": country, "test": test},
    }


async def test_router_filters_transforms_and_fans_out(make_driver: DriverFactory) -> None:
    app = router.make_app(demo_traffic=False)
    inputs = [
        order(1, 1500.0, "NL"),  # big EU order + analytics
        order(2, 1500.0, "US"),  # analytics only (not EU)
        order(3, 10.0, "DE", express=True),  # express -> shipping + audit, + analytics
        order(4, 10.0, "JP", test=True),  # test customer: no route at all
        order(5, 1000.0, "BE"),  # exactly 1000 is not > 1000: analytics only
    ]
    async with make_driver(app) as driver:
        for i, value in enumerate(inputs):
            await driver.send("orders-in", value, key=f"k{i}")
        # Bad records: not JSON, not an object, and an object a transform cannot handle.
        await driver.send_raw("orders-in", b"{not json")
        await driver.send_raw("orders-in", b"[1, 2, 3]")
        await driver.send("orders-in", {"order": {"id": "o9", "total": 5, "express": True}})
        await driver.run_until_idle()
        big = await driver.values("orders-big")
        express = await driver.values("shipping-express")
        audit = await driver.values("audit")
        analytics = await driver.values("analytics")
        dead = await driver.dead_letters()

    assert big == [{"order": {"id": "o1", "total": 1500.0}, "customer": {"id": "c1"}}]
    assert express == audit == [{"id": "o3", "ship_to": "DE", "kind": "x"}]
    ids = sorted(a["order"]["id"] for a in analytics)
    assert ids == ["o1", "o2", "o3", "o5"]
    first = next(a for a in analytics if a["order"]["id"] == "o1")
    expected_hash = hashlib.sha256(b"pepper" + b"U1@Example.com").hexdigest()
    assert first == {
        "order": {"id": "o1", "total": 1500.0},
        "customer": {"email": expected_hash, "country": "nl"},
    }
    stages = sorted(
        (dict(d.headers)["flowkit.error.stage"], dict(d.headers)["flowkit.error.type"])
        for d in dead
    )
    assert stages == [
        (b"decode", b"DecodeError"),
        (b"decode", b"DecodeError"),
        (b"process", b"MissingFieldError"),
    ]
    assert {d.value for d in dead} >= {b"{not json", b"[1, 2, 3]"}


async def test_routes_come_from_plain_config() -> None:
    from flowkit.testing import TestDriver

    routes = [
        {
            "name": "only-nl",
            "filter": {"field": "customer.country", "op": "==", "value": "NL"},
            "transform": {"pick": ["order.id"]},
            "to": ["nl", "everything-nl"],
        }
    ]
    app = router.make_app(routes, demo_traffic=False)
    async with TestDriver(app) as driver:
        await driver.send("orders-in", order(1, 1.0, "NL"))
        await driver.send("orders-in", order(2, 1.0, "BE"))
        await driver.run_until_idle()
        assert await driver.values("nl") == [{"order": {"id": "o1"}}]
        assert await driver.values("everything-nl") == [{"order": {"id": "o1"}}]
    assert json.dumps(routes)  # the config is plain data
