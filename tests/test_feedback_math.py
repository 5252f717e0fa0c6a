"""Feedback typesets its math offline, from the Jupyter server that shows it.

One sample submission (ada's 01_similarity, plus a markdown cell of her own with
``\\href``, ``\\class`` and ``\\cssId`` in math) is graded by the real pipeline
(``grader.unit.grade_submission``: the sandboxed autograde and nbgrader's
generate_feedback through nbgrader_config.py). Its feedback page must name no http(s)
script or stylesheet and no CDN, and its one script must be the same bytes whatever the
student wrote.

In the browser the page is opened as a student opens fetched feedback: through
``/files/`` of their own Jupyter server (``jupyter server`` from this environment, on
loopback, at JupyterHub's ``/user/<name>/`` base URL), from the folder
``<assignment>/feedback/<timestamp>/`` that ``nbgrader fetch_feedback`` writes, with
every request not to 127.0.0.1 aborted and chromium told to use no proxy. MathJax must
come from jupyter_server_mathjax on that server and typeset the notebook's formulas
(HTML-CSS output: the only one that package ships); the student's ``\\href`` must make no link; no request may leave loopback. Opened
as a plain file, with no server to load MathJax from, the page shows the LaTeX as
written. A screenshot goes to out/screenshots/feedback-math-offline.png.

Without chromium at /usr/bin/chromium the browser test fails and says how to install
it; it is never skipped.
"""
from __future__ import annotations

import shutil
import urllib.parse
import urllib.request
from html.parser import HTMLParser

import nbformat
import pytest

from grader import course
from tests import lab as browser_lab

pytestmark = [pytest.mark.browser, pytest.mark.kernel]

ASSIGNMENT = "01_similarity"
SHOT = course.ROOT / "out" / "screenshots" / "feedback-math-offline.png"
EVIL = browser_lab.EVIL_HOST
STUDENT_MATH = (f"My own notes: $\\href{{http://{EVIL}/math}}{{\\text{{click me}}}}$, "
                "$\\class{{navbar}}{{x^2}}$ and $\\cssId{{top}}{{y_1}}$.")
# Formulas of the notebook's own markdown, as typed; typeset, they are no longer text.
FORMULAS = ["QK^\\top", "\\sqrt{d_k}", "a, b \\in \\mathbb{R}^d"]
# fetch_feedback's folder name is the submission's timestamp, with spaces
TIMESTAMP = "2026-12-01 09:30:00.000000 UTC"


class _Resources(HTMLParser):
    """Every script (its src and text) and every element that names a URL to load."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.scripts: list[tuple[str | None, str]] = []
        self.loads: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "script":
            self.scripts.append((a.get("src"), ""))
            self._in_script = True
        if tag == "link" or (a.get("src") and tag != "img"):
            self.loads.append(f"<{tag}> {a.get('href') or a.get('src')}")

    def handle_data(self, data):
        if self._in_script:
            src, text = self.scripts[-1]
            self.scripts[-1] = (src, text + data)

    def handle_endtag(self, tag):
        self._in_script = self._in_script and tag != "script"


def resources_of(page: str) -> _Resources:
    parser = _Resources()
    parser.feed(page)
    parser.close()
    return parser


@pytest.fixture(scope="module")
def feedback(tmp_path_factory) -> str:
    """The feedback HTML of ada's 01_similarity with her own hostile math added."""
    from grader.unit import Settings, course_version, grade_submission

    folder = tmp_path_factory.mktemp("submission") / ASSIGNMENT
    shutil.copytree(course.SAMPLE_CLASS / "ada" / ASSIGNMENT, folder)
    path = folder / f"{ASSIGNMENT}.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(2, nbformat.v4.new_markdown_cell(STUDENT_MATH))
    nbformat.write(nb, path)
    result = grade_submission(str(folder), "ada", ASSIGNMENT, Settings(b"0" * 64, course_version=course_version()))
    assert result["status"].startswith("graded"), result["status"]
    return result["feedback"][ASSIGNMENT]


def test_feedback_loads_nothing_from_the_internet_and_its_script_is_ours(feedback):
    from tests.test_html_safety import attacked, feedback_page, graded

    assert "\\href{" in feedback and "\\sqrt{d_k}" in feedback  # the math is on the page, for MathJax
    found = resources_of(feedback)
    assert not found.loads, found.loads
    assert len(found.scripts) == 1, found.scripts
    src, text = found.scripts[0]
    assert src is None and "http://" not in text and "https://" not in text and "//cdn" not in text
    assert "static/jupyter_server_mathjax/MathJax.js" in text and 'URLs: "none"' in text
    lowered = feedback.lower()
    assert "cdnjs" not in lowered and "cdn.jsdelivr" not in lowered and "mathjax/2.7" not in lowered
    # the same bytes on a page full of attacks (tests/test_html_safety.py's): nothing a
    # student writes reaches the script, its URL or MathJax's configuration
    hostile = resources_of(feedback_page(graded(attacked(), message="<script>alert(1)</script> $\\href{x}{y}$")))
    assert hostile.scripts == found.scripts and not hostile.loads


