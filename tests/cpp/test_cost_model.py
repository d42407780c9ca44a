# SPDX-License-Identifier: Apache-2.0
"""Cost model and chunk planner for chunked pipeline parallelism: pure math, no engine."""

import json
import math
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from vllm_omni.cpp.chunking import balance, budget_for_chunk, plan_chunks
from vllm_omni.cpp.cost_model import (
    CostModel,
    FitResult,
    ModelShape,
    StepSample,
)


def test_module_imports_neither_torch_nor_vllm():
    code = (
        "import sys, vllm_omni.cpp.cost_model; print(sorted({'torch', 'vllm'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


TINY = ModelShape(
    num_layers=3,
    hidden_size=32,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    intermediate_size=48,
    vocab_size=100,
)
SMALL = ModelShape(
    num_layers=8,
    hidden_size=256,
    num_heads=4,
    num_kv_heads=2,
    head_dim=64,
    intermediate_size=512,
    vocab_size=2048,
)


def heaviest_stage_layers(num_layers: int, pp: int) -> int:
    # vLLM gives every stage num_layers // pp layers and spreads the remainder one per stage.
    parts = [num_layers // pp] * pp
    for i in range(num_layers % pp):
        parts[i] += 1
    return max(parts)


def brute_force_flops(shape: ModelShape, x: int, cached: int, pp: int) -> int:
    """Per-stage FLOPs, counted matmul by matmul, token by token, key by key."""
    h, hd, f = shape.hidden_size, shape.head_dim, shape.intermediate_size
    q, kv = shape.num_heads * hd, shape.num_kv_heads * hd
    total = 0
    for _layer in range(heaviest_stage_layers(shape.num_layers, pp)):
        for i in range(x):
            total += 2 * h * q + 2 * 2 * h * kv + 2 * q * h  # q, k, v, o projections
            total += 2 * 2 * h * f + 2 * f * h  # gate + up, down
            for _key in range(cached + i + 1):  # causal: token i sees L + i + 1 keys
                total += shape.num_heads * (2 * hd + 2 * hd)  # QK^T and AV
    return total


@pytest.mark.parametrize("pp", [1, 2, 3])
@pytest.mark.parametrize("x,cached", [(1, 0), (1, 37), (2, 0), (7, 0), (8, 5), (13, 100), (32, 3)])
def test_analytic_flops_equal_brute_force(x, cached, pp):
    model = CostModel.analytic(TINY, pp_size=pp)
    assert model.unit == "flop" and model.step_overhead == 0
    assert model.chunk_cost(x, cached) == brute_force_flops(TINY, x, cached, pp)


def test_analytic_lm_head_and_validation():
    model = CostModel.analytic(TINY, include_lm_head=True)
    assert model.step_overhead == 2 * TINY.vocab_size * TINY.hidden_size
    assert model.step_cost([(5, 3), (1, 9)]) == (
        model.step_overhead + model.chunk_cost(5, 3) + model.chunk_cost(1, 9)
    )
    with pytest.raises(ValueError, match="pp_size"):
        CostModel.analytic(TINY, pp_size=4)


def test_llama3_8b_flops_per_token_is_about_twice_the_params():
    model = CostModel.analytic(ModelShape.llama3_8b())
    # ~7.0e9 non-embedding transformer weights, LM head excluded -> ~14 GFLOP per token.
    assert 13.5e9 < model.chunk_cost(1, 0) < 14.5e9
    assert CostModel.analytic(ModelShape.llama3_8b(), pp_size=4).linear == pytest.approx(
        model.linear / 4
    )


def test_model_shape_from_hf_config():
    cfg = {
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
    }
    assert ModelShape.from_hf_config(cfg) == ModelShape.llama3_8b()
    obj = SimpleNamespace(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=None,
        head_dim=None,
        intermediate_size=96,
        vocab_size=10,
    )
    assert ModelShape.from_hf_config(obj) == ModelShape(2, 64, 4, 4, 16, 96, 10)
    assert ModelShape.from_hf_config({"text_config": cfg}) == ModelShape.llama3_8b()
    with pytest.raises(ValueError, match="intermediate_size"):
        ModelShape.from_hf_config({k: v for k, v in cfg.items() if k != "intermediate_size"})


def test_model_shape_validation_names_the_field():
    assert ModelShape.llama3_70b().num_layers == 80
    with pytest.raises(ValueError, match="hidden_size"):
        ModelShape(2, 0, 4, 4, 16, 96, 10)
    with pytest.raises(ValueError, match="num_kv_heads"):
        ModelShape(2, 64, 4, 3, 16, 96, 10)


MODELS = [
    CostModel.analytic(ModelShape.llama3_8b()),
    CostModel.analytic(SMALL, pp_size=2),
    CostModel(linear=3.1e-5, attention=7.3e-10, step_overhead=4e-3, unit="s"),
    CostModel(linear=1.0, attention=0.0),
    CostModel(linear=0.0, attention=1e-9, unit="s"),
]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("cached", [0, 1, 17, 4096, 131071, 1_000_000])
def test_max_chunk_is_exact(model, cached):
    budgets = [0.0, model.chunk_cost(1, cached) * 0.5]
    for k in (1, 2, 15, 16, 17, 1000, 16384, 123457):
        cost = model.chunk_cost(k, cached)
        budgets += [cost, math.nextafter(cost, 0.0), math.nextafter(cost, math.inf), cost * 1.3]
    for budget in budgets:
        x = model.max_chunk(cached, budget)
        assert model.chunk_cost(x, cached) <= budget < model.chunk_cost(x + 1, cached)
    assert model.max_chunk(cached, 0.0) == 0
    assert model.max_chunk(cached, model.chunk_cost(1, cached) * 0.99) == 0


def test_max_chunk_rejects_bad_budget():
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="budget"):
            MODELS[0].max_chunk(0, bad)


def synthetic_samples(truth: CostModel, n: int, noise: float, seed: int) -> list[StepSample]:
    rng = np.random.default_rng(seed)
    samples = []
    for i in range(n):
        kind = i % 3
        if kind == 0:  # decode-only batch
            chunks = [(1, int(c)) for c in rng.integers(0, 32768, rng.integers(1, 64))]
        elif kind == 1:  # one prefill chunk
            chunks = [(int(rng.integers(16, 4096)), int(rng.integers(0, 200_000)))]
        else:  # prefill chunk mixed with decodes
            chunks = [(int(rng.integers(16, 2048)), int(rng.integers(0, 65536)))]
            chunks += [(1, int(c)) for c in rng.integers(0, 32768, rng.integers(1, 32))]
        seconds = truth.step_cost(chunks) * (1 + noise * rng.standard_normal())
        samples.append(StepSample(tuple(chunks), seconds))
    return samples


def test_fit_recovers_known_coefficients():
    truth = CostModel(linear=6e-5, attention=2e-9, step_overhead=5e-3, unit="s")
    result = CostModel.fit(synthetic_samples(truth, 600, noise=0.02, seed=0))
    assert isinstance(result, FitResult) and result.num_samples == 600
    fitted = result.model
    assert fitted.unit == "s"
    for name in ("linear", "attention", "step_overhead"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=0.01), name
    assert 0.015 < result.rel_rmse < 0.025  # the injected 2% noise


def test_fit_without_overhead_stays_non_negative():
    truth = CostModel(linear=6e-5, attention=2e-9, step_overhead=0.0, unit="s")
    samples = synthetic_samples(truth, 300, noise=0.02, seed=1)
    for with_overhead in (True, False):
        fitted = CostModel.fit(samples, step_overhead=with_overhead).model
        assert min(fitted.linear, fitted.attention, fitted.step_overhead) >= 0
        assert fitted.step_overhead < 1e-4  # ~0, far below one decode's cost
        assert fitted.linear == pytest.approx(truth.linear, rel=0.02)
        assert fitted.attention == pytest.approx(truth.attention, rel=0.02)


def test_fit_rejects_too_few_samples_and_step_sample_validates():
    with pytest.raises(ValueError, match="samples"):
        CostModel.fit([StepSample(((4, 0),), 1.0)])
    assert StepSample([[4, 0]], 1.0).chunks == ((4, 0),)
    with pytest.raises(ValueError, match="seconds"):
        StepSample(((4, 0),), 0.0)
    with pytest.raises(ValueError, match="num_cached_tokens"):
        StepSample(((4, -1),), 1.0)


def test_save_load_round_trip_and_unknown_key(tmp_path):
    model = CostModel(linear=3.1e-5, attention=7.3e-10, step_overhead=4e-3, unit="s")
    path = tmp_path / "cost.json"
    model.save(path)
    assert CostModel.load(path) == model
    assert CostModel.load_with_fit(path) == (model, None)
    assert CostModel.from_dict(model.to_dict()) == model
    model.save(path, fit={"source": "online", "rel_rmse": 0.05})  # an online fit, and how
    assert CostModel.load_with_fit(path) == (model, {"source": "online", "rel_rmse": 0.05})
    path.write_text(json.dumps({**model.to_dict(), "quadratic": 1.0}))
    with pytest.raises(ValueError, match="quadratic"):
        CostModel.load(path)
    with pytest.raises(ValueError, match="step_overhead"):
        CostModel.from_dict({"linear": 1.0, "attention": 0.0, "unit": "s"})
    with pytest.raises(ValueError, match="unit"):
        CostModel(1.0, 0.0, 0.0, "ms")
    with pytest.raises(ValueError, match="attention"):
        CostModel(1.0, -1.0)


def assert_valid_plan(chunks, prompt_len, start, block_size):
    assert sum(chunks) == prompt_len - start
    assert all(c % block_size == 0 for c in chunks[:-1])
    assert all(a >= b for a, b in zip(chunks[:-1], chunks[1:-1]))  # shrink as context grows


@pytest.mark.parametrize("prompt_len", [16384, 32768])
def test_plan_is_balanced_on_small_model_at_pp2(prompt_len):
    model = CostModel.analytic(SMALL, pp_size=2)
    budget = budget_for_chunk(model, 2048)
    chunks = plan_chunks(prompt_len, model, budget)
    assert chunks[0] == 2048
    assert_valid_plan(chunks, prompt_len, 0, 16)
    assert chunks[-2] < chunks[0] / 4  # attention dominates late chunks
    assert balance(chunks, model) <= 1.05


def test_plan_is_balanced_for_llama3_8b_at_1m_tokens():
    model = CostModel.analytic(ModelShape.llama3_8b(), pp_size=4)
    chunks = plan_chunks(1 << 20, model, budget_for_chunk(model, 16384))
    assert chunks[0] == 16384
    assert_valid_plan(chunks, 1 << 20, 0, 16)
    assert balance(chunks, model) <= 1.05  # ~1.010 over ~1000 chunks


def test_plan_start_tail_merge_and_floor():
    flat = CostModel(linear=1.0, attention=0.0)  # cost = tokens
    assert plan_chunks(200, flat, 100) == [96, 96, 8]
    assert plan_chunks(200, flat, 100, min_chunk=10) == [96, 104]  # 8-token tail merged
    assert plan_chunks(296, flat, 100, start=100) == [96, 96, 4]
    assert plan_chunks(50, flat, 1) == [16, 16, 16, 2]  # over budget: taken at the floor
    assert plan_chunks(70, flat, 1, min_chunk=20) == [32, 38]  # floor rounded up to a block
    assert plan_chunks(100, flat, 1000) == [100]
    assert plan_chunks(64, flat, 100, start=64) == []
    model = CostModel.analytic(SMALL, pp_size=2)
    merged = plan_chunks(16384, model, budget_for_chunk(model, 2048), min_chunk=64)
    assert sum(merged) == 16384 and merged[-1] >= 64
    with pytest.raises(ValueError, match="start"):
        plan_chunks(10, flat, 100, start=11)
    with pytest.raises(ValueError, match="step_budget"):
        plan_chunks(10, flat, 0.0)


def test_balance_uses_tokens_before_each_chunk():
    model = CostModel(linear=0.0, attention=1.0)
    assert balance([4, 4], model) == pytest.approx(
        max(model.chunk_cost(4, 0), model.chunk_cost(4, 4)) / (model.chunk_cost(8, 0) / 2)
    )
    assert balance([4], model, start=100) == 1.0
    with pytest.raises(ValueError, match="chunks"):
        balance([], model)


def test_context_term_is_fitted_and_bounds_chunks():
    truth = CostModel(linear=2e-5, attention=1e-8, step_overhead=5e-3, unit="s", context=1e-6)
    rng = np.random.default_rng(7)
    samples = [
        StepSample(((int(x), int(cached)),), truth.step_cost([(int(x), int(cached))]) * (1 + e))
        for x, cached, e in zip(
            rng.integers(64, 4096, 300), rng.integers(0, 32768, 300), rng.normal(0, 0.01, 300)
        )
    ]
    fitted = CostModel.fit(samples).model
    for name in ("linear", "attention", "step_overhead", "context"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=0.05), name
    # A chunk after L cached tokens pays context * L whatever its size: below that, nothing fits.
    assert truth.max_chunk(10_000, 0.9 * truth.context * 10_000) == 0
    x = truth.max_chunk(10_000, 0.1)
    assert truth.chunk_cost(x, 10_000) <= 0.1 < truth.chunk_cost(x + 1, 10_000)
    assert (
        CostModel.from_dict({k: v for k, v in truth.to_dict().items() if k != "context"}).context
        == 0
    )
