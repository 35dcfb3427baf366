"""Raw-socket abuse of a running pdserve-decode (started by socket_abuse.sh): slowloris,
half-closed connections, garbage bytes, and a burst of streams cut off by their clients, after
which /metrics must show no KV block in use. Every socket operation has a timeout.

Usage: socket_abuse.py http://HOST:PORT
"""

import json
import random
import socket
import struct
import sys
import threading
import time
import traceback
import urllib.request

HEADER_TIMEOUT_S = 10.0  # http::ServerOptions::header_timeout, the server's default
SLACK_S = 5.0


class Server:
    def __init__(self, url):
        host_port = url.removeprefix("http://")
        host, port = host_port.rsplit(":", 1)
        self.address = (host, int(port))
        self.url = url

    def connect(self, timeout=10.0):
        return socket.create_connection(self.address, timeout=timeout)

    def get(self, path, timeout=10.0):
        with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
            return response.status, response.read().decode()

    def post_json(self, path, body, timeout=30.0):
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())

    def metrics(self):
        status, text = self.get("/metrics")
        assert status == 200
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                series, _, value = line.rpartition(" ")
                values[series] = float(value)
                # Also by the bare name (its first series): vLLM's carry model_name and engine.
                values.setdefault(series.split("{", 1)[0], float(value))
        return values

    def kv_blocks_in_use(self):
        return self.metrics()["pdserve:kv_cache_blocks_used"]


def read_until_closed(sock, deadline_s):
    """Everything the server sends until it closes; raises TimeoutError past the deadline."""
    data = b""
    end = time.monotonic() + deadline_s
    while True:
        left = end - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"the server kept the connection open for {deadline_s} s")
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        except socket.timeout as error:
            raise TimeoutError(f"the server kept the connection open for {deadline_s} s") from error
        if not chunk:
            return data
        data += chunk


def status_of(response):
    if not response.startswith(b"HTTP/1.1 "):
        return None
    return int(response[9:12])


def assert_serving(server):
    status, body = server.get("/health", timeout=5.0)
    assert status == 200, f"/health answered {status} {body}"


def streaming_request(prompt, max_tokens):
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
                       "temperature": 0, "stream": True}).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def check_slowloris(server):
    """Twenty connections trickle header bytes; each is closed within the header timeout, and
    the server answers other clients all along."""
    sockets = [server.connect() for _ in range(20)]
    start = time.monotonic()
    for sock in sockets:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\n")
    closed_at = [None] * len(sockets)
    trickled = 0
    while time.monotonic() - start < HEADER_TIMEOUT_S + SLACK_S and None in closed_at:
        for i, sock in enumerate(sockets):
            if closed_at[i] is not None:
                continue
            try:
                sock.sendall(b"X-Slow-%d: a\r\n" % trickled)  # headers that never end
            except (BrokenPipeError, ConnectionResetError):
                closed_at[i] = time.monotonic() - start
                continue
            sock.settimeout(0.01)
            try:
                if sock.recv(65536) == b"":
                    closed_at[i] = time.monotonic() - start
            except socket.timeout:
                pass
            except ConnectionResetError:
                closed_at[i] = time.monotonic() - start
        trickled += 1
        assert_serving(server)  # the trickling clients do not block anyone else
        time.sleep(0.5)  # the trickle's pace: the slow client is the behaviour under test
    for sock in sockets:
        sock.close()
    still_open = closed_at.count(None)
    assert still_open == 0, (f"{still_open} of {len(sockets)} trickling connections still open "
                             f"{HEADER_TIMEOUT_S + SLACK_S} s after their first byte")
    print(f"     slow connections closed after {min(closed_at):.1f} to {max(closed_at):.1f} s")
    assert_serving(server)


def check_half_closed(server):
    """A complete request followed by shutdown(SHUT_WR) is answered, then the server closes; a
    request cut off mid-headers by shutdown(SHUT_WR) is closed at once."""
    with server.connect() as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n")
        sock.shutdown(socket.SHUT_WR)
        response = read_until_closed(sock, 5.0)
        assert status_of(response) == 200, f"half-closed request got {response[:200]!r}"
    with server.connect() as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: te")
        sock.shutdown(socket.SHUT_WR)
        response = read_until_closed(sock, 5.0)
        assert response == b"" or status_of(response) == 400, f"got {response[:200]!r}"
    with server.connect() as sock:  # the body is cut short
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Length: 100\r\n\r\n{\"pro")
        sock.shutdown(socket.SHUT_WR)
        response = read_until_closed(sock, 5.0)
        assert response == b"" or status_of(response) == 400, f"got {response[:200]!r}"
    assert_serving(server)


