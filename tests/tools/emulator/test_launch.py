"""In-loop start (async context manager) and many concurrent streams."""

from __future__ import annotations

import asyncio

import httpx

from router.tools.emulator import EmulatorConfig
from router.tools.emulator.launch import serve_emulator


async def test_serve_emulator_in_current_loop_with_concurrent_streams() -> None:
    config = EmulatorConfig(time_scale=0.01)
    async with serve_emulator(config) as emu, \
            httpx.AsyncClient(base_url=emu.url, trust_env=False, timeout=30) as client:

        async def one(i: int) -> int:
            count = 0
            async with client.stream("POST", "/v1/completions",
                                     json={"prompt": f"stream {i} " * 20, "max_tokens": 12,
                                           "stream": True}) as resp:
                assert resp.status_code == 200
                async for line in resp.aiter_lines():
                    if line.startswith("data: {") and '"text":""' not in line:
                        count += 1
            return count

        counts = await asyncio.gather(*(one(i) for i in range(60)))
        assert counts == [12] * 60
        stats = (await client.get("/emulator/stats")).json()
        assert stats["requests"]["finished"] == 60
        assert stats["requests"]["running"] == 0 and stats["kv"]["used_blocks"] == 0


async def test_client_disconnect_aborts_engine_request() -> None:
    async with serve_emulator(EmulatorConfig(time_scale=0.5)) as emu, \
            httpx.AsyncClient(base_url=emu.url, trust_env=False, timeout=30) as client:
        async with client.stream("POST", "/v1/completions",
                                 json={"prompt": "long", "max_tokens": 5000,
                                       "stream": True}) as resp:
            async for line in resp.aiter_lines():
                if line.startswith("data: "):
                    break
        for _ in range(100):
            stats = (await client.get("/emulator/stats")).json()
            if stats["requests"]["aborted"] == 1:
                break
            await asyncio.sleep(0.02)
        assert stats["requests"]["aborted"] == 1
        assert stats["requests"]["running"] == 0 and stats["kv"]["used_blocks"] == 0
