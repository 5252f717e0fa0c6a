"""The one place where student-controlled text is made safe for HTML.

Students control markdown cells, every output their code displays (any MIME type and
its metadata) and the messages of the exceptions their code raises, which become
diagnoses. Those reach the feedback page, formgrader's view of the autograded notebook
and the class report. Two kinds of helpers:

- Text that must stay text (diagnoses, ids, file names): ``one_line`` makes it one
  printable line, ``text_html`` escapes it for HTML and keeps MathJax off it.
- Markup that must stay readable (the learner's prose, the tutor's tables, the
  instructor's comments): ``clean_html`` keeps an allowlist of elements and attributes
  and escapes the rest. nbconvert calls it through ``c.HTMLExporter.filters``
  (``clean_html`` for text/html outputs and ``MarkdownToSafeHTML`` for every
  ``markdown2html``), and ``SanitizeOutputs`` (``c.HTMLExporter.preprocessors``) drops
  output metadata the templates would put into attributes unchecked.

Sources: OWASP Cross Site Scripting Prevention Cheat Sheet (rules 1, 2 and 6: escape
text for its context, sanitize HTML with an allowlist library), OWASP HTML
Sanitization guidance; bleach 6 (``bleach.sanitizer.Cleaner``); nbconvert 7's classic
templates (``data_png``'s unquoted ``width=``/``height=``, ``metadata.filenames`` as
``src``), nbgrader 0.9.6's feedback and formgrade templates (``markdown2html`` without
``clean_html``).
"""
from __future__ import annotations

import html
import re
import unicodedata
from urllib.parse import urlsplit

import bleach
from bleach.css_sanitizer import CSSSanitizer
from jinja2 import pass_context
from nbconvert.preprocessors import Preprocessor
from traitlets.config import LoggingConfigurable

__all__ = ["ALLOWED_TAGS", "ALLOWED_ATTRIBUTES", "one_line", "text_html", "clean_html",
           "MarkdownToSafeHTML", "SanitizeOutputs"]

# What nbconvert's markdown renderer (mistune), pygments and the tutor's summary
# produce for the course's prose; nothing that runs, embeds, submits or styles a page.
ALLOWED_TAGS = frozenset({
    "a", "abbr", "b", "blockquote", "br", "caption", "code", "col", "colgroup", "dd", "del",
    "details", "div", "dl", "dt", "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "i", "img",
    "ins", "kbd", "li", "mark", "ol", "p", "pre", "q", "s", "samp", "small", "span", "strong",
    "sub", "summary", "sup", "table", "tbody", "td", "tfoot", "th", "thead", "tr", "u", "ul",
    "var",
})
ALLOWED_ATTRIBUTES = {
    "*": ["class", "id", "title", "lang", "dir"],
    "a": ["href"],
    "img": ["src", "alt", "width", "height"],
    "td": ["colspan", "rowspan", "align", "style"],
    "th": ["colspan", "rowspan", "align", "style"],
    "ol": ["start"],
    "col": ["span"],
}
# mistune writes table alignment as style="text-align: ..."; no other property (and
# so no url(), @import or expression()) survives.
_CSS = CSSSanitizer(allowed_css_properties=["text-align"])
_LINK_SCHEMES = {"http", "https", "mailto"}
# Images only as data the page already holds: a src that names a server is a request
# (a tracking pixel, or a probe of the instructor's network). SVG in <img> runs no
# script and loads nothing.
_DATA_IMAGE = re.compile(r"data:image/(png|jpeg|gif|webp|svg\+xml)[;,]", re.IGNORECASE)
_NUMBER = re.compile(r"\d{1,5}%?")
# What browsers ignore inside a URL's scheme ("java\tscript:"): strip before judging.
_URL_NOISE = re.compile(r"[\x00-\x20\x7f]+")
# C0 and C1 controls (ANSI escapes, NUL, bidi and other format characters are handled
# below): none of them belongs in one line of text.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_ANSI = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|[@-Z\\-_])")
# MathJax 2 (nbconvert's templates) skips elements of class tex2jax_ignore; MathJax 3
# and JupyterLab of class mathjax_ignore.
NO_MATH = "tex2jax_ignore mathjax_ignore"


def one_line(text: object, limit: int = 500) -> str:
    """``text`` as one printable line of at most ``limit`` characters.

    ANSI escape sequences are removed; other control characters, line breaks and
    Unicode format characters (bidi overrides, zero-width) become spaces; unpaired
    surrogates become U+FFFD, so the result always encodes as UTF-8; runs of spaces
    collapse; a longer text is cut and ends with "…". Never raises (``str()`` of any
    object). No HTML escaping: see ``text_html``.
    """
    text = str(text)
    text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    text = _CONTROL.sub(" ", _ANSI.sub("", text))
    text = "".join(" " if unicodedata.category(ch) in ("Cf", "Zl", "Zp") else ch for ch in text)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def text_html(text: object, limit: int = 500) -> str:
    """``text`` as HTML that shows exactly that text: ``one_line``, HTML-escaped (OWASP
    rule 1; quotes too, so it is also safe in a quoted attribute), with ``$`` and ``\\``
    as character references so that neither markdown (math, backslash escapes) nor
    MathJax reads them. Wrap it in an element of class ``NO_MATH`` where MathJax runs:
    the browser decodes ``&#36;`` back to ``$`` before MathJax looks. Never raises.
    """
    return html.escape(one_line(text, limit), quote=True).replace("$", "&#36;").replace("\\", "&#92;")


