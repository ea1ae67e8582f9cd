"""HTTP servers that ``sage bench-serving`` measures: one it launches (:class:`Server`) or one already running
(:class:`RemoteServer`, ``--url NAME=URL``), behind the same small JSON client.

Both speak SGLang's native API: ``POST /generate``, ``GET /server_info``, ``GET /health``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from ..config import ConfigError

__all__ = ["SERVER_START_TIMEOUT_S", "HttpServer", "RemoteServer", "Server", "parallel", "parse_urls"]

SERVER_START_TIMEOUT_S = 420


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HttpServer:
    """A tiny JSON client of one SGLang HTTP server at ``base_url`` (no trailing slash)."""

    base_url: str

    def post(self, path: str, payload: dict, timeout: float = 900) -> dict:
        req = urllib.request.Request(f"{self.base_url}{path}", data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body = r.read()
        try:
            return json.loads(body) if body else {}
        except ValueError:  # e.g. /flush_cache answers in plain text
            return {"text": body.decode()}

    def get(self, path: str) -> dict:
        return json.loads(self.get_text(path))

    def health(self, timeout: float) -> int:
        """The HTTP status of ``GET /health`` (``OSError`` when the server does not answer)."""
        with urllib.request.urlopen(f"{self.base_url}/health", timeout=timeout) as r:
            return r.status

    def get_text(self, path: str) -> str:
        with urllib.request.urlopen(f"{self.base_url}{path}", timeout=60) as r:
            return r.read().decode()

    def generate(self, text: str, max_new_tokens: int, **extra: Any) -> dict:
        params = {"max_new_tokens": max_new_tokens, "temperature": 0.0}
        return self.post("/generate", {"text": text, "sampling_params": params, **extra})

    def stop(self) -> None:
        """Nothing to stop for a server this process did not start."""


class RemoteServer(HttpServer):
    """A server someone else started (``--url NAME=URL``): checked with ``/health`` now, never stopped."""

    def __init__(self, name: str, url: str) -> None:
        self.base_url = url.rstrip("/")
        try:
            status = self.health(timeout=10)
        except OSError as exc:  # urllib's URLError included
            raise ConfigError(f"--url {name}={url}: the server does not answer /health ({exc})") from exc
        if status != 200:
            raise ConfigError(f"--url {name}={url}: /health answered {status}")


class Server(HttpServer):
    """A ``sglang.launch_server`` child in its own process group on 127.0.0.1.

    The constructor blocks (``wait=False``: :meth:`wait_ready` does) until ``/health`` answers and the log says the
    server is ready; it raises ``RuntimeError`` with the log's tail if the process exits or ``timeout`` seconds pass
    from the launch.  :meth:`stop` tears the whole group down.
    """

    def __init__(self, args: list[str], env: dict[str, str], log: Path, cwd: Path | None = None,
                 timeout: float = SERVER_START_TIMEOUT_S, wait: bool = True) -> None:  # fmt: skip
        """``wait=False`` returns once the process is started, so that several servers can load side by side."""
        self.port = _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.argv = [sys.executable, "-m", "sglang.launch_server", *args, "--host", "127.0.0.1",
                     "--port", str(self.port)]  # fmt: skip
        self._fh = open(log, "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(self.argv, env=env, cwd=cwd, stdout=self._fh, stderr=subprocess.STDOUT,
                                     start_new_session=True)  # fmt: skip
        self._timeout, self._deadline = timeout, time.monotonic() + timeout
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Block until the server is ready (see the class); on a timeout the server is stopped first."""
        log = self.log
        while True:
            if self.proc.poll() is not None:
                self._fh.close()
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{log.read_text()[-4000:]}")
            try:
                if self.health(timeout=5) == 200 and "fired up" in log.read_text():
                    return
            except OSError:
                pass
            if time.monotonic() > self._deadline:
                self.stop()
                raise RuntimeError(f"server not ready in {self._timeout} s:\n{log.read_text()[-4000:]}")
            time.sleep(2)

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if not self._fh.closed:
            self._fh.close()


def parse_urls(items: list[str] | None) -> dict[str, str]:
    """``--url NAME=URL`` (repeatable) -> ``{NAME: URL}``: servers already running, benched under ``NAME``.

    ``NAME`` is a method name of the report (``plain``, ``sage``, ... in place of launching that method, or a new
    one); ``URL`` is ``http://`` or ``https://`` with a host.
    """
    out: dict[str, str] = {}
    for item in items or []:
        name, sep, url = item.partition("=")
        name, url = name.strip(), url.strip()
        parsed = urllib.parse.urlparse(url)
        if not sep or not name or parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ConfigError(f"--url must be NAME=http://HOST:PORT, got {item!r}")
        if name in out:
            raise ConfigError(f"--url: {name!r} given twice")
        out[name] = url
    return out


def parallel(fn: Callable[[Any], Any], items: list, concurrency: int | None = None) -> list:
    """``[fn(x) for x in items]`` in threads, results in input order: all at once, or with ``concurrency`` given, at
    most that many in flight, each finished call starting the next item at once (a closed-loop client of that many
    users, as a serving benchmark's ``--max-concurrency``)."""
    if concurrency is not None and concurrency < len(items):
        with ThreadPoolExecutor(max_workers=max(concurrency, 1)) as pool:
            return list(pool.map(fn, items))
    out: list = [None] * len(items)

    def work(i: int, item: Any) -> None:
        out[i] = fn(item)

    threads = [threading.Thread(target=work, args=(i, it)) for i, it in enumerate(items)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out
