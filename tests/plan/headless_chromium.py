"""Load a page in real headless Chromium and report what it rendered and logged.

Talks the DevTools protocol over `--remote-debugging-pipe` (NUL-separated JSON on file
descriptors 3 and 4), so no websocket client is needed: open the page, wait for its load
event, evaluate a probe expression, and collect console errors, uncaught exceptions and
error-level log entries on the way.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--disable-dev-shm-usage", "--remote-debugging-pipe"]


def ensure_chromium() -> str:
    """The chromium executable, installed with apt-get (Debian's package) when missing."""
    exe = shutil.which("chromium")
    if exe is None:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-q"], check=True, env=env,
                       stdout=subprocess.DEVNULL)
        subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends",
                        "chromium"], check=True, env=env, stdout=subprocess.DEVNULL)
        exe = shutil.which("chromium")
    if exe is None:
        raise RuntimeError("chromium is not on PATH after apt-get install chromium")
    return exe


@dataclass
class PageLoad:
    probe: object
    errors: list[str] = field(default_factory=list)


class _Pipe:
    def __init__(self, proc: subprocess.Popen, write_fd: int, read_fd: int):
        self.proc, self.w, self.r = proc, write_fd, read_fd
        self.buf = b""
        self.next_id = 0
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None
             ) -> dict:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self.read()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def read(self) -> dict:
        while b"\0" not in self.buf:
            chunk = os.read(self.r, 1 << 16)
            if not chunk:
                raise RuntimeError(f"chromium closed the pipe (exit {self.proc.poll()})")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def wait_for(self, method: str, timeout_s: float) -> None:
        end = time.monotonic() + timeout_s
        while not any(e.get("method") == method for e in self.events):
            if time.monotonic() > end:
                raise TimeoutError(f"no {method} within {timeout_s} s")
            self.events.append(self.read())


def _errors(events: list[dict]) -> list[str]:
    out = []
    for e in events:
        m, p = e.get("method"), e.get("params", {})
        if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append("console: " + " ".join(str(a.get("value", a.get("description")))
                                              for a in p.get("args", [])))
        elif m == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            out.append("exception: " + str(d.get("exception", {}).get("description")
                                           or d.get("text")))
        elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            out.append("log: " + p["entry"].get("text", ""))
    return out


def load_page(path: Path, probe_js: str, user_data_dir: Path, timeout_s: float = 30.0
              ) -> PageLoad:
    """Open `path` in headless Chromium, evaluate `probe_js` (its JSON-able value is
    returned) after the load event, and collect every error the page logged."""
    exe = ensure_chromium()
    to_chrome_r, to_chrome_w = os.pipe()
    from_chrome_r, from_chrome_w = os.pipe()

    def fds() -> None:  # the child reads commands on fd 3 and writes replies on fd 4
        # move both ends above 4 first: a pipe end may itself be fd 3 or 4, and dup2 onto
        # itself would leave it close-on-exec
        r, w = (fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_chrome_r, from_chrome_w))
        os.dup2(r, 3)
        os.dup2(w, 4)

    proc = subprocess.Popen([exe, *FLAGS, f"--user-data-dir={user_data_dir}", "about:blank"],
                            preexec_fn=fds, close_fds=False, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    os.close(to_chrome_r)
    os.close(from_chrome_w)
    pipe = _Pipe(proc, to_chrome_w, from_chrome_r)
    try:
        target = pipe.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = pipe.send("Target.attachToTarget", {"targetId": target,
                                                      "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            pipe.send(f"{domain}.enable", session=session)
        pipe.send("Page.navigate", {"url": path.resolve().as_uri()}, session=session)
        pipe.wait_for("Page.loadEventFired", timeout_s)
        got = pipe.send("Runtime.evaluate", {"expression": probe_js, "returnByValue": True,
                                             "awaitPromise": True}, session=session)
        errors = _errors([e for e in pipe.events if e.get("sessionId") == session])
        return PageLoad(probe=got.get("result", {}).get("value"), errors=errors)
    finally:
        try:
            pipe.send("Browser.close")
        except RuntimeError:
            pass
        os.close(to_chrome_w)
        os.close(from_chrome_r)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
