# SPDX-License-Identifier: Apache-2.0
"""Plans for a two-stage pipeline that hands chunks on by rendezvous (vllm_omni.cpp.handoff)."""

import pytest

from vllm_omni.cpp.cost_model import CostModel
from vllm_omni.cpp.handoff import rendezvous_plan
from vllm_omni.cpp.simulator import simulate

from .test_limits import compositions

MODEL = CostModel(linear=1.0, attention=0.02, step_overhead=12.0, unit="s", context=0.05)


def makespan(chunks, start=0):
    return simulate(chunks, MODEL, 2, start=start, rendezvous=True).makespan


@pytest.mark.parametrize("max_blocks,start", [(64, 0), (2, 0), (3, 40)])
def test_the_plan_is_the_best_of_all_plans_within_its_longest_chunk(max_blocks, start):
    block, cells = 16, 10
    n = start + cells * block - 5  # the last chunk is a remainder
    best = min(
        makespan(
            [min(c * block, n - start - block * sum(sizes[:k])) for k, c in enumerate(sizes)], start
        )
        for sizes in compositions(cells)
        if max(sizes) <= max_blocks
    )
    chunks, time = rendezvous_plan(MODEL, n, start, block, max_blocks)
    assert sum(chunks) == n - start and max(chunks) <= max_blocks * block
    assert all(c % block == 0 for c in chunks[:-1])
    assert time == pytest.approx(best, rel=1e-12) == makespan(chunks, start)


def test_one_block_or_less_is_one_chunk():
    assert rendezvous_plan(MODEL, 100, 0, 128) == (
        [100],
        pytest.approx(2 * MODEL.step_cost([(100, 0)])),
    )


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(num_tokens=0), "num_tokens"),
        (dict(num_tokens=64, start=64), "start"),
        (dict(num_tokens=64, block_size=0), "block_size"),
        (dict(num_tokens=64, max_blocks=0), "max_blocks"),
    ],
)
def test_rejects_bad_arguments(kwargs, field):
    with pytest.raises(ValueError, match=field):
        rendezvous_plan(MODEL, **kwargs)
