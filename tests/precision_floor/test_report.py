"""The HTML report: every section, no external resource, a pure function of the store, the bug-zoo
table when a zoo summary is present, the CLI, and (slow) a clean render in headless Chromium."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from precision_floor.cache import EvalStore
from precision_floor.errors import StoreError
from precision_floor.report.__main__ import main as report_main
from precision_floor.report.build import SECTIONS, render_report

EXTERNAL = re.compile(r"https?:|//cdn|<script|<link|<img|<iframe|src\s*=|@import|url\(", re.IGNORECASE)
VOID = {"meta", "br", "hr", "img", "input", "link", "col", "area", "base", "embed", "source", "track", "wbr"}


class TagBalance(HTMLParser):
    """Fails on an end tag that does not close the innermost open element (SVG included)."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        pass

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1] if self.stack else 'nothing'}")
        else:
            self.stack.pop()


@pytest.fixture(scope="module")
def html(study_dir) -> str:
    return render_report(EvalStore(study_dir))


def test_every_section_is_present_and_well_formed(html) -> None:
    for sid, title in SECTIONS:
        assert f'<section id="{sid}">' in html and f'<a href="#{sid}">' in html
    p = TagBalance()
    p.feed(html)
    assert p.errors == [] and p.stack == []
    assert html.count("<svg") >= 3               # Pareto, cosine curves, flip bars


def test_no_external_url_or_script(html) -> None:
    assert EXTERNAL.findall(html) == []
    assert len(html.encode()) < 1_000_000


def test_report_says_what_it_measured(html, study_dir) -> None:
    search = json.loads((study_dir / "search.json").read_text())
    assert "<code>lm_head</code>" in html                                   # the floor set
    assert search["context"]["checkpoint_fingerprint"] in html              # provenance
    from precision_floor.provenance import backends

    compiled_only = [b for b in backends("cpu") if not b["executes_here"] and "compiled" in b["note"]]
    assert ("no — compiled, not executed" in html) == bool(compiled_only)  # CuTe DSL backends on CPU
    assert "bug_budget</b>: absent — no kernel backend executes on cpu" in html
    assert "No bug-zoo summary" not in html and "Absent: no bug-zoo summary or records" in html
    assert "Absent: run <code>python -m precision_floor.attribution" in html


