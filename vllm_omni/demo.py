# SPDX-License-Identifier: Apache-2.0
"""`make demo` / `python -m vllm_omni.demo`: the main job end to end on the embedded tiny models.

Builds the tiny models (once), then
1. generates chat replies through vLLM with pipeline parallelism (PP=2, one CPU core per stage
   here) at `dtype auto` (the model's bfloat16, or float32 on a CPU without native bfloat16),
   then checks PP=2 against PP=1 in float32 - the same greedy tokens. (The comparison is made
   in float32 because the random-weight model has near-ties between its top tokens that
   bfloat16 rounds into exact ties, which batch shapes and CPU kernels then break either way:
   an AVX2-only CPU disagreed at bfloat16.);
2. generates images with OmniLLM("Qwen/Qwen-Image") - the tiny pipeline, stored under the real
   name in a hub cache of the demo's (offline) - with the text encoder on a vLLM engine and the
   DiT in its own process, saves them as PNG and checks one against diffusers' own pipeline;
3. edits the first image with OmniLLM("Qwen/Qwen-Image-Edit") - Qwen2.5-VL reading the prompt and
   the image on vLLM, the DiT conditioned on the image's latents - and checks the edit against
   diffusers' own pipeline (its encoder given the model's image positions);
4. makes a video with OmniLLM("Wan-AI/Wan2.1-T2V-1.3B-Diffusers") - the UMT5 text encoder, the
   DiT and the VAE in one process stage - saves it as MP4 and checks the frames against
   diffusers' own pipeline;
5. has OmniLLM("Qwen/Qwen2.5-Omni-7B") (the tiny one, the same way) answer in text and speech
   (thinker and talker on vLLM engines, code2wav in the DiT process), saves the speech as WAV
   and checks the text tokens against transformers' thinker.
The models have random weights, so replies are gibberish and images and video noise-like patterns;
equality with the references is what matters.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

# The omni models load by their hub names from a cache of the tiny ones (testing/tiny_hub.py),
# offline: set before huggingface_hub is imported, which reads it once.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from vllm_omni.engine.ar_stage import ENGINE_SHUTDOWN_TIMEOUT_S  # noqa: E402

LOGGING_LEVEL_ENV = "VLLM_LOGGING_LEVEL"
# vLLM's "WARNING mm-dd ..." lines, Python's "...Warning: ...", and torch's C++ "[W...]" ones.
WARNING_LINE = re.compile(r"^(WARNING|ERROR) |\w+Warning: |^\[W\d")

_terminal = sys.stdout
"""Where the demo's own lines go; the engines' logs go to a file unless --verbose."""


def say(*args, **kwargs) -> None:
    print(*args, **kwargs, file=_terminal, flush=True)
    if _terminal is not sys.stdout:  # the log has them too, between the engines' lines
        print(*args, **kwargs, flush=True)


@contextlib.contextmanager
def engine_logs_to(path: Path) -> Iterator[None]:
    """This process's stdout and stderr, and so its engines' (child processes inherit them),
    go to `path`; `say` keeps the terminal. On an error, the log's tail is shown."""
    global _terminal
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    _terminal = os.fdopen(os.dup(1), "w")
    with path.open("w") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        except Exception:
            traceback.print_exc()
            sys.stderr.flush()
            tail = path.read_text().splitlines()[-40:]
            say(f"[demo] failed; the last lines of {path}:\n" + "\n".join(tail))
            raise
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            _terminal.close()
            _terminal = sys.stdout


IMAGE_MODEL = "Qwen/Qwen-Image"
EDIT_MODEL = "Qwen/Qwen-Image-Edit"
VIDEO_MODEL = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
SPEECH_MODEL = "Qwen/Qwen2.5-Omni-7B"

PROMPTS = [
    "What does pipeline parallelism do?",
    "Write one sentence about a diffusion transformer.",
    "Count from one to five.",
]


