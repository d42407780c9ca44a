# SPDX-License-Identifier: Apache-2.0
"""Qwen2.5-Omni's code2wav stage: its waveforms equal transformers' token2wav for the same codes,
voice and seed, in-process and through a real DiT stage process."""

from __future__ import annotations

import asyncio

import pytest
import torch

from vllm_omni.config.stage_config import StageConfig
from vllm_omni.diffusion.cache_manager import DiTCacheManager
from vllm_omni.diffusion.config import DiTConfig
from vllm_omni.diffusion.engine_core import DiffusionEngineCore
from vllm_omni.diffusion.request import DiTRequest
from vllm_omni.engine.process_stage import ProcessStage
from vllm_omni.models.qwen2_5_omni import tiny as tiny_omni
from vllm_omni.models.qwen2_5_omni.code2wav import (
    CODEC_TOKENS,
    STREAM_CHUNK_CODES,
    STREAM_FIRST_CHUNK_CODES,
    STREAM_LEFT_CODES,
    STREAM_LOOKAHEAD_CODES,
    Code2WavExecutor,
    chunk_windows,
)
from vllm_omni.models.qwen2_5_omni.params import Code2WavParams

SAMPLES_PER_TOKEN = 480  # 2 mel frames per codec token x BigVGAN hop 240
# The executor against itself in a DiT stage process (another thread pool): a last-bit difference
# would be acceptable; 1e-6 is far below the 1.0 peak of these waveforms.
PROCESS_ATOL = 1e-6
WINDOW_ALIGN = 12  # the tiny DiT's block_size 24 frames / 2 frames per code


HF_TOLERANCE = 1e-3
"""Our waveform against transformers' token2wav, relative to its peak. Same modules, inputs and
noise; the DiT attends through block_attention (the same band of blocks, added up in another
order): measured up to 4.2e-4 over 11-512 codes, both voices, two seeds (the mel itself within
~2e-7 of its peak; the random-weight BigVGAN amplifies)."""

BATCH_TOLERANCE = 1e-3  # measured: 4.0e-4
"""A batched row against the same request decoded alone, relative to the peak: other kernel
shapes round differently; the noise and the inputs are the row's own."""


def _codes(n: int, seed: int) -> torch.Tensor:
    # Plain codec ids: the talker's pad/bos/eos/mask (60..63) never reach code2wav.
    return torch.randint(
        0, tiny_omni.CODEC_PAD, (n,), generator=torch.Generator().manual_seed(seed)
    )


@pytest.fixture(scope="module")
def omni_dir(tiny_models):
    return str(tiny_models["qwen2.5-omni"])


@pytest.fixture(scope="module")
def executor(omni_dir) -> Code2WavExecutor:
    return Code2WavExecutor(DiTConfig(model=omni_dir, device="cpu"), DiTCacheManager())


@pytest.fixture(scope="module")
def hf_model(omni_dir):
    from transformers import Qwen2_5OmniForConditionalGeneration

    return Qwen2_5OmniForConditionalGeneration.from_pretrained(omni_dir, dtype=torch.float32)


def _hf_wav(hf_model, codes: torch.Tensor, voice: str, seed: int, **kwargs) -> torch.Tensor:
    """What Qwen2_5OmniForConditionalGeneration.generate does with the codes, after
    `torch.manual_seed(seed)`."""
    speaker = hf_model.speaker_map[voice]
    torch.manual_seed(seed)
    with torch.no_grad():
        wav = hf_model.token2wav(
            codes[None],
            conditioning=speaker["cond"].float().expand(1, -1),
            reference_mel=speaker["ref_mel"].float().expand(1, -1, -1),
            **kwargs,
        )
    return wav.reshape(-1).float()


def _decode(executor: Code2WavExecutor, codes: torch.Tensor, **params) -> torch.Tensor:
    return executor.decode(DiTRequest("r", Code2WavParams(**params), {CODEC_TOKENS: codes}))


