"""The one place where student-controlled text is made safe for HTML.

Students control markdown cells, every output their code displays (any MIME type and
its metadata) and the messages of the exceptions their code raises, which become
diagnoses. Those reach the feedback page, formgrader's view of the autograded notebook
and the class report. Two kinds of helpers:

- Text that must stay text (diagnoses, ids, file names): ``one_line`` makes it one
  printable line, ``text_html`` escapes it for HTML and keeps MathJax off it.
- Markup that must stay readable (the learner's prose, the tutor's tables, the
  instructor's comments): ``clean_html`` keeps an allowlist of elements and attributes
  and escapes the rest. It is also inert in the page around it: every ``id`` (and a
  ``#fragment`` link to it) moves into the ``user-content-`` namespace the page never
  uses, so it cannot capture formgrader's widgets or the feedback's anchors; ``class``
  keeps only what the renderers emit (``STUDENT_CLASSES``), so no Bootstrap or Jupyter
  class can position or layer it over the page; and ``student_html`` puts it in a box
  that clips and contains whatever it draws (``CONTAIN``). Its cost is linear in the
  input: html5lib's tree building costs the depth of the open elements per tag
  (quadratic when misnested formatting elements pile up), so HTML nesting deeper than
  ``MAX_DEPTH`` is shown as text instead. nbconvert calls it through ``c.HTMLExporter.filters``
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
import secrets
import unicodedata
from urllib.parse import urlsplit

import bleach
from bleach._vendor.html5lib.constants import tokenTypes  # bleach's own html5lib
from bleach._vendor.html5lib.treebuilders import getTreeBuilder
from bleach.css_sanitizer import CSSSanitizer
from bleach.html5lib_shim import BleachHTMLParser, BleachHTMLTokenizer, Filter, getTreeWalker
from jinja2 import pass_context
from nbconvert.preprocessors import Preprocessor
from pygments.token import STANDARD_TYPES
from traitlets.config import LoggingConfigurable

__all__ = ["ALLOWED_TAGS", "ALLOWED_ATTRIBUTES", "STUDENT_CLASSES", "COURSE_CLASSES", "ID_PREFIX",
           "LEXER_CLASS", "MAX_DEPTH", "CONTAIN", "one_line", "text_html", "clean_html", "student_html",
           "MarkdownToSafeHTML", "SanitizeOutputs", "mark_trusted"]

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

# Where student ids live: a namespace no page of nbconvert, nbgrader or the course uses
# (GitHub's choice for rendered READMEs). formgrader binds each grade widget with
# $("#" + grade_id) and the feedback's table of contents links to <a name=grade_id>:
# an id of the page's own, in student markup, would take them.
ID_PREFIX = "user-content-"
# The only classes student markup keeps: what nbconvert's markdown renderer (heading
# anchors), pygments (the highlight box, hl-<lexer>, its token classes), mistune
# (language-<name>), pandas (dataframe) and the course's autograder comments emit.
# Everything else (Bootstrap's navbar-fixed-top, modal, affix, pull-right, hidden;
# JupyterLab's jp-*; formgrader's score, full-credit, nbgrader_cell) is dropped: a class
# is how markup without a style attribute gets positioned.
STUDENT_CLASSES = frozenset({"anchor-link", "highlight", "hll", "dataframe", "autograder-comment",
                             *NO_MATH.split(), *filter(None, STANDARD_TYPES.values())})
# pygments' box names its lexer (hl-ipython3), mistune's code blocks their language
LEXER_CLASS = re.compile(r"(hl|language)-[A-Za-z0-9_+#.-]{1,40}")
# The tutor's own cells (grader/tutor.py, marked by ``mark_trusted``) also keep their
# ids as written and these classes; their text is escaped by ``text_html`` anyway.
COURSE_CLASSES = STUDENT_CLASSES | {"tutor-summary", "tutor-comment", "passed", "failed", "table",
                                    "table-condensed"}
# Nesting beyond this is not prose (the course's deepest is a dozen): html5lib's tree
# building costs up to the depth of the open elements for each tag, so a bound on the
# depth makes the whole parse linear.
MAX_DEPTH = 100
# The box every rendered student cell and output is drawn in: a containing block for
# fixed and absolute positions (contain: paint), clipped to its own area, in a stacking
# context of its own, so that a class or element the allowlists missed still cannot
# cover the score, the navigation or a grade widget outside it.
CONTAIN = "position: relative; overflow: auto; isolation: isolate; contain: paint;"


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


def _namespace(classes: frozenset[str], prefix: str) -> type[Filter]:
    """A bleach filter (run after its sanitizer) that moves ids, names, ``for`` and
    ``#fragment`` links into ``prefix`` and keeps only ``classes``. Idempotent: a value
    already in the namespace is left as it is (nbconvert cleans a text/markdown output
    twice)."""

    def inside(value: str) -> str:
        return value if value.startswith(prefix) else prefix + value

    class Namespace(Filter):
        def __iter__(self):
            for token in super().__iter__():
                if token["type"] in ("StartTag", "EmptyTag") and token.get("data"):
                    token["data"] = self.attributes(token["data"])
                yield token

        @staticmethod
        def attributes(attrs: dict) -> dict:
            kept = {}
            for key, value in attrs.items():
                name = key[1] if isinstance(key, tuple) else key
                if name in ("id", "name", "for"):  # the names a page binds by (only id is allowed now)
                    value = " ".join(inside(v) for v in value.split())
                    if not value:
                        continue
                elif name == "href" and value.startswith("#") and len(value) > 1:
                    value = "#" + inside(value[1:])
                elif name == "class":
                    value = " ".join(c for c in value.split() if c in classes or LEXER_CLASS.fullmatch(c))
                    if not value:
                        continue
                kept[key] = value
            return kept

    return Namespace


class TooDeep(ValueError):
    """HTML whose elements nest deeper than ``MAX_DEPTH``."""


class _BoundedTree(getTreeBuilder("etree")):
    """html5lib's etree builder that refuses to open an element beyond ``MAX_DEPTH``
    open elements or active formatting elements: every way the parser grows either list
    goes through ``insertElement`` (the adoption agency only replaces entries)."""

    def _check(self) -> None:
        if len(self.openElements) >= MAX_DEPTH or len(self.activeFormattingElements) >= MAX_DEPTH:
            raise TooDeep(f"elements nest more than {MAX_DEPTH} deep")

    def insertElementNormal(self, token):
        self._check()
        return super().insertElementNormal(token)

    def insertElementTable(self, token):
        self._check()
        return super().insertElementTable(token)


class _Walker(getTreeWalker("etree")):
    """html5lib's etree tree walker (bleach's), with a step back up to the parent in
    constant time: html5lib's finds the parent's place among its siblings with
    ``list.count`` and ``list.index``, quadratic in the number of siblings (a cell of a
    few thousand paragraphs took seconds). Nodes are html5lib's (element, index, parents,
    flag) tuples, but ``parents`` holds (element, its index in its own parent)."""

    def getFirstChild(self, node):
        element, key, parents, flag = node if isinstance(node, tuple) else (node, None, [], None)
        if flag in ("text", "tail"):
            return None
        if element.text:
            return element, key, parents, "text"
        return self._first_element(element, key, parents)

    @staticmethod
    def _first_element(element, key, parents):
        if not len(element):
            return None
        parents.append((element, key))
        return element[0], 0, parents, None

    def getNextSibling(self, node):
        if not isinstance(node, tuple):
            return None
        element, key, parents, flag = node
        if flag == "text":
            return self._first_element(element, key, parents)
        if element.tail and flag != "tail":
            return element, key, parents, "tail"
        if key < len(parents[-1][0]) - 1:
            return parents[-1][0][key + 1], key + 1, parents, None
        return None

    def getParentNode(self, node):
        if not isinstance(node, tuple):
            return None
        element, key, parents, flag = node
        if flag == "text":
            return (element, key, parents, None) if parents else element
        parent, index = parents.pop()
        return (parent, index, parents, None) if parents else parent


_CHARACTERS, _SPACES, _ERROR = tokenTypes["Characters"], tokenTypes["SpaceCharacters"], tokenTypes["ParseError"]


class _JoinedText(BleachHTMLTokenizer):
    """bleach's tokenizer, with each run of text handed to the parser as one token.

    html5lib's etree builder appends every text token to the text before it with
    ``+=`` on an element attribute, which copies it: quadratic in the number of tokens a
    run is cut into (every ``<`` or ``&`` cuts it). Joining them first is what the HTML
    standard parses the same way (its tokens are single characters); only the text of a
    run is held, never a tag."""

    def __iter__(self):
        run: list[str] = []
        for token in super().__iter__():
            if run and token["type"] in (_CHARACTERS, _SPACES):
                run.append(token["data"])
                continue
            if run and token["type"] == _ERROR:  # only logged by the parser: keep the run
                yield token
                continue
            if run:
                yield {"type": _CHARACTERS, "data": "".join(run)}
                run = []
            if token["type"] == _CHARACTERS:
                run.append(token["data"])
            else:
                yield token
        if run:
            yield {"type": _CHARACTERS, "data": "".join(run)}


class _Parser(BleachHTMLParser):
    """bleach's parser on ``_BoundedTree``, reading ``_JoinedText``."""

    def __init__(self, tags, strip):
        super().__init__(tags=tags, strip=strip, consume_entities=False, namespaceHTMLElements=False,
                         tree=_BoundedTree)

    def mainLoop(self):
        # BleachHTMLParser._parse has just built its BleachHTMLTokenizer: read it joined
        self.tokenizer.__class__ = _JoinedText
        return super().mainLoop()