def run_chat(
    model: str, pipeline_parallel_size: int, max_tokens: int, dtype: str = "auto"
) -> tuple[list, float, str]:
    """Greedy replies to PROMPTS, the seconds they took, and the dtype the engine ran in."""
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=model,
        pipeline_parallel_size=pipeline_parallel_size,
        max_model_len=4096,
        dtype=dtype,
    )
    conversations = [[{"role": "user", "content": p}] for p in PROMPTS]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    start = time.perf_counter()
    outputs = llm.chat(conversations, params)
    elapsed = time.perf_counter() - start
    ran_in = str(llm.llm_engine.model_config.dtype).removeprefix("torch.")
    # Shut the engine down now, with time to unlink its shared memory (see ARStage).
    llm.llm_engine.engine_core.shutdown(timeout=ENGINE_SHUTDOWN_TIMEOUT_S)
    del llm
    return outputs, elapsed, ran_in


def run_pipeline_parallel(model: str, max_tokens: int) -> bool:
    """PP=2 replies at dtype auto, then PP=2 against PP=1 in float32."""
    if _visible_gpus() == 1:
        say("[demo] one GPU: pipeline parallelism needs two; showing PP=1 only")
        replies, seconds, _ = run_chat(model, 1, max_tokens)
        _print_replies("vLLM, pipeline_parallel_size=1", replies, seconds)
        return True
    replies, seconds, dtype = run_chat(model, 2, max_tokens)
    _print_replies(f"vLLM, pipeline_parallel_size=2, dtype auto ({dtype})", replies, seconds)
    # On a CPU without native bf16, auto already is float32 (vllm_omni's CPU default).
    pp2 = replies if dtype == "float32" else run_chat(model, 2, max_tokens, dtype="float32")[0]
    pp1, _, _ = run_chat(model, 1, max_tokens, dtype="float32")
    same = all(a.outputs[0].token_ids == b.outputs[0].token_ids for a, b in zip(pp1, pp2))
    say(f"[demo] float32: PP=2 greedy tokens identical to PP=1: {same}")
    if not same:
        first = next(
            i
            for i, (a, b) in enumerate(zip(pp1, pp2))
            if a.outputs[0].token_ids != b.outputs[0].token_ids
        )
        say(
            f"  prompt {first}: PP=1 {pp1[first].outputs[0].token_ids}\n"
            f"            PP=2 {pp2[first].outputs[0].token_ids}"
        )
    return same


def _print_replies(title: str, outputs: list, seconds: float) -> None:
    say(f"\n[demo] {title}:")
    for prompt, out in zip(PROMPTS, outputs):
        say(f"  user: {prompt}\n  assistant: {out.outputs[0].text!r}")
    num_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    say(f"[demo] {num_tokens} tokens in {seconds:.2f} s")


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


IMAGE_PROMPTS = ["a red cat on a blue sofa", "a lighthouse at dusk", "two green apples", "rain"]


def run_images(model: str, hub_cache: Path, out_dir: Path) -> bool:
    import numpy as np
    import torch
    from diffusers import QwenImagePipeline

    from vllm_omni import DiffusionSamplingParams, OmniLLM

    params = DiffusionSamplingParams(height=128, width=128, num_inference_steps=20, seed=0)
    with OmniLLM(model, download_dir=hub_cache) as omni:
        start = time.perf_counter()
        outputs = omni.generate(IMAGE_PROMPTS, params)
        elapsed = time.perf_counter() - start
    out_dir.mkdir(parents=True, exist_ok=True)
    say(f"\n[demo] OmniLLM: {len(outputs)} images in {elapsed:.2f} s")
    for i, out in enumerate(outputs):
        path = out_dir / f"image-{i}.png"
        out.images[0].save(path)
        timings = ", ".join(f"{k} {t.seconds * 1e3:.0f} ms" for k, t in out.stage_timings.items())
        say(f"  {out.prompt!r} -> {path} (seed {out.seed}; {timings})")
    pipe = QwenImagePipeline.from_pretrained(model, cache_dir=hub_cache)
    pipe.set_progress_bar_config(disable=True)
    reference = pipe(
        IMAGE_PROMPTS[0],
        height=128,
        width=128,
        num_inference_steps=20,
        generator=torch.Generator().manual_seed(0),
    ).images[0]
    diff = np.abs(np.asarray(reference, int) - np.asarray(outputs[0].images[0], int)).max()
    same = diff <= 2
    say(f"[demo] OmniLLM image equals diffusers' (max pixel difference {diff}/255): {same}")
    return same


