"""What the Python end-to-end tests share: the built binaries, a private temp dir, servers
started on port 0 (each reports the address it got on stdout, so no test probes for free
ports), a colocated node or a whole 1P1D cluster behind the proxy, pdserve-generate as the
greedy oracle, a script-wide deadline, and named checks. Every child process is killed when
the test exits, fails or runs past its deadline.

Environment (set by CTest): PDSERVE_BUILD_DIR, PDSERVE_SOURCE_DIR.
"""
import atexit
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request


def _required_env(name):
    value = os.environ.get(name)
    if not value:
        sys.exit(f"environment variable {name} is not set (run the test via ctest)")
    return value


BUILD = _required_env("PDSERVE_BUILD_DIR")
SOURCE = _required_env("PDSERVE_SOURCE_DIR")
TINY_CONFIG = os.path.join(SOURCE, "tests/data/reference/configs/tiny.json")
QWEN3_06B_CONFIG = os.path.join(SOURCE, "configs/models/qwen3-0.6b/config.json")
BINARIES = {
    "decode": os.path.join(BUILD, "decode_node/pdserve-decode"),
    "prefill": os.path.join(BUILD, "prefill_node/pdserve-prefill"),
    "proxy": os.path.join(BUILD, "proxy/pdserve-proxy"),
    "generate": os.path.join(BUILD, "tools/generate/pdserve-generate"),
    "make-model": os.path.join(BUILD, "tools/make_model/pdserve-make-model"),
}
CLUSTER_TOKEN = "test-cluster-token"

_children = []
_cleanups = []
_work_dir = tempfile.mkdtemp(prefix="pdserve-test-")
_keep_work_dir = os.environ.get("PDSERVE_TEST_KEEP_FILES") == "1"


def work_dir():
    return _work_dir


def add_cleanup(function):
    """Runs `function` when the test exits (normally, on failure, signal or deadline), after
    every child process is killed; the last added runs first."""
    _cleanups.append(function)


def _cleanup():
    for child in _children:
        if child.poll() is None:
            child.kill()
            child.wait()
    while _cleanups:
        try:
            _cleanups.pop()()
        except Exception:  # noqa: BLE001 - the other cleanups still run
            traceback.print_exc()
    if not _keep_work_dir:
        shutil.rmtree(_work_dir, ignore_errors=True)


atexit.register(_cleanup)


def _on_signal(signum, _frame):
    print(f"FAIL: {'the test deadline passed' if signum == signal.SIGALRM else f'signal {signum}'}; "
          "killing the servers", file=sys.stderr, flush=True)
    os._exit(_cleanup() or 1)


for _signal in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM):
    signal.signal(_signal, _on_signal)


def set_deadline(seconds):
    """Fails the whole test after `seconds`: below the CTest TIMEOUT, so the cleanup is ours."""
    signal.alarm(int(seconds))


def run(argv, timeout=120):
    """Runs a command to its end; returns its stdout as written (UTF-8, no newline translation:
    a generated "\r\n" stays one), raises with stderr on failure."""
    result = subprocess.run(argv, capture_output=True, timeout=timeout)
    if result.returncode != 0:
        stderr = result.stderr.decode("utf-8", errors="replace")
        raise AssertionError(f"{' '.join(argv)} exited {result.returncode}:\n{stderr}")
    return result.stdout.decode("utf-8")


def make_model(name="model", config=TINY_CONFIG, seed=7, layers=None, untie=True, fp8=False):
    """A synthetic checkpoint. The tiny one has an untied lm_head by default: with tied
    embeddings a random model's greedy output just repeats the last prompt token, which makes
    text comparisons between prompts far less telling. `fp8`: Qwen's block-FP8 layout
    (pdserve-make-model --fp8)."""
    out = os.path.join(_work_dir, name)
    argv = [BINARIES["make-model"], "--config", config, "--out", out, "--seed", str(seed)]
    if layers is not None:
        argv += ["--layers", str(layers)]
    if untie:
        argv.append("--untie")
    if fp8:
        argv.append("--fp8")
    run(argv, timeout=300)
    return out


def generate_greedy(model, prompt, max_new_tokens, extra=()):
    """What `pdserve-generate` prints for a greedy, ignore-EOS run (without its final newline).
    `prompt` is a string or a list of token ids."""
    prompt_args = ["--prompt-ids", ",".join(map(str, prompt))] if isinstance(prompt, list) else ["--prompt", prompt]
    out = run([BINARIES["generate"], "--model", model, *prompt_args, "--temperature", "0", "--ignore-eos",
               "--max-new-tokens", str(max_new_tokens), "--threads", "1", *extra])
    if not out.endswith("\n"):
        raise AssertionError(f"pdserve-generate output does not end in a newline: {out!r}")
    return out[:-1]