def test_jupyter_server_mathjax_is_an_enabled_server_extension_of_this_environment():
    import subprocess
    import sys

    listed = subprocess.run([sys.executable, "-m", "jupyter", "server", "extension", "list"],
                            capture_output=True, text=True, timeout=120)
    lines = [line for line in (listed.stdout + listed.stderr).splitlines() if "jupyter_server_mathjax" in line]
    assert any("enabled" in line for line in lines), (
        "jupyter_server_mathjax is not an enabled server extension: "
        "pip install jupyter_server_mathjax==0.2.6 (pyproject.toml pins it)\n" + listed.stdout + listed.stderr)


_TYPESET = """() => !!(window.MathJax && MathJax.isReady && MathJax.Hub.queue.pending === 0
                   && !MathJax.Hub.queue.running && document.querySelector('.MathJax nobr'))"""
_MATH = """() => {
    const math = Array.from(document.querySelectorAll('span.MathJax'));
    const links = [];
    for (const box of math) {
        for (const el of box.querySelectorAll('*')) {
            for (const attr of el.attributes) {
                if (/(^|:)href$/.test(attr.name) && !attr.value.startsWith('#')) links.push(el.tagName + ' ' + attr.value);
                if (attr.name === 'class' && /navbar/.test(attr.value)) links.push('class ' + attr.value);
                if (attr.name === 'id' && attr.value === 'top') links.push('id ' + attr.value);
            }
        }
    }
    return {typeset: math.length, links: links,
            errors: document.querySelectorAll('.MathJax_Error, .merror, span.noError').length,
            fonts: Array.from(document.fonts).filter(f => f.status === 'loaded').map(f => f.family),
            failed_fonts: Array.from(document.fonts).filter(f => f.status === 'error').map(f => f.family),
            safe: !!(window.MathJax && MathJax.Extension && MathJax.Extension.Safe),
            text: document.body.innerText};
}"""


@pytest.fixture(scope="module")
def chromium_context(tmp_path_factory):
    browser_lab.require_chromium()
    with browser_lab.browser(tmp_path_factory.mktemp("chromium"), args=["--no-proxy-server"]) as context:
        yield context


def _open(context, url: str, shot=None) -> tuple[dict, list[str], list[str]]:
    """``url`` opened with every request recorded and every one not to loopback aborted:
    (what _MATH found once MathJax is idle or after 20 s without it, requests, blocked)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page = context.new_page()
    requests, blocked = [], []

    def route(r):
        if r.request.url.startswith(("http://127.0.0.1:", "file:", "data:", "about:", "blob:")):
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort()

    page.on("request", lambda r: requests.append(r.url))
    page.route("**/*", route)
    page.goto(url, wait_until="load")
    try:
        page.wait_for_function(_TYPESET, timeout=20_000)
    except PlaywrightTimeout:  # no MathJax (a plain file): what the page shows is asserted
        pass
    found = page.evaluate(_MATH)
    if shot:
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.evaluate("() => { const m = document.querySelectorAll('span.MathJax'); if (m.length > 2) m[2].scrollIntoView(); }")
        page.screenshot(path=str(shot), full_page=False)
    page.close()
    return found, requests, blocked


def test_a_student_s_fetched_feedback_typesets_its_math_offline(feedback, chromium_context, tmp_path):
    home = tmp_path / "ada"  # the student's server root, with fetch_feedback's folder in it
    folder = home / ASSIGNMENT / "feedback" / TIMESTAMP
    folder.mkdir(parents=True)
    (folder / f"{ASSIGNMENT}.html").write_text(feedback, encoding="utf-8")
    relative = urllib.parse.quote(f"{ASSIGNMENT}/feedback/{TIMESTAMP}/{ASSIGNMENT}.html")
    with browser_lab.serve_folder(home, tmp_path / "server", base_url="/user/ada/") as server:
        url = f"{server.url}/files/{relative}?token={server.token}"
        with urllib.request.urlopen(url, timeout=30) as response:
            # the page is its own unique origin, as the student's browser gets it
            assert "sandbox allow-scripts" in response.headers.get("Content-Security-Policy", "")
        found, requests, blocked = _open(chromium_context, url, SHOT)
        log = server.log_tail()
    assert not blocked, f"requests off this machine: {blocked}"
    origin = server.url.split("/user/")[0] + "/"
    assert all(u.startswith(origin) or u.startswith(("data:", "about:")) for u in requests), requests
    mathjax = f"{origin}user/ada/static/jupyter_server_mathjax/MathJax.js?"
    assert any(u.startswith(mathjax) for u in requests), (requests, log)
    assert found["safe"], "MathJax's Safe extension is not loaded"
    assert found["typeset"] >= 10, (found["typeset"], requests, log)
    assert not found["errors"], found["errors"]
    for formula in FORMULAS + ["\\href", "\\class", "\\cssId"]:
        assert formula not in found["text"], f"{formula!r} still shows as LaTeX source"
    assert "My own notes:" in found["text"]
    assert not found["links"], f"the student's math made links, classes or ids: {found['links']}"
    assert SHOT.stat().st_size > 10_000


def test_without_a_jupyter_server_the_page_shows_the_latex_as_written(feedback, chromium_context, tmp_path):
    path = tmp_path / f"{ASSIGNMENT}.html"
    path.write_text(feedback, encoding="utf-8")
    found, requests, blocked = _open(chromium_context, path.as_uri())
    assert not blocked and all(u.startswith("file:") or u.startswith("data:") for u in requests), requests
    assert not found["typeset"] and not found["safe"]
    for formula in FORMULAS:
        assert formula in found["text"], formula
    assert f"\\href{{http://{EVIL}/math}}" in found["text"]  # text, not a link
