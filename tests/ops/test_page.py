"""The live page in a real headless Chromium: the graph renders and its figures move.

Needs Debian's ``chromium`` and ``chromium-driver`` (CI installs them); without them the
test is skipped, saying so.
"""

from __future__ import annotations

import asyncio
import shutil
import time

import pytest

from flowkit.testing import TestDriver
from tests.ops.webapp import Click, build

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs chromium and chromedriver (apt-get install chromium chromium-driver)",
)


# The records the page shows the agent "count" has processed (0 until it shows any).
RECORDS = (
    "const f = document.querySelector('[data-id=\"agent:count\"] [data-records]');"
    "return f ? +f.getAttribute('data-records') : 0"
)


def browser() -> object:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM or ""
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1200,700"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


def wait_for(driver: object, script: str, deadline: float = 15.0) -> object:
    """Run ``script`` in the page until it returns something truthy."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        value = driver.execute_script(script)  # type: ignore[attr-defined]
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"the page never satisfied: {script}")


async def test_the_page_draws_the_graph_and_its_figures_move() -> None:
    app = build("pagedemo")
    clicks = app.topics["clicks"]
    async with TestDriver(app, web_port=0) as driver:
        web = driver.worker.web
        assert web is not None
        stop = asyncio.Event()

        async def traffic() -> None:
            n = 0
            while not stop.is_set():
                await driver.send(clicks, Click(f"user{n % 5}"), key=f"user{n % 5}")
                n += 1
                await asyncio.sleep(0.02)

        sender = asyncio.create_task(traffic())
        chrome = await asyncio.to_thread(browser)
        try:

            def check() -> tuple[str, int, int]:
                chrome.get(web.url)  # type: ignore[attr-defined]
                wait_for(chrome, "return document.querySelector('svg[data-rendered]')")
                names = chrome.execute_script(  # type: ignore[attr-defined]
                    "return [...document.querySelectorAll('.node')]"
                    ".map(n => n.dataset.name).sort().join(',')"
                )
                first = int(wait_for(chrome, RECORDS))  # type: ignore[call-overload]
                later = first
                end = time.monotonic() + 15
                while later <= first and time.monotonic() < end:
                    time.sleep(0.1)
                    later = int(chrome.execute_script(RECORDS))  # type: ignore[attr-defined]
                return names, first, later

            names, first, later = await asyncio.to_thread(check)
        finally:
            await asyncio.to_thread(chrome.quit)  # type: ignore[attr-defined]
            stop.set()
            await sender
        assert names == (
            "clicks,count,counts,pagedemo-counts-changelog,pagedemo-dlq,"
            "pagedemo-per_window-changelog,pagedemo-per_window-repartition,per_window,users"
        )
        assert later > first > 0


TOKEN = "page-token-8c2f7a1e"


async def test_the_page_works_with_a_token_given_once() -> None:
    app = build("tokenpage")
    clicks = app.topics["clicks"]
    async with TestDriver(app, web_port=0, web_token=TOKEN) as driver:
        web = driver.worker.web
        assert web is not None
        for n in range(5):
            await driver.send(clicks, Click(f"user{n}"), key=f"user{n}")
        await driver.run_until_idle()
        chrome = await asyncio.to_thread(browser)
        try:

            def check() -> tuple[str, str, int, str, str]:
                # without the token: the page asks for it, and shows no graph
                chrome.get(web.url)  # type: ignore[attr-defined]
                wait_for(chrome, "return !document.getElementById('login').hidden")
                asked = chrome.execute_script(  # type: ignore[attr-defined]
                    "return document.getElementById('state').textContent"
                )
                # typed into the form: the graph draws and the figures come
                field = "document.getElementById('login-token')"
                chrome.execute_script(f"{field}.value = arguments[0]", TOKEN)  # type: ignore[attr-defined]
                chrome.execute_script(  # type: ignore[attr-defined]
                    "document.getElementById('login').requestSubmit()"
                )
                wait_for(chrome, "return document.querySelector('svg[data-rendered]')")
                typed = int(wait_for(chrome, RECORDS))  # type: ignore[call-overload]
                # in the address, in a new tab's session: taken, then removed from it
                chrome.execute_script("sessionStorage.clear()")  # type: ignore[attr-defined]
                chrome.get("about:blank")  # type: ignore[attr-defined]
                chrome.get(f"{web.url}/#token={TOKEN}")  # type: ignore[attr-defined]
                wait_for(chrome, "return document.querySelector('svg[data-rendered]')")
                wait_for(chrome, RECORDS)
                address = chrome.current_url  # type: ignore[attr-defined]
                chrome.execute_script(  # type: ignore[attr-defined]
                    "document.getElementById('lookup-table').value = 'counts';"
                    "document.getElementById('lookup-key').value = 'user3';"
                    "document.getElementById('lookup').requestSubmit();"
                )
                value = str(
                    wait_for(
                        chrome,
                        "return document.getElementById('lookup-result').textContent",
                    )
                )
                # a wrong token in the address: asked again
                chrome.execute_script("sessionStorage.clear()")  # type: ignore[attr-defined]
                chrome.get("about:blank")  # type: ignore[attr-defined]
                chrome.get(f"{web.url}/#token=wrong")  # type: ignore[attr-defined]
                wait_for(chrome, "return !document.getElementById('login').hidden")
                errors = chrome.get_log("browser")  # type: ignore[attr-defined]
                csp = [e["message"] for e in errors if "Content Security Policy" in e["message"]]
                return asked, address, typed, value, str(csp)

            asked, address, typed, value, csp = await asyncio.to_thread(check)
        finally:
            await asyncio.to_thread(chrome.quit)  # type: ignore[attr-defined]
    assert asked == "needs its token"
    assert typed == 5
    assert TOKEN not in address and "#" not in address
    assert '"value": 1' in value and '"key": "user3"' in value
    assert csp == "[]"  # the inline script and style are the ones the policy admits
