"""Read-only cells assembled from other notebooks' cells at release: code written once.

Notebook 09 builds its Transformer from the pieces learners wrote in notebooks 03-08,
notebook 07's Encoder uses 05's positional encoding, notebook 08's decoder 03's masks and
05's encoding, notebook 10 trains its Transformer with 05's encoding and 09's loss and
learning-rate schedule, and notebook 12's GPT is made of 03's, 06's and 07's pieces and reads
text through 11's byte-pair encoding; notebook 13 rotates 06's attention and trains 12's blocks
beside 05's encoding, and notebook 14 measures 06's attention and compares with 04's stable
softmax; notebook 15 trains its modern model beside 12's GPT, on 12's corpus, and notebook 16
serves a model made of 15's layers. Their helper cells are not typed again: ``course-grader release``
(``make release``)
copies the earlier notebooks' own cells into them (d2l's ``#@save``, done at release),
rewrites the cells in ``solutions/`` and then lets nbgrader generate the student versions,
so the instructor's source, the student version and ``nbgrader generate_assignment`` agree.

Each piece is one cell (its nbgrader grade_id) of one source notebook, with nbgrader's
solution markers dropped, or some top-level definitions of it. A numpy solution (notebooks
03 and 05) is used as it is and wrapped by ``coursekit.returns_tensor``, because the model
needs tensors; its wrap line is the only code the assembly adds.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import nbformat

from . import course

SOLUTION_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")
PIECE_HEADER = "# ---- from notebook {assignment}, cell {cell}{names} ----"


@dataclass(frozen=True)
class Piece:
    """One cell of a source notebook (or some of its top-level definitions).

    ``tensor_dtype``: None for torch code; for a numpy function, "bool" or "float32", the
    dtype of the tensor ``coursekit.returns_tensor`` makes of its result.
    """
    assignment: str
    cell: str
    names: tuple[str, ...] = ()
    tensor_dtype: str | None = None


@dataclass(frozen=True)
class Assembly:
    """A read-only cell (grade_id ``cell`` of ``assignment``): ``intro`` comments, then the pieces."""
    assignment: str
    cell: str
    intro: str
    pieces: tuple[Piece, ...]


# Pieces that more than one assembled cell copies, in the order the cells hold them.
BPE_PIECES = (      # notebook 11's byte-pair encoding, with its helpers cell
    Piece("11_tokenization", "tokenization-helpers"),
    Piece("11_tokenization", "tokenization-count_pairs"),
    Piece("11_tokenization", "tokenization-merge_pair"),
    Piece("11_tokenization", "tokenization-train_bpe"),
    Piece("11_tokenization", "tokenization-bpe_encode"),
    Piece("11_tokenization", "tokenization-bpe_decode"),
)
ATTENTION_PIECES = (    # notebook 03's causal mask and notebook 06's multi-head attention
    Piece("03_masking", "masking-causal_mask", tensor_dtype="bool"),
    Piece("06_multi_head", "multi_head-split_heads"),
    Piece("06_multi_head", "multi_head-merge_heads"),
    Piece("06_multi_head", "multi_head-helpers", names=("scaled_dot_product_attention",)),
    Piece("06_multi_head", "multi_head-MultiHeadAttention"),
)

ASSEMBLIES = (
    Assembly(
        "07_encoder", "encoder-helpers",
        "# Read-only helper: sinusoidal_encoding of notebook 05, returning a float32 tensor (the Encoder\n"
        "# registers it as a buffer).\n"
        "# Generated, do not edit: made by `make release` from the solution cell named below;\n"
        "# change it there and release again.\n"
        "from coursekit import returns_tensor",
        (Piece("05_positional_encoding", "positional_encoding-sinusoidal_encoding", tensor_dtype="float32"),),
    ),
    Assembly(
        "08_decoder", "decoder-helpers",
        "# Read-only helpers: the causal mask of notebook 03, its conversion to the attn_mask of\n"
        "# nn.MultiheadAttention (notebook 03, section 7) and the sinusoidal encoding of notebook 05,\n"
        "# returning tensors.\n"
        "# Generated, do not edit: made by `make release` from the solution cells named below;\n"
        "# change a piece there and release again.\n"
        "from coursekit import returns_tensor",
        (
            Piece("03_masking", "masking-causal_mask", tensor_dtype="bool"),
            Piece("03_masking", "masking-pytorch", names=("torch_attn_mask",)),
            Piece("05_positional_encoding", "positional_encoding-sinusoidal_encoding", tensor_dtype="float32"),
        ),
    ),
    Assembly(
        "09_transformer", "transformer-helpers",
        "# Read-only helpers: the pieces of notebooks 03, 05, 07 and 08 that the model is made of.\n"
        # `make release`, not `course-grader release`: a student version names no instructor module
        "# Generated, do not edit: made by `make release` from the solution cells named below;\n"
        "# change a piece there and release again.\n"
        "# Mask convention of this course: True = may attend / real token. torch's attn_mask and\n"
        "# key_padding_mask use the opposite (True = IGNORE), hence the ~ where torch is called.\n"
        "from coursekit import returns_tensor",
        (
            Piece("03_masking", "masking-causal_mask", tensor_dtype="bool"),
            Piece("05_positional_encoding", "positional_encoding-sinusoidal_encoding", tensor_dtype="float32"),
            Piece("07_encoder", "encoder-sublayer_connection"),
            Piece("07_encoder", "encoder-EncoderLayer"),
            Piece("03_masking", "masking-pytorch", names=("torch_attn_mask",)),
            Piece("08_decoder", "decoder-DecoderLayer"),
        ),
    ),
    Assembly(
        "10_seq2seq_rnn", "seq2seq_rnn-recipe-helpers",
        "# Read-only helpers: the positional encoding of notebook 05, and the loss and learning-rate\n"
        "# schedule of notebook 09, for the Transformer that trains beside the GRUs below.\n"
        "# Generated, do not edit: made by `make release` from the solution cells named below;\n"
        "# change a piece there and release again.\n"
        "from coursekit import returns_tensor",
        (
            Piece("05_positional_encoding", "positional_encoding-sinusoidal_encoding", tensor_dtype="float32"),
            Piece("09_transformer", "transformer-label_smoothed_loss"),
            Piece("09_transformer", "transformer-noam_lr"),
        ),
    ),
    Assembly(
        "12_gpt", "gpt-bpe-helpers",
        "# Read-only helpers: byte-pair encoding, your solutions of notebook 11, with its helpers cell.\n"
        "# Generated, do not edit: made by `make release` from the cells named below;\n"
        "# change a piece there and release again.",
        BPE_PIECES,
    ),
    Assembly(
        "12_gpt", "gpt-model-helpers",
        "# Read-only helpers: the pieces of notebooks 03, 06 and 07 that a GPT block is made of.\n"
        "# Generated, do not edit: made by `make release` from the solution cells named below;\n"
        "# change a piece there and release again.\n"
        "# Mask convention of this course: True = may attend.\n"
        "from coursekit import returns_tensor",
        (
            *ATTENTION_PIECES,
            Piece("06_multi_head", "multi_head-load_torch_weights"),
            Piece("07_encoder", "encoder-sublayer_connection"),
        ),
    ),
    Assembly(
        "13_rope", "rope-helpers",
        "# Read-only helpers: your solutions of notebooks 03, 05, 06, 07 and 12 that this notebook builds on.\n"
        "# Generated, do not edit: made by `make release` from the solution cells named below;\n"
        "# change a piece there and release again.\n"
        "# Mask convention of this course: True = may attend.\n"
        "from coursekit import returns_tensor",
        (
            Piece("05_positional_encoding", "positional_encoding-sinusoidal_encoding", tensor_dtype="float32"),
            Piece("05_positional_encoding", "positional_encoding-shift_matrix"),
            Piece("03_masking", "masking-causal_mask", tensor_dtype="bool"),
            Piece("06_multi_head", "multi_head-split_heads"),
            Piece("06_multi_head", "multi_head-merge_heads"),
            Piece("06_multi_head", "multi_head-helpers", names=("scaled_dot_product_attention",)),
            Piece("06_multi_head", "multi_head-MultiHeadAttention"),
            Piece("07_encoder", "encoder-sublayer_connection"),
            Piece("12_gpt", "gpt-Block"),
        ),
    ),
    Assembly(
        "14_efficient_attention", "efficient_attention-helpers",
        "# Read-only helpers: stable_softmax of notebook 04 (numpy), and scaled dot-product attention in\n"
        "# PyTorch as notebook 06 gives it, the naive attention that this notebook measures.\n"
        "# Generated, do not edit: made by `make release` from the cells named below;\n"
        "# change them there and release again.",
        (
            Piece("04_softmax", "softmax-stable_softmax"),
            Piece("06_multi_head", "multi_head-helpers", names=("scaled_dot_product_attention",)),
        ),
    ),
    Assembly(
        "15_modern_decoder", "modern_decoder-demo-gpt-helpers",
        "# Read-only helpers for section 8: notebook 12's GPT as you wrote it, with the pieces of notebooks 03, 06\n"
        "# and 07 it is made of, its next-token loss, its corpus in your byte-pair tokens (notebook 11), its batches.\n"
        "# Generated, do not edit: made by `make release` from the cells named below;\n"
        "# change a piece there and release again. Building the corpus takes a few seconds; the cell above\n"
        "# imported coursekit.translation as tt. Mask convention of this course: True = may attend.\n"
        "from coursekit import returns_tensor",
        (
            *BPE_PIECES,
            *ATTENTION_PIECES,
            Piece("07_encoder", "encoder-sublayer_connection"),
            Piece("12_gpt", "gpt-Block"),
            Piece("12_gpt", "gpt-GPT"),
            Piece("12_gpt", "gpt-next_token_loss"),
            Piece("12_gpt", "gpt-corpus"),
            Piece("12_gpt", "gpt-demo-train", names=("batches",)),
        ),
    ),
    Assembly(
        "16_serving", "serving-helpers",
        "# Read-only helpers: your RMSNorm, SwiGLU, Attention and DecoderLayer of notebook 15, the layers of the\n"
        "# model this notebook serves.\n"
        "# Generated, do not edit: made by `make release` from the solution cells named below;\n"
        "# change a piece there and release again.",
        (
            Piece("15_modern_decoder", "modern_decoder-RMSNorm"),
            Piece("15_modern_decoder", "modern_decoder-SwiGLU"),
            Piece("15_modern_decoder", "modern_decoder-Attention"),
            Piece("15_modern_decoder", "modern_decoder-DecoderLayer"),
        ),
    ),
)


def notebook_path(assignment: str, root: Path | None = None) -> Path:
    """The source notebook of ``assignment`` under ``root`` (default: solutions/)."""
    return (root or course.SOLUTIONS) / assignment / f"{assignment}.ipynb"


def find_cell(nb, grade_id: str):
    """The cell of ``nb`` whose nbgrader grade_id is ``grade_id``.

    Raises:
        KeyError: no cell has that grade_id.
    """
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            return cell
    raise KeyError(f"no cell with grade_id {grade_id!r}")


def without_markers(source: str) -> str:
    """A solution cell's code as the solution reads: nbgrader's solution marker lines dropped."""
    return "\n".join(line for line in source.splitlines() if line.strip() not in SOLUTION_MARKERS)


def definitions(source: str, names: tuple[str, ...]) -> str:
    """The top-level definitions ``names`` of ``source``, decorators and all, in that order.

    Raises:
        KeyError: ``source`` defines no function or class of one of the names.
    """
    lines = source.splitlines()
    nodes = {n.name: n for n in ast.parse(source).body
             if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    parts = []
    for name in names:
        if name not in nodes:
            raise KeyError(f"the cell defines no {name!r} at its top level")
        node = nodes[name]
        start = min([node.lineno] + [d.lineno for d in node.decorator_list])
        parts.append("\n".join(lines[start - 1:node.end_lineno]))
    return "\n\n\n".join(parts)


def defined_names(source: str) -> list[str]:
    """The functions and classes ``source`` defines at its top level, in order.

    Raises:
        SyntaxError: ``source`` is not Python.
    """
    return [n.name for n in ast.parse(source).body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


def piece_code(piece: Piece, root: Path | None = None) -> str:
    """The code of ``piece`` as its own notebook holds it (solution markers dropped).

    Raises:
        FileNotFoundError: the piece's notebook does not exist.
        KeyError: the notebook has no such cell, or the cell no such definition.
    """
    cell = find_cell(nbformat.read(notebook_path(piece.assignment, root), as_version=4), piece.cell)
    code = without_markers(cell.source)
    return definitions(code, piece.names) if piece.names else code.strip("\n")


def wrap_line(piece: Piece, code: str) -> str:
    """The line that makes a numpy piece's function return a tensor, or "" for torch code.

    Raises:
        ValueError: a numpy piece defines other than exactly one function.
    """
    if piece.tensor_dtype is None:
        return ""
    names = defined_names(code)
    if len(names) != 1:
        raise ValueError(f"{piece.cell}: a numpy piece must define one function, not {names}")
    return f"{names[0]} = returns_tensor({names[0]}, torch.{piece.tensor_dtype})"


def piece_header(piece: Piece) -> str:
    """The comment above a piece, naming where it comes from."""
    names = f" ({', '.join(piece.names)})" if piece.names else ""
    numpy = " (numpy: returns_tensor wraps it)" if piece.tensor_dtype else ""
    return PIECE_HEADER.format(assignment=piece.assignment, cell=piece.cell, names=names + numpy)


def assembled_source(assembly: Assembly, root: Path | None = None) -> str:
    """The source of ``assembly``'s cell: the intro, then each piece under its header.

    Raises:
        FileNotFoundError, KeyError, ValueError: as ``piece_code`` and ``wrap_line``.
    """
    blocks = [assembly.intro]
    for piece in assembly.pieces:
        code = piece_code(piece, root)
        wrap = wrap_line(piece, code)
        blocks.append(piece_header(piece) + "\n" + code + (f"\n\n\n{wrap}" if wrap else ""))
    return "\n\n\n".join(blocks) + "\n"


def stale(root: Path | None = None) -> list[str]:
    """The assembled cells whose source in ``root`` (default: solutions/) is not what
    ``assembled_source`` makes, as "assignment:cell".

    Raises:
        FileNotFoundError, KeyError, ValueError: as ``assembled_source``.
    """
    out = []
    for assembly in ASSEMBLIES:
        cell = find_cell(nbformat.read(notebook_path(assembly.assignment, root), as_version=4), assembly.cell)
        if cell.source != assembled_source(assembly, root):
            out.append(f"{assembly.assignment}:{assembly.cell}")
    return out


def update_sources(root: Path | None = None) -> list[Path]:
    """Rewrite every assembled cell in the source notebooks under ``root`` (default:
    solutions/) that is out of date; returns the notebooks written. The cell keeps its id,
    metadata (read-only, grade_id) and place.

    Raises:
        FileNotFoundError, KeyError, ValueError: as ``assembled_source``.
    """
    written = []
    for assembly in ASSEMBLIES:
        path = notebook_path(assembly.assignment, root)
        nb = nbformat.read(path, as_version=4)
        cell = find_cell(nb, assembly.cell)
        source = assembled_source(assembly, root)
        if cell.source != source:
            cell.source = source
            nbformat.write(nb, path)
            written.append(path)
    return written


def answers_copied(assignment: str, root: Path | None = None) -> dict[str, list[str]]:
    """The earlier assignments whose answers ``assignment``'s read-only cells hold, read from
    ``ASSEMBLIES``: each copied assignment (sorted) -> its solution cells that are copied.

    A piece that is a solution cell (nbgrader's ``solution``) of its notebook in ``root``
    (default: solutions/) is an answer; a locked helper cell that is copied is not. A piece
    that is itself an assembled cell brings what that cell copies, so a chain of copies is
    followed to the answers at its end.

    Raises:
        FileNotFoundError, KeyError: as ``piece_code``: a piece's notebook or cell is gone.
    """
    assemblies = {(a.assignment, a.cell): a for a in ASSEMBLIES}
    notebooks: dict[str, nbformat.NotebookNode] = {}
    copied: dict[str, list[str]] = {}

    def visit(assembly: Assembly, seen: frozenset) -> None:
        for piece in assembly.pieces:
            key = (piece.assignment, piece.cell)
            if key in assemblies and key not in seen:
                visit(assemblies[key], seen | {key})
                continue
            if piece.assignment not in notebooks:
                notebooks[piece.assignment] = nbformat.read(notebook_path(piece.assignment, root), as_version=4)
            cell = find_cell(notebooks[piece.assignment], piece.cell)
            if piece.assignment == assignment or not cell.metadata.get("nbgrader", {}).get("solution"):
                continue
            cells = copied.setdefault(piece.assignment, [])
            if piece.cell not in cells:
                cells.append(piece.cell)

    for assembly in ASSEMBLIES:
        if assembly.assignment == assignment:
            visit(assembly, frozenset({(assembly.assignment, assembly.cell)}))
    return dict(sorted(copied.items()))
