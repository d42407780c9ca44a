# SPDX-License-Identifier: Apache-2.0
"""Wan's model code for the framework's step loop (vllm_omni.diffusion.step_loop): the whole
pipeline in the stage process (vLLM has no UMT5, so the text encoder runs here, batched over
new requests; the VAE decodes here too).

Per request it does what `WanPipeline.__call__` (text-to-video) or
`WanImageToVideoPipeline.__call__` (image-to-video) does for one prompt and seed - the prompt
padded to 512 tokens as the pipeline pads it (prompt.py), the noise of its `prepare_latents`,
its sampler, its classifier-free guidance (`guidance_scale > 1`, the negative prompt's row), a
two-expert pipeline's switch at `boundary_ratio` - so the frames match diffusers' (tests/models/
wan). Requests of one shape share each transformer call, one row per prompt and guidance; rows
whose step falls to the other expert go into that expert's call. A request's residual-cache
state is dropped when it changes experts.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image

from vllm_omni.diffusion.cache_manager import DiTCacheEntry
from vllm_omni.diffusion.config import DiTConfig
from vllm_omni.diffusion.executor_kind import VideoStageInfo
from vllm_omni.diffusion.params import INPUT_IMAGES
from vllm_omni.diffusion.request import DiTRequest
from vllm_omni.diffusion.residual_cache import FirstBlockCache, forget
from vllm_omni.diffusion.step_loop import RequestState, row_groups, timestep
from vllm_omni.errors import FieldError
from vllm_omni.models.wan.cached_forward import WanCachedForward
from vllm_omni.models.wan.prompt import encode_prompts
from vllm_omni.models.wan.vae_norm import use_fast_norms

PROMPT = "prompt_embeds"
NEGATIVE = "negative_prompt_embeds"
IMAGE_EMBEDS = "image_embeds"
CONDITION = "condition"
EXPERT = "expert"  # the transformer that ran the request's last step
DEFAULT_SHAPE = (81, 480, 832)  # the pipelines' own defaults: frames, height, width
DEFAULT_FPS = 16.0  # what Wan2.1 and the Wan2.2 A14B models were trained at
IMAGE_TO_VIDEO = "WanImageToVideoPipeline"


class WanRunner:
    def __init__(self, pipe, config: DiTConfig, device: torch.device):
        if pipe.config.get("expand_timesteps", False):
            raise NotImplementedError(
                "Wan pipelines with expand_timesteps (Wan2.2 TI2V-5B) are not supported yet"
            )
        use_fast_norms(pipe.vae)
        self.pipe = pipe
        self.device = device
        self.experts = [m for m in (pipe.transformer, pipe.transformer_2) if m is not None]
        self.cached_forwards = [WanCachedForward(m) for m in self.experts]
        self.dtype = self.experts[0].dtype
        ratio = pipe.config.get("boundary_ratio")
        num_train = pipe.scheduler.config.num_train_timesteps
        self.boundary = None if ratio is None else ratio * num_train
        name = type(pipe).__name__
        self.image_to_video = name == IMAGE_TO_VIDEO
        self._info = VideoStageInfo(
            DEFAULT_SHAPE,
            pipe.vae_scale_factor_spatial * self.experts[0].config.patch_size[1],
            frame_step=pipe.vae_scale_factor_temporal,  # the VAE compresses time after frame 1
            default_fps=DEFAULT_FPS,
            image_to_video=self.image_to_video,
            pipeline_class=name,
            num_experts=1 if self.boundary is None else 2,
        )

    @property
    def info(self) -> VideoStageInfo:
        return self._info

    @property
    def residual_caches(self) -> list[FirstBlockCache]:
        return [f.cache for f in self.cached_forwards]

    def check_request(self, request: DiTRequest) -> None:
        if not isinstance(request.inputs.get("prompt"), str):
            raise FieldError("prompt", "a Wan stage takes a text prompt")
        given = bool(request.inputs.get(INPUT_IMAGES))
        if given != self.image_to_video:
            raise FieldError(
                INPUT_IMAGES,
                f"{self._info.pipeline_class} "
                + (
                    "needs the first frame as an input image"
                    if not given
                    else "takes no input image"
                ),
            )

    def estimate_bytes(self, request: DiTRequest) -> int:
        p = request.params
        latent_frames = (p.num_frames - 1) // self.pipe.vae_scale_factor_temporal + 1
        f = self.pipe.vae_scale_factor_spatial
        channels = self.pipe.vae.config.z_dim * (3 if self.image_to_video else 1)
        latents = latent_frames * (p.height // f) * (p.width // f) * channels * 4
        return latents + 3 * p.num_frames * p.height * p.width  # and the frames it returns

    # ------------------------------------------------------------------ new requests
    def prepare(self, requests: list[DiTRequest]) -> list[RequestState]:
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
        states = []
        for request, prompt in zip(requests, embeds):
            tensors = {PROMPT: prompt[None]}
            if request.request_id in negatives:
                tensors[NEGATIVE] = negatives[request.request_id][None]
            states.append(self._state(request, tensors))
        return states

    def _state(self, request: DiTRequest, tensors: dict[str, torch.Tensor]) -> RequestState:
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
        return RequestState(tensors, sampler)

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

    def denoise(self, requests: list[DiTRequest], entries: list[DiTCacheEntry]) -> list:
        """One denoising step for each request (one shape), one transformer call per expert."""
        by_expert: dict[int, list[int]] = {}
        for i, entry in enumerate(entries):
            by_expert.setdefault(self.expert(timestep(entry)), []).append(i)
        predictions: list[Any] = [None] * len(requests)
        for index, rows in sorted(by_expert.items()):
            batch = [requests[i] for i in rows], [entries[i] for i in rows]
            for i, pred in zip(rows, self._step(index, *batch)):
                predictions[i] = pred
        return predictions

    def _step(self, expert: int, requests: list[DiTRequest], entries: list[DiTCacheEntry]):
        rows_latents, rows_t, rows_text, rows_image = [], [], [], []
        for request, entry in zip(requests, entries):
            if entry.state.get(EXPERT, expert) != expert:
                forget(entry)  # the other expert's residuals are no guide to this one's
            entry.state[EXPERT] = expert
            latents = entry.tensors["latents"]
            if CONDITION in entry.tensors:
                latents = torch.cat([latents, entry.tensors[CONDITION]], dim=1)
            names = [PROMPT] + ([NEGATIVE] if request.params.do_cfg else [])
            for name in names:  # guidance: the negative prompt's row right after the prompt's
                rows_latents.append(latents)
                rows_t.append(timestep(entry))
                rows_text.append(entry.tensors[name])
                if IMAGE_EMBEDS in entry.tensors:
                    rows_image.append(entry.tensors[IMAGE_EMBEDS])
        groups = row_groups(requests, entries)
        latents = torch.cat(rows_latents).to(self.dtype)
        t, text = torch.stack(rows_t), torch.cat(rows_text)
        image = torch.cat(rows_image) if rows_image else None
        if any(g.policy is not None for g in groups):
            noise = self.cached_forwards[expert](latents, t, text, image, groups)
        else:
            noise = self.experts[expert](
                hidden_states=latents,
                timestep=t,
                encoder_hidden_states=text,
                encoder_hidden_states_image=image,
                return_dict=False,
            )[0]
        predictions = []
        for request, group in zip(requests, groups):
            pred = noise[group.start : group.start + 1]
            p = request.params
            if p.do_cfg:
                uncond = noise[group.start + 1 : group.stop]
                scale = p.guidance_scale if expert == 0 else guidance_2(p)
                pred = uncond + scale * (pred - uncond)
            predictions.append(pred)
        return predictions

    # ------------------------------------------------------------------ decode
    def decode(self, requests: list[DiTRequest], entries: list[DiTCacheEntry]) -> list:
        """Finished requests of one shape -> {"video": uint8 frames (F, H, W, 3), "fps"}, in one
        VAE call."""
        vae = self.pipe.vae
        latents = torch.cat([e.tensors["latents"] for e in entries]).to(vae.dtype)
        z = vae.config.z_dim
        mean = torch.tensor(vae.config.latents_mean).view(1, z, 1, 1, 1).to(latents)
        std = torch.tensor(vae.config.latents_std).view(1, z, 1, 1, 1).to(latents)
        video = vae.decode(latents * std + mean, return_dict=False)[0]
        frames = self.pipe.video_processor.postprocess_video(video, output_type="np")
        return [{"video": to_uint8(f), "fps": r.params.fps} for r, f in zip(requests, frames)]


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