def _decode_chunked(
    executor: Code2WavExecutor, codes: torch.Tensor, chunk: int, left: int, lookahead: int, **params
) -> tuple[torch.Tensor, list[tuple[int, int, int, int]]]:
    """Every window through the executor, the kept audio joined (what streaming sends)."""
    windows = chunk_windows(
        len(codes), chunk, left, lookahead, executor.window_align, first=STREAM_FIRST_CHUNK_CODES
    )
    pieces = [
        _decode(
            executor,
            codes[start:end],
            window_start=start,
            keep=(keep_start - start, keep_end - start),
            **params,
        )
        for start, end, keep_start, keep_end in windows
    ]
    return torch.cat(pieces), windows


# ---------------------------------------------------------------------------- params
def test_params_validate_each_field() -> None:
    assert Code2WavParams() == Code2WavParams(
        voice="Chelsie", seed=None, num_steps=10, guidance_scale=0.5, sway_coefficient=-1.0
    )
    bad = [
        ({"voice": ""}, "voice"),
        ({"seed": -1}, "seed"),
        ({"seed": True}, "seed"),
        ({"num_steps": 1}, "num_steps"),
        ({"num_steps": 2.0}, "num_steps"),
        ({"guidance_scale": -0.1}, "guidance_scale"),
        ({"guidance_scale": float("nan")}, "guidance_scale"),
        ({"sway_coefficient": float("inf")}, "sway_coefficient"),
        ({"window_start": -1}, "window_start"),
        ({"window_start": 12.0}, "window_start"),
        ({"keep": (3, 3)}, "keep"),
        ({"keep": (-1, 2)}, "keep"),
        ({"keep": (0, 1, 2)}, "keep"),
        ({"keep": (0, True)}, "keep"),
        ({"keep": "ab"}, "keep"),
    ]
    for kwargs, field in bad:
        with pytest.raises(ValueError, match=f"^{field}:"):
            Code2WavParams(**kwargs)
    assert Code2WavParams.from_dict({"voice": "Ethan", "seed": 3}).voice == "Ethan"
    with pytest.raises(ValueError, match="^speed: unknown code2wav parameter"):
        Code2WavParams.from_dict({"speed": 1.0})
    # A JSON body's list becomes the tuple, so the params compare (and hash) as built in Python.
    assert Code2WavParams.from_dict({"keep": [2, 5]}) == Code2WavParams(keep=(2, 5))


def test_chunk_windows() -> None:
    windows = chunk_windows(100, chunk=30, left=20, lookahead=15, align=12)
    assert windows == [(0, 45, 0, 30), (0, 75, 30, 60), (36, 100, 60, 90), (60, 100, 90, 100)]
    for num_codes, chunk, left, lookahead in [(1, 24, 24, 24), (150, 36, 36, 36), (97, 7, 5, 0)]:
        windows = chunk_windows(num_codes, chunk, left, lookahead, WINDOW_ALIGN)
        assert [w[2] for w in windows] == list(range(0, num_codes, chunk))
        assert [w[3] for w in windows[:-1]] == [w[2] for w in windows[1:]]
        assert windows[-1][3] == num_codes
        for start, end, keep_start, keep_end in windows:
            assert start % WINDOW_ALIGN == 0 and keep_start - left - WINDOW_ALIGN < start
            assert start <= keep_start < keep_end <= end <= min(num_codes, keep_end + lookahead)
    assert chunk_windows(0, 24, 24, 24, 12) == []
    # A shorter first chunk; the rest tile on from its end.
    windows = chunk_windows(100, chunk=36, left=36, lookahead=36, align=12, first=12)
    assert windows == [(0, 48, 0, 12), (0, 84, 12, 48), (12, 100, 48, 84), (48, 100, 84, 100)]
    bad = [({"chunk": 0}, "chunk"), ({"left": -1}, "left"), ({"align": 0}, "align")]
    for kwargs, field in bad + [({"first": 0}, "first")]:
        with pytest.raises(ValueError, match=f"^{field}:"):
            chunk_windows(
                **{"num_codes": 10, "chunk": 4, "left": 0, "lookahead": 0, "align": 1, **kwargs}
            )


def test_stage_config_runs_code2wav_whole_requests(omni_dir) -> None:
    config = StageConfig(name="code2wav", engine_type="DiT", model=omni_dir, executor="code2wav")
    assert config.scheduler == "fifo"
    with pytest.raises(ValueError, match="^scheduler: the code2wav executor runs whole"):
        StageConfig(
            name="code2wav",
            engine_type="DiT",
            model=omni_dir,
            executor="code2wav",
            scheduler="step",
        )


