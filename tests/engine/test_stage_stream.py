# SPDX-License-Identifier: Apache-2.0
"""A streaming stage's view of its source (`StageStream`): partial outputs renamed by the stage's
edges, in order, then the final one."""

from __future__ import annotations

import asyncio

from vllm_omni.engine.stage_stream import StageStream


async def _read(upstream: StageStream) -> list:
    return [item async for item in upstream]


def test_items_come_renamed_in_order_and_end_with_the_final_one() -> None:
    upstream = StageStream({"codes": "codec_tokens", "states": "hidden"})
    upstream.put({"codec_tokens": 1, "other": 9})
    upstream.put({"other": 9})  # nothing this stage reads: not queued
    upstream.put({"hidden": 2, "codec_tokens": 3})
    upstream.put({"codec_tokens": 4}, final=True)
    upstream.put({"codec_tokens": 5})  # after the end: never read
    items = asyncio.run(_read(upstream))
    assert items == [
        ({"codes": 1}, False),
        ({"states": 2, "codes": 3}, False),
        ({"codes": 4}, True),
    ]


def test_a_final_output_without_the_edges_still_ends_the_stream() -> None:
    upstream = StageStream({"codes": "codec_tokens"})
    upstream.put({"text": "hi"}, final=True)
    assert asyncio.run(_read(upstream)) == [({}, True)]
