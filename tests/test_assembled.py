"""The helper cells of notebooks 07, 08, 09, 10, 12 and 14 are the earlier notebooks' own code,
assembled at release (grader/assembled.py), in the instructor's source and in the student
version."""
from __future__ import annotations

import ast
import math
import re
import shutil

import nbformat
import numpy as np
import pytest
import torch

from grader import assembled, course
from grader.course import solution_namespace

HEADER = re.compile(r"^# ---- from notebook (?P<assignment>\w+), cell (?P<cell>[\w-]+)(?P<rest>.*) ----$", re.M)
WRAP = re.compile(r"^(?P<name>\w+) = returns_tensor\((?P=name), torch\.(bool|float32)\)$")
MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")


def _helper_cell(root, assignment="09_transformer", grade_id="transformer-helpers") -> str:
    nb = nbformat.read(root / assignment / f"{assignment}.ipynb", as_version=4)
    cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id]
    assert len(cells) == 1, f"{root.name}: one {grade_id} cell expected, found {len(cells)}"
    assert cells[0].metadata["nbgrader"]["locked"] and not cells[0].metadata["nbgrader"].get("solution")
    return cells[0].source


def _definitions(source: str) -> dict[str, str]:
    """Top-level function and class name -> its exact source text (decorators included)."""
    lines = source.splitlines()
    out = {}
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            out[node.name] = "\n".join(lines[start - 1:node.end_lineno])
    return out


def _cell_code(assignment: str, grade_id: str) -> str:
    """A cell of an earlier solution notebook as its solution reads (nbgrader's markers dropped),
    read here without grader.assembled, so that the test does not check the generator with itself."""
    nb = nbformat.read(course.SOLUTIONS / assignment / f"{assignment}.ipynb", as_version=4)
    [cell] = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id]
    return "\n".join(line for line in cell.source.splitlines() if line.strip() not in MARKERS)


# each assembled cell and the definitions it must hold, in order
COPIES = {("09_transformer", "transformer-helpers"): ["causal_mask", "sinusoidal_encoding", "sublayer_connection",
                                                      "EncoderLayer", "torch_attn_mask", "DecoderLayer"],
          ("07_encoder", "encoder-helpers"): ["sinusoidal_encoding"],
          ("08_decoder", "decoder-helpers"): ["causal_mask", "torch_attn_mask", "sinusoidal_encoding"],
          ("10_seq2seq_rnn", "seq2seq_rnn-recipe-helpers"): ["sinusoidal_encoding", "label_smoothed_loss", "noam_lr"],
          ("12_gpt", "gpt-bpe-helpers"): ["pretokenize", "learned_tokens", "shown", "token_name", "count_pairs",
                                          "merge_pair", "train_bpe", "bpe_encode", "bpe_decode"],
          ("12_gpt", "gpt-model-helpers"): ["causal_mask", "split_heads", "merge_heads", "scaled_dot_product_attention",
                                            "MultiHeadAttention", "load_torch_weights", "sublayer_connection"],
          ("13_rope", "rope-helpers"): ["sinusoidal_encoding", "shift_matrix", "causal_mask", "split_heads", "merge_heads",
                                        "scaled_dot_product_attention", "MultiHeadAttention", "sublayer_connection",
                                        "Block"],
          ("14_efficient_attention", "efficient_attention-helpers"): ["stable_softmax", "scaled_dot_product_attention"],
          ("15_modern_decoder", "modern_decoder-demo-gpt-helpers"): [
              "pretokenize", "learned_tokens", "shown", "token_name", "count_pairs", "merge_pair", "train_bpe",
              "bpe_encode", "bpe_decode", "causal_mask", "split_heads", "merge_heads", "scaled_dot_product_attention",
              "MultiHeadAttention", "sublayer_connection", "Block", "GPT", "next_token_loss",
              "encode_sentence", "show", "text_of", "batches"],
          ("16_serving", "serving-helpers"): ["RMSNorm", "SwiGLU", "Attention", "DecoderLayer"]}


def test_every_assembled_cell_is_tested():
    assert {(a.assignment, a.cell) for a in assembled.ASSEMBLIES} == set(COPIES)