def test_cpu_stage_decodes_on_one_thread_one_request_at_a_time(omni_dir) -> None:
    # Beside vLLM workers bound to the other cores, a second thread only waits (dit_stage.py).
    def dit(**settings):
        config = StageConfig(
            name="code2wav",
            engine_type="DiT",
            model=omni_dir,
            executor="code2wav",
            dit={"device": "cpu", **settings},
        )
        return ProcessStage(config).dit_config

    assert (dit().num_threads, dit().max_num_seqs) == (1, 1)
    chosen = dit(num_threads=2, max_num_seqs=4)  # the stage config wins
    assert (chosen.num_threads, chosen.max_num_seqs) == (2, 4)


# ---------------------------------------------------------------------------- in-process
def test_info(executor: Code2WavExecutor) -> None:
    info = executor.info
    assert info.sample_rate == 24_000
    assert info.voices == tuple(sorted(tiny_omni.SPEAKERS))
    assert info.samples_per_token == SAMPLES_PER_TOKEN
    assert info.max_codec_tokens == 4096  # max_position_embeddings 8192 / 2 frames per code
    assert info.window_align == WINDOW_ALIGN


@pytest.mark.parametrize("voice", tiny_omni.SPEAKERS)
def test_matches_transformers(executor, hf_model, voice: str) -> None:
    codes = _codes(23, seed=0)
    wavs = {}
    for seed in (0, 1234):
        ours = _decode(executor, codes, voice=voice, seed=seed)
        ref = _hf_wav(hf_model, codes, voice, seed)
        assert ours.dtype == torch.float32 and ours.shape == ref.shape == (23 * SAMPLES_PER_TOKEN,)
        error = (ours - ref).abs().max().item() / ref.abs().max().item()
        assert error <= HF_TOLERANCE, f"{voice}, seed {seed}: max |difference| / peak {error}"
        wavs[seed] = ours
    assert not torch.equal(wavs[0], wavs[1234])  # the seed picks the DiT's initial noise


def test_matches_transformers_without_guidance(executor, hf_model) -> None:
    # guidance_scale < 1e-5: one unguided pass per evaluation (sample()'s other branch).
    codes = _codes(11, seed=3)
    kwargs = {"num_steps": 4, "guidance_scale": 0.0, "sway_coefficient": 0.3}
    ours = _decode(executor, codes, voice="Ethan", seed=9, **kwargs)
    ref = _hf_wav(hf_model, codes, "Ethan", 9, **kwargs)
    assert (ours - ref).abs().max().item() <= HF_TOLERANCE * ref.abs().max().item()


def test_noise_prefix_is_the_global_rng_draw(executor) -> None:
    # What keeps whole requests equal to HF's: CPU randn fills in order, so the request's noise
    # starts with the noise sample() draws for N codes after torch.manual_seed(seed).
    noise = executor.noise(1234)
    assert noise.shape == (1, 2 * 4096, 80)
    for n in (1, 23, 150):
        torch.manual_seed(1234)
        assert torch.equal(noise[:, : 2 * n], torch.randn([1, 2 * n, 80]))


def test_keep_returns_the_kept_codes_audio(executor) -> None:
    codes = _codes(23, seed=6)
    whole = _decode(executor, codes, seed=4)
    kept = _decode(executor, codes, seed=4, keep=(5, 17))
    assert torch.equal(kept, whole[5 * SAMPLES_PER_TOKEN : 17 * SAMPLES_PER_TOKEN])


def test_window_uses_the_noise_frames_it_covers(executor, monkeypatch) -> None:
    # A window at code 24 must start from the request's noise frames [48, ...): the same
    # decode as a window at 0 whose noise is the request's shifted by those 48 frames.
    codes = _codes(30, seed=7)
    at_24 = _decode(executor, codes, seed=5, window_start=24)
    noise = executor.noise(5)
    monkeypatch.setattr(executor, "noise", lambda seed: noise[:, 48:])
    assert torch.equal(at_24, _decode(executor, codes, seed=5))


