# SPDX-License-Identifier: Apache-2.0
"""DiffusionModelRunner: the step-wise denoising path, without diffusers' own loop.

It drives the pipeline's components (transformer, sampler, VAE) one denoising step at a time
for a batch of requests that may sit at different step indices, so requests can join and
leave between steps. Per request it reproduces what `QwenImagePipeline.__call__` does for a
single prompt - same noise for the seed, same sigma schedule, same guidance - so the images
match diffusers' (tests/diffusion/test_model_runner.py, tests/entrypoints/test_omni_llm.py).

Per-request state (latents, prompt embeddings, the sampler with its step index) lives in the
DiTCacheManager, so releasing the entry frees everything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch

from vllm_omni.diffusion.cache_manager import DiTCacheManager
from vllm_omni.diffusion.params import INPUT_IMAGES as IMAGE_ARG
from vllm_omni.diffusion.request import DiTRequest
from vllm_omni.diffusion.residual_cache import POLICY, ResidualCacheConfig, RowGroup
from vllm_omni.diffusion.step_loop import advance
from vllm_omni.errors import FieldError
from vllm_omni.models.qwen_image.cached_forward import FirstBlockCachedForward, supports
from vllm_omni.models.qwen_image.latent_decoder import LatentDecoder

PROMPT_EMBEDS = "prompt_embeds"
NEGATIVE_PROMPT_EMBEDS = "negative_prompt_embeds"
IMAGE_LATENTS = "image_latents"
CONDITION_GRIDS = "condition_grids"


class Conditioning(Protocol):
    """How an editing pipeline's input images condition the DiT (a family's, e.g.
    vllm_omni.models.qwen_image_edit.conditioning): appended to each row's latent sequence."""

    def latent_tokens(self, images: Sequence[Any]) -> int: ...

    def prepare(
        self, pipe, images: Sequence[Any], height: int, width: int, dtype, device, generator
    ) -> tuple[torch.Tensor, torch.Tensor, list[tuple[int, int, int]]]:
        """(noise latents, image latents, the images' latent grids) for one request."""
        ...


class DiffusionModelRunner:
    """`residual_cache`: the stage's first-block caching policy (None: off unless a request
    asks for it with `cache_threshold`); `conditioning`: an editing pipeline's, which every
    request's input images (`image`) go through."""

    def __init__(
        self,
        pipe,
        cache: DiTCacheManager,
        device: torch.device,
        decodes: bool = True,
        residual_cache: ResidualCacheConfig | None = None,
        conditioning: Conditioning | None = None,
    ) -> None:
        if pipe.transformer.config.get("guidance_embeds", False):
            raise NotImplementedError("guidance-distilled transformers are not supported yet")
        self.pipe = pipe
        self.cache = cache
        self.device = device
        self.dtype = pipe.transformer.dtype
        self.decoder = LatentDecoder(pipe)
        self.decodes = decodes
        self.num_channels_latents = pipe.transformer.config.in_channels // 4
        self.residual_cache = residual_cache
        self.conditioning = conditioning
        wanted = residual_cache is not None and residual_cache.enabled
        # On a transformer it does not know, the constructor raises, naming the setting.
        self.cached_forward = (
            FirstBlockCachedForward(pipe.transformer)
            if wanted or supports(pipe.transformer)
            else None
        )

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

    # ------------------------------------------------------------------ step path
    def prepare(self, request: DiTRequest) -> None:
        """Draw the initial noise and set up this request's sampler."""
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
        self.cache.allocate(
            request.request_id,
            tensors,
            sampler=sampler,
            step=0,
            **state,
            **{POLICY: self.policy(p)},
        )

    def policy(self, params) -> ResidualCacheConfig | None:
        """The request's caching policy: the stage's, with the request's own threshold."""
        threshold = params.cache_threshold
        if threshold is None:
            return self.residual_cache
        if threshold > 0 and self.cached_forward is None:
            raise FieldError(
                "cache_threshold",
                f"{type(self.pipe.transformer).__name__} does not support residual caching",
            )
        return (self.residual_cache or ResidualCacheConfig()).with_threshold(threshold)

    @torch.inference_mode()
    def denoise_step(self, requests: list[DiTRequest]) -> None:
        """One denoising step for requests of equal image size, as one transformer call."""
        rows_latents, rows_t, rows_text, rows_grids, groups = [], [], [], [], []
        entries = [self.cache.get(r.request_id) for r in requests]
        p0 = requests[0].params
        grid = self.latent_grid(p0.height, p0.width)
        for request, entry in zip(requests, entries):
            t = entry.state["sampler"].timesteps[entry.state["step"]]
            names = [PROMPT_EMBEDS] + ([NEGATIVE_PROMPT_EMBEDS] if request.params.do_cfg else [])
            latents = entry.tensors["latents"]
            if IMAGE_LATENTS in entry.tensors:  # an edit: its images' latents follow the noise
                latents = torch.cat([latents, entry.tensors[IMAGE_LATENTS]], dim=1)
            start = len(rows_latents)
            for name in names:  # guidance: the unconditional row rides in the same batch
                rows_latents.append(latents)
                rows_t.append(t)
                rows_text.append(entry.tensors[name])
                rows_grids.append([grid, *entry.state.get(CONDITION_GRIDS, ())])
            groups.append(
                RowGroup(start, len(rows_latents), entry, entry.state["step"], request.num_steps)
            )
        latents = torch.cat(rows_latents)
        timestep = torch.stack(rows_t).to(latents.dtype) / 1000
        text, mask = pad_text(rows_text)
        img_shapes = rows_grids
        if any(g.policy is not None for g in groups):
            noise = self.cached_forward(latents, timestep, text, mask, img_shapes, groups)
        else:
            noise = self.pipe.transformer(
                hidden_states=latents,
                timestep=timestep,
                guidance=None,
                encoder_hidden_states=text,
                encoder_hidden_states_mask=mask,
                img_shapes=img_shapes,
                return_dict=False,
            )[0]
        row = 0
        for request, entry in zip(requests, entries):
            own = entry.tensors["latents"].shape[1]  # the prediction for the output's rows
            pred = noise[row : row + 1, :own]
            row += 1
            if request.params.do_cfg:
                pred = _guide(pred, noise[row : row + 1, :own], request.params.true_cfg_scale)
                row += 1
            advance(entry, pred)

    def is_done(self, request: DiTRequest) -> bool:
        entry = self.cache.get(request.request_id)
        return entry.state["step"] >= request.params.num_inference_steps

    @torch.inference_mode()
    def decode(self, requests: list[DiTRequest]) -> dict[str, object]:
        """Finished requests of equal size -> images in one VAE call (or their latents, when
        asked for or when a separate VAE stage decodes)."""
        results: dict[str, object] = {}
        to_decode = []
        for request in requests:
            latents = self.cache.get(request.request_id).tensors["latents"]
            if request.params.output_type == "latent" or not self.decodes:
                results[request.request_id] = latents[0].detach().cpu()
            else:
                to_decode.append((request, latents))
        if to_decode:
            p0 = to_decode[0][0].params
            images = self.decoder.decode(
                torch.cat([lat for _, lat in to_decode]), p0.height, p0.width
            )
            for (request, _), image in zip(to_decode, images):
                results[request.request_id] = image
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
