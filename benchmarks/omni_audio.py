# SPDX-License-Identifier: Apache-2.0
"""Text + speech throughput: transformers' Omni `generate`, once per request, vs OmniLLM.

    python -m benchmarks.omni_audio --json out/omni_audio.json --png out/omni_audio.png
    python -m benchmarks.omni_audio --model qwen3-omni --json out/qwen3_omni_audio.json

Same weights (the tiny Qwen2.5-Omni or Qwen3-Omni of the tests, float32), same prompts, same
work per request: the thinker writes up to --text-tokens greedy tokens, the talker speaks them
(greedy, up to --codes codes; for Qwen3-Omni, frames of all code groups), code2wav decodes
(Qwen2.5-Omni: 10 ODE steps). The baseline is what a transformers user
writes: `model.generate(...)` for each request in turn, in this process, on torch's default
threads. OmniLLM runs the built-in graph (thinker and talker on vLLM engines, code2wav in the
DiT process); at concurrency c, c requests are in flight at a time.

The machines here drift between runs, so each baseline pass is paired with an OmniLLM pass over
the same requests at each concurrency, and ratios are taken per pair (median of --runs pairs,
after a warm-up). Every request writes exactly --text-tokens tokens and --codes codes (no end
token; the random-weight model would stop at random). The defaults, 64 tokens and 512 codes
(10 s of speech at 50 codes/s; Qwen3-Omni: 128 frames at 12.5/s), are about what a 64-token
reply takes to say. Reported:
requests/s and audio seconds per second; for a request alone, its real-time factor (seconds of
work per second of audio) and the time to its first audio, whole (the reply decoded at once)
and streamed (talker started with the thinker, code2wav in chunks); and (--png) the stage
timeline of the last OmniLLM pass at the highest concurrency.
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import FIRST_COMPLETED, wait
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import write_result
from vllm_omni.testing.tiny import build_tiny_models, default_models_dir

TOPICS = ("the sea", "mountains", "a red cat", "the city at night", "rain", "a lighthouse",
          "old books", "the moon")  # fmt: skip
PROMPT = "<|im_start|>user\nTell me about {}.<|im_end|>\n<|im_start|>assistant\n"
CODEC_BOS = 61  # the tiny Qwen2.5-Omni's codec start code: never sampled: "no end code"
DEFAULT_CODES = {"qwen2.5-omni": 512, "qwen3-omni": 128}


def prompts(n: int) -> list[str]:
    return [PROMPT.format(TOPICS[i % len(TOPICS)]) for i in range(n)]


def run_baseline(model, tokenizer, texts: list[str], args) -> tuple[float, float]:
    """Seconds for all requests in turn, and seconds of audio made."""
    audio_s = 0.0
    start = time.perf_counter()
    for i, text in enumerate(texts):
        ids = torch.tensor([tokenizer.encode(text)])
        torch.manual_seed(i)
        # Greedy, Qwen3-Omni's talker never samples its end code on the random weights.
        stop = {"talker_eos_token_id": [CODEC_BOS]} if args.model == "qwen2.5-omni" else {}
        with torch.no_grad():
            _, wav = model.generate(
                input_ids=ids,
                thinker_max_new_tokens=args.text_tokens,
                thinker_min_new_tokens=args.text_tokens,
                thinker_do_sample=False,
                talker_do_sample=False,
                talker_max_new_tokens=args.codes,
                **stop,
            )
        audio_s += wav.numel() / 24000
    return time.perf_counter() - start, audio_s


def omni_params(args, seed: int) -> dict[str, Any]:
    from vllm import SamplingParams

    from vllm_omni import Code2WavParams

    tokens = args.text_tokens
    thinker = SamplingParams(temperature=0, max_tokens=tokens, min_tokens=tokens)
    if args.model == "qwen3-omni":
        talker = SamplingParams(temperature=0, max_tokens=args.codes, repetition_penalty=1.05)
        return {"thinker": thinker, "talker": talker}
    talker = SamplingParams(
        temperature=0, max_tokens=args.codes, repetition_penalty=1.05, stop_token_ids=[CODEC_BOS]
    )
    return {"thinker": thinker, "talker": talker, "code2wav": Code2WavParams(seed=seed)}


def first_audio(omni, text: str, args, stream: bool) -> tuple[float, float]:
    """Seconds from submission to the first audio (a streamed chunk, or the whole reply), and
    to the end."""
    from vllm_omni.engine.request_run import StageDelta

    async def run():
        inputs, params = omni.engine.prepare(
            {"prompt": text, "stream": stream}, omni_params(args, 0)
        )
        firsts: list[float] = []

        def hear(event) -> None:
            if isinstance(event, StageDelta) and "audio" in event.data and not firsts:
                firsts.append(time.monotonic())

        start = time.monotonic()
        await omni.engine.run_prepared(inputs, params, on_event=hear)
        end = time.monotonic()
        return (firsts[0] if firsts else end) - start, end - start

    return omni._call(run())


def run_omni(omni, texts: list[str], args, concurrency: int) -> tuple[float, float, list]:
    """Seconds for all requests with `concurrency` in flight, seconds of audio, the outputs."""
    outputs: list = [None] * len(texts)
    start = time.perf_counter()
    pending = list(enumerate(texts))
    running: dict = {}
    while pending or running:
        while pending and len(running) < concurrency:
            i, text = pending.pop(0)
            running[omni.add_request(text, omni_params(args, i))] = i
        done, _ = wait(running, return_when=FIRST_COMPLETED)
        for future in done:
            outputs[running.pop(future)] = future.result()
    seconds = time.perf_counter() - start
    return seconds, sum(o.audio.numel() / o.sample_rate for o in outputs), outputs


def bench(args) -> dict[str, Any]:
    import transformers

    from vllm_omni import OmniLLM

    folder = build_tiny_models(default_models_dir(), [args.model])[args.model]
    name = {"qwen2.5-omni": "Qwen2_5Omni", "qwen3-omni": "Qwen3OmniMoe"}[args.model]
    model_class = getattr(transformers, f"{name}ForConditionalGeneration")
    model = model_class.from_pretrained(folder, dtype=torch.float32)
    AutoTokenizer = transformers.AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(folder)
    float32 = {"engine_args": {"dtype": "float32", "max_model_len": 4096}}
    omni = OmniLLM(folder, stage_overrides={"thinker": float32, "talker": float32})
    texts = prompts(args.requests)
    result: dict[str, Any] = {"model": args.model, "requests": args.requests,
                              "text_tokens": args.text_tokens, "codes": args.codes,
                              "runs": []}  # fmt: skip
    try:
        run_baseline(model, tokenizer, texts[:1], args)  # warm-up
        run_omni(omni, texts[:2], args, 2)
        solo = omni.generate(texts[0], omni_params(args, 0), use_tqdm=False)[0]
        result["solo_latency_s"] = solo.latency_s
        result["solo_audio_s"] = solo.audio.numel() / solo.sample_rate
        result["solo_rtf"] = solo.latency_s / max(result["solo_audio_s"], 1e-9)
        result["solo_stage_s"] = {k: t.seconds for k, t in solo.stage_timings.items()}
        whole = [first_audio(omni, texts[0], args, stream=False) for _ in range(args.runs)]
        streamed = [first_audio(omni, texts[0], args, stream=True) for _ in range(args.runs)]
        result["first_audio_s"] = {
            "whole": statistics.median(w[0] for w in whole),
            "streamed": statistics.median(s[0] for s in streamed),
            "streamed_total": statistics.median(s[1] for s in streamed),
        }
        result["first_audio_speedup"] = (
            result["first_audio_s"]["whole"] / result["first_audio_s"]["streamed"]
        )
        for run in range(args.runs):
            base_s, base_audio = run_baseline(model, tokenizer, texts, args)
            entry = {"baseline_s": base_s, "baseline_audio_s": base_audio, "omni": {}}
            for c in args.concurrency:
                mark = time.monotonic()
                s, audio, outputs = run_omni(omni, texts, args, c)
                entry["omni"][c] = {"seconds": s, "audio_s": audio}
                print(
                    f"run {run + 1}: transformers {args.requests / base_s:.2f} req/s, "
                    f"OmniLLM c={c} {args.requests / s:.2f} req/s ({base_s / s:.2f}x), "
                    f"audio {audio / s:.2f} s/s",
                    flush=True,
                )
            result["runs"].append(entry)
        result["timeline"] = {
            name: [(max(0.0, a - mark), b - mark) for a, b in stage.busy.intervals if b > mark]
            for name, stage in omni.engine.stages.items()
        }
    finally:
        omni.shutdown()
    summary = {}
    for c in args.concurrency:
        ratios = [r["baseline_s"] / r["omni"][c]["seconds"] for r in result["runs"]]
        summary[c] = {
            "omni_requests_per_s": statistics.median(
                args.requests / r["omni"][c]["seconds"] for r in result["runs"]
            ),
            "omni_audio_s_per_s": statistics.median(
                r["omni"][c]["audio_s"] / r["omni"][c]["seconds"] for r in result["runs"]
            ),
            "ratio_median": statistics.median(ratios),
        }
    result["baseline_requests_per_s"] = statistics.median(
        args.requests / r["baseline_s"] for r in result["runs"]
    )
    result["baseline_audio_s_per_s"] = statistics.median(
        r["baseline_audio_s"] / r["baseline_s"] for r in result["runs"]
    )
    result["summary"] = summary
    return result


def write_png(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(result["timeline"].items())
    fig, ax = plt.subplots(figsize=(11, 0.6 * len(rows) + 1.2))
    for y, (label, intervals) in enumerate(rows):
        ax.broken_barh([(s, e - s) for s, e in intervals], (y - 0.35, 0.7), color=f"C{y}")
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.invert_yaxis()
    ax.set_xlabel("seconds (last OmniLLM pass at the highest concurrency)")
    ax.set_title(f"{result['model']} stages busy (tiny model, 2-core CPU)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--concurrency", default="1,4,8")
    parser.add_argument("--text-tokens", type=int, default=64)
    parser.add_argument("--model", choices=sorted(DEFAULT_CODES), default="qwen2.5-omni")
    parser.add_argument(
        "--codes",
        type=int,
        help="speech codes (Qwen3-Omni: frames) per reply; default 512 (Qwen2.5-Omni, 50 a "
        "second of audio) or 128 (Qwen3-Omni, 12.5 a second)",
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the figures as JSON here")
    parser.add_argument("--png", type=Path, help="write the stage timeline here")
    args = parser.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.codes = args.codes or DEFAULT_CODES[args.model]

    result = bench(args)
    fa = result["first_audio_s"]
    print(
        f"\nalone: {result['solo_latency_s']:.2f} s for {result['solo_audio_s']:.2f} s of audio "
        f"(RTF {result['solo_rtf']:.2f})\nfirst audio: {fa['whole']:.2f} s whole, "
        f"{fa['streamed']:.2f} s streamed ({result['first_audio_speedup']:.2f}x sooner; "
        f"streamed request done in {fa['streamed_total']:.2f} s)"
    )
    print(
        f"transformers, one request at a time: {result['baseline_requests_per_s']:.2f} req/s, "
        f"{result['baseline_audio_s_per_s']:.2f} audio s/s"
    )
    print("concurrency  OmniLLM req/s  audio s/s  vs transformers (median of pairs)")
    for c, s in result["summary"].items():
        print(
            f"{c:11d} {s['omni_requests_per_s']:14.2f} {s['omni_audio_s_per_s']:10.2f} "
            f"{s['ratio_median']:10.2f}x"
        )
    write_result(args.json, result, dtype="float32")
    if args.png:
        write_png(result, args.png)


if __name__ == "__main__":
    main()
