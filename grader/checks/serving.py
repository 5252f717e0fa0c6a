"""Hidden checks of notebook 16, serving: how a decoder is served.

Section 2, speculative decoding: ``speculative_step``, one step of speculative sampling (Leviathan
et al. 2023, Algorithm 1; Chen et al. 2023). The driver (``coursekit/drivers/serving.py``) calls
the learner's function with a ``torch.Generator`` seeded by the grader, whose k + 1 uniforms the
docstring fixes (``torch.rand(k + 1, generator=generator, dtype=torch.float64)``, first), so
each seeded call has one right output. One more call asks for the exact distribution of the
step's output on a vocabulary of 3 tokens with k = 2: the driver enumerates the 9 draft sequences
and, for each, the accept/reject branches and the last token's inverse CDF, by bisection on
uniforms it chooses (no sampling); the reference's equals the target's (its first token is p[0]'s).
Sizes differ (k from 1 to 5, V from 5 to 7); every distribution has no zero, so every
token can be drafted and every ratio p/q is finite.
"""
from __future__ import annotations

import numpy as np
import torch

from coursekit.probe import collect

from ..wire import decode_payload

from ._core import Call, Knob, Mistake, Rule, Spec
from .reference import serving as ref

_ID = "serving-speculative_step"
_DRIVER = "serving.speculative"


def _spec_variant(rule="ratio", offset="same", residual="clamped", bonus="once", keep="prefix", draws="upfront"):
    """speculative_step with some of its choices wrong (the spec's knobs)."""

    def speculative_step(draft_tokens, q, p, generator):
        k, V = q.shape
        if tuple(draft_tokens.shape) != (k,) or tuple(p.shape) != (k + 1, V):
            raise ValueError("draft_tokens should be (k,), q (k, V) and p (k + 1, V)")
        x = draft_tokens.long()
        u = torch.rand(k + 1, generator=generator, dtype=torch.float64) if draws == "upfront" else None

        def uniform(i):
            return u[i] if u is not None else torch.rand((), generator=generator, dtype=torch.float64)

        def sample(w, normalise=True):
            v = u[k] if u is not None else torch.rand((), generator=generator, dtype=torch.float64)
            cdf = torch.cumsum(w, 0) / (w.sum() if normalise else 1.0)
            return torch.searchsorted(cdf, v.reshape(1), right=True).clamp(max=V - 1)

        kept, rejected = [], None
        for i in range(k):
            judge = min(i + 1, k) if offset == "next" else i
            if rule == "ratio":
                accept = bool(uniform(i) < p[judge, x[i]] / q[i, x[i]])
            elif rule == "inverted":
                accept = bool(uniform(i) < q[i, x[i]] / p[judge, x[i]])
            else:                                   # greedy: the draft token must be the target's argmax
                uniform(i)
                accept = bool(x[i] == torch.argmax(p[judge]))
            if accept:
                if rejected is None or keep == "all_accepted":
                    kept.append(x[i].reshape(1))
            elif rejected is None:
                rejected = i
                if keep == "prefix":
                    break
        if rejected is None:
            out = kept + ([] if bonus == "forgotten" else [sample(p[k])])
        else:
            judge = min(rejected + 1, k) if offset == "next" else rejected
            base = p[judge] if residual == "from_p" else p[judge] - q[rejected]
            w = base if residual == "unclamped" else torch.clamp(base, min=0)
            out = kept + [sample(w, normalise=residual != "unnormalised")]
            if bonus == "after_rejection":
                out.append(sample(p[k]))
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.int64)

    return speculative_step


def _residual_row(shift):
    """The reference, its residual at a rejection at i taken from p[i + shift] (p[-1] is p[k])."""

    def speculative_step(draft_tokens, q, p, generator):
        k, V = q.shape
        u = torch.rand(k + 1, generator=generator, dtype=torch.float64)
        x = draft_tokens.long()
        for i in range(k):
            if not u[i] < p[i, x[i]] / q[i, x[i]]:
                return torch.cat([x[:i], ref._inverse_cdf(torch.clamp(p[i + shift] - q[i], min=0), u[k])])
        return torch.cat([x, ref._inverse_cdf(p[k], u[k])])

    return speculative_step


_RESIDUAL_ROW = ("the residual at a rejection is taken from another row of p than the one that judged the "
                 "rejected draft: at a rejection of draft_tokens[i], sample from max(0, p[i] - q[i]), the same i")


def _distributions(rng, rows, V, near=None):
    """``rows`` distributions over V tokens, none below 0.015; ``near`` (rows, V): mostly those."""
    d = rng.dirichlet(np.full(V, 0.8), size=rows)
    if near is not None:
        d = 0.75 * near + 0.25 * d
    d = d + 0.02
    return d / d.sum(-1, keepdims=True)


def _step_call(rng, k, V, close=False):
    q = _distributions(rng, k, V)
    p = _distributions(rng, k + 1, V, near=np.vstack([q, q[-1:]]) if close else None)
    draft = np.array([rng.choice(V, p=row) for row in q], dtype=np.int64)
    return Call((draft, q, p, int(rng.integers(2 ** 31))), what=f"speculative_step with k={k} drafts over V={V} "
                                                                    "tokens (a seeded generator)")


def _answer(fn, call):
    return decode_payload(collect(_ID, fn, [call.call()], _DRIVER), _ID)[0]


def _length(call):
    return len(np.asarray(_answer(ref.speculative_step, call)))


_LAZY = _spec_variant(draws="lazy")


