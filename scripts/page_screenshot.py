"""Take the screenshot of the live page shown in docs/operations.md.

    python scripts/page_screenshot.py [docs/images/live-page.png]

Runs ``examples/operations.py`` in a worker with its web endpoint, lets its traffic flow
for a few seconds, and opens the page in headless Chromium (Debian's ``chromium`` and
``chromium-driver``), as the page's test does.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import flowkit
from examples.operations import app
from flowkit.logs import configure_logging


def shoot(url: str, out: Path) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,1000"):
        options.add_argument(flag)
    chrome = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        chrome.get(url)
        time.sleep(10)  # some refreshes: rates need two polls, sparklines more
        chrome.find_element("id", "lookup-key").send_keys("c7")
        chrome.find_element("css selector", "#lookup button").click()
        time.sleep(1)
        chrome.save_screenshot(str(out))
    finally:
        chrome.quit()


async def main(out: Path) -> None:
    configure_logging("warning")
    async with flowkit.Worker(app, web_port=0, clock=flowkit.SystemClock()) as worker:
        assert worker.web is not None
        await asyncio.sleep(2)
        await asyncio.to_thread(shoot, worker.web.url, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/images/live-page.png")
    target.parent.mkdir(parents=True, exist_ok=True)
    asyncio.run(main(target))
