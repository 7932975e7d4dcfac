"""report/index.html in a real browser: headless Chromium (Debian's `chromium`) loads each
example's page; the page logs no console error, every section renders with a non-empty
drawing, and no two labels of a drawing overlap as Chromium lays them out. A full-page
screenshot of each goes to $RACKC_REPORT_SCREENSHOTS when it is set (docs/report-screenshots/
keeps five, reduced to 128 colours, for review).

Skipped, with that reason, where no chromium is installed (`apt-get install chromium`)."""

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from targets._report_html import SECTIONS
from targets.report import emit
from tests.targets.fixtures import EXAMPLE_CASES, FLEET_EXAMPLES, compiled_plan

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH "
                                "(Debian: apt-get install chromium)")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--disable-default-apps", "--hide-scrollbars", "--mute-audio")
WIDTH = 1280

# Run in the page once it has loaded: errors seen, each section's size and drawings, and the
# pairs of overlapping labels per drawing (as Chromium lays the text out).
CHECK = """<script>
(function () {
  var out = {errors: window.__errors, sections: {}, overlaps: [], height: 0};
  SECTIONS.forEach(function (id) {
    var s = document.getElementById(id);
    if (!s) { out.sections[id] = null; return; }
    var r = s.getBoundingClientRect();
    var svgs = Array.prototype.map.call(s.querySelectorAll("svg"), function (g) {
      var b = g.getBoundingClientRect();
      return [b.width, b.height, g.querySelectorAll("rect,circle,polyline").length];
    });
    out.sections[id] = {height: r.height, svgs: svgs};
  });
  Array.prototype.forEach.call(document.querySelectorAll("svg"), function (g, k) {
    var boxes = Array.prototype.map.call(g.querySelectorAll("text"), function (t) {
      return [t.textContent, t.getBoundingClientRect()];
    });
    for (var a = 0; a < boxes.length; a++) for (var b = a + 1; b < boxes.length; b++) {
      var p = boxes[a][1], q = boxes[b][1];
      if (p.left < q.right - 0.5 && q.left < p.right - 0.5 &&
          p.top < q.bottom - 0.5 && q.top < p.bottom - 0.5)
        out.overlaps.push([k, boxes[a][0], boxes[b][0]]);
    }
  });
  out.height = Math.ceil(document.documentElement.scrollHeight);
  var pre = document.createElement("pre");
  pre.id = "rackc-check";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"""
CATCH = ("<script>window.__errors=[];window.addEventListener('error',function(e){"
         "window.__errors.push(String(e.message))});</script>")


def _chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp / 'profile'}", *args],
                          capture_output=True, text=True, timeout=120, check=False)


def _console_errors(stderr: str) -> list[str]:
    """Console messages of level error that Chromium logs with --enable-logging=stderr."""
    return [ln for ln in stderr.splitlines()
            if "CONSOLE" in ln and ("ERROR" in ln.split("CONSOLE")[0] or "Uncaught" in ln)]


@pytest.mark.parametrize("case", sorted([*EXAMPLE_CASES, *FLEET_EXAMPLES]))
def test_the_report_renders_in_chromium(case: str, tmp_path: Path):
    page = emit(compiled_plan(case))["report/index.html"]
    checked = page.replace("<head>", "<head>" + CATCH, 1).replace(
        "</body>", CHECK.replace("SECTIONS", json.dumps(list(SECTIONS))) + "</body>", 1)
    (tmp_path / "check.html").write_text(checked)
    run = _chromium(tmp_path, "--enable-logging=stderr", "--v=0",
                    f"--window-size={WIDTH},900", "--dump-dom",
                    (tmp_path / "check.html").as_uri())
    assert run.returncode == 0, run.stderr[-2000:]
    found = re.search(r'<pre id="rackc-check">(.*?)</pre>', run.stdout, re.S)
    assert found, run.stdout[-2000:]
    result = json.loads(html.unescape(found[1]))
    assert result["errors"] == [] and _console_errors(run.stderr) == []
    for key in SECTIONS:
        section = result["sections"][key]
        assert section is not None and section["height"] > 40, (key, section)
    for key in ("rack", "memory", "curve"):
        svgs = result["sections"][key]["svgs"]
        assert svgs and all(w > 100 and h > 20 and shapes >= 2 for w, h, shapes in svgs), \
            (key, svgs)
    assert result["overlaps"] == []
    shots = os.environ.get("RACKC_REPORT_SCREENSHOTS")
    if shots:
        (tmp_path / "index.html").write_text(page)
        target = Path(shots).resolve() / f"{case}.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        shot = _chromium(tmp_path, f"--window-size={WIDTH},{result['height']}",
                         f"--screenshot={target}", (tmp_path / "index.html").as_uri())
        assert shot.returncode == 0 and target.read_bytes()[:4] == b"\x89PNG", shot.stderr
