# SPDX-License-Identifier: Apache-2.0
"""A memory plan for a stage graph at real sizes, from config files only.

Each stage's modules are built on the meta device (vllm_omni.meta_modules) and counted:

- weights: parameters x the dtype's bytes;
- KV cache (AR stages): what vLLM's cache needs for `max_num_seqs` sequences of
  `max_model_len` tokens, in whole blocks of `BLOCK_SIZE` - layers x 2 (key, value) x KV heads x
  head size x the cache dtype's bytes per token, as vLLM counts it. A pooling encoder keeps
  nothing between requests: one `max_model_len` input;
- activations (an estimate, see `ar_activation_bytes` / `dit_activation_bytes`) and a fixed
  `PROCESS_OVERHEAD_BYTES` per stage process (CUDA context, allocator slack, graphs).

Stages are placed on the devices largest first, each on the device with the most room left of
`DEVICE_BUDGET` x its memory (vLLM's default `gpu_memory_utilization`). What is left on a device
goes to its AR stages' KV caches, in proportion to what they need; an AR stage's
`gpu_memory_utilization` is then its share of the device. A stage that fits no device is a
`ValueError` naming it and by how much it is short.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from vllm_omni.config.stage_config import StageConfig, StageGraph
from vllm_omni.logger import init_logger

logger = init_logger(__name__)

GiB = 2**30
BLOCK_SIZE = 16  # vLLM's default KV block size (tokens) on CUDA
DEVICE_BUDGET = 0.92  # vLLM's default gpu_memory_utilization: what a device may hold in all
PROCESS_OVERHEAD_BYTES = GiB // 2
"""Per stage process: the CUDA context, cuBLAS/cuDNN workspaces, the caching allocator's slack
(an estimate)."""
DEFAULT_BATCHED_TOKENS = 8192  # vLLM's default token budget per step for online serving
SAMPLER_SEQS = 256  # vLLM's default max_num_seqs: the sampler's logits are sized for it
DEFAULT_NUM_SEQS = 1
"""Full-length sequences an AR stage's KV cache must hold at least: vLLM refuses to start a
cache that cannot hold one. The plan gives each AR stage the device memory left over on top."""
DIT_IMAGE_SIDE = 1024  # the image size a DiT stage's activations are estimated for
DIT_TEXT_TOKENS = 512
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass(frozen=True)
class StagePlan:
    name: str
    engine_type: str
    params: int
    weight_bytes: int
    kv_bytes: int
    activation_bytes: int
    overhead_bytes: int
    device: int
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    gpu_memory_utilization: float | None = None
    """AR stages: the share of the device's memory vLLM may take (weights, activations, KV)."""

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.activation_bytes + self.overhead_bytes


@dataclass(frozen=True)
class MemoryPlan:
    model: str
    dtype: str
    device_memory: int
    num_devices: int
    stages: tuple[StagePlan, ...]

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for stage, plan in zip(out["stages"], self.stages):
            stage["total_bytes"] = plan.total_bytes
        return out

    def write_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n")

    def table(self) -> str:
        rows = [
            f"{'stage':<14} {'device':>6} {'params':>9} {'weights':>9} {'KV':>9} "
            f"{'activ.':>9} {'total':>9}  gpu_memory_utilization"
        ]
        for s in self.stages:
            util = "-" if s.gpu_memory_utilization is None else f"{s.gpu_memory_utilization:.3f}"
            rows.append(
                f"{s.name:<14} {s.device:>6} {s.params / 1e9:>8.2f}B "
                f"{_gib(s.weight_bytes):>9} {_gib(s.kv_bytes):>9} {_gib(s.activation_bytes):>9} "
                f"{_gib(s.total_bytes):>9}  {util}"
            )
        rows.append(
            f"{self.num_devices} device(s) of {_gib(self.device_memory)}, {self.dtype}; "
            f"per stage {_gib(PROCESS_OVERHEAD_BYTES)} of process overhead is in 'total'"
        )
        return "\n".join(rows)


def _gib(n: int) -> str:
    return f"{n / GiB:.2f}GiB"


