"""Open the HTML report and the published asv site in headless Chromium; fail on console errors and on
charts that did not render.

How the browser is driven: Chromium's DevTools protocol over ``--remote-debugging-pipe`` (JSON messages
separated by NUL bytes on file descriptors 3 and 4). That needs no websocket library and no debugging
port, and it reports console messages with their level (``Runtime.consoleAPICalled``), uncaught
exceptions (``Runtime.exceptionThrown``) and browser-side errors such as failed loads
(``Log.entryAdded``), which ``--enable-logging=stderr`` prints without a level. ``Runtime.evaluate``
then measures every chart in the rendered page.

Everything stays on loopback: pages come from file:// or a ``python -m http.server`` bound to
127.0.0.1, and every other request is sent to a proxy address where nothing listens, so a page that
tries to fetch from the internet fails here with a logged error instead of leaving the machine.
"""

from __future__ import annotations

import fcntl
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pytest_hpcnet.cli import main
from pytest_hpcnet.measure import measurement
from pytest_hpcnet.report import asv_site
from pytest_hpcnet.report.html import write_html
from pytest_hpcnet.results import RunRecord

CHROMIUM_NAMES = ("chromium", "chromium-browser")
FLAGS = ["--headless", "--disable-gpu", "--disable-quic", "--no-first-run", "--no-default-browser-check",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--mute-audio", "--remote-debugging-pipe",
         # no request leaves loopback: a proxy nobody listens on for everything that is not loopback
         "--proxy-server=127.0.0.1:9", "--window-size=1280,1600"]


def chromium_path() -> str:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("headless browser check needs Chromium: /usr/bin/chromium not found "
                "(Debian: apt-get install chromium)")