def test_chunked_decode_boundary_error(executor) -> None:
    """Streaming's windows, joined, against the whole decode (150 codes of the tiny model).

    The error comes from the DiT only seeing its window: per evaluation a frame attends to its
    block (24 frames = 12 codes) and one block before (layer 0) or after (layer 1), and the 36
    evaluations of 10-step RK4 carry that further; BigVGAN adds ~12 frames each side. Measured
    max |chunked - whole| / peak here (seed 0, Chelsie; seed 1, Ethan), boundary = 1 code around
    each chunk boundary (chunk, left, lookahead in codes):
      24/12/12 1.2 | 24/24/24 5.7e-2, 1.0e-1 | 24/48/24 5.7e-2 | 24/24/48 4.1e-2, 1.0e-1
      24/36/36 9.7e-4, 7.6e-4 | 36/36/36 9.4e-4, 8.9e-4 | 48/48/48 3.5e-4, 6.2e-4
    With less than 3 blocks (36 codes) on either side the error reaches a clipped sample's full
    swing; the tiny model's waveform is ~90% clipped at +-1, so max error is a harsh measure.
    """
    codes = _codes(150, seed=0)
    whole = _decode(executor, codes, seed=0)
    joined, windows = _decode_chunked(
        executor,
        codes,
        STREAM_CHUNK_CODES,
        STREAM_LEFT_CODES,
        STREAM_LOOKAHEAD_CODES,
        seed=0,
    )
    assert joined.shape == whole.shape
    assert len(windows) == 5  # 150 codes: 12, then chunks of 36
    error = (joined - whole).abs().max().item() / whole.abs().max().item()
    # Measured at the streaming defaults (first chunk 12), three code sequences: 6.5e-4 to
    # 2.2e-3, largest at whichever chunk boundary the waveform happens to swing at.
    assert error <= 3e-3, f"chunked decode: max error {error:.2e} of the peak"


def test_decode_leaves_the_global_rng_alone(executor) -> None:
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    _decode(executor, _codes(4, seed=1), seed=7)
    assert torch.equal(torch.rand(3), expected)


def test_zero_codes_give_an_empty_waveform(executor) -> None:
    wav = _decode(executor, torch.zeros(0, dtype=torch.long), seed=0)
    assert wav.dtype == torch.float32 and wav.shape == (0,)


def test_engine_core_runs_each_request_alone_and_frees_it(omni_dir, executor) -> None:
    core = DiffusionEngineCore(DiTConfig(model=omni_dir, device="cpu"), "fifo", "code2wav")
    requests = {
        "a": (_codes(5, seed=1), Code2WavParams(voice="Ethan", seed=1)),
        "b": (_codes(7, seed=2), Code2WavParams(voice="Chelsie", seed=2)),
        "gone": (_codes(6, seed=3), Code2WavParams(seed=3)),
    }
    for rid, (codes, params) in requests.items():
        core.add_request(rid, {CODEC_TOKENS: codes}, params)
    assert core.abort_request("gone")
    results, steps = {}, 0
    while core.has_unfinished_requests():
        finished, _, _ = core.step()
        assert len(finished) == 1  # one request per step: nobody waits for another's decode
        results.update({r.request_id: out for r, out in finished})
        steps += 1
    assert steps == 2 and sorted(results) == ["a", "b"]
    assert core.cache.num_entries == 0
    for rid in results:
        codes, params = requests[rid]
        expected = executor.decode(DiTRequest(rid, params, {CODEC_TOKENS: codes}))
        assert torch.equal(results[rid], expected)


def test_equal_requests_decode_as_one_batch(omni_dir, executor) -> None:
    # Same length and voice: one DiT batch, each row with its own noise.
    core = DiffusionEngineCore(DiTConfig(model=omni_dir, device="cpu"), "fifo", "code2wav")
    requests = {f"r{i}": (_codes(30, seed=i), Code2WavParams(seed=10 + i)) for i in range(3)}
    for rid, (codes, params) in requests.items():
        core.add_request(rid, {CODEC_TOKENS: codes}, params)
    finished, _, _ = core.step()
    assert sorted(r.request_id for r, _ in finished) == sorted(requests)
    for request, wav in finished:
        codes, params = requests[request.request_id]
        alone = executor.decode(DiTRequest("alone", params, {CODEC_TOKENS: codes}))
        error = (wav - alone).abs().max().item() / alone.abs().max().item()
        assert error <= BATCH_TOLERANCE, error


