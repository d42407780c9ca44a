# SPDX-License-Identifier: Apache-2.0
"""AuraFlow's model code for the framework's step loop (vllm_omni.diffusion.step_loop).

Per request it does what `AuraFlowPipeline.__call__` does for one prompt and seed: the prompt
(and under guidance the negative prompt, empty if none) through the UMT5 encoder, padded to 256
tokens and masked; the noise of its `prepare_latents`; its flow-matching sampler; guidance
`uncond + scale * (cond - uncond)` whenever `guidance_scale > 1`. Every row of a call has 256
text tokens, so requests of one image size share each transformer call whatever their prompt,
step or guidance; new requests' prompts are encoded together, in one encoder call.
"""

from __future__ import annotations

import numpy as np
import torch

from vllm_omni.diffusion.cache_manager import DiTCacheEntry
from vllm_omni.diffusion.executor_kind import ImageStageInfo
from vllm_omni.diffusion.request import DiTRequest
from vllm_omni.diffusion.step_loop import RequestState, timestep
from vllm_omni.errors import FieldError

PROMPT = "prompt_embeds"
NEGATIVE = "negative_prompt_embeds"
MAX_TEXT_TOKENS = 256  # the pipeline's max_sequence_length
DEFAULT_SIZE = (1024, 1024)  # the pipeline's own default
REFUSES = frozenset({"cache_threshold"})
"""Residual caching needs a cached forward of the transformer's blocks; AuraFlow has none yet."""


class AuraFlowRunner:
    residual_caches = ()

    def __init__(self, pipe, device: torch.device) -> None:
        self.pipe = pipe
        self.device = device
        self.dtype = pipe.transformer.dtype

    @property
    def info(self) -> ImageStageInfo:
        multiple = self.pipe.vae_scale_factor * self.pipe.transformer.config.patch_size
        return ImageStageInfo(DEFAULT_SIZE, multiple, refuses=REFUSES)

    def check_request(self, request: DiTRequest) -> None:
        if not isinstance(request.inputs.get("prompt"), str):
            raise FieldError("prompt", "an AuraFlow stage takes a text prompt")

    def estimate_bytes(self, request: DiTRequest) -> int:
        p = request.params
        f = self.pipe.vae_scale_factor
        latents = (p.height // f) * (p.width // f) * self.pipe.transformer.config.in_channels * 4
        width = self.pipe.text_encoder.config.d_model
        return latents + p.rows * MAX_TEXT_TOKENS * width * self.dtype.itemsize

    def prepare(self, requests: list[DiTRequest]) -> list[RequestState]:
        """Encode the new requests' prompts and negative prompts (one encoder call), draw their
        noise and set up each one's sampler."""
        from diffusers.pipelines.aura_flow.pipeline_aura_flow import retrieve_timesteps

        texts = [r.inputs["prompt"] for r in requests]
        guided = [r for r in requests if r.params.do_cfg]
        texts += [r.params.negative_prompt or "" for r in guided]  # the pipeline's default: ""
        embeds = self.pipe.encode_prompt(
            prompt=texts,
            do_classifier_free_guidance=False,
            device=self.device,
            max_sequence_length=MAX_TEXT_TOKENS,
        )[0]
        negatives = dict(zip([r.request_id for r in guided], embeds[len(requests) :]))
        states = []
        for request, prompt in zip(requests, embeds):
            p = request.params
            tensors = {PROMPT: prompt[None]}
            if request.request_id in negatives:
                tensors[NEGATIVE] = negatives[request.request_id][None]
            generator = torch.Generator(device="cpu").manual_seed(p.seed)
            channels = self.pipe.transformer.config.in_channels
            tensors["latents"] = self.pipe.prepare_latents(
                1, channels, p.height, p.width, prompt.dtype, self.device, generator
            )
            sampler = type(self.pipe.scheduler).from_config(self.pipe.scheduler.config)
            retrieve_timesteps(sampler, p.num_inference_steps, self.device)
            sampler.set_begin_index(0)
            states.append(RequestState(tensors, sampler))
        return states

    def denoise(self, requests: list[DiTRequest], entries: list[DiTCacheEntry]) -> list:
        """One denoising step for each request (one image size), as one transformer call."""
        rows_latents, rows_t, rows_text = [], [], []
        for request, entry in zip(requests, entries):
            names = [PROMPT] + ([NEGATIVE] if request.params.do_cfg else [])
            for name in names:  # guidance: the negative prompt's row right after the prompt's
                rows_latents.append(entry.tensors["latents"])
                rows_t.append(timestep(entry) / 1000)  # AuraFlow's time runs from 1 to 0
                rows_text.append(entry.tensors[name])
        latents = torch.cat(rows_latents)
        noise = self.pipe.transformer(
            latents,
            encoder_hidden_states=torch.cat(rows_text),
            timestep=torch.stack(rows_t).to(latents.dtype),
            return_dict=False,
        )[0]
        predictions, row = [], 0
        for request in requests:
            pred = noise[row : row + 1]
            row += 1
            if request.params.do_cfg:
                uncond = noise[row : row + 1]
                row += 1
                pred = uncond + request.params.guidance_scale * (pred - uncond)
            predictions.append(pred)
        return predictions

    def decode(self, requests: list[DiTRequest], entries: list[DiTCacheEntry]) -> list:
        """Finished requests of one size -> images (uint8 arrays) in one VAE call, or their
        latents where asked for."""
        results: list = [None] * len(requests)
        todo = []
        for i, (request, entry) in enumerate(zip(requests, entries)):
            if request.params.output_type == "latent":
                results[i] = entry.tensors["latents"][0].detach().cpu()
            else:
                todo.append((i, entry.tensors["latents"]))
        if todo:
            vae = self.pipe.vae
            latents = torch.cat([lat for _, lat in todo]).to(vae.dtype)
            pixels = vae.decode(latents / vae.config.scaling_factor, return_dict=False)[0]
            images = self.pipe.image_processor.postprocess(pixels, output_type="pil")
            for (i, _), image in zip(todo, images):
                results[i] = np.asarray(image)
        return results
