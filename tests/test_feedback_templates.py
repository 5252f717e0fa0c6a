"""Feedback pages come from templates compiled once per process (grader.feedback.FeedbackExporter)."""
from __future__ import annotations

import jinja2
import nbformat
from nbconvert.exporters import HTMLExporter

from grader import course
from grader.feedback import FeedbackExporter


def _notebook():
    return nbformat.read(course.NOTEBOOKS / "01_similarity" / "01_similarity.ipynb", as_version=4)


def test_feedback_is_nbgraders_exporter_with_compiled_templates_kept():
    config = course.load_config()
    assert config.GenerateFeedback.exporter_class == "grader.feedback.FeedbackExporter"
    compiled = []
    real = jinja2.Environment._compile

    def counting(self, source, filename):
        compiled.append(filename)
        return real(self, source, filename)

    jinja2.Environment._compile = counting
    try:
        stock, _ = HTMLExporter(template_name="classic").from_notebook_node(_notebook())
        compiled.clear()
        first, _ = FeedbackExporter(template_name="classic").from_notebook_node(_notebook())
        assert compiled, "the first exporter compiles the templates"
        compiled.clear()
        again, _ = FeedbackExporter(template_name="classic").from_notebook_node(_notebook())
    finally:
        jinja2.Environment._compile = real
    assert compiled == [], f"a new exporter compiled {compiled} again"
    assert first == stock and again == stock  # the same page as nbconvert's own exporter
