# SPDX-License-Identifier: Apache-2.0
"""Per-request first-block residual caching in the DiT stage's step path (no vLLM).

The tiny pipeline's random time embedding makes block residuals jump between steps (relative
L1 ~1: nothing would be cached), so these tests smooth it (`smooth_time_embedding_`), as
benchmarks/dit_cache.py's compute-bound model does, to make the cache actually hit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_omni.config.stage_config import StageConfig
from vllm_omni.diffusion.config import DiTConfig
from vllm_omni.diffusion.engine_core import DiffusionEngineCore
from vllm_omni.diffusion.params import DiffusionSamplingParams
from vllm_omni.diffusion.residual_cache import ResidualCacheConfig, RowGroup
from vllm_omni.models.qwen_image.cached_forward import FirstBlockCachedForward, supports
from vllm_omni.testing.tiny_common import smooth_time_embedding_

from ...helpers.diffusers_reference import load_pipeline, max_pixel_diff

POLICY = ResidualCacheConfig(threshold=0.3, warmup_steps=2, final_steps=1, max_consecutive=2)
STEPS = 12


@pytest.fixture(scope="module")
def pipe(tiny_models):
    pipe = load_pipeline(tiny_models["qwen-image"])
    smooth_time_embedding_(pipe.transformer, 3.0)
    return pipe


@pytest.fixture(scope="module")
def embeds(pipe):
    prompts = ["a red cat", "a lighthouse at dusk over a stormy sea", "blurry", "two apples"]
    with torch.inference_mode():
        return [pipe.encode_prompt(p, device=torch.device("cpu"))[0][0] for p in prompts]


def _core(pipe, tiny_models, policy=POLICY) -> DiffusionEngineCore:
    config = DiTConfig(model=str(tiny_models["qwen-image"]), residual_cache=policy)
    return DiffusionEngineCore(config, "step", "qwen_image", pipe=pipe)


def _requests(embeds) -> dict[str, tuple]:
    """Four requests that share one step-level batch: other prompt lengths, a request with
    its own threshold and guidance, an uncached one, and one of another size."""

    def params(**kw):
        return DiffusionSamplingParams(num_inference_steps=STEPS, height=64, width=64, **kw)

    return {
        "stage_policy": ({"prompt_embeds": embeds[0]}, params(seed=1)),
        "own_threshold_cfg": (
            {"prompt_embeds": embeds[1], "negative_prompt_embeds": embeds[2]},
            params(seed=2, negative_prompt="blurry", cache_threshold=0.5),
        ),
        "uncached": ({"prompt_embeds": embeds[3]}, params(seed=3, cache_threshold=0.0)),
        "other_size": (
            {"prompt_embeds": embeds[3]},
            DiffusionSamplingParams(num_inference_steps=8, height=32, width=48, seed=4),
        ),
    }


def _run(core: DiffusionEngineCore, requests: dict, joins: dict[str, int]) -> dict:
    """Request r joins before engine step joins[r]; returns images by request id."""
    results, step = {}, 0
    pending = dict(requests)
    while pending or core.has_unfinished_requests():
        for rid in [r for r in pending if joins[r] <= step]:
            core.add_request(rid, *pending.pop(rid))
        finished, _, _ = core.step()
        results.update({r.request_id: out for r, out in finished})
        step += 1
    assert core.cache.num_entries == 0 and core.cache.num_bytes == 0
    return results


def test_request_image_is_the_same_alone_and_in_a_mixed_step_batch(pipe, tiny_models, embeds):
    requests = _requests(embeds)
    alone, cached_alone = {}, 0
    for rid, request in requests.items():
        core = _core(pipe, tiny_models)
        alone.update(_run(core, {rid: request}, {rid: 0}))
        cached_alone += core.stats()["residual_cached_rows"]
    core = _core(pipe, tiny_models)
    batched = _run(
        core, requests, {"stage_policy": 0, "uncached": 0, "own_threshold_cfg": 3, "other_size": 5}
    )
    for rid in requests:
        assert max_pixel_diff(alone[rid], batched[rid]) <= 2, rid
    # the cache did hit, and every request decided alone as it did in the batch
    assert cached_alone > 0
    assert core.stats()["residual_cached_rows"] == cached_alone


def test_caching_changes_the_image_only_a_little(pipe, tiny_models, embeds):
    request = (
        {"prompt_embeds": embeds[0]},
        DiffusionSamplingParams(num_inference_steps=STEPS, height=64, width=64, seed=1),
    )
    cached_core, plain_core = _core(pipe, tiny_models), _core(pipe, tiny_models, None)
    cached = _run(cached_core, {"r": request}, {"r": 0})["r"]
    plain = _run(plain_core, {"r": request}, {"r": 0})["r"]
    assert cached_core.stats()["residual_cached_rows"] > 0
    assert plain_core.stats()["residual_cached_rows"] == 0
    mse = np.mean((cached.astype(float) - plain.astype(float)) ** 2)
    assert 0 < mse and 10 * np.log10(255**2 / mse) > 30


def test_all_rows_computing_is_the_transformer_forward(pipe, embeds):
    """Every row computing (the last warm-up step): exactly the operations of the transformer's
    forward, and the residuals kept for the next step."""
    from vllm_omni.diffusion.cache_manager import DiTCacheEntry
    from vllm_omni.models.qwen_image.runner import pad_text

    t = pipe.transformer
    text, mask = pad_text([e[None] for e in embeds[:3]])
    latents = torch.randn(3, 16, t.config.in_channels, generator=torch.Generator().manual_seed(0))
    timestep = torch.tensor([0.9, 0.5, 0.1])
    shapes = [[(1, 4, 4)]] * 3
    entries = [DiTCacheEntry({}, {"fbcache_policy": POLICY}) for _ in range(3)]
    step = POLICY.warmup_steps - 1
    groups = [RowGroup(i, i + 1, entries[i], step, num_steps=STEPS) for i in range(3)]
    with torch.inference_mode():
        ours = FirstBlockCachedForward(t)(latents, timestep, text, mask, shapes, groups)
        ref = t(
            hidden_states=latents,
            timestep=timestep,
            encoder_hidden_states=text,
            encoder_hidden_states_mask=mask,
            img_shapes=shapes,
            return_dict=False,
        )[0]
    assert torch.equal(ours, ref)
    assert all("fbcache_tail_residual" in e.tensors for e in entries)  # state for next step


def test_abort_frees_the_cache_state(pipe, tiny_models, embeds):
    core = _core(pipe, tiny_models)
    core.add_request(
        "r",
        {"prompt_embeds": embeds[0]},
        DiffusionSamplingParams(num_inference_steps=STEPS, height=64, width=64, seed=1),
    )
    for _ in range(POLICY.warmup_steps + 2):
        core.step()
    assert core.stats()["residual_cached_rows"] > 0
    assert any(k.startswith("fbcache") for k in core.cache.get("r").tensors)
    core.abort_request("r")
    assert core.cache.num_entries == 0 and core.cache.num_bytes == 0


def test_settings_are_validated_naming_the_field():
    with pytest.raises(ValueError, match="threshold"):
        ResidualCacheConfig(threshold=1.5)
    with pytest.raises(ValueError, match="max_consecutive"):
        ResidualCacheConfig(max_consecutive=-1)
    assert ResidualCacheConfig.parse("0.3").threshold == 0.3
    assert ResidualCacheConfig.parse('{"warmup_steps": 2}').warmup_steps == 2
    with pytest.raises(ValueError, match="bogus"):
        ResidualCacheConfig.parse('{"bogus": 1}')
    with pytest.raises(ValueError, match="cache_threshold"):
        DiffusionSamplingParams(cache_threshold=-0.1)
    with pytest.raises(ValueError, match=r"dit\.residual_cache\.threshold"):
        DiTConfig.from_dict({"model": "m", "residual_cache": {"threshold": 2}}, where="dit")
    with pytest.raises(ValueError, match="step"):  # whole-request scheduling cannot cache
        StageConfig(
            name="dit",
            engine_type="DiT",
            model="m",
            executor="qwen_image",
            scheduler="fifo",
            dit={"residual_cache": {"threshold": 0.2}},
        )
    assert not supports(torch.nn.Linear(2, 2))