@pytest.mark.parametrize("root", [course.SOLUTIONS, course.NOTEBOOKS], ids=["solutions", "notebooks"])
@pytest.mark.parametrize("assignment,grade_id", list(COPIES))
def test_helper_cell_is_the_code_of_the_earlier_solution_cells(root, assignment, grade_id):
    source = _helper_cell(root, assignment, grade_id)
    heads = list(HEADER.finditer(source))
    assert heads, "the helper cell names no source cell"
    intro = source[:heads[0].start()]
    assert all(line.startswith("#") or line in ("", "from coursekit import returns_tensor")
               for line in intro.splitlines()), f"code before the first piece:\n{intro}"
    assert "do not edit" in intro.lower() and "made by `make release`" in intro
    copied = []
    for head, after in zip(heads, heads[1:] + [None]):
        section = source[head.end():after.start() if after else len(source)]
        earlier_code = _cell_code(head["assignment"], head["cell"])
        earlier = _definitions(earlier_code)
        mine = _definitions(section)
        assert mine, f"{head['cell']}: no definition under its header"
        for name, text in mine.items():
            assert name in earlier, f"{name} is not defined in {head['assignment']}'s cell {head['cell']}"
            assert text == earlier[name], f"{name} differs from {head['assignment']}'s cell {head['cell']}"
        some = re.fullmatch(r" \((\w+(?:, \w+)*)\)", head["rest"])     # "(torch_attn_mask)": only these
        wanted = some[1].split(", ") if some else list(earlier)        # otherwise all of the cell
        assert list(mine) == wanted, f"{head['cell']}: {list(mine)} copied, {wanted} named"
        others = [n for n in ast.parse(section).body if not isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        for node in others:        # imports and constants of a whole cell, copied; or the one line the
            line = ast.get_source_segment(section, node)   # assembly adds: a numpy function made to return tensors
            wrapped = WRAP.match(line) and WRAP.match(line)["name"] in mine
            assert wrapped or (not some and line in earlier_code), f"{head['cell']}: {line!r} is not copied"
        copied += mine
    assert copied == COPIES[assignment, grade_id]


def test_the_sources_are_up_to_date():
    assert assembled.stale() == [], "an assembled cell is out of date: run `make release` and commit solutions/"


# a piece changed in its own notebook -> the assembled cell that must follow it
CHANGES = {
    "07's EncoderLayer -> 09": ("07_encoder", "encoder-EncoderLayer", "        x = sublayer_connection(x, attend",
                                "09_transformer", "transformer-helpers"),
    "09's label_smoothed_loss -> 10": ("09_transformer", "transformer-label_smoothed_loss", "    keep = target != pad_id",
                                       "10_seq2seq_rnn", "seq2seq_rnn-recipe-helpers"),
    "11's train_bpe -> 12 and 15": ("11_tokenization", "tokenization-train_bpe", "        merges.append(best)",
                                    "12_gpt", "gpt-bpe-helpers", "15_modern_decoder", "modern_decoder-demo-gpt-helpers"),
    "12's GPT -> 15": ("12_gpt", "gpt-GPT", "        x = self.dropout(", "15_modern_decoder",
                       "modern_decoder-demo-gpt-helpers"),
}


@pytest.mark.parametrize("change", CHANGES)
def test_release_copies_a_changed_piece(tmp_path, change):
    """Change a piece in a copy of solutions/: assembling rewrites the cell that copies it, and only that one."""
    source, piece_cell, line, *copies = CHANGES[change]
    targets = list(zip(copies[::2], copies[1::2]))          # (assignment, cell) of every cell that copies the piece
    for assignment in {p.assignment for a in assembled.ASSEMBLIES for p in a.pieces} | {
            a.assignment for a in assembled.ASSEMBLIES}:
        shutil.copytree(course.SOLUTIONS / assignment, tmp_path / assignment)
    path = tmp_path / source / f"{source}.ipynb"
    nb = nbformat.read(path, as_version=4)
    [cell] = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == piece_cell]
    assert line in cell.source
    cell.source = cell.source.replace(line, "    # a changed line\n" + line)
    nbformat.write(nb, path)
    assert assembled.stale(tmp_path) == [f"{target}:{target_cell}" for target, target_cell in targets]
    assert assembled.update_sources(tmp_path) == [tmp_path / target / f"{target}.ipynb" for target, _ in targets]
    for target, target_cell in targets:
        assert "    # a changed line\n" in _helper_cell(tmp_path, target, target_cell)
    assert assembled.stale(tmp_path) == [] and assembled.update_sources(tmp_path) == []


