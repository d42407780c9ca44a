# SPDX-License-Identifier: Apache-2.0
"""What the omni engine asks of a stage, whatever runs it: a vLLM engine (ARStage, RayARStage)
or a process of its own (ProcessStage)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from vllm_omni.config.stage_config import StageConfig


class Stage(Protocol):
    config: StageConfig
    engine_type: str

    @property
    def name(self) -> str: ...

    @property
    def request_options(self) -> tuple[str, ...]:
        """Fields of a request's prompt mapping this stage reads (e.g. a voice)."""
        ...

    @property
    def takes_messages(self) -> bool:
        """Whether, as a first stage, it takes chat messages instead of a prompt."""
        ...

    @property
    def is_alive(self) -> bool: ...

    def takes_params(self, params: Any) -> bool:
        """Whether one parameter object given for a whole request is this stage's."""
        ...

    def validate(self, params: Any, inputs: dict[str, Any] | None = None) -> Any:
        """The request's parameters for this stage, filled in; raises FieldError."""
        ...

    def prompt_inputs(self, params: Any) -> dict[str, Any]:
        """Fields the validated parameters add to the request's prompt inputs."""
        ...

    async def run(
        self,
        request_id: str,
        inputs: dict[str, Any],
        params: Any,
        emit: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """One request through the stage; its named outputs. `emit` hears partial outputs."""
        ...

    def stats(self) -> Any: ...

    def shutdown(self) -> None: ...
