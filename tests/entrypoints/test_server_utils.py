# SPDX-License-Identifier: Apache-2.0
"""The omni server's request helpers that need no engine."""

import asyncio

import pytest

from vllm_omni.entrypoints.openai.server_utils import gather_or_cancel


def test_first_failure_cancels_the_other_jobs():
    cancelled = []

    async def slow(name: str):
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(name)
            raise

    async def failing():
        await asyncio.sleep(0.01)
        raise ValueError("seed: refused")

    async def main():
        with pytest.raises(ValueError, match="seed"):
            await asyncio.wait_for(gather_or_cancel(slow("a"), failing(), slow("b")), 5)

    asyncio.run(main())
    assert sorted(cancelled) == ["a", "b"]


def test_results_in_order_when_all_succeed():
    async def value(x: int, delay: float) -> int:
        await asyncio.sleep(delay)
        return x

    result = asyncio.run(gather_or_cancel(value(1, 0.02), value(2, 0.0)))
    assert result == [1, 2]