def test_a_missing_piece_is_named():
    piece = assembled.Piece("07_encoder", "encoder-NoSuchLayer")
    with pytest.raises(KeyError, match="encoder-NoSuchLayer"):
        assembled.piece_code(piece)
    with pytest.raises(KeyError, match="no_such_function"):
        assembled.piece_code(assembled.Piece("08_decoder", "decoder-helpers", names=("no_such_function",)))


@pytest.mark.parametrize("assignment", ["08_decoder", "09_transformer"])
def test_the_numpy_pieces_return_tensors_of_notebook_05_s_values(assignment):
    ns, ns05 = solution_namespace(assignment), solution_namespace("05_positional_encoding")
    mask = ns["causal_mask"](4)
    assert mask.dtype == torch.bool and mask.tolist() == np.tril(np.ones((4, 4), bool)).tolist()
    pe = ns["sinusoidal_encoding"](7, 6)
    assert pe.dtype == torch.float32
    np.testing.assert_allclose(pe.numpy(), ns05["sinusoidal_encoding"](7, 6), rtol=1e-6, atol=1e-7)
    assert "Causal (look-ahead) mask" in ns["causal_mask"].__doc__     # returns_tensor keeps the docstring
    ignore = ns["torch_attn_mask"](torch.stack([mask, mask.T]), heads=3)   # (batch 2, 4, 4) -> (2 * 3, 4, 4)
    assert ignore.shape == (6, 4, 4) and torch.equal(ignore[:3], ~mask.expand(3, 4, 4))
    assert torch.equal(ignore[3:], ~mask.T.expand(3, 4, 4)) and ns["torch_attn_mask"](None, 3) is None


@pytest.mark.slow
def test_notebook_10_trains_with_notebook_09_s_loss_and_schedule():
    """10's Transformer learns with 09's label_smoothed_loss (no mass on <pad>), not
    F.cross_entropy(label_smoothing=0.1), and with 09's noam_lr."""
    ns10, ns09 = solution_namespace("10_seq2seq_rnn"), solution_namespace("09_transformer")
    torch.manual_seed(0)
    logits, target = torch.randn(2, 5, 7), torch.tensor([[3, 1, 4, 2, 0], [2, 6, 5, 0, 0]])
    assert torch.equal(ns10["label_smoothed_loss"](logits, target, 0, 0.1),
                       ns09["label_smoothed_loss"](logits, target, 0, 0.1))
    assert ns10["noam_lr"](37, 64, 100, 0.5) == ns09["noam_lr"](37, 64, 100, 0.5)
    pe = ns10["sinusoidal_encoding"](7, 6)
    assert pe.dtype == torch.float32

    class Stand_in(torch.nn.Module):                     # logits that do not depend on the batch
        def __init__(self):
            super().__init__()
            self.logits = torch.nn.Parameter(logits.clone())

        def forward(self, src, tgt_in):
            return self.logits

    model = Stand_in()
    loss = ns10["make_step"](model, torch.optim.SGD(model.parameters(), lr=0.0))((None, None, target))
    expected = ns09["label_smoothed_loss"](logits, target, 0, 0.1).item()
    assert loss == expected, "make_step trains with label_smoothed_loss(logits, tgt_out, PAD_ID, 0.1)"
    smoothed_over_pad = torch.nn.functional.cross_entropy(logits.reshape(-1, 7), target.reshape(-1),
                                                          ignore_index=0, label_smoothing=0.1).item()
    assert not math.isclose(loss, smoothed_over_pad, rel_tol=1e-4)


def test_recorded_attention_gives_the_weights_of_each_call():
    from coursekit.training import recorded_attention

    torch.manual_seed(0)
    attention = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
    q, kv = torch.randn(1, 3, 8), torch.randn(1, 5, 8)
    ignore = torch.tensor([[False, False, False, True, True]])
    with recorded_attention(attention) as calls:
        out, _ = attention(q, kv, kv, key_padding_mask=ignore, need_weights=False)
    _, expected = attention(q, kv, kv, key_padding_mask=ignore, average_attn_weights=False)
    assert len(calls) == 1 and calls[0].shape == (1, 2, 3, 5)
    torch.testing.assert_close(calls[0], expected)
    assert float(calls[0][..., 3:].abs().max()) == 0.0
    attention(q, kv, kv)
    assert len(calls) == 1, "the hook is removed after the block"
    with pytest.raises(TypeError, match="MultiheadAttention"):
        with recorded_attention(torch.nn.Linear(2, 2)):
            pass
