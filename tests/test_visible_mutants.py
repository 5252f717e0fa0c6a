"""A visible assert that names a property fails for every mutant that breaks the property.

The visible tests teach: "positions 0-2 may not see position 3 (causal mask)" tells a learner
that their block is causal. Such an assert must not pass a block with no mask (it did:
issue 33). For each property below, every mutant of the exercise's reference
(grader/checks/_mutants.py) is measured on fresh random inputs by an oracle of the property;
each mutant that breaks it is put in the solution notebook in place of the learner's
function, and the visible test cell must fail at that assert or at one before it (every such
mutant in `make test`; the first few, tests/scope.py's FEW, in the quick edit loop).
"""
from __future__ import annotations

import math
import re
import traceback
import warnings
from dataclasses import dataclass
from typing import Callable

import matplotlib
import nbformat
import numpy as np
import pytest
import torch

from grader import course
from grader.checks import get
from grader.checks._mutants import mutants
from tests.scope import FEW, slow_if_costly

HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS\n?", re.S)


def _np(x) -> np.ndarray:
    return x.detach().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


# --- oracles: implementation -> does it break the property? (fresh inputs, not the visible test's)

def _future_moves_past(make: Callable, run: Callable, perturb: Callable) -> Callable[[object], bool]:
    """Causality: random new values at the later positions change an earlier output."""
    def breaks(implementation) -> bool:
        torch.manual_seed(1)
        module = make(implementation)
        generator = torch.Generator().manual_seed(2)
        with torch.no_grad():
            before, after = run(module, perturb(generator, False)), run(module, perturb(generator, True))
        return not np.allclose(_np(before), _np(after), atol=1e-5)
    return breaks


def _block_input(generator, later: bool):
    x = torch.randn(2, 6, 12, generator=torch.Generator().manual_seed(3))
    if later:
        x[:, 3:] = torch.randn(2, 3, 12, generator=generator)
    return x


def _rows_sum_to_one(call: Callable, weights_of: Callable = lambda out: out[1]) -> Callable[[object], bool]:
    def breaks(implementation) -> bool:
        weights = _np(weights_of(call(implementation)))
        return not np.allclose(weights.sum(axis=-1), 1.0, atol=1e-5)
    return breaks


def _weight_on_later_keys(call: Callable) -> Callable[[object], bool]:
    def breaks(implementation) -> bool:
        weights = _np(call(implementation)[1])
        return bool(np.abs(np.triu(weights, k=1)).max() > 1e-6)
    return breaks


def _rng() -> np.random.Generator:
    return np.random.default_rng(7)


def _mha(implementation, mask_kind: str | None = None):
    torch.manual_seed(4)
    module = implementation(12, 3)
    x = torch.randn(2, 5, 12, generator=torch.Generator().manual_seed(5))
    mask = torch.tril(torch.ones(5, 5, dtype=torch.bool)) if mask_kind == "causal" else None
    with torch.no_grad():
        return module(x, x, x, mask) if mask is not None else module(x, x, x)


def _sdpa(causal: bool):
    def call(implementation):
        q, k, v = (_rng().normal(size=s) for s in [(2, 3, 5, 6)] * 2 + [(2, 3, 5, 7)])
        mask = np.tril(np.ones((5, 5), dtype=bool)) if causal else None
        return implementation(q, k * 1.3, v, mask=mask)
    return call


