"""An agent that never finishes its record: a graceful stop waits, a forced one does not."""

import asyncio

import flowkit

app = flowkit.App("slow")
jobs = app.topic("jobs", value_type=int)


@app.task
async def submit() -> None:
    for n in range(5):
        await jobs.send(n)


@app.agent(jobs)
async def crawl(stream: flowkit.Stream[int]) -> None:
    async for job in stream:
        print(f"started job {job}", flush=True)
        await asyncio.sleep(3600)
