"""The HTML transition-coverage report in a real browser: Debian's Chromium, headless.

Driven over the DevTools protocol (``--remote-debugging-port``, a small websocket client of
the standard library below); never a downloaded browser build, background networking off, no
host name resolved (``--host-resolver-rules``). ``make setup`` installs ``chromium`` and
``fonts-dejavu-core``; this test is never skipped. The timeouts only guard against a hang.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
import zlib
from pathlib import Path

import pytest

from fsm.core import lifecycle as L
from fsm.review import report as R
from fsm.review.diagrams import DrawnRow, extract, review_edges
from fsm.review.diagrams.style import STATUS_STYLE

CHROMIUM = "/usr/bin/chromium"
HANG = 120.0  # seconds: a hang guard, never a measure
WIDTH, HEIGHT = 1280, 800

pytestmark = pytest.mark.subprocess


class DevTools:
    """A DevTools-protocol client over one websocket (RFC 6455, text frames, client-masked)."""

    def __init__(self, url: str) -> None:
        u = urllib.parse.urlparse(url)
        self.sock = socket.create_connection((u.hostname, u.port), timeout=HANG)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {u.path} HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\n"
                           "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                           f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
                          .encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(1)
            assert chunk, "DevTools closed the connection during the handshake"
            head += chunk
        assert head.split(b"\r\n", 1)[0].split()[1] == b"101", head
        self.next_id = 0
        self.events: list[dict] = []

    def _exact(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            assert chunk, "DevTools closed the connection"
            data += chunk
        return data

    def _send(self, payload: bytes, opcode: int = 0x1) -> None:
        n = len(payload)
        head = bytes([0x80 | opcode])
        head += (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack(">H", n)
                 if n < 65536 else bytes([0x80 | 127]) + struct.pack(">Q", n))
        mask = os.urandom(4)
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def _message(self) -> dict:
        parts = b""
        while True:
            b1, b2 = self._exact(2)
            n = b2 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._exact(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._exact(8))[0]
            data = self._exact(n)
            opcode = b1 & 0x0F
            if opcode == 0x9:  # ping
                self._send(data, 0xA)
                continue
            assert opcode != 0x8, "DevTools closed the websocket"
            parts += data
            if b1 & 0x80:
                return json.loads(parts)

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        self._send(json.dumps({"id": self.next_id, "method": method, "params": params}).encode())
        while True:
            msg = self._message()
            if msg.get("id") == self.next_id:
                assert "error" not in msg, (method, msg["error"])
                return msg.get("result", {})
            self.events.append(msg)

    def wait_for(self, method: str) -> dict:
        """The next event ``method`` (those already heard first)."""
        while True:
            for i, e in enumerate(self.events):
                if e.get("method") == method:
                    return self.events.pop(i)
            self.events.append(self._message())

    def js(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def open(self, url: str) -> None:
        self.events = [e for e in self.events if e.get("method") != "Page.loadEventFired"]
        self.call("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired")

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def browser(tmp_path):
    """A headless Chromium of its own (a throw-away profile) and a DevTools client of its page."""
    assert os.access(CHROMIUM, os.X_OK), (
        f"{CHROMIUM} is missing: 'make setup' installs Debian's chromium and fonts-dejavu-core")
    profile = Path(tempfile.mkdtemp(prefix="fsm-chromium-"))
    args = [CHROMIUM, "--headless", "--disable-gpu", "--no-first-run",
            "--no-default-browser-check", "--disable-background-networking",
            "--disable-component-update", "--disable-default-apps", "--disable-extensions",
            "--disable-sync", "--disable-domain-reliability", "--metrics-recording-only",
            "--disable-client-side-phishing-detection", "--disable-breakpad",
            "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
            "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
            f"--user-data-dir={profile}", f"--window-size={WIDTH},{HEIGHT}",
            "--force-device-scale-factor=1", "--hide-scrollbars", "about:blank"]
    if os.geteuid() == 0:
        args.insert(1, "--no-sandbox")  # Chromium's sandbox refuses to run as root
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = None
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + HANG
        while not port_file.is_file() or not port_file.read_text().strip():
            assert proc.poll() is None, f"chromium exited with {proc.returncode}"
            assert time.monotonic() < deadline, "chromium did not open its DevTools port"
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=HANG) as r:
            pages = [t for t in json.load(r) if t["type"] == "page"]
        client = DevTools(pages[0]["webSocketDebuggerUrl"])
        client.call("Page.enable")
        client.call("Network.enable")
        client.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT,
                    deviceScaleFactor=1, mobile=False)
        yield client
    finally:
        if client is not None:
            client.close()
        proc.terminate()
        try:
            proc.wait(timeout=HANG)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB(A) bytes) of an 8-bit, non-interlaced PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and interlace == 0 and colour in (2, 6)
            bpp = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, prev = [], bytes(stride)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 0xFF
            elif f == 2:
                line[i] = (line[i] + b) & 0xFF
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        prev = bytes(line)
        rows.append(prev[::bpp] + prev[1::bpp] + prev[2::bpp])  # R…, G…, B… of the row
    return width, height, rows


# Measured in the page: every label of a diagram (a node with edges "<id>#from" / "<id>#to"),
# the union of its texts' boxes and the distance, in CSS pixels, to the nearest point of its
# edges' paths; and per label, its rows' links and the colour of its edges.
MEASURE = r"""
(() => {
  const out = [];
  for (const svg of document.querySelectorAll('.diagram svg')) {
    for (const node of svg.querySelectorAll('g.node')) {
      const edges = ['#from', '#to'].map(s => svg.getElementById(node.id + s)).filter(e => e);
      const texts = [...node.querySelectorAll('text')];
      if (!edges.length || !texts.length) continue;
      const boxes = texts.map(t => t.getBoundingClientRect());
      const box = {l: Math.min(...boxes.map(b => b.left)), r: Math.max(...boxes.map(b => b.right)),
                   t: Math.min(...boxes.map(b => b.top)), b: Math.max(...boxes.map(b => b.bottom))};
      let best = Infinity;
      const strokes = [];
      for (const e of edges) {
        const path = e.querySelector('path');
        strokes.push(path.getAttribute('stroke'));
        const m = path.getScreenCTM(), len = path.getTotalLength();
        for (let d = 0; d <= len; d += 1) {
          const p = path.getPointAtLength(d);
          const x = m.a * p.x + m.c * p.y + m.e, y = m.b * p.x + m.d * p.y + m.f;
          const dx = Math.max(box.l - x, 0, x - box.r), dy = Math.max(box.t - y, 0, y - box.b);
          best = Math.min(best, Math.hypot(dx, dy));
        }
      }
      const links = [...node.querySelectorAll('a')].map(a => ({
        href: a.getAttribute('href') || a.getAttribute('xlink:href') || '',
        fill: (a.querySelector('text') || {getAttribute: () => ''}).getAttribute('fill')}))
        .filter(a => a.href);
      out.push({id: node.id, distance: best, strokes, links,
                width: box.r - box.l, height: box.b - box.t});
    }
  }
  return out;
})()
"""

ROWS = r"""
[...document.querySelectorAll('#rows-table tbody tr')].map(tr => ({
  anchor: tr.id, row: tr.dataset.row, status: tr.dataset.status,
  state: [...tr.querySelectorAll('td:nth-of-type(1) a')].map(a => a.getAttribute('href'))}))