def _step_calls(rng: np.random.Generator) -> list[Call]:
    calls = [_step_call(rng, k, V) for k, V in [(1, 5), (2, 6), (3, 7), (4, 5), (5, 6)]]
    wanted = [lambda c: _length(c) == len(c.args[0]) + 1,             # all k accepted: the bonus token
              lambda c: 2 <= _length(c) < len(c.args[0]),               # a rejection after an acceptance
              lambda c: _length(c) == 1]                                # the first draft rejected
    for test, (k, V) in zip(wanted, [(3, 6), (4, 7), (3, 5)]):
        while True:
            call = _step_call(rng, k, V, close=test is wanted[0] or test is wanted[1])
            if test(call):
                calls.append(call)
                break
    while not any(not np.array_equal(np.asarray(_answer(_LAZY, c)), np.asarray(_answer(ref.speculative_step, c)))
                  for c in calls):
        calls.append(_step_call(rng, 4, 6))
    q = _distributions(rng, 2, 3)
    p = _distributions(rng, 3, 3)
    calls.append(Call((None, q, p, None), what="the exact distribution of speculative_step's output with k=2 drafts "
                                               "over V=3 tokens (every draft sequence and branch enumerated)"))
    draft = np.array([0, 1], dtype=np.int64)
    calls.append(Call((draft, _distributions(rng, 2, 5), _distributions(rng, 2, 5), 7), raises="ValueError",
                      what="speculative_step with p of shape (k, V): the target's k + 1 rows are needed"))
    return calls


def _exact(call):
    return call.args[3] is None and not call.raises


SPECULATIVE_STEP = Spec(
    id=_ID,
    function="speculative_step",
    driver=_DRIVER,
    inputs=_step_calls,
    reference=ref.speculative_step,
    variant=_spec_variant,
    mistakes=(
        Mistake("residual_next_row", _RESIDUAL_ROW, _residual_row(1)),
        Mistake("residual_previous_row", _RESIDUAL_ROW, _residual_row(-1)),
    ),
    equivalent=(
        ("L18 1 -> 2", "drawing k + 2 doubles leaves u[0], ..., u[k] as they were; the extra draw moves only the "
                       "generator's later numbers, which one step's output does not show (the visible test checks "
                       "that exactly k + 1 are drawn)"),
        ("L21 u[i] < p[i, x[i]] / q[i, x[i]] -> u[i] <= p[i, x[i]] / q[i, x[i]]",
         "they differ only when a uniform equals the ratio exactly, a probability-0 event no seed here meets "
         "(min(1, ratio) is the probability of acceptance either way)"),
    ),
    figures=(f"{_ID}-figure",),
    rules=(
        Rule("ValueError: p is not (k + 1, V)", lambda call: call.raises == "ValueError"),
        Rule("all k drafts accepted: the bonus token from p[k]",
             lambda call: not call.raises and not _exact(call) and _length(call) == len(call.args[0]) + 1),
        Rule("the first draft rejected", lambda call: not call.raises and not _exact(call) and _length(call) == 1),
        Rule("a rejection after an acceptance",
             lambda call: not call.raises and not _exact(call) and 2 <= _length(call) <= len(call.args[0])),
        Rule("the exact distribution of the output (the target's)", _exact),
    ),
    knobs=(
        Knob("rule", (
            ("inverted", "the acceptance ratio is inverted: accept x_i with probability min(1, p_i(x_i) / q_i(x_i)), "
                         "the target's probability over the draft's (u < p[i, x] / q[i, x])"),
            ("greedy", "a draft token is accepted only when it is the target's argmax: that is greedy verification, "
                       "which changes the distribution; accept x_i when u[i] < p_i(x_i) / q_i(x_i)"),
        )),
        Knob("offset", (("next", "p and the drafts are off by one: p[i] (the target's distribution before x_{i+1}, "
                                 "0-based draft_tokens[i]) judges draft_tokens[i], and the residual at a rejection "
                                 "is max(0, p[i] - q[i]) of that same i; p[k] is only for the bonus token"),)),
        Knob("residual", (
            ("unclamped", "the residual is not clamped at 0: sample from max(0, p_i - q_i), renormalised; p_i - q_i "
                          "has negative entries"),
            ("unnormalised", "the residual max(0, p_i - q_i) is not renormalised: its entries sum to less than 1, "
                             "divide the cumulative sum by its total before comparing it with u[k]"),
            ("from_p", "at a rejection the token is drawn from p_i itself: draw it from the residual "
                       "norm(max(0, p_i - q_i)), which removes the mass the draft already proposed"),
        )),
        Knob("bonus", (
            ("forgotten", "when all k drafts are accepted the bonus token is missing: draw one more from p[k], "
                          "so a step returns k + 1 tokens"),
            ("after_rejection", "a bonus token from p[k] is added after a rejection too: after the first rejection "
                                "the step ends with the residual's token; p[k] is used only when all k are accepted"),
        )),
        Knob("keep", (("all_accepted", "drafts accepted after the first rejection are kept: the step stops at the "
                                       "first rejection (the later drafts were drawn after a rejected token)"),)),
        Knob("draws", (("lazy", "the uniforms are not drawn as the docstring fixes: first and all at once, u = "
                                "torch.rand(k + 1, generator=generator, dtype=torch.float64), u[i] judges "
                                "draft_tokens[i] and u[k] picks the last token, whatever happens"),)),
    ),
)

SPECS = (SPECULATIVE_STEP,)