def test_bad_requests_are_rejected_at_admission(omni_dir) -> None:
    core = DiffusionEngineCore(DiTConfig(model=omni_dir, device="cpu"), "fifo", "code2wav")
    bad = [
        ({CODEC_TOKENS: _codes(3, 0)}, Code2WavParams(voice="Nobody"), "^voice: unknown voice"),
        ({}, Code2WavParams(), "^inputs: the code2wav stage needs 'codec_tokens'"),
        ({CODEC_TOKENS: torch.zeros(2, 3, dtype=torch.long)}, Code2WavParams(), "^codec_tokens:"),
        ({CODEC_TOKENS: torch.zeros(3)}, Code2WavParams(), "^codec_tokens: must be a 1-D int"),
        ({CODEC_TOKENS: torch.tensor([1, 65])}, Code2WavParams(), r"^codec_tokens: ids must be"),
        ({CODEC_TOKENS: torch.zeros(4097, dtype=torch.long)}, Code2WavParams(), "^codec_tokens:"),
        (
            {CODEC_TOKENS: _codes(3, 0)},
            Code2WavParams(seed=1, window_start=6),
            "^window_start: must be a multiple of 12 codes",
        ),
        (
            {CODEC_TOKENS: _codes(12, 0)},
            Code2WavParams(seed=1, window_start=4092),
            r"^window_start: the window \[4092, 4104\) ends past the 4096",
        ),
        ({CODEC_TOKENS: _codes(3, 0)}, Code2WavParams(seed=1, keep=(1, 4)), "^keep:"),
        ({CODEC_TOKENS: _codes(3, 0)}, Code2WavParams(keep=(0, 2)), "^seed: windowed"),
    ]
    for i, (inputs, params, match) in enumerate(bad):
        with pytest.raises(ValueError, match=match):
            core.add_request(f"r{i}", inputs, params)
    assert not core.has_unfinished_requests()


# ---------------------------------------------------------------------------- stage process
def test_dit_stage_process(omni_dir, executor) -> None:
    asyncio.run(_stage_scenario(omni_dir, executor))


async def _stage_scenario(omni_dir: str, executor: Code2WavExecutor) -> None:
    config = StageConfig(
        name="code2wav",
        engine_type="DiT",
        model=omni_dir,
        executor="code2wav",
        dit={"device": "cpu", "num_threads": torch.get_num_threads()},
    )
    stage = ProcessStage(config)
    await stage.start()
    try:
        assert stage.info.voices == tuple(sorted(tiny_omni.SPEAKERS))
        assert stage.info.samples_per_token == SAMPLES_PER_TOKEN
        codes = {"a": _codes(9, seed=4), "b": _codes(14, seed=5)}
        params = {
            "a": stage.validate(Code2WavParams(voice="Ethan", seed=11)),
            "b": stage.validate(None),  # defaults, with a drawn seed
        }
        assert params["b"].voice == "Chelsie" and params["b"].seed is not None
        outs = await asyncio.gather(
            *(stage.run(rid, {CODEC_TOKENS: codes[rid]}, params[rid]) for rid in codes)
        )
        for rid, out in zip(codes, outs):
            audio = out["audio"]
            assert audio.dtype == torch.float32 and audio.shape == (
                len(codes[rid]) * SAMPLES_PER_TOKEN,
            )
            expected = executor.decode(DiTRequest(rid, params[rid], {CODEC_TOKENS: codes[rid]}))
            diff = (audio - expected).abs().max().item()
            assert diff <= PROCESS_ATOL, f"{rid}: max abs difference {diff}"
        with pytest.raises(ValueError, match=r"^voice: unknown voice 'Nobody'; known: \['Chel"):
            stage.validate(Code2WavParams(voice="Nobody"))
        # Past the orchestrator's check, the stage process still rejects it, naming the field.
        with pytest.raises(ValueError, match="^voice: unknown voice 'Nobody'"):
            await stage.run("bad", {CODEC_TOKENS: codes["a"]}, Code2WavParams(voice="Nobody"))
        empty = await stage.run("empty", {CODEC_TOKENS: codes["a"][:0]}, params["a"])
        assert empty["audio"].shape == (0,)
        stats = await stage.stats()
        assert stats["cache_entries"] == 0 and stats["num_finished"] == 3
    finally:
        stage.shutdown()
