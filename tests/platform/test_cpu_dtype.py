# SPDX-License-Identifier: Apache-2.0
"""`--dtype auto` on a CPU without native 16-bit arithmetic becomes float32; explicit dtypes and
CPUs with the instructions keep vLLM's choice."""

import pytest
import torch

from vllm_omni import plugin
from vllm_omni.platform import cpu_dtype
from vllm_omni.platform.cpu_dtype import auto_dtype, cpu_flags

AVX2_EPYC = "processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma\nprocessor\t: 1\n"
SAPPHIRE_RAPIDS = "flags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile avx512_fp16\n"


def test_flags_of_first_processor():
    assert cpu_flags(AVX2_EPYC) == {"fpu", "sse", "sse2", "avx", "avx2", "fma"}
    assert cpu_flags("processor: 0\n") == set()


@pytest.mark.parametrize(
    "resolved, native, expected",
    [
        (torch.bfloat16, frozenset(), torch.float32),  # AVX2 only
        (torch.float16, frozenset(), torch.float32),
        (torch.bfloat16, frozenset({torch.bfloat16}), torch.bfloat16),  # AVX512_BF16 / AMX
        (torch.float16, frozenset({torch.bfloat16}), torch.float32),
        (torch.float32, frozenset(), torch.float32),
        (torch.bfloat16, None, torch.bfloat16),  # not x86 Linux: vLLM's choice stands
    ],
)
def test_auto_dtype(resolved, native, expected):
    assert auto_dtype(resolved, native) == expected


def test_native_types_from_flags():
    names = cpu_flags(SAPPHIRE_RAPIDS)
    native = {d for d, flags in cpu_dtype.NATIVE_FLAGS.items() if names.intersection(flags)}
    assert native == {torch.bfloat16, torch.float16}


@pytest.mark.parametrize("native", [frozenset(), frozenset({torch.bfloat16})], ids=["avx2", "bf16"])
def test_engine_config_dtype(tiny_models, monkeypatch, native):
    # Through vLLM's own resolution, with the plugin's patch in place: the tiny Llama is bf16.
    from vllm.engine.arg_utils import EngineArgs

    plugin.register()
    monkeypatch.setattr(cpu_dtype, "native_low_precision", lambda: native)
    model = str(tiny_models["llama-8l"])
    auto = EngineArgs(model=model).create_model_config().dtype
    explicit = EngineArgs(model=model, dtype="bfloat16").create_model_config().dtype
    assert auto == (torch.bfloat16 if native else torch.float32)
    assert explicit == torch.bfloat16
