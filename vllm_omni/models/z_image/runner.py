# SPDX-License-Identifier: Apache-2.0
"""Z-Image's model code for the framework's step loop (vllm_omni.diffusion.step_loop).

Per request it does what `ZImagePipeline.__call__` does for one prompt and seed - the noise of
its `prepare_latents`, its sigma schedule, its classifier-free guidance (`guidance_scale > 0`,
the negative prompt's row beside the prompt's) - so the images match diffusers'
(tests/models/z_image). The transformer takes a list of latents and a list of prompt
embeddings of any lengths, so requests of any prompt, step or guidance share one call. The
text encoder is not loaded: the embeddings come from the encoder stage.
"""

from __future__ import annotations

import numpy as np
import torch

from vllm_omni.diffusion.cache_manager import DiTCacheEntry
from vllm_omni.diffusion.executor_kind import ImageStageInfo
from vllm_omni.diffusion.request import DiTRequest
from vllm_omni.diffusion.step_loop import RequestState, timestep
from vllm_omni.errors import FieldError

PROMPT_EMBEDS = "prompt_embeds"
NEGATIVE_PROMPT_EMBEDS = "negative_prompt_embeds"
DEFAULT_SIZE = (1024, 1024)  # the pipeline's own default
REFUSES = frozenset({"cache_threshold"})
"""Residual caching needs a cached forward of the transformer's blocks; Z-Image has none yet."""


class ZImageRunner:
    residual_caches = ()

    def __init__(self, pipe, device: torch.device) -> None:
        self.pipe = pipe
        self.device = device
        self.dtype = pipe.transformer.dtype

    @property
    def info(self) -> ImageStageInfo:
        return ImageStageInfo(DEFAULT_SIZE, self.pipe.vae_scale_factor * 2, refuses=REFUSES)

    def check_request(self, request: DiTRequest) -> None:
        pass

    def estimate_bytes(self, request: DiTRequest) -> int:
        p = request.params
        latents = (p.height // 8) * (p.width // 8) * self.pipe.transformer.in_channels * 4
        embeds = sum(t.numel() * t.element_size() for t in request.inputs.values())
        return latents + embeds

    def prepare(self, requests: list[DiTRequest]) -> list[RequestState]:
        return [self._prepare(r) for r in requests]

    def _prepare(self, request: DiTRequest) -> RequestState:
        """The initial noise and this request's sampler."""
        from diffusers.pipelines.z_image.pipeline_z_image import (
            calculate_shift,
            get_default_z_image_sigmas,
        )

        p = request.params
        generator = torch.Generator(device="cpu").manual_seed(p.seed)
        channels = self.pipe.transformer.in_channels
        latents = self.pipe.prepare_latents(
            1, channels, p.height, p.width, torch.float32, self.device, generator
        )
        sampler = type(self.pipe.scheduler).from_config(self.pipe.scheduler.config)
        cfg = sampler.config
        mu = calculate_shift(
            (latents.shape[2] // 2) * (latents.shape[3] // 2),
            cfg.get("base_image_seq_len", 256),
            cfg.get("max_image_seq_len", 4096),
            cfg.get("base_shift", 0.5),
            cfg.get("max_shift", 1.15),
        )
        sigmas = get_default_z_image_sigmas(p.num_inference_steps)
        sampler.set_timesteps(sigmas=sigmas, mu=mu, device=self.device)
        sampler.set_begin_index(0)
        tensors = {"latents": latents}
        names = [PROMPT_EMBEDS] + ([NEGATIVE_PROMPT_EMBEDS] if p.do_cfg else [])
        for name in names:
            if name not in request.inputs:
                raise FieldError("inputs", f"the Z-Image DiT stage needs {name!r}")
            tensors[name] = request.inputs[name].to(self.device)
        return RequestState(tensors, sampler)

    def denoise(self, requests: list[DiTRequest], entries: list[DiTCacheEntry]) -> list:
        """One denoising step for each request, as one transformer call."""
        rows_latents, rows_t, rows_text = [], [], []
        for request, entry in zip(requests, entries):
            t = timestep(entry)
            latents = entry.tensors["latents"].to(self.dtype)[0].unsqueeze(1)  # (C, 1, H, W)
            names = [PROMPT_EMBEDS] + ([NEGATIVE_PROMPT_EMBEDS] if request.params.do_cfg else [])
            for name in names:  # guidance: the negative prompt's row right after the prompt's
                rows_latents.append(latents)
                rows_t.append((1000 - t) / 1000)
                rows_text.append(entry.tensors[name])
        out = self.pipe.transformer(
            rows_latents, torch.stack(rows_t), rows_text, return_dict=False
        )[0]
        predictions, row = [], 0
        for request in requests:
            pred = out[row].float()
            row += 1
            if request.params.do_cfg:
                negative = out[row].float()
                row += 1
                pred = pred + request.params.guidance_scale * (pred - negative)
            predictions.append(-pred.squeeze(1)[None])
        return predictions

    def decode(self, requests: list[DiTRequest], entries: list[DiTCacheEntry]) -> list:
        """Finished requests of equal size -> images (uint8 arrays) in one VAE call, or their
        latents where asked for."""
        results: list = [None] * len(requests)
        todo = []
        for i, (request, entry) in enumerate(zip(requests, entries)):
            latents = entry.tensors["latents"]
            if request.params.output_type == "latent":
                results[i] = latents[0].detach().cpu()
            else:
                todo.append((i, latents))
        if todo:
            vae = self.pipe.vae
            latents = torch.cat([lat for _, lat in todo]).to(vae.dtype)
            latents = latents / vae.config.scaling_factor + vae.config.shift_factor
            images = self.pipe.image_processor.postprocess(
                vae.decode(latents, return_dict=False)[0], output_type="pil"
            )
            for (i, _), image in zip(todo, images):
                results[i] = np.asarray(image)
        return results
