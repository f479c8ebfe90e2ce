"""A one-member etcd on loopback for the rendezvous benchmarks (Debian's etcd-server), and the
count of requests it served (its /metrics: grpc_server_started_total by method).

    with LocalEtcd() as etcd:
        etcd.endpoint          # "127.0.0.1:PORT"
        etcd.requests()        # {"Range": n, "Txn": n, "Put": n, "LeaseKeepAlive": n, ...}
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class LocalEtcd:
    def __init__(self, program="etcd"):
        self.program = shutil.which(program) or program
        self.dir = None
        self.proc = None
        self.client = self.peer = 0

    @property
    def endpoint(self):
        return f"127.0.0.1:{self.client}"

    def __enter__(self):
        self.dir = tempfile.mkdtemp(prefix="bench-etcd-")
        self.client, self.peer = _free_port(), _free_port()
        url = f"http://127.0.0.1:{self.client}"
        peer = f"http://127.0.0.1:{self.peer}"
        log = open(os.path.join(self.dir, "etcd.log"), "wb")
        self.proc = subprocess.Popen(
            [self.program, "--name", "bench", "--data-dir", os.path.join(self.dir, "data"),
             "--listen-client-urls", url, "--advertise-client-urls", url,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"bench={peer}", "--heartbeat-interval", "10", "--election-timeout", "100",
             "--quota-backend-bytes", str(8 << 30)],
            stdout=log, stderr=log, env={k: v for k, v in os.environ.items() if not k.startswith("ETCD")})
        log.close()
        deadline = time.monotonic() + 30
        while True:  # a benchmark's start-up, not a test: asking /health until it says so is fine
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1) as r:
                    if b'"true"' in r.read():
                        return self
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"etcd did not start; see {self.dir}/etcd.log")
            time.sleep(0.05)

    def requests(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.client}/metrics", timeout=5) as r:
            text = r.read().decode()
        out = {}
        # Every request the gateway passed on, a watch stream or a keep-alive as one.
        pattern = r'^grpc_server_started_total\{grpc_method="(\w+)",grpc_service="etcdserverpb\.\w+"[^}]*\} (\d+)'
        for m in re.finditer(pattern, text, re.M):
            out[m.group(1)] = out.get(m.group(1), 0) + int(m.group(2))
        return out

    def __exit__(self, *exc):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        return False