EDIT_PROMPT = "make the sofa green"


def run_edit(model: str, hub_cache: Path, out_dir: Path) -> bool:
    import numpy as np
    import torch
    from diffusers import QwenImageEditPipeline
    from PIL import Image

    from vllm_omni import DiffusionSamplingParams, OmniLLM
    from vllm_omni.models.qwen_image.edit.reference import with_image_positions

    image = Image.open(out_dir / "image-0.png")
    params = DiffusionSamplingParams(height=128, width=128, num_inference_steps=20, seed=0)
    with OmniLLM(model, download_dir=hub_cache) as omni:
        start = time.perf_counter()
        out = omni.generate({"prompt": EDIT_PROMPT, "image": image}, params)[0]
        elapsed = time.perf_counter() - start
    path = out_dir / "edit-0.png"
    out.images[0].save(path)
    say(f"\n[demo] OmniLLM: {EDIT_PROMPT!r} on image-0.png -> {path} in {elapsed:.2f} s")
    pipe = with_image_positions(QwenImageEditPipeline.from_pretrained(model, cache_dir=hub_cache))
    pipe.set_progress_bar_config(disable=True)
    reference = pipe(
        image=image,
        prompt=EDIT_PROMPT,
        height=128,
        width=128,
        num_inference_steps=20,
        generator=torch.Generator().manual_seed(0),
    ).images[0]
    diff = np.abs(np.asarray(reference, int) - np.asarray(out.images[0], int)).max()
    same = diff <= 2
    say(f"[demo] OmniLLM edit equals diffusers' (max pixel difference {diff}/255): {same}")
    return same


VIDEO_PROMPT = "a red bird over the sea"


def run_video(model: str, hub_cache: Path, out_dir: Path) -> bool:
    import numpy as np
    import torch
    from diffusers import WanPipeline

    from vllm_omni import OmniLLM, VideoSamplingParams
    from vllm_omni.video_file import encode_mp4

    params = VideoSamplingParams(height=96, width=96, num_frames=33, num_inference_steps=20, seed=0)
    with OmniLLM(model, download_dir=hub_cache) as omni:
        start = time.perf_counter()
        out = omni.generate(VIDEO_PROMPT, params)[0]
        elapsed = time.perf_counter() - start
    path = out_dir / "video.mp4"
    path.write_bytes(encode_mp4(out.video, out.fps))
    frames, height, width, _ = out.video.shape
    say(f"\n[demo] OmniLLM: {VIDEO_PROMPT!r} -> {path} ({frames} frames, {width}x{height}, "
        f"{out.fps:g} fps, H.264) in {elapsed:.2f} s")  # fmt: skip
    pipe = WanPipeline.from_pretrained(model, cache_dir=hub_cache)
    pipe.set_progress_bar_config(disable=True)
    reference = pipe(
        prompt=VIDEO_PROMPT,
        height=96,
        width=96,
        num_frames=33,
        num_inference_steps=20,
        generator=torch.Generator().manual_seed(0),
        output_type="np",
    ).frames[0]
    reference = (reference * 255).round().astype(np.uint8)
    diff = np.abs(reference.astype(int) - out.video.astype(int)).max()
    same = diff <= 2
    say(f"[demo] OmniLLM video equals diffusers' frames (max difference {diff}/255): {same}")
    return same


SPEECH_PROMPT = "<|im_start|>user\nSay something about the sea.<|im_end|>\n<|im_start|>assistant\n"