"""


def colour_status() -> dict[str, str]:
    return {colour.lower(): status for status, (colour, *_) in STATUS_STYLE.items()}


def edge_status(statuses: set[str]) -> str:
    """An edge's colour from its rows' statuses (docs/diagrams.md "The coverage audit")."""
    if statuses == {"covered"}:
        return "covered"
    return "not covered" if statuses == {"not covered"} else "partly covered"


def check_diagram(browser: DevTools, status_of: dict[str, str], page: str) -> int:
    """Every label within 40 px of its edge, and every edge in its rows' colour; the labels seen."""
    labels = browser.js(MEASURE)
    assert labels, f"{page}: no labelled edge in the diagram"
    colours = colour_status()
    for label in labels:
        assert label["width"] > 0 and label["height"] > 0, (page, label["id"])
        assert label["distance"] <= 40, (page, label["id"], label["distance"])
        rows = [link["href"].rsplit("#", 1)[1] for link in label["links"] if "#" in link["href"]]
        assert rows, (page, label["id"], "a label without links to its rows")
        want = edge_status({status_of[a] for a in rows})
        assert {colours[s.lower()] for s in label["strokes"]} == {want}, (page, label["id"])
        for link in label["links"]:  # each row of the label in its own row's colour
            anchor = link["href"].rsplit("#", 1)[1]
            assert colours[link["fill"].lower()] == status_of[anchor], (page, label["id"], anchor)
    return len(labels)