def parse_bytes(text: str) -> int:
    """'80GiB', '24GB', '512MiB' or a number of bytes."""
    units = {"": 1, "B": 1, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
    units |= {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "K": 2**10, "M": 2**20}
    units |= {"G": 2**30, "T": 2**40}
    value = text.strip().upper()
    number = value.rstrip("KMGTIB")
    try:
        amount = float(number)
    except ValueError:
        raise ValueError(f"device_memory: not a size: {text!r} (e.g. 80GiB)") from None
    unit = value[len(number) :]
    if unit not in units or amount <= 0:
        raise ValueError(f"device_memory: not a size: {text!r} (e.g. 80GiB)")
    return int(amount * units[unit])


# ------------------------------------------------------------------------------ per stage


def stage_modules(graph: StageGraph, stage: StageConfig) -> list:
    """The modules `stage` holds, on the meta device."""
    from vllm_omni.meta_modules import diffusers_components, transformers_stage

    folder = Path(stage.model)
    if (folder / "model_index.json").is_file():
        owned = {
            Path(other.model).relative_to(folder).parts[0]
            for other in graph.stages
            if other is not stage and Path(other.model).is_relative_to(folder)
            and Path(other.model) != folder
        }  # fmt: skip
        return list(diffusers_components(folder, owned).values())
    return [transformers_stage(folder, stage.name)]


def count_params(modules: list) -> int:
    return sum(p.numel() for m in modules for p in m.parameters())


def decoder_config(module) -> Any:
    """The config that sizes an AR module's KV cache (its text decoder's)."""
    return module.config.get_text_config()


def kv_bytes_per_token(module, cache_dtype: torch.dtype) -> int:
    text = decoder_config(module)
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    return text.num_hidden_layers * 2 * kv_heads * head_dim * cache_dtype.itemsize


def ar_activation_bytes(module, tokens: int, num_seqs: int, dtype: torch.dtype) -> int:
    """One step's peak: a few hidden-size and MLP-wide tensors per token in flight, plus the
    float32 logits of every sequence the sampler sees."""
    text = decoder_config(module)
    width = 6 * text.hidden_size + 3 * getattr(text, "intermediate_size", 4 * text.hidden_size)
    return tokens * width * dtype.itemsize + num_seqs * text.vocab_size * 4


def dit_activation_bytes(modules: list, batch: int, dtype: torch.dtype) -> int:
    """A denoising step of `batch` images at DIT_IMAGE_SIDE (twice with guidance), or one VAE
    decode, whichever is larger: hidden-size tensors per token, and a decoder's full-resolution
    feature maps. Modules of neither kind count a tenth of their weights."""
    peak = 0
    for module in modules:
        config = getattr(module, "config", None)
        heads = getattr(config, "num_attention_heads", None)
        head_dim = getattr(config, "attention_head_dim", None)
        if heads and head_dim:
            patch = getattr(config, "patch_size", 2) * 8  # latent patches of an 8x VAE
            tokens = (DIT_IMAGE_SIDE // patch) ** 2 + DIT_TEXT_TOKENS
            peak = max(peak, 2 * batch * tokens * heads * head_dim * 12 * dtype.itemsize)
        elif "Autoencoder" in type(module).__name__:
            peak = max(peak, batch * DIT_IMAGE_SIDE**2 * 512 * dtype.itemsize)
        else:
            peak = max(peak, count_params([module]) * dtype.itemsize // 10)
    return peak


def sizing_engine_args(stage: StageConfig) -> dict[str, Any]:
    """The engine arguments of an AR stage that size its memory: the stage's own over a prompt
    encoder's defaults (it runs as a pooling model, with a context of its own)."""
    from vllm_omni.engine.ar_processor import PromptEncoder
    from vllm_omni.registry import processors

    processor = processors()[stage.processor](stage) if stage.processor else None
    defaults = processor.engine_defaults() if isinstance(processor, PromptEncoder) else {}
    return {**defaults, **stage.engine_args}


@dataclass(frozen=True)
class StageNeed:
    stage: StageConfig
    params: int
    weight_bytes: int
    kv_bytes: int
    activation_bytes: int
    max_model_len: int | None
    max_num_seqs: int | None

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.activation_bytes + PROCESS_OVERHEAD_BYTES


def stage_need(
    graph: StageGraph,
    stage: StageConfig,
    dtype: torch.dtype,
    max_model_len: int | None,
    max_num_seqs: int,
) -> StageNeed:
    modules = stage_modules(graph, stage)
    params = count_params(modules)
    weight_bytes = params * dtype.itemsize
    if stage.engine_type != "AR":
        batch = int(stage.dit.get("max_num_seqs", 1))
        activations = dit_activation_bytes(modules, batch, dtype)
        return StageNeed(stage, params, weight_bytes, 0, activations, None, None)
    args = sizing_engine_args(stage)
    text = decoder_config(modules[0])
    length = args.get("max_model_len") or max_model_len or text.max_position_embeddings
    num_seqs = args.get("max_num_seqs") or max_num_seqs
    blocks = math.ceil(length / BLOCK_SIZE)
    kv_seqs = 1 if args.get("runner") == "pooling" else num_seqs
    kv_bytes = kv_seqs * blocks * BLOCK_SIZE * kv_bytes_per_token(modules[0], dtype)
    tokens = min(args.get("max_num_batched_tokens") or DEFAULT_BATCHED_TOKENS, length * num_seqs)
    sampled = args.get("max_num_seqs") or SAMPLER_SEQS
    activations = ar_activation_bytes(modules[0], tokens, sampled, dtype)
    return StageNeed(stage, params, weight_bytes, kv_bytes, activations, length, num_seqs)


# ------------------------------------------------------------------------------- placement


def place(needs: list[StageNeed], device_memory: int, num_devices: int) -> list[int]:
    """Each stage's device: largest first, on the device with the most room left."""
    budget = int(DEVICE_BUDGET * device_memory)
    free = [budget] * num_devices
    devices = [0] * len(needs)
    for i in sorted(range(len(needs)), key=lambda i: -needs[i].total_bytes):
        need = needs[i]
        best = max(range(num_devices), key=lambda d: free[d])
        if need.total_bytes > free[best]:
            raise ValueError(
                f"stage {need.stage.name!r} does not fit: it needs {_gib(need.total_bytes)} "
                f"(weights {_gib(need.weight_bytes)}, KV cache {_gib(need.kv_bytes)}, "
                f"activations {_gib(need.activation_bytes)}, process "
                f"{_gib(PROCESS_OVERHEAD_BYTES)}); the most room left on one of the "
                f"{num_devices} device(s) is {_gib(free[best])} of {_gib(device_memory)} "
                f"(x{DEVICE_BUDGET}): short by {_gib(need.total_bytes - free[best])}. Use more "
                "devices, a smaller --max-model-len or --max-num-seqs, or a smaller --dtype"
            )
        free[best] -= need.total_bytes
        devices[i] = best
    return devices


def utilizations(
    needs: list[StageNeed], devices: list[int], device_memory: int, num_devices: int
) -> list[float | None]:
    """AR stages' gpu_memory_utilization: their need plus a share of what is left on their
    device (in proportion to their KV cache), as a fraction of the device, rounded down."""
    budget = int(DEVICE_BUDGET * device_memory)
    used = [0] * num_devices
    kv = [0] * num_devices
    for need, device in zip(needs, devices):
        used[device] += need.total_bytes
        kv[device] += need.kv_bytes
    out: list[float | None] = []
    for need, device in zip(needs, devices):
        if need.stage.engine_type != "AR":
            out.append(None)
            continue
        extra = (budget - used[device]) * need.kv_bytes // kv[device] if kv[device] else 0
        share = (need.total_bytes - PROCESS_OVERHEAD_BYTES + extra) / device_memory
        out.append(math.floor(share * 1000) / 1000)
    return out


def plan_memory(
    model: str,
    graph: StageGraph,
    *,
    dtype: str = "bfloat16",
    device_memory: int = 80 * GiB,
    num_devices: int = 1,
    max_model_len: int | None = None,
    max_num_seqs: int = DEFAULT_NUM_SEQS,
) -> MemoryPlan:
    """The plan for `graph` (already resolved to local folders) on `num_devices` devices of
    `device_memory` bytes each."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype: must be one of {sorted(DTYPES)}, got {dtype!r}")
    if num_devices < 1:
        raise ValueError(f"num_devices: must be >= 1, got {num_devices}")
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs: must be >= 1, got {max_num_seqs}")
    torch_dtype = DTYPES[dtype]
    needs = [stage_need(graph, s, torch_dtype, max_model_len, max_num_seqs) for s in graph.stages]
    devices = place(needs, device_memory, num_devices)
    utils = utilizations(needs, devices, device_memory, num_devices)
    stages = tuple(
        StagePlan(
            name=n.stage.name,
            engine_type=n.stage.engine_type,
            params=n.params,
            weight_bytes=n.weight_bytes,
            kv_bytes=n.kv_bytes,
            activation_bytes=n.activation_bytes,
            overhead_bytes=PROCESS_OVERHEAD_BYTES,
            device=d,
            max_model_len=n.max_model_len,
            max_num_seqs=n.max_num_seqs,
            gpu_memory_utilization=u,
        )
        for n, d, u in zip(needs, devices, utils)
    )
    return MemoryPlan(model, dtype, device_memory, num_devices, stages)


SERVE_DTYPES = {"auto": "bfloat16", "half": "float16", "float": "float32"}
"""vLLM's --dtype spellings, as the plan's dtypes."""


def plan_for_this_device(
    model: str, graph: StageGraph, dtype: str = "auto", max_model_len: int | None = None
) -> MemoryPlan | None:
    """The plan on this machine's first CUDA device (where every stage of a local graph
    starts), or None without CUDA or when the graph does not fit (logged: the user's settings
    may still work, the estimates being estimates)."""
    if not torch.cuda.is_available():
        return None
    total = torch.cuda.get_device_properties(0).total_memory
    try:
        plan = plan_memory(
            model,
            graph,
            dtype=SERVE_DTYPES.get(dtype, dtype),
            device_memory=total,
            max_model_len=max_model_len,
        )
    except ValueError as e:
        logger.warning("memory plan: %s; starting with vLLM's defaults", e)
        return None
    logger.info("memory plan for %s on CUDA device 0:\n%s", model, plan.table())
    return plan
