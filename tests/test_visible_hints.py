"""The visible tests of notebooks 01-10 tell the truth about mistakes and about dependencies.

- A numeric hint ("that is the answer you get when the ReLU is missing") is data, the
  ``mistakes=`` of ``coursekit.testing.assert_close``, and each one is proven here: the
  described mistake, written as a learner would, runs through the visible test cell, which
  must fail with exactly that hint. No hint is free text ("If you got (1.5, -1), ..."),
  where its numbers could be wrong unnoticed (they were: issue 17).
- A check that also runs an earlier function of the learner says so (``uses=``): the
  functions the exercise's solution calls (``Spec.depends``) and the learner's functions the
  test cell calls itself, followed through the cell's assignments.
"""
from __future__ import annotations

import ast
import re
import warnings

import matplotlib
import nbformat
import pytest

from grader import course
from grader.checks import get
from tests.scope import slow_if_costly

ASSIGNMENTS = [a for a in course.assignments() if a[:2] <= "10"]   # the notebooks of issue 17
HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS\n?", re.S)
FREE_TEXT_HINT = re.compile(r"you got\s*[\[(\-\d]", re.I)
CHECKS = {"assert_close", "assert_shape"}

# (exercise, the start of the hint's description) -> the mistake as a learner writes it
MISTAKES = {
    ("positional_encoding-shift_matrix", "the block is the textbook rotation"): '''
def shift_matrix(k, d_model):
    M = np.zeros((d_model, d_model))
    for i in range(d_model // 2):
        angle = k / 10000 ** (2 * i / d_model)
        M[2 * i:2 * i + 2, 2 * i:2 * i + 2] = [[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]]
    return M
''',
    ("multi_head-split_heads", "the reshape goes straight to"): '''
def split_heads(x, heads):
    batch, seq_len, d_model = x.shape
    return x.reshape(batch, heads, seq_len, d_model // heads)
''',
    ("multi_head-split_heads", "d_model is cut as (d_k, heads)"): '''
def split_heads(x, heads):
    batch, seq_len, d_model = x.shape
    return x.reshape(batch, seq_len, d_model // heads, heads).permute(0, 3, 1, 2)
''',
    ("multi_head-merge_heads", "the reshape comes without transpose"): '''
def merge_heads(x):
    batch, heads, seq_len, d_k = x.shape
    return x.reshape(batch, seq_len, heads * d_k)
''',
    ("encoder-layer_norm", "the variance is divided by d - 1"): '''
def layer_norm(x, gamma, beta, eps=1e-5):
    mean = x.mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(x.var(dim=-1, keepdim=True) + eps) * gamma + beta
''',
    ("encoder-feed_forward", "the ReLU is missing"): '''
def feed_forward(x, W1, b1, W2, b2):
    return (x @ W1.T + b1) @ W2.T + b2
''',
    ("encoder-feed_forward", "the second bias b2 is missing"): '''
def feed_forward(x, W1, b1, W2, b2):
    return torch.relu(x @ W1.T + b1) @ W2.T
''',
    ("encoder-feed_forward", "the first bias b1 is missing"): '''
def feed_forward(x, W1, b1, W2, b2):
    return torch.relu(x @ W1.T) @ W2.T + b2
''',
    ("encoder-sublayer_connection", "the residual adds norm(x)"): '''
def sublayer_connection(x, sublayer, norm, norm_first=False):
    if norm_first:
        x = norm(x)
        return x + sublayer(x)
    return norm(x + sublayer(x))
''',
    ("seq2seq_rnn-additive_attention", "the softmax ran over the batch axis"): '''
def additive_attention(query, keys, W_q, W_k, v, mask=None):
    scores = torch.tanh((query @ W_q.T)[:, None, :] + keys @ W_k.T) @ v
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=0)
    return (weights[:, :, None] * keys).sum(dim=1), weights
''',
    ("seq2seq_rnn-additive_attention", "the mask is inverted"): '''
def additive_attention(query, keys, W_q, W_k, v, mask=None):
    scores = torch.tanh((query @ W_q.T)[:, None, :] + keys @ W_k.T) @ v
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return (weights[:, :, None] * keys).sum(dim=1), weights
''',
    ("encoder-sublayer_connection", "the two branches are swapped"): '''
def sublayer_connection(x, sublayer, norm, norm_first=False):
    if not norm_first:
        return x + sublayer(norm(x))
    return norm(x + sublayer(x))
''',
}


def _cells(assignment: str):
    return nbformat.read(course.SOLUTIONS / assignment / f"{assignment}.ipynb", as_version=4).cells


def _test_cells():
    """(assignment, exercise id, the visible part of its test cell, the cells above it)."""
    for assignment in ASSIGNMENTS:
        cells = _cells(assignment)
        for index, cell in enumerate(cells):
            grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "")
            if cell.cell_type == "code" and grade_id.endswith(course.TEST_SUFFIX):
                yield assignment, course.exercise_id(grade_id), HIDDEN.sub("", cell.source), cells[:index]


def _hints(source: str) -> list[tuple[str, ast.Call]]:
    """The descriptions of ``mistakes={...}`` in a cell's checks, with their calls."""
    found = []
    for call in _calls(ast.parse(source)):
        for keyword in call.keywords:
            if keyword.arg == "mistakes":
                assert isinstance(keyword.value, ast.Dict), "mistakes= is a dict written in the call"
                found += [(ast.literal_eval(key), call) for key in keyword.value.keys]
    return found