def test_the_report_renders_links_and_agrees_with_itself_in_chromium(browser, sample_report,
                                                                      tmp_path):
    """Opened in Chromium at 1280 × 800: a screenshot that is not blank, one table line per
    declared row, a row's state link leading to its state page, the diagram's colours agreeing
    with the table, each edge label within 40 px of its edge (measured in the DOM), keyboard
    navigation, nothing fetched but the report's own files (docs/diagrams.md "The report")."""
    out = tmp_path / "html"
    R.write(out, sample_report)
    index = (out / "index.html").as_uri()
    browser.open(index)
    font = subprocess.run(["fc-match", "-f", "%{family}", "DejaVu Sans"], capture_output=True,
                          text=True, timeout=HANG).stdout
    assert "DejaVu Sans" in font, f"fonts-dejavu-core is missing ('make setup'): {font}"

    # the screenshot: many colours, not one blank page
    shot = base64.b64decode(browser.call("Page.captureScreenshot", format="png")["data"])
    width, height, rows = png_pixels(shot)
    assert (width, height) == (WIDTH, HEIGHT)
    inked = sum(sum(1 for v in row[:width] if v < 200) for row in rows)  # red channel dark
    assert inked > width * height // 200, inked
    # readable at 1280 × 800: no sideways scrolling of the page
    assert browser.js("document.documentElement.scrollWidth") <= WIDTH

    table = browser.js(ROWS)
    assert len(table) == len(L.declaration()["rows"])
    status_of = {r["anchor"]: r["status"] for r in table}
    assert set(status_of.values()) == {"covered", "partly covered", "not covered"}
    edges = review_edges([DrawnRow(r) for r in extract().rows])
    assert check_diagram(browser, status_of, "index.html") == len(edges)

    # keyboard: the first Tab reaches the skip link, Enter jumps to the table
    for kind in ("keyDown", "keyUp"):
        browser.call("Input.dispatchKeyEvent", type=kind, key="Tab", code="Tab",
                     windowsVirtualKeyCode=9)
    assert browser.js("document.activeElement.className") == "skip"
    for kind in ("keyDown", "char", "keyUp"):
        browser.call("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter",
                     windowsVirtualKeyCode=13, text="\r")
    assert browser.js("location.hash") == "#rows-table"

    # a row's state link leads to that state's page, whose table links back to the row
    row = next(r for r in table if r["state"])
    state = row["state"][0].split("/")[-1].removesuffix(".html")
    browser.js(f"document.querySelector('#{row['anchor']} td a').click()")
    browser.wait_for("Page.loadEventFired")
    assert browser.js("location.pathname").endswith(f"/states/{state}.html")
    assert browser.js("document.querySelector('h1').textContent") == f"State {state}"
    links = browser.js("[...document.querySelectorAll('#state-rows a')].map(a => a.href)")
    assert f"{index}#{row['anchor']}" in links
    check_diagram(browser, status_of, f"states/{state}.html")
    for other in L.STATES:
        browser.open((out / "states" / f"{other}.html").as_uri())
        check_diagram(browser, status_of, f"states/{other}.html")

    fetched = {e["params"]["request"]["url"].split(":", 1)[0] for e in browser.events
               if e.get("method") == "Network.requestWillBeSent"}
    assert fetched <= {"file", "data"}, fetched
