# SPDX-License-Identifier: Apache-2.0
"""Wan's denoising, one step at a time, for videos at any step.

Per request it does what `WanPipeline.__call__` (text-to-video) or
`WanImageToVideoPipeline.__call__` (image-to-video) does for one prompt and seed - the prompt
padded to 512 tokens as the pipeline pads it (prompt.py), the noise of its `prepare_latents`,
its sampler, its classifier-free guidance (`guidance_scale > 1`, the negative prompt's row), a
two-expert pipeline's switch at `boundary_ratio` - so the frames match diffusers' (tests/models/
wan). Requests of one shape share each transformer call, one row per prompt and guidance; rows
whose step falls to the other expert go into that expert's call. New requests' prompts are
encoded together, in one UMT5 call. A request may skip its later blocks on steps whose first-
block residual barely changed (`cache_threshold`, the stage's `residual_cache`; per request,
never across an expert switch). Each request's state (latents, embeddings, condition, its own
sampler: UniPC keeps a history of past predictions) lives in the DiTCacheManager.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image

from vllm_omni.diffusion.cache_manager import DiTCacheEntry, DiTCacheManager
from vllm_omni.diffusion.params import INPUT_IMAGES
from vllm_omni.diffusion.request import DiTRequest
from vllm_omni.diffusion.residual_cache import POLICY, ResidualCacheConfig, RowGroup, forget
from vllm_omni.diffusion.step_loop import advance
from vllm_omni.errors import FieldError
from vllm_omni.models.wan.cached_forward import WanCachedForward
from vllm_omni.models.wan.prompt import encode_prompts

PROMPT = "prompt_embeds"
NEGATIVE = "negative_prompt_embeds"
IMAGE_EMBEDS = "image_embeds"
CONDITION = "condition"
EXPERT = "expert"  # the transformer that ran the request's last step


class WanRunner:
    """`image_to_video`: the pipeline is `WanImageToVideoPipeline` (each request gives the first
    frame as its input image)."""

    def __init__(
        self,
        pipe,
        cache: DiTCacheManager,
        device: torch.device,
        image_to_video: bool,
        residual_cache: ResidualCacheConfig | None = None,
    ):
        if pipe.config.get("expand_timesteps", False):
            raise NotImplementedError(
                "Wan pipelines with expand_timesteps (Wan2.2 TI2V-5B) are not supported yet"
            )
        self.pipe = pipe
        self.cache = cache
        self.device = device
        self.image_to_video = image_to_video
        self.experts = [m for m in (pipe.transformer, pipe.transformer_2) if m is not None]
        self.cached_forwards = [WanCachedForward(m) for m in self.experts]
        self.residual_cache = residual_cache
        self.dtype = self.experts[0].dtype
        ratio = pipe.config.get("boundary_ratio")
        num_train = pipe.scheduler.config.num_train_timesteps
        self.boundary = None if ratio is None else ratio * num_train

    # ------------------------------------------------------------------ new requests
    @torch.inference_mode()
    def prepare(self, requests: list[DiTRequest]) -> None:
        """Encode the new requests' prompts (one text-encoder call), draw their noise, encode an
        image-to-video request's first frame, and set up each one's sampler."""
        texts = [r.inputs.get("prompt") for r in requests]
        for r, text in zip(requests, texts):
            if not isinstance(text, str):
                raise FieldError("prompt", "a Wan stage takes a text prompt")
        guided = [r for r in requests if r.params.do_cfg]
        texts += [r.params.negative_prompt or "" for r in guided]  # the pipelines' default: ""
        embeds = encode_prompts(self.pipe, texts, self.device).to(self.dtype)
        negatives = dict(zip([r.request_id for r in guided], embeds[len(requests) :]))
        for request, prompt in zip(requests, embeds):
            tensors = {PROMPT: prompt[None]}
            if request.request_id in negatives:
                tensors[NEGATIVE] = negatives[request.request_id][None]
            self._allocate(request, tensors)

    def _allocate(self, request: DiTRequest, tensors: dict[str, torch.Tensor]) -> None:
        p = request.params
        generator = torch.Generator(device="cpu").manual_seed(p.seed)
        if self.image_to_video:
            image = first_frame(request)
            tensors.update(self._condition(image, p, generator))
        else:
            channels = self.experts[0].config.in_channels
            tensors["latents"] = self.pipe.prepare_latents(
                1, channels, p.height, p.width, p.num_frames, torch.float32, self.device, generator
            )
        sampler = type(self.pipe.scheduler).from_config(self.pipe.scheduler.config)
        sampler.set_timesteps(p.num_inference_steps, device=self.device)
        sampler.set_begin_index(0)
        policy = {POLICY: self.policy(p)}
        self.cache.allocate(request.request_id, tensors, sampler=sampler, step=0, **policy)

    def policy(self, params) -> ResidualCacheConfig | None:
        """The request's caching policy: the stage's, with the request's own threshold."""
        if params.cache_threshold is None:
            return self.residual_cache
        return (self.residual_cache or ResidualCacheConfig()).with_threshold(params.cache_threshold)

    def _condition(self, image: Image.Image, p, generator) -> dict[str, torch.Tensor]:
        """Image-to-video: the noise, and the first frame as the pipeline conditions on it (the
        frame mask and the VAE-encoded frame; Wan2.1's CLIP image embeddings)."""
        pipe = self.pipe
        tensors = {}
        if self.experts[0].config.image_dim is not None:
            tensors[IMAGE_EMBEDS] = pipe.encode_image(image, self.device).to(self.dtype)
        pixels = pipe.video_processor.preprocess(image, height=p.height, width=p.width)
        latents, condition = pipe.prepare_latents(
            pixels.to(self.device, torch.float32),
            1,
            pipe.vae.config.z_dim,
            p.height,
            p.width,
            p.num_frames,
            torch.float32,
            self.device,
            generator,
        )
        tensors["latents"], tensors[CONDITION] = latents, condition
        return tensors

    # ------------------------------------------------------------------ steps
    def expert(self, t: torch.Tensor) -> int:
        """Which transformer runs a step at timestep `t` (0: the high-noise one)."""
        return 0 if self.boundary is None or t >= self.boundary else 1

    @torch.inference_mode()
    def denoise_step(self, requests: list[DiTRequest]) -> None:
        """One denoising step for each request (one shape), one transformer call per expert."""
        entries = [self.cache.get(r.request_id) for r in requests]
        by_expert: dict[int, list[tuple[DiTRequest, DiTCacheEntry]]] = {}
        for request, entry in zip(requests, entries):
            t = entry.state["sampler"].timesteps[entry.state["step"]]
            by_expert.setdefault(self.expert(t), []).append((request, entry))
        for index, batch in sorted(by_expert.items()):
            self._step(self.experts[index], index, batch)

    def _step(self, model, expert: int, batch: list[tuple[DiTRequest, DiTCacheEntry]]) -> None:
        rows_latents, rows_t, rows_text, rows_image, groups = [], [], [], [], []
        for request, entry in batch:
            if entry.state.get(EXPERT, expert) != expert:
                forget(entry)  # the other expert's residuals are no guide to this one's
            entry.state[EXPERT] = expert
            t = entry.state["sampler"].timesteps[entry.state["step"]]
            latents = entry.tensors["latents"]
            if CONDITION in entry.tensors:
                latents = torch.cat([latents, entry.tensors[CONDITION]], dim=1)
            names = [PROMPT] + ([NEGATIVE] if request.params.do_cfg else [])
            start = len(rows_latents)
            for name in names:  # guidance: the negative prompt's row right after the prompt's
                rows_latents.append(latents)
                rows_t.append(t)
                rows_text.append(entry.tensors[name])
                if IMAGE_EMBEDS in entry.tensors:
                    rows_image.append(entry.tensors[IMAGE_EMBEDS])
            step = entry.state["step"]
            groups.append(RowGroup(start, len(rows_latents), entry, step, request.num_steps))
        latents = torch.cat(rows_latents).to(self.dtype)
        timestep, text = torch.stack(rows_t), torch.cat(rows_text)
        image = torch.cat(rows_image) if rows_image else None
        if any(g.policy is not None for g in groups):
            noise = self.cached_forwards[expert](latents, timestep, text, image, groups)
        else:
            noise = model(
                hidden_states=latents,
                timestep=timestep,
                encoder_hidden_states=text,
                encoder_hidden_states_image=image,
                return_dict=False,
            )[0]
        row = 0
        for request, entry in batch:
            pred = noise[row : row + 1]
            row += 1
            p = request.params
            if p.do_cfg:
                uncond = noise[row : row + 1]
                row += 1
                scale = p.guidance_scale if expert == 0 else guidance_2(p)
                pred = uncond + scale * (pred - uncond)
            advance(entry, pred)

    def is_done(self, request: DiTRequest) -> bool:
        return self.cache.get(request.request_id).state["step"] >= request.num_steps

    # ------------------------------------------------------------------ decode
    @torch.inference_mode()
    def decode(self, requests: list[DiTRequest]) -> dict[str, Any]:
        """Finished requests of one shape -> {"video": uint8 frames (F, H, W, 3), "fps"}, in one
        VAE call."""
        vae = self.pipe.vae
        latents = torch.cat([self.cache.get(r.request_id).tensors["latents"] for r in requests])
        latents = latents.to(vae.dtype)
        z = vae.config.z_dim
        mean = torch.tensor(vae.config.latents_mean).view(1, z, 1, 1, 1).to(latents)
        std = torch.tensor(vae.config.latents_std).view(1, z, 1, 1, 1).to(latents)
        video = vae.decode(latents * std + mean, return_dict=False)[0]
        frames = self.pipe.video_processor.postprocess_video(video, output_type="np")
        return {
            r.request_id: {"video": to_uint8(f), "fps": r.params.fps}
            for r, f in zip(requests, frames)
        }


def guidance_2(params) -> float:
    """The low-noise expert's guidance scale (the pipelines': `guidance_scale` if unset)."""
    return params.guidance_scale if params.guidance_scale_2 is None else params.guidance_scale_2


def to_uint8(frames: np.ndarray) -> np.ndarray:
    """Frames in [0, 1] -> uint8, rounded as diffusers' `numpy_to_pil` rounds."""
    return (np.asarray(frames) * 255).round().astype(np.uint8)


def first_frame(request: DiTRequest) -> Image.Image:
    """An image-to-video request's input image (it arrives as a list of one array)."""
    images = request.inputs.get(INPUT_IMAGES)
    if not images:
        raise FieldError(INPUT_IMAGES, "image-to-video needs the first frame as an input image")
    return Image.fromarray(np.asarray(images[0])).convert("RGB")