def test_rendering_is_a_function_of_the_store(study_dir, tmp_path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(study_dir, copy)
    a = render_report(EvalStore(study_dir))
    b = render_report(EvalStore(copy))
    strip = re.compile(r"<code>[^<]*(study|copy)[^<]*</code>|generated</th><td>[^<]*</td>")
    assert strip.sub("", a) == strip.sub("", b)
    # Deleting one evaluation the search visited makes the replay fail loudly, not render stale numbers.
    victim = next(p for p in (copy / "evals").glob("*.json") if json.loads(p.read_text())["plan_name"] == "all-fp4")
    victim.unlink()
    assert "not replayable" in render_report(EvalStore(copy))


def test_bugzoo_table_from_a_summary(study_dir, tmp_path) -> None:
    zoo = {"schema": "parity.bugzoo/1", "passed": False, "wall_seconds": 12.5,
           "checkpoint": {"spec": "tiny", "fingerprint": "abc"}, "plan": {"name": "default"}, "prompts": [{}],
           "prompt_set": "dsv4/data/prompts_holdout.toml", "rules": {"count": 200},
           "rows": [{"fault": None, "expected": None, "columns_alarmed": [], "caught": False, "column_ok": True,
                     "localized": None, "first_divergence": None, "passed": True, "seconds": 1.0},
                    {"fault": "attention_sink_dropped", "expected": {"column": "logic", "layer": 0,
                                                                      "component": "attention"},
                     "columns_alarmed": ["logic"], "caught": True, "column_ok": True, "localized": False,
                     "first_divergence": {"probe": "layers.0.attn.core", "component": "attention",
                                          "metric": "cosine", "value": 0.5, "op": ">=", "threshold": 0.99},
                     "passed": False, "seconds": 2.0}]}
    path = tmp_path / "zoo.json"
    path.write_text(json.dumps(zoo))
    html = render_report(EvalStore(study_dir), zoo_summary=path)
    body = html[html.index('<section id="bugzoo">'):html.index('<section id="attribution">')]
    assert "attention_sink_dropped" in body and "(clean)" in body and "layers.0.attn.core" in body
    assert body.count('class="fail"') == 1      # the failing fault row


def test_cli_renders_a_store_and_rejects_a_file(study_dir, tmp_path) -> None:
    out = tmp_path / "r.html"
    assert report_main(["--out", str(out), "--records", str(study_dir), "--zoo-summary",
                        str(tmp_path / "none.json")]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    assert report_main(["--out", str(out), "--records", str(not_a_dir)]) == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(StoreError):
        render_report(EvalStore(empty))


def test_report_runs_only_the_missing_studies_with_this_runs_choices(study_dir, tmp_path, monkeypatch) -> None:
    """A store with flips and search but no zoo: only the zoo's own command runs, with the report's
    checkpoint choices and the store's file names; every section names its regenerate command."""
    import shutil as sh

    import parity.bugzoo.__main__ as zoo_cli
    import precision_floor.flips as flips_cli
    import precision_floor.search as search_cli
    from precision_floor.report.studies import STUDIES, ZOO_SUMMARY

    store = tmp_path / "store"
    sh.copytree(study_dir, store)
    calls = []

    def fake_zoo(argv):
        calls.append(("bugzoo", list(argv)))
        return 2 if "--fail" in argv else 0      # writes nothing: the study "could not run"

    monkeypatch.setattr(zoo_cli, "main", fake_zoo)
    monkeypatch.setattr(flips_cli, "main", lambda argv: pytest.fail("flips is in the store: must not run"))
    monkeypatch.setattr(search_cli, "main", lambda argv: pytest.fail("search is in the store: must not run"))
    out = tmp_path / "r.html"
    rc = report_main(["--out", str(out), "--records", str(store), "--seed", "0", "--threads", "1"])
    assert rc == 3                                # the zoo left no summary: reported, the rest rendered
    assert [c[0] for c in calls] == ["bugzoo"]
    argv = calls[0][1]
    assert argv[argv.index("--json") + 1] == str(store / ZOO_SUMMARY) and argv[argv.index("--threads") + 1] == "1"
    body = out.read_text()
    for _, (_, cmd) in STUDIES.items():
        assert cmd in body.replace("&quot;", '"')


def test_report_estimates_from_the_store(study_dir) -> None:
    from precision_floor.report.__main__ import estimate

    text = estimate(EvalStore(study_dir), "flips", 10)
    assert text.startswith("up to 22 evaluations, ~") and " s each" in text


CHROMIUM = next((shutil.which(n) for n in ("chromium-headless-shell", "chromium", "chromium-browser",
                                             "google-chrome") if shutil.which(n)), None)
# Measures every SVG text's rendered box (transforms included) and leaves them in the DOM for --dump-dom.
MEASURE = """<script>const out=[];document.querySelectorAll('svg').forEach((s,i)=>s.querySelectorAll('text')
.forEach(t=>{const b=t.getBoundingClientRect();out.push([i,t.getAttribute('class'),t.textContent,b.left,b.top,
b.right,b.bottom])}));document.body.setAttribute('data-boxes',JSON.stringify(out));</script>"""


def chromium(*flags: str, page) -> subprocess.CompletedProcess:
    # --enable-logging=stderr prints the page's console messages as "CONSOLE(...)" / "Uncaught" lines.
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                           "--v=0", *flags, page.as_uri()], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (apt-get install -y "
                                             "chromium-headless-shell)")
def test_renders_in_headless_chromium_without_console_errors_or_overlapping_labels(html, tmp_path) -> None:
    page = tmp_path / "report.html"
    page.write_text(html)
    shot = tmp_path / "report.png"
    r = chromium(f"--screenshot={shot}", "--window-size=1400,4000", page=page)
    assert r.returncode == 0, r.stderr[-2000:]
    console = [ln for ln in r.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln or "ERR_FILE" in ln]
    assert console == []
    assert shot.stat().st_size > 50_000          # a real page, not a blank one
    measured = tmp_path / "measured.html"
    measured.write_text(html.replace("</body>", MEASURE + "</body>"))
    dom = chromium("--window-size=1400,4000", "--dump-dom", page=measured)
    for sid, _ in SECTIONS:
        assert f'id="{sid}"' in dom.stdout
    m = re.search(r'data-boxes="([^"]*)"', dom.stdout)
    assert m, "the measuring script did not run"
    boxes = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert len(boxes) > 20 and {b[1] for b in boxes} >= {"tick", "axis", "pt-label"}
    by_svg: dict[int, list] = {}
    for b in boxes:
        by_svg.setdefault(b[0], []).append(b)
    overlaps = []
    for items in by_svg.values():
        for i, a in enumerate(items):
            for b in items[i + 1:]:
                if min(a[5], b[5]) - max(a[3], b[3]) > 0.5 and min(a[6], b[6]) - max(a[4], b[4]) > 0.5:
                    overlaps.append((a[1:3], b[1:3]))
    assert overlaps == []