def _calls(tree) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            and n.func.id in CHECKS]


def _registered(exercise: str, description: str) -> str | None:
    for (ex, start), code in MISTAKES.items():
        if ex == exercise and description.startswith(start):
            return code
    return None


def _run_up_to(cells, namespace: dict) -> None:
    """Run the code cells above a test cell in process (hidden tests left out), figures off."""
    import matplotlib.pyplot as plt

    for cell in cells:
        if cell.cell_type == "code":
            exec(compile(HIDDEN.sub("", cell.source), cell.get("id", "cell"), "exec"), namespace)
            plt.close("all")


CASES = [(a, e, d) for a, e, source, _ in _test_cells() for d, _ in _hints(source)]


@pytest.mark.parametrize("assignment, exercise, description",
                         [slow_if_costly(a, a, e, d, id=f"{e}: {d[:40]}") for a, e, d in CASES])
def test_the_mistake_a_hint_names_gives_the_hint(assignment, exercise, description):
    code = _registered(exercise, description)
    assert code, f"{exercise}: no mistake in MISTAKES proves the hint {description!r}"
    [(source, above)] = [(s, c) for a, e, s, c in _test_cells() if (a, e) == (assignment, exercise)]
    matplotlib.use("Agg")
    namespace: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _run_up_to(above, namespace)
        exec(compile(source, f"{exercise}-test", "exec"), namespace)      # the solution passes it
        exec(compile(code, f"{exercise}: {description[:30]}", "exec"), namespace)
        with pytest.raises(AssertionError) as failed:
            exec(compile(source, f"{exercise}-test", "exec"), namespace)
    assert f"That is the answer you get when {description}." in str(failed.value), str(failed.value)


def test_every_registered_mistake_proves_a_hint_and_the_cases_are_found():
    assert MISTAKES and len(CASES) >= len(MISTAKES)
    proven = {(e, start) for e, start in MISTAKES for _, ex, d in CASES if ex == e and d.startswith(start)}
    assert proven == set(MISTAKES), f"mistakes that prove no hint: {set(MISTAKES) - proven}"


def test_no_numeric_hint_is_free_text():
    for assignment, exercise, source, _ in _test_cells():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert not FREE_TEXT_HINT.search(node.value), (
                    f"{exercise}: a hint with numbers in free text ({node.value!r}): give it as mistakes= so that "
                    "tests/test_visible_hints.py proves its numbers")


def _learner_functions(cells) -> set[str]:
    return {n.name for c in cells if c.metadata.get("nbgrader", {}).get("solution")
            for n in ast.parse(c.source).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


class _Flow(ast.NodeVisitor):
    """For every check call of a cell, the names its arguments come from, through the cell's
    assignments (``out = f(x)`` makes ``out`` come from ``f`` and ``x``), in source order."""

    def __init__(self):
        self.sources: dict[str, set[str]] = {}
        self.calls: list[tuple[ast.Call, set[str]]] = []

    def _names(self, node) -> set[str]:
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} if node is not None else set()
        return names.union(*(self.sources.get(n, set()) for n in names))

    def _assign(self, targets, value):
        came_from = self._names(value)
        for target in targets:
            for name in ast.walk(target):
                if isinstance(name, ast.Name):
                    self.sources[name.id] = came_from | self.sources.get(name.id, set())

    def visit_Assign(self, node):
        self.generic_visit(node)
        self._assign(node.targets, node.value)

    def visit_AugAssign(self, node):
        self.generic_visit(node)
        self._assign([node.target], node.value)

    def visit_For(self, node):
        self._assign([node.target], node.iter)
        self.generic_visit(node)

    def visit_With(self, node):
        for item in node.items:
            if item.optional_vars is not None:
                self._assign([item.optional_vars], item.context_expr)
        self.generic_visit(node)

    def visit_Call(self, node):
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id in CHECKS:
            self.calls.append((node, self._names(ast.Tuple(elts=list(node.args), ctx=ast.Load()))))


def _uses(call: ast.Call, tree) -> set[str]:
    """The names a check call's ``uses=`` gives: a literal tuple, a name assigned one in the
    cell, or ``A if condition else B`` of those (then either may be given: both count)."""
    [value] = [k.value for k in call.keywords if k.arg == "uses"] or [None]
    return set() if value is None else _literal_names(value, tree)


def _literal_names(value, tree) -> set[str]:
    if isinstance(value, ast.IfExp):
        return _literal_names(value.body, tree) | _literal_names(value.orelse, tree)
    if isinstance(value, ast.Name):
        [value] = [n.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
                   and any(isinstance(t, ast.Name) and t.id == value.id for t in n.targets)]
    return set(ast.literal_eval(value))


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_a_check_that_runs_an_earlier_function_of_the_learner_names_it(assignment):
    missing = []
    for _, exercise, source, above in (t for t in _test_cells() if t[0] == assignment):
        tested = get(exercise).function
        earlier = _learner_functions(above) - {tested}
        through = {get(d).function for d in get(exercise).depends}
        tree = ast.parse(source)
        flow = _Flow()
        flow.visit(tree)
        for call, came_from in flow.calls:
            needed = (came_from & earlier) | (through if tested in came_from else set())
            if not needed <= _uses(call, tree):
                missing.append(f"{exercise}, line {call.lineno}: uses= must name {sorted(needed)}")
    assert not missing, "\n".join(missing)