def check_garbage(server):
    """Garbage of several kinds gets a 4xx answer or a closed connection, never a hang."""
    rng = random.Random(1234)
    garbage = [
        bytes(rng.randrange(256) for _ in range(4096)),
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64),  # a TLS ClientHello
        b"GET / HTTP/9.9\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: test\r\nContent-Length: -5\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\nhello",
        b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"\r\n" * 5000,
        b"GET /health HTTP/1.1\r\nHost: test\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n",
    ]
    for i, data in enumerate(garbage):
        with server.connect() as sock:
            try:
                sock.sendall(data)
                sock.shutdown(socket.SHUT_WR)
            except (BrokenPipeError, ConnectionResetError):
                pass  # closed while we were still sending: fine
            response = read_until_closed(sock, 5.0)
            status = status_of(response)
            assert response == b"" or (status is not None and 400 <= status < 500), \
                f"garbage {i} got {response[:200]!r}"
            if status is not None:
                body = json.loads(response.split(b"\r\n\r\n", 1)[1])
                assert sorted(body["error"]) == ["code", "message", "param", "type"], body
    assert_serving(server)


def check_pipelining_survives(server):
    """Two requests in one write are answered in order on the same connection."""
    with server.connect() as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n"
                     b"GET /v1/models HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        response = read_until_closed(sock, 5.0)
    assert response.count(b"HTTP/1.1 200 OK") == 2, response[:300]
    assert response.index(b"{}") < response.index(b'"object":"list"'), response[:300]


def check_disconnect_burst(server):
    """Twenty streams, each cut off by its client at a random point (before or after the
    first tokens, with a FIN or a RST), leave no KV block in use, and the greedy text of a
    request afterwards is the same as before the burst."""
    probe = {"prompt": "After the storm", "max_tokens": 16, "temperature": 0, "ignore_eos": True}
    status, before = server.post_json("/v1/completions", probe)
    assert status == 200

    rng = random.Random(99)
    sockets = []
    for i in range(20):
        sock = server.connect(timeout=30.0)
        prompt = " ".join(rng.choice(["kv", "block", "abort", "leak", "stream"]) for _ in range(5 + i * 7))
        sock.sendall(streaming_request(prompt, 4000))
        sockets.append(sock)
    # Polled: the server's /metrics is the only view of its KV pool.
    end = time.monotonic() + 10
    while (in_use_during := server.kv_blocks_in_use()) == 0 and time.monotonic() < end:
        time.sleep(0.05)

    def cut_off(sock, wanted_bytes, reset):
        received = 0
        try:
            while received < wanted_bytes:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                received += len(chunk)
        except (socket.timeout, ConnectionResetError):
            pass
        if reset:  # SO_LINGER 0: close() sends a RST instead of a FIN
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()

    threads = [threading.Thread(target=cut_off, args=(sock, rng.choice([0, 200, 2000, 20000]), rng.random() < 0.5))
               for sock in sockets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "a client never got its bytes"
    assert in_use_during > 0, "no KV block was in use while twenty streams ran"
    print(f"     KV in use during the burst: {in_use_during:g}")

    # Polled (/metrics): the aborts land at the server's next engine step.
    end = time.monotonic() + 15
    while True:
        values = server.metrics()
        idle = values["vllm:num_requests_running"] == 0 and values["vllm:num_requests_waiting"] == 0
        in_use = server.kv_blocks_in_use()
        if idle and in_use == 0:
            break
        assert time.monotonic() < end, (f"15 s after the burst: running {values['vllm:num_requests_running']}, "
                                        f"waiting {values['vllm:num_requests_waiting']}, KV in use {in_use}")
        time.sleep(0.1)
    assert server.metrics()["vllm:kv_cache_usage_perc"] == 0
    status, after = server.post_json("/v1/completions", probe)
    assert status == 200
    assert after["choices"][0]["text"] == before["choices"][0]["text"], "greedy text changed after the aborts"


def main():
    server = Server(sys.argv[1])
    failures = 0
    for check in (check_half_closed, check_garbage, check_pipelining_survives, check_disconnect_burst,
                  check_slowloris):
        start = time.monotonic()
        try:
            check(server)
            print(f"ok   {check.__name__} ({time.monotonic() - start:.1f} s)", flush=True)
        except Exception:  # noqa: BLE001 - report every failure and go on with the next check
            failures += 1
            print(f"FAIL {check.__name__}:\n{traceback.format_exc()}", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
