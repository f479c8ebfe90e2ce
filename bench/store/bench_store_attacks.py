#!/usr/bin/env python3
"""The store under attack: elastic-store's peak resident memory (VmHWM) while hostile clients
attack it, one attack per fresh server and then all at once, with PyTorch 1.13's Python client
doing SET and GET in a loop throughout (its round trips are counted; it must never fail).

  /usr/bin/python3 bench/store/bench_store_attacks.py --build build/bench [--max-memory BYTES]

--build is a build tree holding bin/elastic-store (the top project's examples, or bench/).
Every attack is bounded in count and time and sends only to 127.0.0.1.
"""
import argparse
import os
import socket
import struct
import subprocess
import sys
import time

MIB = 1024 * 1024
TORCH_PYTHON = "/usr/bin/python3"

TORCH_CLIENT = r"""
import datetime, sys, time
import torch.distributed as dist
s = dist.TCPStore("127.0.0.1", int(sys.argv[1]), 1, False, datetime.timedelta(seconds=60))
s.set("ready", "1")
n = 0
t0 = time.monotonic()
while s.add("done", 0) == 0:
    v = "value-%d" % n
    s.set("torch/%d" % (n % 100), v)
    assert s.get("torch/%d" % (n % 100)) == v.encode()
    n += 1
print(n, time.monotonic() - t0, flush=True)
"""


def u64(n):
    return struct.pack("<Q", n)


def blob(b):
    return u64(len(b)) + b


def set_req(key, value):
    return b"\x00" + blob(key) + blob(value)


def num_keys_req():
    return b"\x06"


def connect(port):
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def closed(s, timeout=10.0):
    """True when the server closed the connection (EOF or reset) within `timeout`."""
    s.settimeout(timeout)
    try:
        while True:
            data = s.recv(1 << 20)
            if not data:
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def sync(s):
    s.sendall(num_keys_req())
    got = b""
    while len(got) < 8:
        part = s.recv(8 - len(got))
        if not part:
            raise ConnectionError("closed")
        got += part


def attack_multi_get(port):
    w = connect(port)
    w.sendall(set_req(b"/big", b"v" * MIB))
    sync(w)
    bomb = connect(port)
    bomb.sendall(b"\x0a" + u64(128 * 1024) + blob(b"/big") * (128 * 1024))
    return closed(bomb)


def attack_partial(port):
    held = []
    for _ in range(40):
        c = connect(port)
        c.sendall(b"\x00" + blob(b"/k") + u64(16 * MIB) + b"p" * 10)
        held.append(c)
    probe = connect(port)
    sync(probe)
    return held  # kept open until the end of the run


def attack_watcher(port):
    watcher = connect(port)
    watcher.sendall(b"\x07" + blob(b"/watched"))
    watcher.recv(1)
    writer = connect(port)
    value = b"x" * MIB
    for _ in range(200):
        try:
            writer.sendall(set_req(b"/watched", value) + num_keys_req())
            writer.recv(8, socket.MSG_WAITALL)
        except OSError:
            return False
    return closed(watcher, 1.0)


def attack_append(port):
    c = connect(port)
    value = b"a" * MIB
    try:
        for _ in range(20):
            c.sendall(b"\x09" + blob(b"/appended") + blob(value))
    except OSError:
        pass
    return closed(c)


def attack_fill(port):
    c = connect(port)
    value = b"f" * MIB
    for i in range(2048):
        try:
            c.sendall(set_req(b"/fill/%d" % i, value) + num_keys_req())
            got = c.recv(8, socket.MSG_WAITALL)
            if len(got) < 8:
                return True
        except OSError:
            return True
    return False


ATTACKS = [
    ("MULTI_GET asking for 128 GiB", attack_multi_get),
    ("40 requests announcing 16 MiB, 10 bytes sent", attack_partial),
    ("WATCH_KEY never read, 200 values of 1 MiB", attack_watcher),
    ("APPEND past the value limit", attack_append),
    ("new 1 MiB values until the store is full", attack_fill),
]


def vm_kib(pid, field):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def run(build, max_memory, attacks):
    args = [os.path.join(build, "bin", "elastic-store"), "--port", "0"]
    if max_memory:
        args += ["--max-memory", str(max_memory)]
    server = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        line = server.stdout.readline().decode()
        port = int(line.rsplit(":", 1)[1])
        start_kib = vm_kib(server.pid, "VmHWM:")
        torch = subprocess.Popen([TORCH_PYTHON, "-c", TORCH_CLIENT, str(port)],
                                 stdout=subprocess.PIPE)
        probe = connect(port)
        probe.sendall(b"\x05" + u64(1) + blob(b"/ready"))  # WAIT for the client's "ready"
        probe.recv(1)
        outcomes, keep = [], []
        for name, attack in attacks:
            result = attack(port)
            if isinstance(result, list):
                keep += result
                result = True
            outcomes.append((name, result))
        done = connect(port)
        done.sendall(b"\x03" + blob(b"/done") + struct.pack("<q", 1))
        done.recv(8)
        out, _ = torch.communicate(timeout=60)
        fields = out.split()
        peak_kib = vm_kib(server.pid, "VmHWM:")
        return {
            "start_kib": start_kib,
            "peak_kib": peak_kib,
            "outcomes": outcomes,
            "torch_ok": torch.returncode == 0,
            "torch_ops": int(fields[0]) if fields else 0,
            "torch_s": float(fields[1]) if len(fields) > 1 else 0.0,
            "alive": server.poll() is None,
        }
    finally:
        server.kill()
        server.wait()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", required=True)
    p.add_argument("--max-memory", type=int, default=0, help="elastic-store --max-memory")
    a = p.parse_args()
    limit = "%d MiB" % (a.max_memory // MIB) if a.max_memory else "default (1 GiB)"
    print("elastic-store, max_memory %s; PyTorch 1.13 client doing SET+GET throughout" % limit)
    print("| attack | peak RSS | attacker closed | PyTorch client round trips | server alive |")
    print("|---|---|---|---|---|")
    rows = [(name, [(name, f)]) for name, f in ATTACKS] + [("all of the above at once", ATTACKS)]
    failed = False
    for title, attacks in rows:
        r = run(a.build, a.max_memory, attacks)
        closed_all = all(ok for _, ok in r["outcomes"])
        print("| %s | %.1f MiB | %s | %s | %s |" % (
            title, r["peak_kib"] / 1024.0, "yes" if closed_all else "NO",
            ("%d in %.1f s" % (r["torch_ops"], r["torch_s"])) if r["torch_ok"] else "FAILED",
            "yes" if r["alive"] else "NO"))
        failed |= not (closed_all and r["torch_ok"] and r["alive"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
