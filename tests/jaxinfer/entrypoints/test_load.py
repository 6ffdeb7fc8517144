"""Load on the embedded model: 200 concurrent streaming chat requests all
complete, each stream's deltas add up to the same request's non-streaming
answer, and afterwards every KV page is free."""

from __future__ import annotations

import asyncio
import time

import openai
import pytest

from .conftest import pages_all_free, start_server

N = 200
MAX_TOKENS = 6


# One worker runs both modes: the split server's core process then loads
# the programs the in-process engine compiled (conftest.compilation_cache_dir).
@pytest.mark.slow
@pytest.mark.xdist_group("load")
@pytest.mark.both_servers  # in-process and multi-process (conftest.py)
def test_200_concurrent_streaming_chats(server_mode):
    server, engine = start_server("smollm2-135m-instruct",
                                  served_model_names=["smollm2"],
                                  mode=server_mode,
                                  max_model_len=256, max_num_seqs=64,
                                  max_num_batched_tokens=512)
    try:
        asyncio.run(_drive(server.base_url))
        assert pages_all_free(engine)
        assert engine.is_running
    finally:
        server.stop()


async def _drive(base_url: str) -> None:
    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="x",
                                max_retries=0, timeout=600)
    questions = [[{"role": "user", "content": f"Give me one word about {i}."}]
                 for i in range(N)]

    async def streamed(messages):
        stream = await client.chat.completions.create(
            model="smollm2", messages=messages, max_tokens=MAX_TOKENS,
            temperature=0, stream=True, stream_options={"include_usage": True})
        parts, finish, usage = [], None, None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                parts.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
        return "".join(parts), finish, usage

    async def whole(messages):
        resp = await client.chat.completions.create(
            model="smollm2", messages=messages, max_tokens=MAX_TOKENS, temperature=0)
        return resp.choices[0].message.content, resp.choices[0].finish_reason, resp.usage

    t0 = time.time()
    streams = await asyncio.gather(*(streamed(m) for m in questions))
    t1 = time.time()
    fulls = await asyncio.gather(*(whole(m) for m in questions))
    print(f"\n{N} streaming chats in {t1 - t0:.1f}s, {N} non-streaming in "
          f"{time.time() - t1:.1f}s")
    await client.close()
    assert len(streams) == len(fulls) == N
    mismatches = [i for i, (s, f) in enumerate(zip(streams, fulls)) if s != f]
    assert not mismatches, [(streams[i], fulls[i]) for i in mismatches[:3]]
    assert all(s[1] in ("stop", "length") for s in streams)
    assert all(0 < s[2].completion_tokens <= MAX_TOKENS for s in streams)