def run_speech(model: str, hub_cache: Path, out_dir: Path, max_tokens: int) -> bool:
    import torch
    from transformers import AutoTokenizer, Qwen2_5OmniForConditionalGeneration
    from vllm import SamplingParams

    from vllm_omni import Code2WavParams, OmniLLM
    from vllm_omni.audio_file import wav_file
    from vllm_omni.config.model_source import model_path
    from vllm_omni.models.qwen2_5_omni.tiny import CODEC_BOS

    float32 = {"engine_args": {"dtype": "float32", "max_model_len": 2048}}
    params = {
        "thinker": SamplingParams(temperature=0, max_tokens=max_tokens),
        # A random-weight talker ends its speech at random (a few codes, often): the start code,
        # which it never samples, as the only end code gives 3 s of (noise-like) speech.
        "talker": SamplingParams(
            temperature=0, max_tokens=150, repetition_penalty=1.05, stop_token_ids=[CODEC_BOS]
        ),
        "code2wav": Code2WavParams(seed=0),
    }
    overrides = {"thinker": float32, "talker": float32}
    with OmniLLM(model, stage_overrides=overrides, download_dir=hub_cache) as omni:
        start = time.perf_counter()
        out = omni.generate({"prompt": SPEECH_PROMPT, "voice": "Ethan"}, params)[0]
        elapsed = time.perf_counter() - start
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "speech.wav"
    path.write_bytes(wav_file(out.audio, out.sample_rate))
    timings = ", ".join(f"{k} {t.seconds * 1e3:.0f} ms" for k, t in out.stage_timings.items())
    say(f"\n[demo] OmniLLM, Qwen2.5-Omni: text and speech in {elapsed:.2f} s ({timings})")
    say(f"  assistant: {out.text!r}")
    say(f"  -> {path}: {len(out.audio) / out.sample_rate:.2f} s of audio from "
          f"{len(out.codec_token_ids)} speech codes (voice Ethan)")  # fmt: skip
    # From the snapshot folder: transformers' Qwen2.5-Omni looks for spk_dict.pt in the default
    # cache whatever `cache_dir` says.
    folder = model_path(model, download_dir=hub_cache)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    hf = Qwen2_5OmniForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
    ids = tokenizer.encode(SPEECH_PROMPT)
    with torch.no_grad():
        reference = hf.thinker.generate(
            torch.tensor([ids]), max_new_tokens=max_tokens, do_sample=False
        )[0, len(ids) :].tolist()
    same = reference == out.token_ids
    say(f"[demo] thinker tokens identical to transformers': {same}")
    return same


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models-dir", default=None, help="where the tiny models live")
    parser.add_argument(
        "--hub-cache",
        type=Path,
        default=Path.home() / ".cache" / "vllm_omni" / "hub",
        help="a Hugging Face hub cache the tiny omni models are stored in, under real names",
    )
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument(
        "--out", type=Path, default=Path("demo-output"), help="where images and speech go"
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help=f"show the engines' logs (also if {LOGGING_LEVEL_ENV} is set; default: OUT/demo.log)",
    )
    args = parser.parse_args(argv)
    if args.verbose or LOGGING_LEVEL_ENV in os.environ:  # the user chose what to see
        run(args)
        return
    log = args.out / "demo.log"
    print(f"[demo] engine logs: {log} (--verbose shows them here)", flush=True)
    with engine_logs_to(log):
        run(args)
    warnings = sum(1 for line in log.read_text().splitlines() if WARNING_LINE.search(line))
    print(f"[demo] done; the engines logged {warnings} warnings, all in {log}", flush=True)


def run(args: argparse.Namespace) -> None:
    from vllm_omni.testing.tiny import build_tiny_models, default_models_dir
    from vllm_omni.testing.tiny_hub import build_hub_cache

    models = build_tiny_models(args.models_dir or default_models_dir(), names=["llama-8l"])
    model = str(models["llama-8l"])
    say(f"[demo] tiny model: {model}")
    build_hub_cache(args.hub_cache, [IMAGE_MODEL, EDIT_MODEL, VIDEO_MODEL, SPEECH_MODEL])
    names = f"{IMAGE_MODEL}, {EDIT_MODEL}, {VIDEO_MODEL} and {SPEECH_MODEL}"
    say(f"[demo] tiny {names} in the hub cache {args.hub_cache}")

    same = run_pipeline_parallel(model, args.max_tokens)
    images_same = run_images(IMAGE_MODEL, args.hub_cache, args.out)
    edit_same = run_edit(EDIT_MODEL, args.hub_cache, args.out)
    video_same = run_video(VIDEO_MODEL, args.hub_cache, args.out)
    speech_same = run_speech(SPEECH_MODEL, args.hub_cache, args.out, args.max_tokens)
    if not (same and images_same and edit_same and video_same and speech_same):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
