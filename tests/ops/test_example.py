"""examples/operations.py runs, and what its docstring says to ask it answers."""

from __future__ import annotations

import asyncio

import aiohttp

import flowkit
from flowkit.testing import TestDriver


async def test_the_operations_example_answers_tables_and_metrics() -> None:
    from examples import operations

    app = operations.app
    assert app.graph().check() == []
    async with TestDriver(app, clock=flowkit.SystemClock(), web_port=0) as driver:
        web = driver.worker.web
        assert web is not None
        for _ in range(100):  # the example's own traffic flows
            if driver.worker.records_in >= 200:
                break
            await asyncio.sleep(0.02)
        customer, seen = next(iter(driver.store(operations.orders_per_customer).items()))
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{web.url}/tables/orders_per_customer/{customer}") as response:
                found = response.status, await response.json()
            async with http.get(f"{web.url}/metrics") as response:
                metrics = await response.text()
    status, body = found
    assert status == 200 and body["key"] == customer and body["value"] >= seen >= 1
    assert "shop_big_orders_total{country=" in metrics
    assert 'flowkit_table_keys{partition="0",table="orders_per_customer"}' in metrics
