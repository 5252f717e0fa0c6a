"""Mistake and variant cases of notebook 16's checks, run in process (no kernel).

Every mistake must be rejected with its own diagnosis; every valid alternative must score
full marks (exercise-standard.md, item 6). speculative_step goes through the driver of
coursekit/drivers/serving.py (a seeded generator; the exact distribution by enumeration), as it
does while grading. 3 seeds.
"""
from __future__ import annotations

import pytest
import torch

from tests.check_cases import shared_tests
from tests.conftest import solution_namespace


@pytest.fixture(scope="module")
def serving_notebook() -> dict:
    """The reference solutions of notebook 16."""
    return solution_namespace("16_serving")


# ---------------------------------------------------------------- speculative_step

def _pick(w, u):
    cdf = torch.cumsum(w, 0) / w.sum()
    return torch.searchsorted(cdf, u.reshape(1), right=True).clamp(max=len(w) - 1)


def ratio_inverted(draft_tokens, q, p, generator):
    k = len(draft_tokens)
    u = torch.rand(k + 1, generator=generator, dtype=torch.float64)
    for i in range(k):
        x = draft_tokens[i]
        if u[i] >= min(1.0, float(q[i, x] / p[i, x])):
            return torch.cat([draft_tokens[:i], _pick(torch.clamp(p[i] - q[i], min=0), u[k])])
    return torch.cat([draft_tokens, _pick(p[k], u[k])])


def residual_from_target(draft_tokens, q, p, generator):
    k = len(draft_tokens)
    u = torch.rand(k + 1, generator=generator, dtype=torch.float64)
    out = []
    for i in range(k):
        x = int(draft_tokens[i])
        if u[i] < p[i, x] / q[i, x]:
            out.append(x)
        else:
            out.append(int(_pick(p[i], u[k])))
            return torch.tensor(out)
    out.append(int(_pick(p[k], u[k])))
    return torch.tensor(out)


def residual_unclamped(draft_tokens, q, p, generator):
    k = len(draft_tokens)
    u = torch.rand(k + 1, generator=generator, dtype=torch.float64)
    accept = u[:k] < p[torch.arange(k), draft_tokens] / q[torch.arange(k), draft_tokens]
    n = k if bool(accept.all()) else int(torch.argmin(accept.int()))
    w = p[k] if n == k else p[n] - q[n]          # max(0, .) forgotten
    return torch.cat([draft_tokens[:n], _pick(w, u[k])])


def greedy_verification(draft_tokens, q, p, generator):
    k = len(draft_tokens)
    u = torch.rand(k + 1, generator=generator, dtype=torch.float64)
    for i in range(k):
        if draft_tokens[i] != p[i].argmax():
            return torch.cat([draft_tokens[:i], _pick(torch.clamp(p[i] - q[i], min=0), u[k])])
    return torch.cat([draft_tokens, _pick(p[k], u[k])])


def no_bonus(draft_tokens, q, p, generator):
    k = len(draft_tokens)
    u = torch.rand(k + 1, generator=generator, dtype=torch.float64)
    for i in range(k):
        if not u[i] < p[i, draft_tokens[i]] / q[i, draft_tokens[i]]:
            return torch.cat([draft_tokens[:i], _pick(torch.clamp(p[i] - q[i], min=0), u[k])])
    return draft_tokens.clone()


def judged_by_next(draft_tokens, q, p, generator):
    k = len(draft_tokens)
    u = torch.rand(k + 1, generator=generator, dtype=torch.float64)
    for i in range(k):
        if not u[i] < p[i + 1, draft_tokens[i]] / q[i, draft_tokens[i]]:
            return torch.cat([draft_tokens[:i], _pick(torch.clamp(p[i + 1] - q[i], min=0), u[k])])
    return torch.cat([draft_tokens, _pick(p[k], u[k])])


# valid: min(1, ratio) written out, u * q < p, the CDF by counting, a list of ints
def with_min_and_counting(draft_tokens, q, p, generator):
    k, V = q.shape
    if p.shape != (k + 1, V) or draft_tokens.shape != (k,):
        raise ValueError("p must be (k + 1, V) and q (k, V)")
    u = torch.rand(k + 1, generator=generator, dtype=torch.float64)
    tokens = []
    for i, x in enumerate(draft_tokens.tolist()):
        if u[i].item() < min(1.0, (p[i, x] / q[i, x]).item()):
            tokens.append(x)
            continue
        residual = (p[i] - q[i]).clamp_min(0.0)
        residual = residual / residual.sum()
        tokens.append(min(int((torch.cumsum(residual, 0) <= u[k]).sum()), V - 1))
        return torch.tensor(tokens, dtype=torch.int64)
    tokens.append(min(int((torch.cumsum(p[k], 0) / p[k].sum() <= u[k]).sum()), V - 1))
    return torch.tensor(tokens, dtype=torch.int64)


def vectorised(draft_tokens, q, p, generator):
    k, V = q.shape
    if tuple(p.shape) != (k + 1, V):
        raise ValueError(f"p should be (k + 1, V) = ({k + 1}, {V}), got {tuple(p.shape)}")
    u = torch.rand(k + 1, generator=generator, dtype=torch.float64)
    idx = torch.arange(k)
    rejected = (u[:k] * q[idx, draft_tokens] >= p[idx, draft_tokens]).nonzero()
    if len(rejected) == 0:
        return torch.cat([draft_tokens, _pick(p[k], u[k])])
    n = int(rejected[0])
    return torch.cat([draft_tokens[:n], _pick(torch.relu(p[n] - q[n]), u[k])])


MISTAKES = {
    "serving-speculative_step": [
        (ratio_inverted, "the acceptance ratio is inverted"),
        (residual_from_target, "at a rejection the token is drawn from p_i itself"),
        (residual_unclamped, "the residual is not clamped at 0"),
        (greedy_verification, "accepted only when it is the target's argmax"),
        (no_bonus, "the bonus token is missing"),
        (judged_by_next, "p and the drafts are off by one"),
    ],
}

VARIANTS = {
    "serving-speculative_step": [with_min_and_counting, vectorised],
}

globals().update(shared_tests("serving", MISTAKES, VARIANTS, solutions="serving_notebook", seeds=3))
