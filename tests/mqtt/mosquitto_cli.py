"""mosquitto_pub and mosquitto_sub (the mosquitto command-line clients) driven from tests.

Every mosquitto_sub runs with `-d`, so its debug lines say when the CONNACK and SUBACK came;
message lines (as printed by `-v` or `-F`) are kept apart from them. Processes are started
through a `Mosquitto` (the `mosquitto` fixture), which kills what is still running by PID at
teardown.
"""

import queue
import re
import signal
import subprocess
import threading
import time

VERSIONS = {"3.1.1": "mqttv311", "5.0": "mqttv5"}

# `-d` output: "Client <id> sending CONNECT", "Client <id> received SUBACK",
# "Subscribed (mid: 1): 1, 128", "Client <id> sending PINGREQ", ...
DEBUG = re.compile(r"^(Client \S+ (sending|received) |Subscribed \(mid: \d+\))")


class Sub:
    """A running mosquitto_sub."""

    def __init__(self, args):
        self.args = args
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        self.lines = queue.Queue()  # message lines
        self.debug = []  # debug lines, in order
        self.stderr = []
        self._debug_event = threading.Condition()
        self._stdout_done = False
        self._pumps = [threading.Thread(target=self._pump_stdout, daemon=True),
                       threading.Thread(target=self._pump_stderr, daemon=True)]
        for t in self._pumps:
            t.start()

    def _pump_stdout(self):
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            if DEBUG.match(line):
                with self._debug_event:
                    self.debug.append(line)
                    self._debug_event.notify_all()
            else:
                self.lines.put(line)
        with self._debug_event:
            self._stdout_done = True
            self._debug_event.notify_all()

    def _pump_stderr(self):
        for line in self.proc.stderr:
            self.stderr.append(line.rstrip("\n"))

    def wait_debug(self, pattern, timeout=10):
        """The first debug line matching `pattern` (a regex), waiting for it if need be."""
        deadline = time.monotonic() + timeout
        with self._debug_event:
            while True:
                for line in self.debug:
                    if re.search(pattern, line):
                        return line
                left = deadline - time.monotonic()
                if left <= 0 or self._stdout_done:
                    raise AssertionError(f"mosquitto_sub never printed /{pattern}/; debug: {self.debug}; "
                                         f"stderr: {self.stderr}; rc: {self.proc.poll()}")
                self._debug_event.wait(min(left, 0.1))

    def suback(self, timeout=10):
        """The SUBACK codes mosquitto_sub printed, e.g. [1] or [0, 128]."""
        line = self.wait_debug(r"^Subscribed \(mid", timeout)
        return [int(x) for x in line.split(":", 2)[2].split(",")]

    def get(self, timeout=10):
        """The next message line."""
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"mosquitto_sub printed no message within {timeout} s; stderr: {self.stderr}; "
                                 f"rc: {self.proc.poll()}") from None

    def take(self, n, timeout=10):
        return [self.get(timeout) for _ in range(n)]

    def none(self, wait=0.5):
        time.sleep(wait)
        return self.lines.empty()

    def drain(self, wait=1.0):
        out = []
        while True:
            try:
                out.append(self.lines.get(timeout=wait))
            except queue.Empty:
                return out

    def wait(self, timeout=15):
        """Waits for mosquitto_sub to exit (after `-C`, `-E` or `-W`) and for its output to be read;
        returns its exit status."""
        rc = self.proc.wait(timeout)
        for t in self._pumps:
            t.join(5)
        return rc

    def freeze(self):
        """SIGSTOP: the client stays connected but reads, acknowledges and pings nothing more."""
        self.proc.send_signal(signal.SIGSTOP)

    def kill(self):
        """SIGKILL: the connection ends without DISCONNECT (the will is published)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


class Mosquitto:
    """Starts mosquitto clients against one broker port; kills the ones still running at teardown."""

    def __init__(self):
        self.started = []

    def sub(self, port, version, *args, wait_suback=True, timeout_secs=20):
        """mosquitto_sub `-V version` with `args`; `-W timeout_secs` ends it in any case. Returns once
        the SUBACK came (unless `wait_suback` is false), so nothing published after can be missed."""
        cmd = ["stdbuf", "-oL", "mosquitto_sub", "-d", "-h", "127.0.0.1", "-p", str(port),
               "-V", VERSIONS.get(version, version), "-W", str(timeout_secs), *args]
        s = Sub(cmd)
        self.started.append(s)
        if wait_suback:
            s.wait_debug(r"received SUBACK")
        return s

    def pub(self, port, version, *args, check=True, timeout=10, stdin=None):
        """mosquitto_pub `-V version` with `args`; returns the CompletedProcess (stdout, stderr as text)."""
        cmd = ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), "-V", VERSIONS.get(version, version), *args]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, input=stdin)
        if check:
            assert out.returncode == 0, f"{cmd}: rc {out.returncode}: {out.stderr}"
        return out

    def close(self):
        for s in self.started:
            if s.proc.poll() is None:
                s.proc.kill()
            try:
                s.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
