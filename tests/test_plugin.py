# SPDX-License-Identifier: Apache-2.0
from importlib.metadata import entry_points

import pytest

from vllm_omni import plugin


def test_entry_point_is_registered_with_vllm():
    names = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert names.get("vllm_omni") == "vllm_omni.plugin:register"


@pytest.mark.parametrize("version", ["0.32.0", "0.32.1", "0.32.0+cpu"])
def test_version_guard_accepts_0_32(version):
    plugin.check_vllm_version(version)


@pytest.mark.parametrize("version", ["0.31.2", "0.33.0", "1.32.0"])
def test_version_guard_rejects_other_versions(version):
    with pytest.raises(plugin.VllmVersionError, match=f"vLLM {version} is installed"):
        plugin.check_vllm_version(version)


def test_register_fails_clearly_on_a_mismatched_vllm(monkeypatch):
    import vllm

    monkeypatch.setattr(plugin, "_registered", False)
    monkeypatch.setattr(vllm, "__version__", "0.33.0")
    with pytest.raises(plugin.VllmVersionError, match="supports vLLM 0.32.x only"):
        plugin.register()


def test_register_is_idempotent_and_traces_each_call(tmp_path, monkeypatch):
    trace = tmp_path / "trace"
    monkeypatch.setenv(plugin.TRACE_ENV, str(trace))
    plugin.register()
    plugin.register()
    lines = trace.read_text().splitlines()
    assert len(lines) == 2 and lines[0] == lines[1]
