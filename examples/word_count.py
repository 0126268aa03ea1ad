"""Faust's word-count example, ported: posts split into words, counted per word.

The Faust original (``examples/word_count.py``, trimmed)::

    app = faust.App("word-counts", broker="kafka://localhost:9092", topic_partitions=8)
    posts_topic = app.topic("posts", value_type=str)
    word_counts = app.Table("word_counts", default=int)

    @app.agent(posts_topic)
    async def shuffle_words(posts):
        async for post in posts:
            for word in post.split():
                await count_words.send(key=word, value=word)

    @app.agent(value_type=str)
    async def count_words(words):
        async for word in words:
            word_counts[word] += 1

    @app.page("/count/{word}/")
    @app.table_route(table=word_counts, match_info="word")
    async def get_count(web, request, word):
        return web.json({word: word_counts[word]})

In flowkit an agent reads a declared topic, so ``words`` is declared, and the shuffle is
a sink: each word goes out keyed by itself, so the partition that owns the word counts
it. ``on_startup``/``on_shutdown`` show the lifecycle hooks. Run it with ``python -m
examples.word_count``. As a worker it waits for posts, which on Kafka you can write by
hand::

    flowkit worker examples.word_count:app --broker kafka://127.0.0.1:9092
    flowkit send examples.word_count:app posts '"the quick brown fox"' \\
        --broker kafka://127.0.0.1:9092
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import flowkit
from flowkit.logs import configure_logging
from flowkit.testing import FakeClock, TestDriver

app = flowkit.App("word-counts", partitions=8)
posts_topic = app.topic("posts", value_type=str, external=True)
words_topic = app.topic("words", value_type=str)
word_counts = app.table("word_counts", default=int)


@app.agent(posts_topic, sink=[words_topic])
async def shuffle_words(posts: flowkit.Stream[str]) -> AsyncIterator[flowkit.Output]:
    async for post in posts:
        for word in post.split():
            yield flowkit.Output(word, key=word)  # keyed by the word: its partition counts it


@app.agent(words_topic)
async def count_words(words: flowkit.Stream[str]) -> None:
    """Count words from blog post article body."""
    async for word in words:
        word_counts[word] += 1


@app.on_startup
async def hello() -> None:
    print("word count starting")


@app.on_shutdown
async def tally() -> None:
    # Runs in the worker before its final commit: the table is still readable here.
    print("tally:", ", ".join(f"{w}={word_counts[w]}" for w in sorted(word_counts)))


POSTS = ["the quick brown fox", "the lazy dog", "the fox"]


async def main() -> None:
    """Feed ``POSTS`` through the app and print the counts."""
    async with TestDriver(app, clock=FakeClock()) as driver:
        for post in POSTS:
            await driver.send(posts_topic, post)
        await driver.run_until_idle()
        print("the:", word_counts["the"], "fox:", word_counts["fox"])


if __name__ == "__main__":
    configure_logging("warning")
    asyncio.run(main())