def _cleaner(classes: frozenset[str], prefix: str) -> bleach.sanitizer.Cleaner:
    cleaner = bleach.sanitizer.Cleaner(
        tags=ALLOWED_TAGS, attributes=_allowed_attribute, protocols={"http", "https", "mailto", "data"},
        css_sanitizer=_CSS, strip=False, strip_comments=True, filters=[_namespace(classes, prefix)])
    # bleach's own parser and walker, each with its cost made linear (see each class)
    cleaner.parser = _Parser(cleaner.tags, cleaner.strip)
    cleaner.walker = _Walker
    return cleaner


_CLEANER = _cleaner(STUDENT_CLASSES, ID_PREFIX)
_COURSE_CLEANER = _cleaner(COURSE_CLASSES, "")


def _clean(cleaner: bleach.sanitizer.Cleaner, element: str | bytes) -> str:
    element = element.decode("utf-8", "replace") if isinstance(element, bytes) else str(element)
    try:
        return cleaner.clean(element)
    except TooDeep:
        # All of it stays readable, as the characters the student wrote.
        return (f"<p><em>Shown as text: this HTML nests more than {MAX_DEPTH} elements deep.</em></p>"
                f'<pre class="{NO_MATH}">{html.escape(element)}</pre>')


def clean_html(element: str | bytes) -> str:
    """HTML from a student, reduced to an allowlist (OWASP XSS rule 6), as nbconvert's
    ``clean_html`` filter (same signature; ``str`` or UTF-8 ``bytes`` in, ``str`` out).

    Kept: ``ALLOWED_TAGS`` with ``ALLOWED_ATTRIBUTES``: links to http(s), mailto or a
    ``#fragment``; images whose ``src`` is a ``data:image/...`` URL; numeric sizes;
    ``text-align`` in table cells. Any other element is escaped, so it shows as text
    (``<script>`` reads as "<script>" and runs nothing); any other attribute
    (``on*``, ``style``, ``srcset``, ``formaction``, ...) and URL (``javascript:``,
    ``vbscript:``, ``http://`` images, relative links into the instructor's files) is
    dropped; comments are removed; ids, ``name``, ``for`` and ``#fragment`` links get the
    ``ID_PREFIX`` (in-page links between them keep working), classes outside
    ``STUDENT_CLASSES`` are dropped. Text, entities and MathJax's ``$...$`` are left as
    they are. HTML nested more than ``MAX_DEPTH`` deep comes back whole as escaped text
    after a one-line note, so the cost is linear in the input. Never raises on any input
    text.
    """
    return _clean(_CLEANER, element)


