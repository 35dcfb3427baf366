#!/usr/bin/python3
"""A userspace Ethernet bridge that shapes what it forwards as `tc netem` would, for kernels
built without sch_netem. It switches frames between the host ends of veth pairs (AF_PACKET
sockets with virtio-net headers, so GSO frames and partial checksums pass whole, as they do
through a kernel bridge) and learns MAC addresses. Frames that a shaped port sends (the egress
of the namespace behind it) are dropped with probability LOSS, serialized at RATE bits/s, then
held DELAY ± JITTER ms (uniform, like netem without a distribution table: frames may reorder).

Usage: link_emulator.py --delay-ms D --jitter-ms J --loss P --rate-bps R --seed S \
           PORT[:shaped] ...
It forwards unshaped until SIGUSR1 turns shaping on. Ports that are down drop what they get.
It exits when its parent does (a test killed by SIGKILL leaves no emulator behind).
"""
import argparse
import errno
import heapq
import os
import random
import select
import signal
import socket
import time

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_VNET_HDR = 15
PACKET_IGNORE_OUTGOING = 23
VNET_HDR_LEN = 10
BROADCAST_BIT = 0x01


def open_port(name):
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    sock.bind((name, 0))
    sock.setblocking(False)
    return sock


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--delay-ms", type=float, required=True)
    parser.add_argument("--jitter-ms", type=float, required=True)
    parser.add_argument("--loss", type=float, required=True)
    parser.add_argument("--rate-bps", type=float, required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("ports", nargs="+")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    ports = []
    for spec in args.ports:
        name, _, flag = spec.partition(":")
        ports.append({"name": name, "sock": open_port(name), "shaped": flag == "shaped", "free_at": 0.0})
    by_fd = {p["sock"].fileno(): p for p in ports}
    shaping = {"on": False}
    signal.signal(signal.SIGUSR1, lambda *_: shaping.update(on=True))
    where = {}  # MAC -> port
    queue = []  # (due, sequence, port, bytes)
    sequence = 0
    poller = select.epoll()
    for p in ports:
        poller.register(p["sock"].fileno(), select.EPOLLIN)

    def send(port, data):
        try:
            port["sock"].send(data)
        except OSError as error:
            if error.errno not in (errno.ENETDOWN, errno.ENXIO, errno.ENOBUFS, errno.EAGAIN):
                raise

    parent = os.getppid()
    while os.getppid() == parent:
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, port, data = heapq.heappop(queue)
            send(port, data)
        timeout = max(0.0, queue[0][0] - now) if queue else 1.0
        try:
            events = poller.poll(timeout)
        except InterruptedError:
            continue
        for fd, _ in events:
            source = by_fd[fd]
            while True:
                try:
                    data = source["sock"].recv(70000)
                except BlockingIOError:
                    break
                except OSError as error:
                    if error.errno in (errno.ENETDOWN, errno.ENXIO):
                        break
                    raise
                if len(data) < VNET_HDR_LEN + 14:
                    continue
                frame = data[VNET_HDR_LEN:]
                where[frame[6:12]] = source
                destination = where.get(frame[0:6]) if not frame[0] & BROADCAST_BIT else None
                targets = [destination] if destination is not None else [p for p in ports if p is not source]
                due = time.monotonic()
                if source["shaped"] and shaping["on"]:
                    if rng.random() < args.loss:
                        continue
                    source["free_at"] = max(due, source["free_at"]) + len(frame) * 8 / args.rate_bps
                    due = source["free_at"] + (args.delay_ms + rng.uniform(-args.jitter_ms, args.jitter_ms)) / 1000
                for target in targets:
                    if target is source:
                        continue
                    if due <= time.monotonic():
                        send(target, data)
                    else:
                        sequence += 1
                        heapq.heappush(queue, (due, sequence, target, data))


if __name__ == "__main__":
    main()