def _cached_differs(implementation) -> bool:
    """KV cache: the cached logits, a token at a time, differ from the model's own."""
    from grader.checks.reference.gpt import GPT

    torch.manual_seed(6)
    model = GPT(11, 12, 3, 20, layers=2, max_len=12).eval()
    ids = torch.randint(0, 11, (2, 7), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        full = model(ids)
        logits, cache = implementation(model, ids[:, :2])
        steps = [logits]
        for t in range(2, 7):
            logits, cache = implementation(model, ids[:, t:t + 1], cache)
            steps.append(logits)
    return not np.allclose(_np(torch.cat(steps, dim=1)), _np(full), atol=1e-4)


def _rotary_cache_differs(implementation) -> bool:
    """RoPE with a KV cache: a sequence fed in chunks (a cache between them) gives other outputs than
    the model without a cache (the reference's one call on the whole sequence)."""
    from grader.checks.reference.rope import rotary_attention_step

    q, k, v = (torch.as_tensor(_rng().normal(size=(2, 3, 7, 4))) for _ in range(3))
    outs, cache, start = [], None, 0
    with torch.no_grad():
        for size in (2, 1, 3, 1):
            out, cache = implementation(q[..., start:start + size, :], k[..., start:start + size, :],
                                        v[..., start:start + size, :], cache)
            outs.append(out)
            start += size
        return not np.allclose(_np(torch.cat(outs, dim=-2)), _np(rotary_attention_step(q, k, v)[0]), atol=1e-5)


def _batch_differs(implementation) -> bool:
    """Batched generation: some row of prompts of 3, 1 and 5 tokens differs from its prompt generated
    alone (the uncached model, greedy, pad_id after eos_id)."""
    from grader.checks.gpt import alone
    from grader.checks.reference.gpt import GPT

    torch.manual_seed(9)
    model = GPT(11, 12, 3, 20, layers=2, max_len=16).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(std=0.7, generator=torch.Generator().manual_seed(p.numel()))
    prompts = [torch.tensor(p) for p in ([1, 7, 3], [1], [1, 9, 4, 6, 8])]
    rows = [alone(model, p, 8, 5)[0] for p in prompts]
    expected = [row + [0] * (8 - len(row)) for row in rows]
    try:
        with torch.no_grad():
            got = implementation(model, prompts, 8, 5, 0)
        return _np(got).tolist() != expected
    except Exception:
        return True


def _beams_differ(implementation) -> bool:
    """Beam search with the cache: some hypothesis or score differs from beam_search without it (a random GPT,
    a prompt of 2 tokens, beams of 1 to 4, every token tried as EOS)."""
    from grader.checks.reference.gpt import GPT, beam_search

    torch.manual_seed(4)
    model = GPT(9, 12, 3, 20, layers=2, max_len=16).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(std=0.7, generator=torch.Generator().manual_seed(p.numel()))
    prompt = torch.tensor([1, 5])
    try:
        for beam in (1, 2, 4):
            for eos in range(9):
                got, want = implementation(model, prompt, beam, 6, eos, 0.6), beam_search(model, prompt, beam, 6, eos, 0.6)
                if _np(got[0]).tolist() != want[0].tolist() or abs(float(got[1]) - want[1]) > 1e-4:
                    return True
    except Exception:
        return True
    return False


def _skipped_tile_read(implementation) -> bool:
    """Tiled attention: a NaN in the value of a key that only tiles wholly above the diagonal hold
    reaches the queries before it (such tiles computed and masked, not skipped)."""
    q, k, v = (torch.as_tensor(_rng().normal(size=(1, 2, 8, 3))) for _ in range(3))
    v[..., 4, :] = float("nan")
    with torch.no_grad():
        return not bool(torch.isfinite(implementation(q, k, v, 2, 2, causal=True)[..., :4, :]).all())


def _heads_not_consecutive(implementation) -> bool:
    """Grouped-query attention: some query head reads another key/value head than h // group (the
    values of key/value head g all equal g, so each output names the head it read)."""
    q, k = torch.as_tensor(_rng().normal(size=(1, 6, 2, 4))), torch.as_tensor(_rng().normal(size=(1, 2, 3, 4)))
    v = torch.arange(2, dtype=torch.float64).reshape(1, 2, 1, 1).expand(1, 2, 3, 1)
    with torch.no_grad():
        read = implementation(q, k, v)[0, :, :, 0]
    return not np.allclose(_np(read), (np.arange(6) // 3)[:, None], atol=1e-6)


def _gradients_differ(implementation) -> bool:
    """FlashAttention's backward: some gradient differs from autograd's through the naive attention,
    with or without the causal mask (aligned bottom-right), 5 queries over 7 keys in tiles of 2 by 3."""
    from grader.checks.reference.efficient_attention import causal_lower_right, flash_forward

    q, k, v = (torch.as_tensor(_rng().normal(size=(1, 2, n, d))) for n, d in ((5, 3), (7, 3), (7, 4)))
    grad_out = torch.as_tensor(_rng().normal(size=(1, 2, 5, 4)))
    for causal in (False, True):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        scores = leaves[0] @ leaves[1].transpose(-2, -1) / math.sqrt(3)
        if causal:
            scores = scores.masked_fill(~causal_lower_right(5, 7), float("-inf"))
        want = torch.autograd.grad(torch.softmax(scores, dim=-1) @ leaves[2], leaves, grad_out)
        with torch.no_grad():
            got = implementation(q, k, v, *flash_forward(q, k, v, 2, 3, causal), grad_out, 2, 3, causal=causal)
        if not all(np.allclose(_np(g), _np(w), atol=1e-6) for g, w in zip(got, want)):
            return True
    return False


def _window_outputs_differ(implementation) -> bool:
    """The rolling buffer: some step's output differs from attention with the sliding-window mask."""
    from grader.checks.reference.efficient_attention import sliding_window_mask

    q, k, v = (torch.as_tensor(_rng().normal(size=(2, 9, d))) for d in (3, 3, 4))
    with torch.no_grad():
        got = implementation(q, k, v, 4)[0]
        scores = (q @ k.transpose(-2, -1) / math.sqrt(3)).masked_fill(~torch.from_numpy(sliding_window_mask(9, 4)),
                                                                       float("-inf"))
        return not np.allclose(_np(got), _np(torch.softmax(scores, dim=-1) @ v), atol=1e-6)


def _rms_not_one(implementation) -> bool:
    """RMSNorm with weight 1: a token of RMS well above sqrt(eps) comes out with RMS 1."""
    x = torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(4)) * 3 + 1
    with torch.no_grad():
        out = implementation(8)(x)
    return tuple(out.shape) != (3, 5, 8) or not np.allclose(_np(out.pow(2).mean(-1)), 1.0, atol=1e-4)


def _swiglu_differs(implementation) -> bool:
    """SwiGLU: W_down(silu(W_gate(x)) * W_up(x)) with random weights loaded by name."""
    from grader.checks.reference.modern_decoder import SwiGLU

    torch.manual_seed(5)
    reference = SwiGLU(6, 10)
    module = implementation(6, 10)
    try:
        module.load_state_dict(reference.state_dict())
    except Exception:
        return True
    x = torch.randn(2, 4, 6, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        got = module(x)
        return not isinstance(got, torch.Tensor) or got.shape != x.shape or not torch.allclose(got, reference(x),
                                                                                                atol=1e-5)


def _chunks_differ(module, x) -> bool:
    """x (batch, 7, d_model) fed 3 + 1 + 3 tokens, each call handed the cache the previous one returned,
    gives other outputs than the module's one call on the whole of x."""
    with torch.no_grad():
        want = module(x)[0]
        outs, cache, start = [], None, 0
        for size in (3, 1, 3):
            out, cache = module(x[:, start:start + size], cache)
            outs.append(out)
            start += size
    return not np.allclose(_np(torch.cat(outs, dim=1)), _np(want), atol=1e-4)


def _attention_cache_differs(implementation) -> bool:
    """Llama/Qwen3 attention with a KV cache: a sequence fed 3 + 1 + 3 tokens (a cache between the calls)
    gives other outputs than the same module's one call on the whole sequence (weights drawn by the reference)."""
    from grader.checks.reference.modern_decoder import Attention

    torch.manual_seed(7)
    reference = Attention(12, 6, 2, 4, qk_norm=True)
    for p in reference.parameters():
        torch.nn.init.normal_(p)
    module = implementation(12, 6, 2, 4, qk_norm=True)
    try:
        module.load_state_dict(reference.state_dict())
    except Exception:
        return True
    return _chunks_differ(module, torch.randn(2, 7, 12, generator=torch.Generator().manual_seed(8)))


def _latent(implementation, seed: int):
    """DeepSeek-V2's latent attention (16, heads 4, kv_rank 6, nope 2, rope 4, v 5) with the reference's weights
    drawn from ``seed``, or None when they do not load."""
    from grader.checks.reference.serving import LatentAttention

    torch.manual_seed(seed)
    reference = LatentAttention(16, 4, 6, 2, 4, 5)
    for p in reference.parameters():
        torch.nn.init.normal_(p)
    module = implementation(16, 4, 6, 2, 4, 5)
    try:
        module.load_state_dict(reference.state_dict())
    except Exception:
        return None
    return module


def _latent_cache_differs(implementation) -> bool:
    """Latent attention with its cache: a sequence fed 3 + 1 + 3 tokens gives other outputs than one call."""
    module = _latent(implementation, 10)
    if module is None:
        return True
    return _chunks_differ(module, torch.randn(2, 7, 16, generator=torch.Generator().manual_seed(11)))


def _latent_rope_not_interleaved(implementation) -> bool:
    """The RoPE key (1, 0, 0, 0) from W_dkv at every token (theta_0 = 1): its cached rotation at position 1 is
    not (cos 1, sin 1, 0, 0)."""
    module = _latent(implementation, 12)
    if module is None:
        return True
    with torch.no_grad():
        module.W_dkv.weight.zero_()
        module.W_dkv.weight[6, 0] = 1.0
        rotated = module(torch.eye(16)[:1].expand(2, 16)[None])[1][1]
    want = np.array([math.cos(1), math.sin(1), 0.0, 0.0])
    return not np.allclose(_np(rotated)[0, 1], want, atol=1e-5)


def _first_token_not_target(implementation) -> bool:
    """Speculative sampling's first token, every draft and every uniform enumerated on fresh q and p
    (k = 2, V = 4): its distribution is not the target's p[0]."""
    from coursekit.drivers.serving import output_distribution

    rng = np.random.default_rng(13)
    q, p = (torch.tensor(rng.dirichlet(np.ones(4), size=rows)) for rows in (2, 3))
    first = np.zeros(4)
    for draft in np.ndindex(4, 4):
        weight = float(q[0, draft[0]] * q[1, draft[1]])
        for tokens, share in output_distribution(implementation, torch.tensor(draft), q, p).items():
            first[tokens[0]] += weight * share
    return not np.allclose(first, _np(p[0]), atol=1e-9)


def _paged_out_of_order(implementation) -> bool:
    """A paged cache of 8 blocks of 2 tokens, one head of one number (the visible test's layout): after
    appends to 'a' and 'b' in turn, 'a' does not gather its keys in the order appended."""
    cache = implementation(8, block_size=2, heads=1, d_k=1)
    appended = []
    for name, n in (("a", 3), ("b", 1), ("a", 2), ("b", 2), ("a", 1)):
        keys = torch.randn(1, n, 1, generator=torch.Generator().manual_seed(n + len(appended)))
        cache.append(name, keys, -keys)
        if name == "a":
            appended.append(keys)
    return not np.allclose(_np(cache.gather("a")[0]).ravel(), _np(torch.cat(appended, dim=1)).ravel())


def _sink_streams(implementation) -> tuple:
    """((cache, last output), the reference's (cache, last output)) after 9 random tokens (2 query heads over 1
    key/value head of head_dim 4) through a SinkCache with n_sink 2 and window 3."""
    from grader.checks.reference.serving import SinkCache

    def stream(cls):
        generator = torch.Generator().manual_seed(19)
        cache = cls(2, 3)
        for _ in range(9):
            q = torch.randn(1, 2, 1, 4, generator=generator)
            k, v = torch.randn(1, 1, 1, 4, generator=generator), torch.randn(1, 1, 1, 4, generator=generator)
            out = cache.attend(q, k, v)
        return cache, out
    return stream(implementation), stream(SinkCache)


def _sinks_not_kept(implementation) -> bool:
    """After 9 tokens with n_sink 2 and window 3, the cache does not hold tokens 0, 1 (the sinks) and 6, 7, 8."""
    (cache, _), (reference, _) = _sink_streams(implementation)
    return tuple(cache.values.shape) != tuple(reference.values.shape) or not np.allclose(
        _np(cache.values), _np(reference.values))


def _sink_output_differs(implementation) -> bool:
    """The last output after 9 tokens (n_sink 2, window 3) is not the reference's: keys at their places in the
    cache, the query at the last."""
    (_, out), (_, expected) = _sink_streams(implementation)
    return not np.allclose(_np(out), _np(expected), atol=1e-5)


def _attention_groups_not_consecutive(implementation) -> bool:
    """Grouped-query heads: with the values of key/value head 1 zero and W_o the identity, query heads 2
    and 3 of 4 (over 2 key/value heads) should come out zero, heads 0 and 1 not."""
    torch.manual_seed(9)
    module = implementation(8, 4, 2, 2)
    with torch.no_grad():
        module.W_q.weight.normal_()
        module.W_k.weight.normal_()
        module.W_v.weight.copy_(torch.cat([torch.rand(2, 8) + 0.5, torch.zeros(2, 8)]))
        module.W_o.weight.copy_(torch.eye(8))
        out = module(torch.rand(1, 3, 8) + 0.5)[0][0].reshape(3, 4, 2)
    return (out.abs().sum((0, 2)) > 0).tolist() != [True, True, False, False]


def _layer_not_residual(implementation) -> bool:
    """The block's residual stream: with W_o and W_down zero, both sublayers add 0 and the block returns x."""
    torch.manual_seed(10)
    module = implementation(12, 6, 2, 4, 20, qk_norm=True)
    x = torch.randn(2, 5, 12, generator=torch.Generator().manual_seed(11)) + 1.0
    with torch.no_grad():
        for p in module.parameters():
            p.normal_()
        module.attention.W_o.weight.zero_()
        module.mlp.W_down.weight.zero_()
        return not np.allclose(_np(module(x)[0]), _np(x), atol=1e-6)


def _model_cache_differs(implementation) -> bool:
    """The Llama/Qwen3 model with a cache per layer: 3 + 1 + 1 tokens with the caches give other logits than one
    call on the whole sequence (weights drawn by the reference)."""
    from grader.checks.reference.modern_decoder import Model

    torch.manual_seed(12)
    reference = Model(11, 12, 2, 6, 2, 4, 20)
    for p in reference.parameters():
        torch.nn.init.normal_(p)
    module = implementation(11, 12, 2, 6, 2, 4, 20)
    try:
        module.load_state_dict(reference.state_dict())
    except Exception:
        return True
    ids = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(13))
    with torch.no_grad():
        whole = module(ids)[0]
        first, cache = module(ids[:, :3])
        fourth, cache = module(ids[:, 3:4], cache)
        fifth, _ = module(ids[:, 4:], cache)
    return not np.allclose(_np(torch.cat([first, fourth, fifth], dim=1)), _np(whole), atol=1e-3)


def _moe_differs(implementation) -> bool:
    """Qwen3-MoE's block with norm_topk_prob: each token's top-2 of 4 experts, the weights renormalised, the
    experts' outputs summed with them (the reference's weights loaded by name, a random batch)."""
    from grader.checks.reference.modern_decoder import SparseMoE

    torch.manual_seed(12)
    reference = SparseMoE(3, 5, 4, 2)
    module = implementation(3, 5, 4, 2)
    try:
        module.load_state_dict(reference.state_dict())
    except Exception:
        return True
    x = torch.randn(2, 6, 3, generator=torch.Generator().manual_seed(13))
    with torch.no_grad():
        got = module(x)[0]
        return not isinstance(got, torch.Tensor) or got.shape != x.shape or not torch.allclose(got, reference(x)[0],
                                                                                                atol=1e-5)


@dataclass(frozen=True)
class Property:
    exercise: str
    label: str  # the start of the visible assert's message that names the property
    breaks: Callable[[object], bool]


PROPERTIES = (
    Property("gpt-Block", "positions 0-2 may not see position 3 (causal mask)",
             _future_moves_past(lambda impl: impl(12, 3, 20).eval(), lambda m, x: m(x)[:, :3], _block_input)),
    Property("gpt-forward_cached", "step ", _cached_differs),
    Property("rope-rotary_attention_step", "tokens with the cache: ", _rotary_cache_differs),
    Property("gpt-generate_batch", "alone writes", _batch_differs),
    Property("gpt-beam_search_cached", "eos_id {eos}: beam_search finds", _beams_differ),
    Property("multi_head-MultiHeadAttention", "causal mask: no weight on later keys",
             _weight_on_later_keys(lambda impl: _mha(impl, "causal"))),
    Property("softmax-scaled_dot_product_attention", "each query's weights sum to 1",
             _rows_sum_to_one(_sdpa(causal=True))),
    Property("softmax-scaled_dot_product_attention", "causal mask: no weight on later keys",
             _weight_on_later_keys(_sdpa(causal=True))),
    Property("similarity-soft_lookup", "each query's weights sum to 1",
             _rows_sum_to_one(lambda impl: impl(_rng().normal(size=(3, 4)), _rng().normal(size=(4, 2))))),
    Property("masking-masked_softmax", "each row of weights sums to 1",
             _rows_sum_to_one(lambda impl: impl(_rng().normal(size=(2, 4, 4)), np.tril(np.ones((4, 4), bool))),
                              weights_of=lambda out: out)),
    Property("masking-masked_softmax", "masked keys get weight 0",
             _weight_on_later_keys(lambda impl: (None, impl(_rng().normal(size=(2, 4, 4)),
                                                            np.tril(np.ones((4, 4), bool)))))),
    Property("efficient_attention-online_softmax", "the weights sum to 1 when the largest score comes last",
             _rows_sum_to_one(lambda impl: impl(np.array([0.5, -1.0, 2.0, 20.0]), 1), weights_of=lambda out: out)),
    Property("efficient_attention-tiled_attention", "a NaN in the value of key 8 reached queries 0-7",
             _skipped_tile_read),
    Property("efficient_attention-grouped_query_attention", "query head {h} attends with key/value head",
             _heads_not_consecutive),
    Property("efficient_attention-flash_backward", "yours vs autograd through the naive attention",
             _gradients_differ),
    Property("efficient_attention-rolling_cache_attention", "every step's output vs attention with the",
             _window_outputs_differ),
    Property("modern_decoder-RMSNorm", "with weight 1 every token comes out with RMS 1", _rms_not_one),
    Property("modern_decoder-SwiGLU", "W_up = 2 I doubles the output", _swiglu_differs),
    Property("modern_decoder-Attention", "tokens 4-6 after a cache of 4", _attention_cache_differs),
    Property("modern_decoder-Attention", "4 query heads over 2 key/value heads", _attention_groups_not_consecutive),
    Property("modern_decoder-DecoderLayer", "W_o and W_down zero: both sublayers add 0", _layer_not_residual),
    Property("modern_decoder-Model", "3 tokens, then 1 and 1 with the caches", _model_cache_differs),
    Property("modern_decoder-SparseMoE", "logits (2, 1, 0, -1), top 2, renormalised", _moe_differs),
    Property("serving-speculative_step", "the first token of a step, over every draft and every uniform",
             _first_token_not_target),
    Property("serving-PagedKVCache", "gather('a') gives its keys in the order appended", _paged_out_of_order),
    Property("serving-LatentAttention", "tokens 4-6 after a cache of 4", _latent_cache_differs),
    Property("serving-LatentAttention", "the RoPE key (1, 0, 0, 0) at position 1", _latent_rope_not_interleaved),
    Property("serving-SinkCache", "after 6 tokens the cache holds token 0 (the sink) and the last 2", _sinks_not_kept),
    Property("serving-SinkCache", "keys at places 0, 1, 2 of the cache and the query at 2", _sink_output_differs),
    Property("masking-causal_mask", "above the diagonal must be False",
             lambda impl: bool(np.triu(_np(impl(6)), k=1).any())),
)


def _test_cell(exercise: str) -> tuple[str, str, list]:
    """(assignment, the visible part of the exercise's test cell, the cells above it)."""
    for assignment in course.assignments():
        cells = nbformat.read(course.SOLUTIONS / assignment / f"{assignment}.ipynb", as_version=4).cells
        for index, cell in enumerate(cells):
            if cell.metadata.get("nbgrader", {}).get("grade_id", "") == f"{exercise}{course.TEST_SUFFIX}":
                return assignment, HIDDEN.sub("", cell.source), cells[:index]
    raise LookupError(exercise)


def _namespace(cells: list, monkeypatch) -> dict:
    """The notebook's state above a test cell as the autograder leaves it, run in process (hidden
    tests left out, figures off, NBGRADER_EXECUTION set: no demo trains a model)."""
    import matplotlib.pyplot as plt

    matplotlib.use("Agg")
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    namespace: dict = {}
    for cell in cells:
        if cell.cell_type == "code":
            exec(compile(HIDDEN.sub("", cell.source), cell.get("id", "cell"), "exec"), namespace)
            plt.close("all")
    return namespace


def _assert_line(source: str, label: str) -> int:
    """The line of the cell where the assert naming the property starts."""
    lines = source.splitlines()
    found = [i + 1 for i, line in enumerate(lines) if label in line]
    assert found, f"no visible assert names {label!r}"
    start = found[0]
    while not re.match(r"\s*(assert\b|assert_close\(|assert_shape\()", lines[start - 1]) and start > 1:
        start -= 1
    return start


def _failing_line(error: BaseException, filename: str) -> int | None:
    lines = [frame.lineno for frame in traceback.extract_tb(error.__traceback__) if frame.filename == filename]
    return lines[-1] if lines else None


def _cases():
    for prop in PROPERTIES:
        assignment = _test_cell(prop.exercise)[0]
        yield slow_if_costly(assignment, prop, id=f"{prop.exercise}: {prop.label[:40]}")


@pytest.mark.parametrize("prop", list(_cases()))
def test_a_visible_assert_naming_a_property_fails_for_every_mutant_that_breaks_it(prop, monkeypatch):
    spec = get(prop.exercise)
    assignment, source, above = _test_cell(prop.exercise)
    line = _assert_line(source, prop.label)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        namespace = _namespace(above, monkeypatch)
        broken = []
        for mutant in mutants(spec):
            if FEW and len(broken) >= FEW:
                break
            try:
                implementation = mutant.implementation.get()
                if not prop.breaks(implementation):
                    continue
            except Exception:
                continue  # (the property is not even defined: the mutant fails on shapes or raises)
            broken.append(mutant.name)
            scope = dict(namespace, **{spec.function: implementation})
            filename = f"{prop.exercise}-visible-test"
            try:
                exec(compile(source, filename, "exec"), scope)
            except AssertionError as error:
                failed_at = _failing_line(error, filename)
                assert failed_at is not None and failed_at <= line, (
                    f"{mutant.name}: the visible test failed only at line {failed_at}, after the assert "
                    f"{prop.label!r} (line {line}), which passed")
                continue
            except Exception:
                continue  # the cell raised before its asserts: the learner sees an error, not a pass
            pytest.fail(f"{mutant.name} breaks {prop.label!r}, yet the visible test cell passes")
    assert broken, f"no mutant of {prop.exercise} breaks {prop.label!r}: the oracle or the operators are wrong"
