"""References of notebook 16, serving: how a decoder is served.

Speculative decoding (section 2): one step of speculative sampling, Leviathan, Kalman and Matias
(2023), "Fast Inference from Transformers via Speculative Decoding", Algorithm 1; Chen et al. (2023),
"Accelerating Large Language Model Decoding with Speculative Sampling", Algorithm 2.
"""
from __future__ import annotations

import torch


def speculative_step(draft_tokens, q, p, generator):
    """One step of speculative sampling: the accepted draft tokens, then one token more.

    draft_tokens (k,) int64: x_1 .. x_k, x_i drawn from q[i - 1]. q (k, V) float64: the draft's
    distributions. p (k + 1, V) float64: the target's, from one forward over the prompt and the k
    drafts (p[i - 1] judges x_i; p[k] follows all k). The only draws: u = torch.rand(k + 1,
    generator=generator, dtype=torch.float64), first and all at once. x_i is accepted while
    u[i - 1] < p_i(x_i) / q_i(x_i) (probability min(1, p_i(x_i) / q_i(x_i))); at the first rejection
    the last token is drawn from norm(max(0, p_i - q_i)), after k acceptances from p[k], by the
    inverse CDF: the first token j with u[k] < cumsum(w)[j] / sum(w) (torch.searchsorted(...,
    right=True), clamped to V - 1). Returns (n + 1,) int64: x_1 .. x_n accepted, then that token.
    Raises ValueError when the shapes do not fit.
    """
    k, V = q.shape
    if tuple(draft_tokens.shape) != (k,) or tuple(p.shape) != (k + 1, V):
        raise ValueError(f"draft_tokens should be (k,), q (k, V) and p (k + 1, V); got {tuple(draft_tokens.shape)}, "
                         f"{tuple(q.shape)} and {tuple(p.shape)}")
    u = torch.rand(k + 1, generator=generator, dtype=torch.float64)
    x = draft_tokens.long()
    for i in range(k):
        if not u[i] < p[i, x[i]] / q[i, x[i]]:
            return torch.cat([x[:i], _inverse_cdf(torch.clamp(p[i] - q[i], min=0), u[k])])
    return torch.cat([x, _inverse_cdf(p[k], u[k])])


def _inverse_cdf(w, u):
    """(1,) int64: the first j with u < cumsum(w)[j] / sum(w)."""
    cdf = (torch.cumsum(w, 0) / w.sum()).to(torch.float64)
    return torch.searchsorted(cdf, u.reshape(1), right=True).clamp(max=len(w) - 1)