def _allowed_attribute(tag: str, name: str, value: str) -> bool:
    if name not in ALLOWED_ATTRIBUTES.get(tag, ()) and name not in ALLOWED_ATTRIBUTES["*"]:
        return False
    if name == "href":
        url = _URL_NOISE.sub("", value)
        return url.startswith("#") or urlsplit(url).scheme.lower() in _LINK_SCHEMES
    if name == "src":
        return bool(_DATA_IMAGE.match(_URL_NOISE.sub("", value)))
    if name in ("width", "height", "colspan", "rowspan", "start", "span"):
        return bool(_NUMBER.fullmatch(value.strip()))
    return True


_CLEANER = bleach.sanitizer.Cleaner(
    tags=ALLOWED_TAGS, attributes=_allowed_attribute, protocols={"http", "https", "mailto", "data"},
    css_sanitizer=_CSS, strip=False, strip_comments=True)


def clean_html(element: str | bytes) -> str:
    """HTML from a student, reduced to an allowlist (OWASP XSS rule 6), as nbconvert's
    ``clean_html`` filter (same signature; ``str`` or UTF-8 ``bytes`` in, ``str`` out).

    Kept: ``ALLOWED_TAGS`` with ``ALLOWED_ATTRIBUTES``: links to http(s), mailto or a
    ``#fragment``; images whose ``src`` is a ``data:image/...`` URL; numeric sizes;
    ``text-align`` in table cells. Any other element is escaped, so it shows as text
    (``<script>`` reads as "<script>" and runs nothing); any other attribute
    (``on*``, ``style``, ``srcset``, ``formaction``, ...) and URL (``javascript:``,
    ``vbscript:``, ``http://`` images, relative links into the instructor's files) is
    dropped; comments are removed. Text, entities and MathJax's ``$...$`` are left as
    they are. Never raises on any input text.
    """
    element = element.decode("utf-8", "replace") if isinstance(element, bytes) else str(element)
    return _CLEANER.clean(element)


class MarkdownToSafeHTML(LoggingConfigurable):
    """The ``markdown2html`` filter of an HTMLExporter, followed by ``clean_html``.

    nbgrader's feedback and formgrade templates render markdown cells and the graders'
    comments with ``markdown2html`` alone, even when ``sanitize_html`` is set; nbconvert's
    renderer passes raw HTML and ``javascript:`` links through. Registered by name in
    ``c.HTMLExporter.filters``; nbconvert constructs it with the exporter as ``parent``
    and this renders with the exporter's own ``markdown2html`` (attachments, anchor
    links), then cleans. Jinja passes the template context (the cell) as with the
    original filter.
    """

    jinja_pass_arg = pass_context(lambda: None).jinja_pass_arg  # as @pass_context on a function

    def __call__(self, context, source: str) -> str:
        render = getattr(self.parent, "markdown2html", None)
        if render is None:  # not under an HTMLExporter: nothing renders markdown, show text
            return "<p>" + html.escape(str(source)) + "</p>"
        return clean_html(render(context, source))


# Outputs whose rendering is script: dropped even where sanitize_html is off.
_SCRIPT_MIMES = ("application/javascript", "application/vnd.jupyter.widget-view+json",
                 "application/vnd.jupyter.widget-state+json", "text/javascript")


class SanitizeOutputs(Preprocessor):
    """Before any HTMLExporter template runs: output metadata reduced to what is safe.

    nbconvert's classic templates write an image output's ``width``/``height``
    metadata unquoted into ``<img ...>`` (``width=1 onerror=...`` adds an attribute),
    and ``metadata.filenames`` as its ``src`` (a request to any server). Here sizes are
    kept only when they are whole numbers, ``filenames`` and ``isolated`` (an iframe)
    are dropped, and script outputs (JavaScript, widgets) and the notebook's widget
    state are removed. Student and name fields formgrader renders unescaped
    (``resources["student"]``, ``first_name``, ``last_name``) are HTML-escaped.
    Registered in ``c.HTMLExporter.preprocessors``, so it runs for formgrader and, first,
    for nbgrader's feedback.
    """

    def preprocess(self, nb, resources):
        nb.metadata.pop("widgets", None)
        for key in ("student", "first_name", "last_name"):
            if isinstance(resources.get(key), str):
                resources[key] = text_html(resources[key], limit=200)
        return super().preprocess(nb, resources)

    def preprocess_cell(self, cell, resources, index):
        for output in cell.get("outputs", []):
            data = output.get("data")
            if isinstance(data, dict):
                for mime in _SCRIPT_MIMES:
                    data.pop(mime, None)
            metadata = output.get("metadata")
            if not isinstance(metadata, dict):
                continue
            metadata.pop("filenames", None)
            for mime, meta in list(metadata.items()):
                if not isinstance(meta, dict):
                    continue
                meta.pop("isolated", None)
                for size in ("width", "height"):
                    if size in meta and not (isinstance(meta[size], int) and not isinstance(meta[size], bool)
                                             or isinstance(meta[size], str) and meta[size].isdigit()):
                        del meta[size]
            metadata.pop("isolated", None)
            for size in ("width", "height"):  # get_metadata also reads the top level
                if size in metadata and not isinstance(metadata[size], int):
                    del metadata[size]
        return cell, resources