class Process:
    """A server started on port 0; `match` is the regex match of the line that names its address."""

    def __init__(self, name, argv, ready_pattern, timeout=120, env=None):
        self.name = name
        self.log_path = os.path.join(_work_dir, f"{name}.log")
        self._log = open(self.log_path, "w", encoding="utf-8")
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self._log, text=True,
                                        env=dict(os.environ, **(env or {})))
        _children.append(self.process)
        self.match = None
        lines = []
        found = threading.Event()

        def read_stdout():
            for line in self.process.stdout:
                lines.append(line)
                self._log.write(line)
                self._log.flush()
                if self.match is None:
                    self.match = re.search(ready_pattern, line)
                    if self.match:
                        found.set()
            found.set()

        threading.Thread(target=read_stdout, daemon=True).start()
        if not found.wait(timeout) or self.match is None:
            self.process.kill()
            raise AssertionError(f"{name} did not start within {timeout} s:\n{self.log()}")

    def log(self):
        with open(self.log_path, encoding="utf-8", errors="replace") as handle:
            return handle.read()

    def stop(self, timeout=15):
        """SIGTERM, then the exit code (SIGKILL and an error after `timeout`)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError(f"{self.name} did not stop within {timeout} s")


SERVING_LINE = r"pdserve-decode: serving (\S+) on (http://\S+) \(device cpu"
DEFAULT_NODE_ARGS = ("--threads", "1", "--kv-cache-memory-gib", "0.25")


class Target:
    """Where a test sends its OpenAI requests: `url` (base, without /v1) and the served
    model `name`; `processes` are what serves it, `decode` the decode node's Process."""

    def __init__(self, kind, url, name, processes, decode):
        self.kind, self.url, self.name, self.processes, self.decode = kind, url, name, processes, decode

    def stop(self):
        """Stops every process (the front door first); returns the exit code of the first."""
        codes = [process.stop() for process in self.processes]
        return codes[0]

    def logs(self):
        return "\n".join(f"--- {p.name}\n{p.log()}" for p in self.processes)


def start_colocated(model, extra=(), name="decode"):
    node = Process(name, [BINARIES["decode"], "--model", model, "--port", "0", *DEFAULT_NODE_ARGS, *extra],
                   SERVING_LINE)
    return Target("colocated", node.match.group(2), node.match.group(1), [node], node)


def start_1p1d(model, node_extra=(), proxy_extra=(), ucx_tls="tcp", decode_extra=()):
    """pdserve-proxy + one prefill + one decode node registered with it, all on port 0;
    `decode_extra`: flags of the decode node only."""
    token = {"PDSERVE_CLUSTER_TOKEN": CLUSTER_TOKEN}
    proxy = Process("proxy", [BINARIES["proxy"], "--port", "0", *proxy_extra],
                    r"pdserve-proxy: listening on (http://\S+)", env=token)
    proxy_url = proxy.match.group(1)
    common = ["--model", model, "--port", "0", "--proxy", proxy_url, "--ucx-tls", ucx_tls, *DEFAULT_NODE_ARGS,
              *node_extra]
    prefill = Process("prefill", [BINARIES["prefill"], *common], r"pdserve-prefill: prefilling (\S+) on (http://\S+)",
                      env=token)
    decode = Process("decode", [BINARIES["decode"], *common, *decode_extra], SERVING_LINE, env=token)
    wait_until(lambda: sum(n["state"] == "up" for n in get_json(proxy_url + "/cluster",
                                                               headers=cluster_headers())["nodes"]) == 2,
               60, "both nodes registered with the proxy")
    return Target("1p1d", proxy_url, decode.match.group(1), [proxy, decode, prefill], decode)


def start_target(kind, model, extra=()):
    if kind == "colocated":
        return start_colocated(model, extra)
    if kind == "1p1d":
        return start_1p1d(model, extra)
    raise ValueError(f"unknown target {kind} (colocated or 1p1d)")


def cluster_headers():
    return {"Authorization": f"Bearer {CLUSTER_TOKEN}"}


def http(method, url, body=None, headers=None, timeout=60):
    """(status, body text); an HTTP error status is returned, not raised."""
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def get_json(url, headers=None, timeout=10):
    status, body = http("GET", url, headers=headers, timeout=timeout)
    if status != 200:
        raise AssertionError(f"GET {url}: HTTP {status}: {body[:300]}")
    return json.loads(body)


def metric(url, name):
    """The value of an unlabelled series (or the first of a labelled one) on /metrics."""
    status, text = http("GET", url + "/metrics", timeout=10)
    if status != 200:
        raise AssertionError(f"GET {url}/metrics: HTTP {status}")
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} is not in {url}/metrics")


def wait_until(condition, seconds, what):
    """Polls `condition` (exceptions count as false) until it holds or `seconds` pass. For states
    of other processes (an HTTP answer, a metric, a file) that give the test no event to wait on."""
    end = time.monotonic() + seconds
    last_error = None
    while time.monotonic() < end:
        try:
            if condition():
                return
        except Exception as error:  # noqa: BLE001 - the condition is retried until the deadline
            last_error = error
        time.sleep(0.05)
    raise AssertionError(f"not within {seconds} s: {what}" + (f" (last error: {last_error})" if last_error else ""))


_failures = []  # (check name, its exception's last line), repeated at the end by finish()


def run_checks(checks):
    """Runs (name, function) pairs in order, printing ok/FAIL for each; returns the failures."""
    failed = 0
    for name, check in checks:
        start = time.monotonic()
        try:
            check()
            print(f"ok   {name} ({(time.monotonic() - start) * 1000:.0f} ms)", flush=True)
        except Exception as error:  # noqa: BLE001 - every failure is reported, then the next check runs
            failed += 1
            _failures.append((name, f"{type(error).__name__}: {error}"))
            print(f"FAIL {name}:\n{traceback.format_exc()}", flush=True)
    return failed


def finish(failed, target=None, what="checks"):
    """Exits 0 when nothing failed; otherwise prints the servers' logs, keeps the temp dir and exits 1."""
    global _keep_work_dir
    if failed:
        if target is not None:
            print(target.logs())
        # Again after the logs, so that a CI system that keeps only the output's tail has them.
        for name, error in _failures:
            print(f"FAILED {name}: {error[:2000]}")
        _keep_work_dir = True
        print(f"{failed} of the {what} failed (files in {_work_dir})")
        sys.exit(1)
    print(f"all {what} passed")
    sys.exit(0)


def expect(condition, message):
    if not condition:
        raise AssertionError(message)


def expect_equal(actual, expected, what):
    if actual != expected:
        raise AssertionError(f"{what}: got {actual!r}, expected {expected!r}")
