# SPDX-License-Identifier: Apache-2.0
"""A live `vllm serve` / `vllm-omni serve` process on loopback, ready when /health answers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The console scripts installed next to this interpreter (`vllm`, `vllm-omni`).
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """Starts `command` with `--host 127.0.0.1 --port <free>` and waits until /health answers.

    Use as a context manager; `url` is the base URL, `headers` carries the API key if any, and
    `log_text()` is what the server printed (to a file, removed on exit unless the server
    had died)."""

    def __init__(
        self,
        command: list[str],
        env: dict[str, str] | None = None,
        timeout_s: float = 300,
        api_key: str | None = None,
    ):
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [*command, "--host", "127.0.0.1", "--port", str(self.port)]
        self.env = {**os.environ, **(env or {})}
        self.timeout_s = timeout_s

    def __enter__(self) -> ServerProcess:
        # A file, not a pipe: nobody reads a pipe while the server runs, and a full one blocks it.
        self.log = tempfile.NamedTemporaryFile("w+", prefix="server-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            self.command, env=self.env, stdout=self.log, stderr=subprocess.STDOUT, text=True
        )
        import requests  # here: benchmarks that start no server run where it is missing

        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                text = self.log_text()
                self.log.close()
                Path(self.log.name).unlink(missing_ok=True)
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{text}")
            try:
                health = requests.get(f"{self.url}/health", headers=self.headers, timeout=2)
                if health.status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(1)
        self.__exit__(None, None, None)
        raise TimeoutError(f"server did not become healthy in {self.timeout_s} s")

    def log_text(self) -> str:
        return Path(self.log.name).read_text()

    def __exit__(self, *exc) -> None:
        died = self.proc.poll() is not None
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        if died:  # kept for a post-mortem
            print(f"the server had exited ({self.proc.returncode}); its log: {self.log.name}")
        else:
            Path(self.log.name).unlink(missing_ok=True)