class Browser:
    """One headless Chromium; ``open(url)`` gives a page's errors and lets you evaluate JavaScript."""

    def __init__(self, executable: str, profile: Path):
        cmd_r, self._cmd_w = os.pipe()
        self._res_r, res_w = os.pipe()

        def wire_pipes():   # in the child: commands on fd 3, responses on fd 4
            a, b = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10), fcntl.fcntl(res_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        argv = [executable, *FLAGS, f"--user-data-dir={profile}"]
        if os.geteuid() == 0:
            argv.append("--no-sandbox")   # Chromium refuses to run as root with its sandbox on
        self.proc = subprocess.Popen(argv, preexec_fn=wire_pipes, close_fds=False, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        os.close(cmd_r)
        os.close(res_w)
        self._ids = iter(range(1, 1 << 30))
        self._messages: queue.Queue = queue.Queue()
        self.events: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()   # drain: never block on it

    def _read(self):
        buf = b""
        with os.fdopen(self._res_r, "rb", buffering=0) as f:
            while chunk := f.read(65536):
                buf += chunk
                *messages, buf = buf.split(b"\0")
                for m in messages:
                    self._messages.put(json.loads(m))
        self._messages.put(None)

    def call(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 30):
        msg_id = next(self._ids)
        msg = {"id": msg_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._next(deadline, f"reply to {method}")
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def _next(self, deadline: float, what: str) -> dict:
        try:
            message = self._messages.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError(f"Chromium sent no {what} in time") from None
        if message is None:
            raise RuntimeError(f"Chromium exited ({self.proc.poll()}) while waiting for {what}")
        return message

    def wait_event(self, method: str, session: str, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        for event in self.events:
            if event.get("method") == method and event.get("sessionId") == session:
                return event
        while True:
            event = self._next(deadline, method)
            self.events.append(event)
            if event.get("method") == method and event.get("sessionId") == session:
                return event

    def open(self, url: str) -> "Page":
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            self.call(f"{domain}.enable", session=session)
        self.call("Page.navigate", {"url": url}, session)
        self.wait_event("Page.loadEventFired", session)
        return Page(self, session)

    def close(self):
        try:
            if self.proc.poll() is None:
                self.call("Browser.close", timeout=10)
                self.proc.wait(10)
        except Exception:
            pass
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
            os.close(self._cmd_w)


class Page:
    def __init__(self, browser: Browser, session: str):
        self.browser, self.session = browser, session

    def evaluate(self, expression: str):
        result = self.browser.call("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                                   self.session)
        if "exceptionDetails" in result:
            raise RuntimeError(f"evaluating {expression[:80]!r}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 20):
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value or time.monotonic() > deadline:
                return value
            time.sleep(0.2)

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and browser-logged errors (failed loads) of this page."""
        out = []
        for event in self.browser.events:
            if event.get("sessionId") != self.session:
                continue
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                out.append("console.error: " + " ".join(str(a.get("value", a.get("description", "")))
                                                         for a in params.get("args", [])))
            elif method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                out.append("exception: " + str(details.get("exception", {}).get("description") or details.get("text")))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                entry = params["entry"]
                out.append(f"{entry.get('source')}: {entry.get('text')} {entry.get('url', '')}".strip())
        return out


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    b = Browser(chromium_path(), tmp_path_factory.mktemp("chromium-profile"))
    try:
        yield b
    finally:
        b.close()


# --- the HTML report --------------------------------------------------------------------------------

MEASURE_CHARTS = """
[...document.querySelectorAll('figure.chart')].map(fig => {
  const svg = fig.querySelector('svg');
  if (!svg) return {kind: fig.dataset.kind, svg: false};
  const box = svg.getBoundingClientRect(), drawn = svg.getBBox();
  return {kind: fig.dataset.kind, svg: true, width: box.width, height: box.height,
          drawn_width: drawn.width, drawn_height: drawn.height,
          paths: svg.querySelectorAll('path').length};
})
"""


def chart_problems(charts: list[dict]) -> list[str]:
    """Why each chart did not render (no SVG, no size on the page, nothing drawn); empty when all did."""
    problems = []
    for i, c in enumerate(charts):
        if not c.get("svg"):
            problems.append(f"chart {i} ({c.get('kind')}): no <svg>")
        elif c["width"] < 100 or c["height"] < 100:
            problems.append(f"chart {i} ({c['kind']}): {c['width']:.0f}x{c['height']:.0f} px on the page")
        elif c["drawn_width"] < 50 or c["drawn_height"] < 50 or c["paths"] < 5:
            problems.append(f"chart {i} ({c['kind']}): nothing drawn ({c['paths']} paths)")
    return problems


# What issue 19 asked of the page, measured on the rendered page: the contents' links all land, claims
# read FAIL, WARN, PASS, then the unjudged; no chart draws more than 8 series or has more than 8 legend
# entries; legends sit outside the plotting area; no table is wider than the page.
MEASURE_LAYOUT = """
(() => {
  const nav = document.querySelector('nav#contents');
  const links = nav ? [...nav.querySelectorAll('a[href^="#"]')].map(a => a.getAttribute('href').slice(1)) : [];
  const overlaps = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  const charts = [...document.querySelectorAll('figure.chart svg')].map(svg => {
    const series = new Set([...svg.querySelectorAll('[id*="-series"]')].map(e => e.id.match(/-series(\\d+)-/)[1]));
    const legend = svg.querySelector('g[id$="-legend_1"]');
    const plot = svg.querySelector('g[id$="-axes_1"] > g[id*="-patch_"]');
    return {series: series.size,
            legend_entries: legend ? legend.querySelectorAll('g[id*="-text_"]').length : 0,
            legend_over_data: !!(legend && plot && overlaps(legend.getBoundingClientRect(), plot.getBoundingClientRect()))};
  });
  const tables = [...document.querySelectorAll('table')].filter(t => t.offsetParent !== null);
  return {
    toc: !!nav, toc_top: nav ? nav.getBoundingClientRect().top : null,
    claims_top: document.getElementById('claims').getBoundingClientRect().top,
    links: links.length, dangling: links.filter(id => !document.getElementById(id)),
    outcomes: [...document.querySelectorAll('[data-outcome]')].map(e => e.dataset.outcome),
    charts: charts,
    wide_tables: tables.filter(t => t.getBoundingClientRect().right > document.body.getBoundingClientRect().right + 1).length,
    page_overflow: document.documentElement.scrollWidth > window.innerWidth,
  };
})()
"""
READING_ORDER = ["fail", "warn", "pass", "not evaluated", "n/a"]


def _record() -> RunRecord:
    """Twelve RPC configurations over three payload sizes (more series than a chart may hold), a DFSIO
    metric, and a verdict of every kind, listed in the wrong order."""
    ms = []
    for t, transport in enumerate(("tcp", "shm", "verbs")):
        for b, buffers in enumerate(("naive", "pooled", "zero", "huge")):
            for size in (64, 4096, 1048576):
                base = 30.0 * (1 + t) * (1 + 0.1 * b) * (1 + size / 8192)
                ms.append(measurement("rpc.echo.latency", [base * (1 + 0.01 * (i % 17)) for i in range(100)],
                                      unit="us", direction="lower", config=f"transport={transport},buffers={buffers}",
                                      params={"size": size}))
    ms.append(measurement("dfsio.write.throughput", [100.0, 110.0, 95.0], unit="MB/s", direction="higher",
                          config="tcp"))
    def verdict(claim_id, outcome, **kw):
        return {"claim_id": claim_id, "outcome": outcome, "bound": "<= 0.8", "source": "local: test",
                "reason": f"{outcome} because", "kind": "ratio", "metric": "rpc.echo.latency",
                "statement": f"{claim_id} holds", **kw}
    measured = {"quantity": 0.4, "ci": [0.38, 0.45], "confidence": 0.95, "n": 30}
    verdicts = [verdict("a.pass", "pass", **measured), verdict("b.na", "n/a"), verdict("c.fail", "fail", **measured),
                verdict("d.not_evaluated", "not evaluated"), verdict("e.warn", "warn", **measured),
                verdict("f.pass", "pass", **measured)]
    return RunRecord(run_id="browser-check", provenance={"host": "ci"}, measurements=ms, verdicts=verdicts)


def test_html_report_renders_every_chart_without_errors(browser, tmp_path):
    """A recorded run, through `hpcnet report RUN.json -o DIR`, opened from disk."""
    record_path = _record().write(tmp_path / "runs")
    assert main(["report", str(record_path), "-o", str(tmp_path / "html"), "-q"]) == 0
    path = tmp_path / "html" / "browser-check.html"
    page = browser.open(path.as_uri())
    charts = page.evaluate(MEASURE_CHARTS)
    # dfsio: one bar chart; rpc: 12 configurations as two bar charts of 6, and a CDF per size (2 x 6 each)
    assert [c["kind"] for c in charts] == ["bar", "bar", "bar"] + ["cdf"] * 6
    assert chart_problems(charts) == []
    assert page.errors() == []
    assert page.evaluate("document.querySelectorAll('tr.pass').length") == 2


def test_html_report_reads_top_down(browser, tmp_path):
    """Issue 19's acceptance: contents at the top, FAIL and WARN first, no chart over 8 series."""
    page = browser.open(write_html(_record(), tmp_path).as_uri())
    layout = page.evaluate(MEASURE_LAYOUT)
    assert layout["toc"] and layout["toc_top"] < layout["claims_top"]
    assert layout["links"] >= 5 and layout["dangling"] == []
    ranks = [READING_ORDER.index(o) for o in layout["outcomes"]]
    assert layout["outcomes"][:2] == ["fail", "warn"] and ranks == sorted(ranks), layout["outcomes"]
    assert len(layout["outcomes"]) == 6
    assert layout["charts"] and max(c["series"] for c in layout["charts"]) <= 8, layout["charts"]
    assert all(1 <= c["legend_entries"] <= 8 for c in layout["charts"]), layout["charts"]
    assert not any(c["legend_over_data"] for c in layout["charts"]), layout["charts"]
    assert layout["wide_tables"] == 0 and not layout["page_overflow"]
    assert page.errors() == []


def test_the_layout_check_sees_a_crowded_chart_and_a_misordered_page(browser, tmp_path):
    """The checks above must fail on what they exist to catch: a chart of 12 series with its legend over
    the data (drawn by matplotlib directly, past the report's splitting), and a PASS listed before a FAIL."""
    from pytest_hpcnet.report import plots
    text = write_html(_record(), tmp_path).read_text()
    bars = [plots.Bar(group="g", series=f"s{i}", median=1.0 + i) for i in range(12)]
    saved = plots.MAX_SERIES, plots._legend_outside
    plots.MAX_SERIES = 99
    plots._legend_outside = lambda ax, fontsize: ax.legend(fontsize=fontsize, loc="center")
    try:
        crowded = plots.bar_chart(bars, title="crowded", ylabel="x")
    finally:
        plots.MAX_SERIES, plots._legend_outside = saved
    text = text.replace("<figure ", f'<figure class="chart" data-kind="bar">{crowded}</figure><figure ', 1)
    fail_row = text.index('<tr class="fail"')
    pass_row = text.index('<tr class="pass"')
    end = text.index("</tr>", pass_row) + 5
    text = text[:fail_row] + text[pass_row:end] + text[fail_row:pass_row] + text[end:]
    path = tmp_path / "crowded.html"
    path.write_text(text)
    layout = browser.open(path.as_uri()).evaluate(MEASURE_LAYOUT)
    assert max(c["series"] for c in layout["charts"]) == 12
    assert any(c["legend_over_data"] for c in layout["charts"])
    assert layout["outcomes"][0] == "pass"


def test_the_check_catches_broken_charts_and_script_errors(browser, tmp_path):
    """The two failure modes the checks exist for, made on purpose, must be seen."""
    text = write_html(_record(), tmp_path).read_text()
    first = text.index("<svg")
    broken = text[:first] + '<svg xmlns="http://www.w3.org/2000/svg" width="0" height="0"></svg><!--' \
        + text[first:text.index("</svg>", first)] + "-->" + text[text.index("</svg>", first) + 6:]
    broken = broken.replace("</body>", "<script>console.error('made to fail'); missingFunction();</script></body>")
    page_path = tmp_path / "broken.html"
    page_path.write_text(broken)
    page = browser.open(page_path.as_uri())
    problems = chart_problems(page.evaluate(MEASURE_CHARTS))
    assert len(problems) == 1 and "chart 0" in problems[0]
    errors = page.errors()
    assert any("made to fail" in e for e in errors) and any("missingFunction" in e for e in errors)


# --- the published asv site -------------------------------------------------------------------------

@pytest.fixture
def asv_site_server(tmp_path):
    """The project's asv site (fresh clone, two quick claim benchmarks run, published, libraries made
    local) served from 127.0.0.1; yields (base URL, discovered benchmark names)."""
    assets = asv_site.default_assets_dir()
    if asv_site.missing_assets(assets):
        pytest.skip(f"the asv site's JavaScript libraries are not in {assets}; "
                    "run `hpcnet asv-site fetch` once (needs npm and the npm registry)")
    sys.path.insert(0, str(Path(__file__).parent))
    try:
        from test_asv import publish_site
    finally:
        sys.path.pop(0)
    clone, html, _ = publish_site(tmp_path, bench=r"^bench_claims\.track_rpc_")
    names = set(json.loads((clone / ".asv" / "results" / "benchmarks.json").read_text())) - {"version"}
    ran = set()
    for path in (clone / ".asv" / "results").glob("*/*.json"):
        if path.name != "machine.json":
            ran |= set(json.loads(path.read_text())["results"])
    server = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "--bind", "127.0.0.1", "0"],
                              cwd=html, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              stdin=subprocess.DEVNULL)
    try:
        line = server.stdout.readline()
        port = re.search(r"port (\d+)", line)
        assert port, f"http.server printed {line!r}"
        yield f"http://127.0.0.1:{port.group(1)}/", names, ran
    finally:
        server.kill()
        server.wait()


def _no_results_yet(error: str, not_run: set[str]) -> bool:
    """The grid asks for a summary graph of every listed benchmark; one this quick run did not run has no
    graph file yet, and the server answers 404. That, and only that, is expected."""
    m = re.search(r"status of 404 .* https?://127\.0\.0\.1:\d+/graphs/summary/([^?]+)\.json", error)
    return bool(m) and m.group(1) in not_run


def test_published_asv_site_lists_the_benchmarks_without_errors(browser, asv_site_server):
    base, names, ran = asv_site_server
    page = browser.open(base + "index.html")
    shown = page.wait_for("document.querySelectorAll('.benchmark-container').length")
    assert shown, "the benchmark grid never appeared"
    html = page.evaluate("document.body.innerHTML")
    missing = sorted(n for n in names if n.rsplit(".", 1)[-1] not in html)
    assert not missing, f"benchmarks not listed on the site: {missing}"
    assert page.evaluate("document.querySelectorAll('.modal.in, .alert-danger:not(.modal-title)').length") == 0
    assert [e for e in page.errors() if not _no_results_yet(e, names - ran)] == []

    # one tracked claim's own page draws its graph (flot draws into <canvas>)
    name = "bench_claims.track_rpc_local_tcp_vs_socket_floor__ratio_lower_is_better"
    graph = browser.open(f"{base}index.html#{name}")
    drawn = graph.wait_for("[...document.querySelectorAll('#graph-display canvas')].filter(c => c.width > 100 && c.height > 100).length")
    assert drawn, "no graph canvas on the benchmark's page"
    assert graph.errors() == []


# --- run records imported into asv (hpcnet asv-import) ---------------------------------------------

@pytest.fixture
def imported_site(tmp_path, nightly_records):
    """``make_site(records)``: an asv project of those run records (hpcnet asv-import), published with
    asv's own ``asv publish``, libraries made local, served from 127.0.0.1; returns the base URL."""
    assets = asv_site.default_assets_dir()
    if asv_site.missing_assets(assets):
        pytest.skip(f"the asv site's JavaScript libraries are not in {assets}; "
                    "run `hpcnet asv-site fetch` once (needs npm and the npm registry)")
    from pytest_hpcnet import asv_import
    if asv_import.asv_executable() is None:
        pytest.skip("asv is not installed (pip install 'asv>=0.6.6,<0.7')")
    servers = []

    def make_site(records, name):
        store = tmp_path / name
        assert main(["asv-import", *map(str, records), "--into", str(store), "--publish"]) == 0
        server = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "--bind", "127.0.0.1", "0"],
                                  cwd=store / "html", stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                  stdin=subprocess.DEVNULL)
        servers.append(server)
        port = re.search(r"port (\d+)", server.stdout.readline())
        assert port
        return f"http://127.0.0.1:{port.group(1)}/"

    try:
        yield make_site
    finally:
        for server in servers:
            server.kill()
            server.wait()


# each drawn series of the benchmark's main graph: its legend label and its points (flot keeps the plot
# object on the placeholder; a point is [x, y], y null where that commit has no result)
GRAPH_SERIES = """
(() => { const plot = $('#main-graph').data('plot');
  if (!plot) return null;
  return plot.getData().map(s => ({label: s.label || '', points: s.data.filter(p => p[1] !== null).length})); })()
"""
ACTIVE_MACHINES = "[...document.querySelectorAll('.btn.active')].map(b => b.textContent.trim())"


def test_asv_site_shows_three_nights_of_a_seed_claim_on_its_cluster(browser, imported_site, nightly_records):
    """Three nights, three stack versions, one project commit: three points on the cluster's line."""
    claim_bench = f"claims.{nightly_records['claim']}"
    base = imported_site([*nightly_records["three"], nightly_records["elsewhere"]], "three")
    page = browser.open(f"{base}index.html#{claim_bench}?machine={nightly_records['cluster']}")
    series = page.wait_for(GRAPH_SERIES)
    assert series, "the claim's graph was not drawn"
    assert [s["points"] for s in series] == [3], series            # this machine's line only: three runs
    assert nightly_records["cluster"] in page.evaluate(ACTIVE_MACHINES)
    assert "other-cluster" not in page.evaluate(ACTIVE_MACHINES)
    drawn = page.evaluate("[...document.querySelectorAll('#graph-display canvas')].filter(c => c.width > 100).length")
    assert drawn
    labels = page.evaluate("document.querySelector('#main-graph').innerText")   # the tags asv draws
    assert all(f"reference-{night.version}@" in labels for night in nightly_records["nights"][:3]), labels
    assert page.errors() == []


def test_asv_regressions_page_flags_the_worse_night(browser, imported_site, nightly_records):
    claim_bench = f"claims.{nightly_records['claim']}"
    base = imported_site([*nightly_records["three"], nightly_records["worse"], nightly_records["elsewhere"]], "four")
    page = browser.open(f"{base}index.html#regressions")
    rows = page.wait_for("[...document.querySelectorAll('#regressions-display tbody tr')]"
                         ".map(r => ({text: r.innerText, links: [...r.querySelectorAll('a')].map(a => a.href)}))")
    assert rows and len(rows) == 1, rows            # the claim on its cluster, nothing else
    [row] = rows
    assert row["text"].startswith(claim_bench) and "2026-11-29" in row["text"] and "1.33x" in row["text"], row
    assert any(f"machine={nightly_records['cluster']}" in link for link in row["links"]), row
    assert page.errors() == []


def test_history_page_draws_a_claims_series(browser, nightly_records, tmp_path):
    """`hpcnet history CLAIM_ID --html`: the series chart renders, one row per night."""
    runs = tmp_path / "runs"
    runs.mkdir()
    for p in [*nightly_records["three"], nightly_records["worse"]]:
        (runs / p.name).write_bytes(p.read_bytes())
    page_path = tmp_path / "series.html"
    assert main(["history", nightly_records["claim"], "--dir", str(runs), "--html", str(page_path)]) == 0
    page = browser.open(page_path.as_uri())
    charts = page.evaluate(MEASURE_CHARTS)
    assert [c["kind"] for c in charts] == ["series"] and chart_problems(charts) == []
    assert page.evaluate("document.querySelectorAll('tr.pass').length") == 3
    assert page.evaluate("document.querySelectorAll('tr.fail').length") == 1
    assert page.errors() == []
