# DESIGN: a private kvcd for demos, tests and benchmarks: the real daemon started on a Unix
# socket in a fresh temporary directory, waited for (bounded), and stopped by its pid
# (SIGTERM, then SIGKILL after a bounded wait); the directory goes with it. KVC_NO_FASTPATH
# set in the environment (libkvc's switch for its clients) turns the fast path off in the
# daemon too (server.fast_path=no), as tests/lib/daemon.c does for the C suites.
import os
import shutil
import signal
import subprocess
import tempfile
import time


def fast_path_off():
    """True when $KVC_NO_FASTPATH asks for no fast path (libkvc reads it the same way)."""
    return os.environ.get("KVC_NO_FASTPATH", "") not in ("", "0")


def daemon_options(options=()):
    """The -o options of a private kvcd: small-host defaults, the fast path as the
    environment says, then `options` (later ones win)."""
    base = ["host.prefault=no", "host.hugepages=off"]
    if fast_path_off():
        base.append("server.fast_path=no")
    return base + list(options)


def kvcd_binary():
    """$KVCD_BIN, else build/bin/kvcd of the source tree this package sits in."""
    if os.environ.get("KVCD_BIN"):
        return os.environ["KVCD_BIN"]
    here = os.path.dirname(os.path.abspath(__file__))
    for up in (3, 4):  # python/kvcd/engine or build/python/kvcd/engine
        cand = os.path.join(here, *([".."] * up), "build", "bin", "kvcd")
        if os.path.exists(cand):
            return os.path.normpath(cand)
    return "kvcd"


class PrivateDaemon:
    """with PrivateDaemon(["host.size=64m"]) as d: ... d.socket ..."""

    def __init__(self, options=(), binary=None, start_timeout=20.0):
        self.options = list(options)
        self.binary = binary or kvcd_binary()
        self.start_timeout = start_timeout
        self.dir = self.socket = self.proc = None

    def start(self):
        self.dir = tempfile.mkdtemp(prefix="kvcd-py.")
        self.socket = os.path.join(self.dir, "kvcd.sock")
        args = [self.binary, "-o", "server.socket=" + self.socket]
        for o in daemon_options(self.options):
            args += ["-o", o]
        self._log = open(os.path.join(self.dir, "kvcd.log"), "wb")
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=self._log)
        end = time.monotonic() + self.start_timeout
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.monotonic() > end:
                log = self.log()
                self.stop()
                raise RuntimeError("kvcd did not start: " + log)
            time.sleep(0.01)
        return self

    def log(self):
        self._log.flush()
        with open(os.path.join(self.dir, "kvcd.log"), errors="replace") as f:
            return f.read()

    def stop(self):
        if self.proc is not None:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.kill(self.proc.pid, signal.SIGKILL)
                    self.proc.wait()
            self.proc = None
            self._log.close()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False
