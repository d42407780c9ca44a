# SPDX-License-Identifier: Apache-2.0
"""StageStream: what a streaming stage (`stream_input: true`) reads from its source stage.

A streaming stage starts as soon as its source has started, not when it has finished: it reads
the source's partial outputs as the source emits them (the thinker's newest hidden states, the
talker's newest speech codes), then the source's final output. Each item comes renamed by the
stage's edges (`inputs: {codec_tokens: talker.codec_tokens}`), with a flag for the final one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any


class StageStream:
    def __init__(self, edges: Mapping[str, str]) -> None:
        """`edges`: this stage's input name -> the source's output name."""
        self._edges = dict(edges)
        self._queue: asyncio.Queue[tuple[dict[str, Any], bool]] = asyncio.Queue()

    def put(self, outputs: Mapping[str, Any], final: bool = False) -> None:
        renamed = {key: outputs[name] for key, name in self._edges.items() if name in outputs}
        if renamed or final:
            self._queue.put_nowait((renamed, final))

    async def __aiter__(self) -> AsyncIterator[tuple[dict[str, Any], bool]]:
        while True:
            outputs, final = await self._queue.get()
            yield outputs, final
            if final:
                return
