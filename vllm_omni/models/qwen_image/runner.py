# SPDX-License-Identifier: Apache-2.0
"""Qwen-Image's model code for the framework's step loop (vllm_omni.diffusion.step_loop).

Per request it reproduces what `QwenImagePipeline.__call__` does for a single prompt - same
noise for the seed, same sigma schedule, same guidance - so the images match diffusers'
(tests/entrypoints/test_omni_llm.py). Requests of equal image size share one transformer call
whatever their step, prompt length or guidance. An editing pipeline's input images condition
each row through a `Conditioning` (vllm_omni.models.qwen_image.edit).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch

from vllm_omni.diffusion.cache_manager import DiTCacheEntry
from vllm_omni.diffusion.config import DiTConfig
from vllm_omni.diffusion.executor_kind import ImageStageInfo
from vllm_omni.diffusion.params import INPUT_IMAGES as IMAGE_ARG
from vllm_omni.diffusion.request import DiTRequest
from vllm_omni.diffusion.residual_cache import FirstBlockCache
from vllm_omni.diffusion.step_loop import RequestState, row_groups, timestep
from vllm_omni.errors import FieldError
from vllm_omni.models.qwen_image.cached_forward import FirstBlockCachedForward, supports
from vllm_omni.models.qwen_image.latent_decoder import LatentDecoder

PROMPT_EMBEDS = "prompt_embeds"
NEGATIVE_PROMPT_EMBEDS = "negative_prompt_embeds"
IMAGE_LATENTS = "image_latents"
CONDITION_GRIDS = "condition_grids"
REFUSES = frozenset({"guidance_scale"})
"""Qwen-Image guides with a negative prompt and `true_cfg_scale`; it has no distilled guidance."""


class Conditioning(Protocol):
    """How an editing pipeline's input images condition the DiT (a family's, e.g.
    vllm_omni.models.qwen_image.edit.conditioning): appended to each row's latent sequence."""

    max_images: int

    def latent_tokens(self, images: Sequence[Any]) -> int: ...

    def prepare(
        self, pipe, images: Sequence[Any], height: int, width: int, dtype, device, generator
    ) -> tuple[torch.Tensor, torch.Tensor, list[tuple[int, int, int]]]:
        """(noise latents, image latents, the images' latent grids) for one request."""
        ...