def student_html(element: str | bytes) -> str:
    """``clean_html`` inside a ``<div class="user-content">`` box styled ``CONTAIN``:
    nbconvert's ``clean_html`` filter (text/html and text/markdown outputs, code cells'
    input, raw cells), so what a class the allowlist missed could draw stays in the
    cell's own area. Markup already in such a box (nbconvert cleans the markdown it
    rendered with ``MarkdownToSafeHTML`` again) is cleaned and boxed once. Never raises."""
    element = element.decode("utf-8", "replace") if isinstance(element, bytes) else str(element)
    if element.startswith(_BOX) and element.endswith(_BOX_END):
        element = element[len(_BOX):-len(_BOX_END)]
    return _contain(clean_html(element))


_BOX, _BOX_END = f'<div class="user-content" style="{CONTAIN}">', "</div>"


def _contain(cleaned: str) -> str:
    return _BOX + cleaned + _BOX_END


# The tutor's cells are the course's, not the student's: marked with a secret of this
# process (a student can write any cell metadata, but not this value).
_TRUST_KEY = "attention_course_tutor"
_TRUST = secrets.token_hex(16)


def mark_trusted(cell) -> None:
    """Mark a markdown cell this process wrote (the tutor's summary and comments) so that
    ``MarkdownToSafeHTML`` keeps its ids and ``COURSE_CLASSES``; it is still cleaned."""
    cell.metadata[_TRUST_KEY] = _TRUST


def _trusted(context) -> bool:
    cell = context.get("cell") if hasattr(context, "get") else None
    meta = cell.get("metadata", {}) if hasattr(cell, "get") else {}
    value = meta.get(_TRUST_KEY) if hasattr(meta, "get") else None
    return isinstance(value, str) and secrets.compare_digest(value, _TRUST)


class MarkdownToSafeHTML(LoggingConfigurable):
    """The ``markdown2html`` filter of an HTMLExporter, followed by ``clean_html``.

    nbgrader's feedback and formgrade templates render markdown cells and the graders'
    comments with ``markdown2html`` alone, even when ``sanitize_html`` is set; nbconvert's
    renderer passes raw HTML and ``javascript:`` links through. Registered by name in
    ``c.HTMLExporter.filters``; nbconvert constructs it with the exporter as ``parent``
    and this renders with the exporter's own ``markdown2html`` (attachments, anchor
    links), then cleans, and puts the result in the ``student_html`` box. Jinja passes
    the template context (the cell) as with the original filter: a cell the tutor wrote
    (``mark_trusted``) keeps its own ids and classes and is not boxed.
    """

    jinja_pass_arg = pass_context(lambda: None).jinja_pass_arg  # as @pass_context on a function

    def __call__(self, context, source: str) -> str:
        render = getattr(self.parent, "markdown2html", None)
        if render is None:  # not under an HTMLExporter: nothing renders markdown, show text
            return "<p>" + html.escape(str(source)) + "</p>"
        if _trusted(context):
            return _clean(_COURSE_CLEANER, render(context, source))
        return student_html(render(context, source))


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
