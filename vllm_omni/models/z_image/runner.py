# SPDX-License-Identifier: Apache-2.0
"""Z-Image's denoising, one step at a time, for requests at any step.

Per request it does what `ZImagePipeline.__call__` does for one prompt and seed - the noise of
its `prepare_latents`, its sigma schedule, its classifier-free guidance (`guidance_scale > 0`,
the negative prompt's row beside the prompt's) - so the images match diffusers'
(tests/models/z_image). The transformer takes a list of latents and a list of prompt
embeddings of any lengths, so requests of any prompt, step or guidance share one call; each
request's state (latents, embeddings, sampler) lives in the DiTCacheManager.
"""

from __future__ import annotations

import numpy as np
import torch

from vllm_omni.diffusion.cache_manager import DiTCacheManager
from vllm_omni.diffusion.request import DiTRequest
from vllm_omni.diffusion.step_loop import advance
from vllm_omni.errors import FieldError

PROMPT_EMBEDS = "prompt_embeds"
NEGATIVE_PROMPT_EMBEDS = "negative_prompt_embeds"


def guided(params) -> bool:
    """Whether a request runs classifier-free guidance, as the pipeline decides."""
    return params.guidance_scale > 0


class ZImageRunner:
    def __init__(self, pipe, cache: DiTCacheManager, device: torch.device) -> None:
        self.pipe = pipe
        self.cache = cache
        self.device = device
        self.dtype = pipe.transformer.dtype

    def prepare(self, request: DiTRequest) -> None:
        """Draw the initial noise and set up this request's sampler."""
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
        names = [PROMPT_EMBEDS] + ([NEGATIVE_PROMPT_EMBEDS] if guided(p) else [])
        for name in names:
            if name not in request.inputs:
                raise FieldError("inputs", f"the Z-Image DiT stage needs {name!r}")
            tensors[name] = request.inputs[name].to(self.device)
        self.cache.allocate(request.request_id, tensors, sampler=sampler, step=0)

    @torch.inference_mode()
    def denoise_step(self, requests: list[DiTRequest]) -> None:
        """One denoising step for each request, as one transformer call."""
        rows_latents, rows_t, rows_text = [], [], []
        entries = [self.cache.get(r.request_id) for r in requests]
        for request, entry in zip(requests, entries):
            t = entry.state["sampler"].timesteps[entry.state["step"]]
            latents = entry.tensors["latents"].to(self.dtype)[0].unsqueeze(1)  # (C, 1, H, W)
            names = [PROMPT_EMBEDS] + ([NEGATIVE_PROMPT_EMBEDS] if guided(request.params) else [])
            for name in names:  # guidance: the negative prompt's row right after the prompt's
                rows_latents.append(latents)
                rows_t.append((1000 - t) / 1000)
                rows_text.append(entry.tensors[name])
        out = self.pipe.transformer(
            rows_latents, torch.stack(rows_t), rows_text, return_dict=False
        )[0]
        row = 0
        for request, entry in zip(requests, entries):
            pred = out[row].float()
            row += 1
            if guided(request.params):
                negative = out[row].float()
                row += 1
                pred = pred + request.params.guidance_scale * (pred - negative)
            advance(entry, -pred.squeeze(1)[None])

    def is_done(self, request: DiTRequest) -> bool:
        return self.cache.get(request.request_id).state["step"] >= request.num_steps

    @torch.inference_mode()
    def decode(self, requests: list[DiTRequest]) -> dict[str, object]:
        """Finished requests of equal size -> images (uint8 arrays) in one VAE call, or their
        latents where asked for."""
        results: dict[str, object] = {}
        todo = []
        for request in requests:
            latents = self.cache.get(request.request_id).tensors["latents"]
            if request.params.output_type == "latent":
                results[request.request_id] = latents[0].detach().cpu()
            else:
                todo.append((request, latents))
        if todo:
            vae = self.pipe.vae
            latents = torch.cat([lat for _, lat in todo]).to(vae.dtype)
            latents = latents / vae.config.scaling_factor + vae.config.shift_factor
            images = self.pipe.image_processor.postprocess(
                vae.decode(latents, return_dict=False)[0], output_type="pil"
            )
            for (request, _), image in zip(todo, images):
                results[request.request_id] = np.asarray(image)
        return results