class QwenImageRunner:
    """`config.decode` False: finished requests return their latents (a VAE stage decodes);
    `conditioning`: an editing pipeline's, which every request's input images (`image`) go
    through."""

    def __init__(
        self,
        pipe,
        config: DiTConfig,
        device: torch.device,
        conditioning: Conditioning | None = None,
    ) -> None:
        if pipe.transformer.config.get("guidance_embeds", False):
            raise NotImplementedError("guidance-distilled transformers are not supported yet")
        self.pipe = pipe
        self.device = device
        self.dtype = pipe.transformer.dtype
        self.decoder = LatentDecoder(pipe)
        self.decodes = config.decode
        self.num_channels_latents = pipe.transformer.config.in_channels // 4
        self.conditioning = conditioning
        wanted = config.residual_cache is not None and config.residual_cache.enabled
        # On a transformer it does not know, the constructor raises, naming the setting.
        self.cached_forward = (
            FirstBlockCachedForward(pipe.transformer)
            if wanted or supports(pipe.transformer)
            else None
        )

    @property
    def info(self) -> ImageStageInfo:
        return ImageStageInfo(
            self.decoder.default_size, self.decoder.size_multiple, refuses=REFUSES
        )

    @property
    def residual_caches(self) -> list[FirstBlockCache]:
        return [] if self.cached_forward is None else [self.cached_forward.cache]

    def check_request(self, request: DiTRequest) -> None:
        pass

    def latent_grid(self, height: int, width: int) -> tuple[int, int, int]:
        f = self.decoder.size_multiple
        return (1, height // f, width // f)

    def estimate_bytes(self, request: DiTRequest) -> int:
        _, h, w = self.latent_grid(request.params.height, request.params.width)
        rows = h * w
        if self.conditioning is not None and IMAGE_ARG in request.inputs:
            rows += self.conditioning.latent_tokens(request.inputs[IMAGE_ARG])
        latents = rows * self.num_channels_latents * 4 * self.dtype.itemsize
        embeds = sum(
            t.numel() * t.element_size() for t in request.inputs.values() if torch.is_tensor(t)
        )
        return latents + embeds

    # ------------------------------------------------------------------ the step loop's
    def prepare(self, requests: list[DiTRequest]) -> list[RequestState]:
        return [self._prepare(r) for r in requests]

    def _prepare(self, request: DiTRequest) -> RequestState:
        """The initial noise and this request's sampler."""
        from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift

        p = request.params
        generator = torch.Generator(device="cpu").manual_seed(p.seed)
        tensors, state = {}, {}
        if self.conditioning is None:
            latents = self.pipe.prepare_latents(
                1, self.num_channels_latents, p.height, p.width, self.dtype, self.device, generator
            )
        else:
            if IMAGE_ARG not in request.inputs:
                raise FieldError(IMAGE_ARG, "the edit stage needs the input image")
            latents, tensors[IMAGE_LATENTS], state[CONDITION_GRIDS] = self.conditioning.prepare(
                self.pipe,
                request.inputs[IMAGE_ARG],
                p.height,
                p.width,
                self.dtype,
                self.device,
                generator,
            )
        sampler = type(self.pipe.scheduler).from_config(self.pipe.scheduler.config)
        cfg = sampler.config
        mu = calculate_shift(
            latents.shape[1],
            cfg.get("base_image_seq_len", 256),
            cfg.get("max_image_seq_len", 4096),
            cfg.get("base_shift", 0.5),
            cfg.get("max_shift", 1.15),
        )
        steps = p.num_inference_steps
        sampler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu, device=self.device)
        sampler.set_begin_index(0)
        tensors["latents"] = latents
        for name in (PROMPT_EMBEDS, NEGATIVE_PROMPT_EMBEDS):
            if name in request.inputs and (name == PROMPT_EMBEDS or p.do_cfg):
                tensors[name] = as_batch(request.inputs[name]).to(self.device, self.dtype)
        if PROMPT_EMBEDS not in tensors:
            raise FieldError("inputs", f"the DiT stage needs {PROMPT_EMBEDS!r}")
        if p.do_cfg and NEGATIVE_PROMPT_EMBEDS not in tensors:
            raise FieldError("inputs", f"guidance needs {NEGATIVE_PROMPT_EMBEDS!r}")
        return RequestState(tensors, sampler, state)

    def denoise(self, requests: list[DiTRequest], entries: list[DiTCacheEntry]) -> list:
        """One denoising step for requests of equal image size, as one transformer call."""
        rows_latents, rows_t, rows_text, rows_grids = [], [], [], []
        p0 = requests[0].params
        grid = self.latent_grid(p0.height, p0.width)
        for request, entry in zip(requests, entries):
            names = [PROMPT_EMBEDS] + ([NEGATIVE_PROMPT_EMBEDS] if request.params.do_cfg else [])
            latents = entry.tensors["latents"]
            if IMAGE_LATENTS in entry.tensors:  # an edit: its images' latents follow the noise
                latents = torch.cat([latents, entry.tensors[IMAGE_LATENTS]], dim=1)
            for name in names:  # guidance: the unconditional row rides in the same batch
                rows_latents.append(latents)
                rows_t.append(timestep(entry))
                rows_text.append(entry.tensors[name])
                rows_grids.append([grid, *entry.state.get(CONDITION_GRIDS, ())])
        groups = row_groups(requests, entries)
        latents = torch.cat(rows_latents)
        t = torch.stack(rows_t).to(latents.dtype) / 1000
        text, mask = pad_text(rows_text)
        if any(g.policy is not None for g in groups):
            noise = self.cached_forward(latents, t, text, mask, rows_grids, groups)
        else:
            noise = self.pipe.transformer(
                hidden_states=latents,
                timestep=t,
                guidance=None,
                encoder_hidden_states=text,
                encoder_hidden_states_mask=mask,
                img_shapes=rows_grids,
                return_dict=False,
            )[0]
        predictions = []
        for request, entry, group in zip(requests, entries, groups):
            own = entry.tensors["latents"].shape[1]  # the prediction for the output's rows
            pred = noise[group.start : group.start + 1, :own]
            if request.params.do_cfg:
                uncond = noise[group.start + 1 : group.stop, :own]
                pred = _guide(pred, uncond, request.params.true_cfg_scale)
            predictions.append(pred)
        return predictions

    def decode(self, requests: list[DiTRequest], entries: list[DiTCacheEntry]) -> list:
        """Finished requests of equal size -> images in one VAE call (or their latents, when
        asked for or when a separate VAE stage decodes)."""
        results: list[Any] = [None] * len(requests)
        to_decode = []
        for i, (request, entry) in enumerate(zip(requests, entries)):
            latents = entry.tensors["latents"]
            if request.params.output_type == "latent" or not self.decodes:
                results[i] = latents[0].detach().cpu()
            else:
                to_decode.append((i, latents))
        if to_decode:
            p0 = requests[to_decode[0][0]].params
            images = self.decoder.decode(
                torch.cat([lat for _, lat in to_decode]), p0.height, p0.width
            )
            for (i, _), image in zip(to_decode, images):
                results[i] = image
        return results


def as_batch(embeds: torch.Tensor) -> torch.Tensor:
    """One prompt's embeddings as a batch of one: [tokens, hidden] -> [1, tokens, hidden]."""
    return embeds[None] if embeds.dim() == 2 else embeds


def pad_text(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Stack [1, n_i, d] prompt embeddings, zero-padded to the longest; the mask marks real
    tokens (None when nothing is padded, exactly as diffusers passes a single prompt)."""
    lengths = [r.shape[1] for r in rows]
    longest = max(lengths)
    if all(n == longest for n in lengths):
        return torch.cat(rows), None
    text = rows[0].new_zeros(len(rows), longest, rows[0].shape[2])
    mask = torch.zeros(len(rows), longest, dtype=torch.bool, device=text.device)
    for i, (r, n) in enumerate(zip(rows, lengths)):
        text[i, :n] = r[0]
        mask[i, :n] = True
    return text, mask


def _guide(cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """True classifier-free guidance with Qwen-Image's norm rescaling: the guided prediction
    keeps the conditional prediction's per-token norm."""
    guided = uncond + scale * (cond - uncond)
    return guided * (cond.norm(dim=-1, keepdim=True) / guided.norm(dim=-1, keepdim=True))
