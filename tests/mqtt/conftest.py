"""A real `silt serve` per test: temporary data directory, ephemeral MQTT port, stopped by PID."""

import os
import queue
import re
import signal
import subprocess
import tempfile
import threading
import time

import paho.mqtt.client as mqtt
import pytest

SILT_BIN = os.environ.get("SILT_BIN", "target/debug/silt")


class Silt:
    def __init__(self, data_dir, extra_args=()):
        self.data_dir = data_dir
        self.proc = subprocess.Popen(
            # A free Kafka port unless the test names one: 9092 may be taken on the machine.
            [SILT_BIN, "serve", "--mqtt", "127.0.0.1:0", "--data-dir", data_dir,
             *([] if "--kafka" in extra_args else ["--kafka", "127.0.0.1:0"]),
             *([] if "--admin" in extra_args else ["--admin", "127.0.0.1:0"]), *extra_args],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        self.log = []
        # The port of every listener, by kind (tcp, tls, ws, wss), from the "listener bound" lines.
        self.ports = {}
        ready = threading.Event()

        def pump():
            for line in self.proc.stderr:
                self.log.append(line)
                admin = re.search(r"admin listener bound addr=127\.0\.0\.1:(\d+)", line)
                if admin:
                    self.admin_port = int(admin.group(1))
                bound = re.search(r"mqtt listener bound kind=(\w+) addr=127\.0\.0\.1:(\d+)", line)
                if bound:
                    self.ports[bound.group(1)] = int(bound.group(2))
                m = re.search(r"mqtt=127\.0\.0\.1:(\d+)", line)
                if m and "silt is running" in line:
                    self.port = int(m.group(1))
                    ready.set()

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(60):
            self.proc.kill()
            raise RuntimeError("silt did not start:\n" + "".join(self.log))

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(30) == 0, "".join(self.log)

    def kill(self):
        self.proc.kill()
        self.proc.wait(30)


@pytest.fixture
def data_dir():
    with tempfile.TemporaryDirectory() as d:
        yield d


@pytest.fixture
def silt(data_dir):
    s = Silt(data_dir)
    yield s
    if s.proc.poll() is None:
        s.kill()


class Client:
    """A paho client that records what it receives.

    `transport` is "tcp" (the default), "tls", "ws" or "wss": the listener of that kind, with
    `ca_file` as the trusted certificate for the TLS ones. `manual_ack` leaves QoS 1/2
    acknowledgements to the test (`c.ack(mid, qos)`)."""

    def __init__(self, silt, client_id="", protocol=mqtt.MQTTv5, clean=True, properties=None, will=None,
                 username=None, password=None, transport="tcp", ca_file=None, manual_ack=False):
        self.messages = queue.Queue()
        self.disconnects = queue.Queue()
        self.connack = queue.Queue()
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol,
                             clean_session=None if protocol == mqtt.MQTTv5 else clean,
                             transport="websockets" if transport in ("ws", "wss") else "tcp",
                             manual_ack=manual_ack)
        if transport in ("ws", "wss"):
            self.c.ws_set_options(path="/mqtt")
        if transport in ("tls", "wss"):
            self.c.tls_set(ca_certs=ca_file)
        self.c.on_message = lambda c, u, msg: self.messages.put(msg)
        self.c.on_connect = lambda c, u, flags, rc, props: self.connack.put((flags, rc, props))
        self.published = queue.Queue()
        self.c.on_publish = lambda c, u, mid, rc, props: self.published.put((mid, rc))
        self.subacks = queue.Queue()
        self.c.on_subscribe = lambda c, u, mid, rcs, props: self.subacks.put(rcs)
        self.c.on_disconnect = lambda c, u, flags, rc, props: self.disconnects.put(rc)
        if username is not None:
            self.c.username_pw_set(username, password)
        if will:
            self.c.will_set(**will)
        kwargs = {"clean_start": clean, "properties": properties} if protocol == mqtt.MQTTv5 else {}
        port = silt.port if transport == "tcp" else silt.ports[transport]
        self.c.connect("127.0.0.1", port, keepalive=30, **kwargs)
        self.c.loop_start()
        self.flags, self.rc, self.props = self.connack.get(timeout=10)

    def get(self, timeout=10):
        return self.messages.get(timeout=timeout)

    def none(self, wait=0.5):
        time.sleep(wait)
        return self.messages.empty()

    def close(self):
        self.c.disconnect()
        self.c.loop_stop()

    def drop(self):
        """Ends the TCP connection without DISCONNECT (an abnormal close)."""
        self.c.loop_stop()
        self.c.socket().close()


def drain(client, wait=1.0):
    """Every message `client` receives until none arrives for `wait` seconds."""
    out = []
    while True:
        try:
            out.append(client.get(timeout=wait))
        except queue.Empty:
            return out


@pytest.fixture
def mosquitto():
    """Starts mosquitto_pub/mosquitto_sub (see mosquitto_cli.py); kills what still runs at teardown."""
    from mosquitto_cli import Mosquitto

    m = Mosquitto()
    yield m
    m.close()


@pytest.fixture(scope="session")
def tls_cert():
    """A self-signed certificate for 127.0.0.1 and localhost (made with the openssl CLI): (cert, key)."""
    with tempfile.TemporaryDirectory() as d:
        cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=localhost",
             "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
            check=True, capture_output=True, timeout=30,
        )
        yield cert, key


def tls_listener_args(tls_cert):
    """`silt serve` flags for TLS, WebSocket and WebSocket-over-TLS listeners on ephemeral ports."""
    cert, key = tls_cert
    return ["--mqtt-tls", "127.0.0.1:0", "--mqtt-ws", "127.0.0.1:0", "--mqtt-wss", "127.0.0.1:0",
            "--tls-cert", cert, "--tls-key", key]


def auth_config(data_dir, users, acl_lines=None):
    """A password file (written by `silt passwd`) and an optional ACL file in data_dir; returns the
    `[mqtt.auth]` config table naming them. `users` maps user name to password."""
    passwd = os.path.join(data_dir, "passwd")
    for user, pw in users.items():
        subprocess.run([SILT_BIN, "passwd", passwd, user], input=pw + "\n", text=True, check=True,
                       capture_output=True, timeout=60)
    toml = f'[mqtt.auth]\npassword_file = "{passwd}"\n'
    if acl_lines is not None:
        acl = os.path.join(data_dir, "acl")
        with open(acl, "w") as f:
            f.write("".join(line + "\n" for line in acl_lines))
        toml += f'acl_file = "{acl}"\n'
    return toml


@pytest.fixture
def start_silt(data_dir):
    """Starts a `silt serve` with `toml` as its config file and extra flags; kills it at teardown."""
    started = []

    def start(toml="", extra_args=()):
        n = len(started)
        cfg = os.path.join(data_dir, f"silt-{n}.toml")
        with open(cfg, "w") as f:
            f.write(toml)
        s = Silt(os.path.join(data_dir, f"data-{n}"), ["--config", cfg, *extra_args])
        started.append(s)
        return s

    yield start
    for s in started:
        if s.proc.poll() is None:
            s.kill()
