# SPDX-License-Identifier: Apache-2.0
"""SLO accounting: the scheduler's ledger, its snapshot, /metrics and admission control."""

from __future__ import annotations

import time
from http import HTTPStatus

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from vllm_omni.cpp import slo_frontend
from vllm_omni.cpp.config import CPPConfig
from vllm_omni.cpp.engine_args import cpp_engine_args
from vllm_omni.cpp.slo import SLOTargets
from vllm_omni.cpp.slo_ledger import SLOLedger, read_snapshot
from vllm_omni.cpp.slo_validation import SLOParamsValidator


def test_ledger_counts_ttft_and_tpot_against_each_request_slo(tmp_path) -> None:
    ledger = SLOLedger(tmp_path / "ledger.json")
    ledger.track("fast", arrival=100.0, targets=SLOTargets(ttft_s=0.5, tpot_s=0.1))
    ledger.track("slow", arrival=100.0, targets=SLOTargets(ttft_s=0.2))
    ledger.track("plain", arrival=100.0, targets=SLOTargets())  # no SLO: not counted
    ledger.on_tokens("fast", 1, now=100.3)  # TTFT 0.3 <= 0.5: met, slack +0.2
    ledger.on_tokens("slow", 1, now=100.3)  # TTFT 0.3 > 0.2: missed, slack -0.1
    ledger.on_tokens("plain", 1, now=100.3)
    ledger.on_tokens("fast", 1, now=100.35)  # 50 ms step: met
    ledger.on_tokens("fast", 2, now=100.65)  # 2 tokens in 300 ms: 150 ms each, both missed
    ledger.on_tokens("slow", 1, now=105.0)  # no TPOT SLO: not counted
    assert (ledger.ttft.met, ledger.ttft.missed) == (1, 1)
    assert (ledger.tpot.met, ledger.tpot.missed) == (1, 2)
    assert sum(ledger.ttft.counts) == 2 and sum(ledger.tpot.counts) == 3
    ledger.forget(["fast"])
    ledger.on_tokens("fast", 1, now=200.0)  # finished: nothing more is counted
    assert ledger.tpot.met + ledger.tpot.missed == 3

    ledger.set_backlog([("a", 110.0, 2.0), ("b", None, 5.0)])
    assert ledger.publish()
    assert not ledger.publish()  # same backlog, too soon: not rewritten
    ledger.drop_from_backlog(["a"])
    assert ledger.publish()  # a request left the backlog: written at once
    snapshot = read_snapshot(ledger.path)
    assert snapshot["ttft"]["met"] == 1 and snapshot["tpot"]["missed"] == 2
    assert snapshot["backlog"] == [[None, 5.0]]
    ledger.remove_file()
    assert read_snapshot(ledger.path) is None


def test_metrics_collector_reads_the_snapshot(tmp_path) -> None:
    ledger = SLOLedger(tmp_path / "ledger.json")
    ledger.track("r", arrival=0.0, targets=SLOTargets(ttft_s=1.0, tpot_s=0.05))
    ledger.on_tokens("r", 1, now=0.4)
    ledger.on_tokens("r", 1, now=0.6)  # 200 ms step vs 50 ms SLO: missed by 150 ms
    ledger.set_backlog([("x", 10.0, 1.5), ("y", None, 0.5)])
    ledger.publish(force=True)
    frontend = slo_frontend.SLOFrontend(ledger.path, SLOTargets(), admission=False)
    registry = CollectorRegistry()
    registry.register(frontend)
    text = generate_latest(registry).decode()
    assert 'vllm_omni:slo_ttft_total{outcome="met"} 1.0' in text
    assert 'vllm_omni:slo_ttft_total{outcome="missed"} 0.0' in text
    assert 'vllm_omni:slo_tpot_total{outcome="missed"} 1.0' in text
    assert 'vllm_omni:slo_ttft_slack_seconds_bucket{le="0.5"} 0.0' in text
    assert 'vllm_omni:slo_ttft_slack_seconds_bucket{le="1.0"} 1.0' in text
    assert 'vllm_omni:slo_ttft_slack_seconds_bucket{le="+Inf"} 1.0' in text
    assert 'vllm_omni:slo_tpot_slack_seconds_bucket{le="-0.2"} 0.0' in text
    assert 'vllm_omni:slo_tpot_slack_seconds_bucket{le="-0.1"} 1.0' in text
    assert "vllm_omni:slo_prefill_backlog_seconds 2.0" in text
    assert "vllm_omni:slo_admission_rejected_total 0.0" in text


def test_admission_refuses_only_what_cannot_be_met(tmp_path) -> None:
    ledger = SLOLedger(tmp_path / "ledger.json")
    now = time.time()
    # 3 s of prefill due within 2 s, 100 s of work due much later, 50 s with no SLO.
    ledger.set_backlog([("a", now + 2, 3.0), ("b", now + 1000, 100.0), ("c", None, 50.0)])
    ledger.publish(force=True)
    frontend = slo_frontend.SLOFrontend(ledger.path, SLOTargets(ttft_s=10.0), admission=True)
    with pytest.raises(slo_frontend.SLOAdmissionError, match=r"vllm_xargs\.ttft_slo_ms") as e:
        frontend.admit({"ttft_slo_ms": 2500})  # 3 s queued ahead of a 2.5 s deadline
    assert e.value.http_status == HTTPStatus.TOO_MANY_REQUESTS
    frontend.admit(None)  # the 10 s default: 3 s ahead, fine
    frontend.admit({"ttft_slo_ms": 500})  # due before "a": nothing is ahead of it
    assert frontend.rejected == 1
    assert slo_frontend.SLOFrontend(ledger.path, SLOTargets(), admission=True).admit({}) is None
    off = slo_frontend.SLOFrontend(ledger.path, SLOTargets(), admission=False)
    off.admit({"ttft_slo_ms": 2500})  # admission control off
    missing = slo_frontend.SLOFrontend(tmp_path / "none.json", SLOTargets(), admission=True)
    missing.admit({"ttft_slo_ms": 1})  # no snapshot yet: nothing known to be queued


def test_cpp_engine_args_arm_the_frontend_through_the_validator(tmp_path) -> None:
    path = tmp_path / "ledger.json"
    args = cpp_engine_args(
        {"slo": True, "admission": True, "ledger_path": str(path), "ttft_slo_ms": 1000},
        pipeline_parallel_size=2,
    )
    assert CPPConfig.from_dict(args["additional_config"]["cpp"]).ledger_path == str(path)
    ledger = SLOLedger(path)
    ledger.set_backlog([("long", time.time() + 0.5, 30.0)])
    ledger.publish(force=True)
    from vllm import SamplingParams

    with pytest.raises(slo_frontend.SLOAdmissionError):
        SLOParamsValidator.validate_params(SamplingParams(max_tokens=1))  # default 1 s SLO
    with pytest.raises(ValueError, match="ttft_slo_ms"):
        SLOParamsValidator.validate_params(SamplingParams(extra_args={"ttft_slo_ms": "x"}))
    SLOParamsValidator.validate_params(SamplingParams(extra_args={"ttft_slo_ms": 100}))
    # Without a path, one is chosen; admission needs SLO scheduling.
    args = cpp_engine_args({"slo": True}, pipeline_parallel_size=2)
    assert args["additional_config"]["cpp"]["ledger_path"].endswith(".json")
    assert slo_frontend.active().admission is False
    with pytest.raises(ValueError, match=r"cpp.admission needs cpp.slo"):
        CPPConfig(admission=True)
