"""References of notebook 12, gpt: a decoder-only language model (PyTorch, as the notebook).

The model is GPT-2's layout (Radford et al. 2019): learned positions added to the token
embeddings, pre-norm blocks, a final layer norm and an output layer tied to the token
embedding. Its attention is notebook 06's ``MultiHeadAttention`` (W_q, W_k, W_v, W_o) and
its connections notebook 07's pre-norm ``sublayer_connection``, so the parameter names are
the notebook's; ``torch_equivalent`` builds the same function from torch's own modules,
which the tests match weight for weight. The block and the model are split into small
methods so that a catalogued mistake is this module's class with one method overridden.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .encoder import sublayer_connection
from .multi_head import MultiHeadAttention, merge_heads, scaled_dot_product_attention, split_heads
from .transformer import causal_mask


class Block(nn.Module):
    """A pre-norm decoder-only block: x + attn(norm1(x)) under a causal mask, then
    x + linear2(gelu(linear1(norm2(x)))); dropout after each sublayer and the activation."""

    def __init__(self, d_model, heads, d_ff, dropout=0.0):
        super().__init__()
        self.attn = MultiHeadAttention(d_model, heads)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def mask(self, length):
        return causal_mask(length)

    def attend(self, h):
        return self.dropout(self.attn(h, h, h, self.mask(h.shape[1]))[0])

    def mlp(self, h):
        return self.dropout(self.linear2(self.dropout(F.gelu(self.linear1(h)))))

    def forward(self, x):
        x = sublayer_connection(x, self.attend, self.norm1, norm_first=True)
        return sublayer_connection(x, self.mlp, self.norm2, norm_first=True)


class GPT(nn.Module):
    """Token embedding + learned position embedding, dropout, the blocks, a final LayerNorm
    and lm_head (no bias), tied to tok_embed when tie_weights. Raises ValueError for
    sequences longer than max_len."""

    block = Block

    def __init__(self, vocab_size, d_model, heads, d_ff, layers, max_len, tie_weights=True, dropout=0.0):
        super().__init__()
        self.max_len = max_len
        self.tok_embed = nn.Embedding(vocab_size, d_model)
        self.pos_embed = nn.Embedding(max_len, d_model)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList([self.block(d_model, heads, d_ff, dropout) for _ in range(layers)])
        self.norm = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        if tie_weights:
            self.lm_head.weight = self.tok_embed.weight

    def positions(self, length):
        return torch.arange(length)

    def embed(self, ids):
        return self.tok_embed(ids) + self.pos_embed(self.positions(ids.shape[1]))

    def head(self, x):
        return self.lm_head(self.norm(x))

    def forward(self, ids):
        if ids.shape[1] > self.max_len:
            raise ValueError(f"a sequence of {ids.shape[1]} tokens is longer than max_len = {self.max_len}")
        x = self.dropout(self.embed(ids))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def torch_equivalent(model: GPT) -> nn.Module:
    """The same function as ``model`` (in eval mode) built from torch's modules, holding copies
    of its weights: nn.TransformerEncoder of nn.TransformerEncoderLayer(norm_first=True,
    activation="gelu") with a final nn.LayerNorm, called with a causal mask, between the two
    embeddings and F.linear with the output weight."""
    d_model = model.tok_embed.embedding_dim
    first = model.blocks[0]
    layer = nn.TransformerEncoderLayer(d_model, first.attn.heads, first.linear1.out_features, dropout=0.0,
                                       activation="gelu", batch_first=True, norm_first=True)
    stack = nn.TransformerEncoder(layer, len(model.blocks), norm=nn.LayerNorm(d_model), enable_nested_tensor=False)
    with torch.no_grad():
        for theirs, ours in zip(stack.layers, model.blocks):
            attn = ours.attn
            theirs.self_attn.in_proj_weight.copy_(torch.cat([attn.W_q.weight, attn.W_k.weight, attn.W_v.weight]))
            theirs.self_attn.in_proj_bias.copy_(torch.cat([attn.W_q.bias, attn.W_k.bias, attn.W_v.bias]))
            theirs.self_attn.out_proj.load_state_dict(attn.W_o.state_dict())
            for name in ("linear1", "linear2", "norm1", "norm2"):
                getattr(theirs, name).load_state_dict(getattr(ours, name).state_dict())
        stack.norm.load_state_dict(model.norm.state_dict())
    tok, pos, out = (nn.Parameter(p.detach().clone()) for p in
                     (model.tok_embed.weight, model.pos_embed.weight, model.lm_head.weight))

    class TorchGPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.stack, self.tok, self.pos, self.out = stack, tok, pos, out

        def forward(self, ids):
            length = ids.shape[1]
            x = F.embedding(ids, self.tok) + self.pos[:length]
            future = nn.Transformer.generate_square_subsequent_mask(length)   # -inf above the diagonal
            return F.linear(self.stack(x, mask=future, is_causal=True), self.out)

    return TorchGPT().eval()


def next_token_loss(logits, ids, pad_id):
    """Position t predicts token t + 1: cross-entropy of logits[:, :-1] against ids[:, 1:],
    averaged over the targets that are not pad_id."""
    vocab = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, vocab), ids[:, 1:].reshape(-1), ignore_index=pad_id)


@torch.no_grad()
def perplexity(model, batches, pad_id):
    """exp(total negative log-likelihood / number of predicted tokens) over every batch, in
    eval mode; the predicted tokens are ids[:, 1:] that are not pad_id."""
    model.eval()
    total, count = 0.0, 0
    for ids in batches:
        logits = model(ids)
        targets = ids[:, 1:]
        total += F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                 ignore_index=pad_id, reduction="sum").item()
        count += int((targets != pad_id).sum())
    return math.exp(total / count)


def gpt2_init(model):
    """GPT-2's initialisation, in place: normal(0, 0.02) for the weights of every nn.Linear and
    nn.Embedding, zero biases, layer norms left at 1 and 0, and the residual projections (each block's
    attn.W_o and linear2) at 0.02 / sqrt(2 N), N blocks. Returns the model."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
    residual_std = 0.02 / math.sqrt(2 * len(model.blocks))
    for block in model.blocks:
        nn.init.normal_(block.attn.W_o.weight, std=residual_std)
        nn.init.normal_(block.linear2.weight, std=residual_std)
    return model


def param_groups(model, weight_decay):
    """AdamW's two parameter groups: weight decay on the matrices of the linear layers only, none on
    biases, norms or embeddings; a weight an nn.Linear shares with an nn.Embedding (tied) is the
    embedding's. Every parameter once (minGPT's configure_optimizers)."""
    embedded = {id(p) for module in model.modules() if isinstance(module, nn.Embedding) for p in module.parameters()}
    decay, no_decay, seen = [], [], set()
    for module in model.modules():
        for name, parameter in module.named_parameters(recurse=False):
            if id(parameter) in seen:
                continue
            seen.add(id(parameter))
            if isinstance(module, nn.Linear) and name == "weight" and id(parameter) not in embedded:
                decay.append(parameter)
            else:
                no_decay.append(parameter)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def next_token_probs(logits, temperature=1.0, top_k=None, top_p=None):
    """(batch, V) logits -> (batch, V) probabilities: divide by the temperature, keep the top_k
    largest, softmax, keep the smallest set of most probable tokens whose probabilities reach
    top_p (the one that crosses it included), renormalise.

    Raises:
        ValueError: temperature <= 0.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    z = logits / temperature
    if top_k is not None and top_k < z.shape[-1]:
        kth = torch.topk(z, top_k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    probs = torch.softmax(z, dim=-1)
    if top_p is not None:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs      # mass of the more probable tokens
        keep_sorted = before < top_p
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        probs = probs * keep
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def forward_cached(model, ids, cache=None):
    """Logits of the new tokens ids (batch, t) after the cached ones, and the cache with them:
    one (keys, values) pair per block, each (batch, heads, past + t, d_k). Uses the model's
    parts only (eval mode: no dropout)."""
    past = 0 if not cache else cache[0][0].shape[2]
    length = ids.shape[1]
    x = model.tok_embed(ids) + model.pos_embed(torch.arange(past, past + length))
    new_cache = []
    for i, block in enumerate(model.blocks):
        attn = block.attn
        h = block.norm1(x)
        q, k, v = (split_heads(layer(h), attn.heads) for layer in (attn.W_q, attn.W_k, attn.W_v))
        if cache:
            k = torch.cat([cache[i][0], k], dim=2)
            v = torch.cat([cache[i][1], v], dim=2)
        mask = torch.ones(length, past + length, dtype=torch.bool).tril(diagonal=past)
        out, _ = scaled_dot_product_attention(q, k, v, mask)
        x = x + attn.W_o(merge_heads(out))
        x = x + block.linear2(F.gelu(block.linear1(block.norm2(x))))
        new_cache.append((k, v))
    return model.lm_head(model.norm(x)), new_cache


def length_penalty(length, alpha):
    """GNMT's lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al. 2016, eq. 14)."""
    return ((5 + length) / 6) ** alpha


@torch.no_grad()
def beam_search(model, prompt, beam_size, max_new_tokens, eos_id, alpha=0.6):
    """Keep the beam_size best continuations by summed log-probability; one that ends in
    eos_id is finished and set aside; stop when none is alive or after max_new_tokens; return
    the finished (or still alive) hypothesis with the best score / length_penalty(its length),
    as (its new tokens, that score)."""
    alive = [(prompt.tolist(), 0.0)]
    finished = []
    for _ in range(max_new_tokens):
        ids = torch.tensor([seq for seq, _ in alive])
        logp = torch.log_softmax(model(ids)[:, -1].double(), dim=-1)           # (alive, V)
        scores = torch.tensor([score for _, score in alive], dtype=torch.float64)[:, None] + logp
        best = torch.topk(scores.flatten(), min(beam_size, scores.numel())).indices.tolist()
        vocab = logp.shape[-1]
        alive_next = []
        for flat in best:
            beam, token = divmod(flat, vocab)
            hypothesis = (alive[beam][0] + [token], scores[beam, token].item())
            (finished if token == eos_id else alive_next).append(hypothesis)
        alive = alive_next
        if not alive:
            break
    start = len(prompt)
    ranked = [(score / length_penalty(len(seq) - start, alpha), seq[start:]) for seq, score in finished + alive]
    score, tokens = max(ranked, key=lambda r: r[0])
    return torch.tensor(tokens, dtype=torch.int64), score


@torch.no_grad()
def generate_batch(model, prompts, max_new_tokens, eos_id, pad_id):
    """Greedy decoding of prompts of different lengths in one batch, with a KV cache: the prompts
    left-padded with pad_id, each token at its position counted from its prompt's first real token,
    no query attending to a pad key (a pad query sees itself only, so no row of the mask is empty);
    after a row's eos_id, pad_id. Returns (batch, max_new_tokens) int64, equal to each prompt
    generated alone. Uses the model's parts only (eval mode: no dropout)."""
    lengths = torch.tensor([len(prompt) for prompt in prompts])
    batch, longest = len(prompts), int(lengths.max())
    ids = torch.full((batch, longest), pad_id, dtype=torch.int64)
    for row, prompt in enumerate(prompts):
        ids[row, longest - len(prompt):] = prompt
    real = torch.arange(longest)[None, :] >= (longest - lengths)[:, None]          # (batch, longest)
    positions = (real.cumsum(dim=1) - 1).clamp(min=0)
    tokens = torch.full((batch, max_new_tokens), pad_id, dtype=torch.int64)
    done = torch.zeros(batch, dtype=torch.bool)
    cache = []
    for step in range(max_new_tokens):
        past, t = real.shape[1] - ids.shape[1], ids.shape[1]
        keys, queries = torch.arange(past + t)[None, :], torch.arange(past, past + t)[:, None]
        mask = ((keys <= queries) & (real[:, None, :] | (keys == queries)))[:, None]   # (batch, 1, t, past + t)
        x = model.tok_embed(ids) + model.pos_embed(positions)
        for i, block in enumerate(model.blocks):
            attn = block.attn
            h = block.norm1(x)
            q, k, v = (split_heads(layer(h), attn.heads) for layer in (attn.W_q, attn.W_k, attn.W_v))
            if step:
                k, v = torch.cat([cache[i][0], k], dim=2), torch.cat([cache[i][1], v], dim=2)
                cache[i] = (k, v)
            else:
                cache.append((k, v))
            out, _ = scaled_dot_product_attention(q, k, v, mask)
            x = x + attn.W_o(merge_heads(out))
            x = x + block.linear2(F.gelu(block.linear1(block.norm2(x))))
        token = model.lm_head(model.norm(x[:, -1])).argmax(dim=-1).masked_fill(done, pad_id)
        tokens[:, step] = token
        done = done | (token == eos_id)
        if done.all():
            break
        ids, positions = token[:, None], positions[:, -1:] + 1
        real = torch.cat([real, torch.ones(batch, 1, dtype=torch.bool)], dim=1)
    return tokens


@torch.no_grad()
def beam_search_cached(model, prompt, beam_size, max_new_tokens, eos_id, alpha=0.6):
    """beam_search with forward_cached: the prompt forwarded once, then one call per step with the
    new token of each alive beam, (alive, 1), after every block's keys and values are reordered by
    the beams' parent index (index_select on the batch axis, the beam axis). The same hypotheses
    and scores as beam_search on the uncached model."""
    logits, cache = forward_cached(model, prompt[None])                            # (1, prompt_len, V)
    alive = [(prompt.tolist(), 0.0)]
    finished = []
    for step in range(max_new_tokens):
        logp = torch.log_softmax(logits[:, -1].double(), dim=-1)                  # (alive, V)
        scores = torch.tensor([score for _, score in alive], dtype=torch.float64)[:, None] + logp
        best = torch.topk(scores.flatten(), min(beam_size, scores.numel())).indices.tolist()
        vocab = logp.shape[-1]
        alive_next, parents = [], []
        for flat in best:
            beam, token = divmod(flat, vocab)
            hypothesis = (alive[beam][0] + [token], scores[beam, token].item())
            if token == eos_id:
                finished.append(hypothesis)
            else:
                alive_next.append(hypothesis)
                parents.append(beam)
        alive = alive_next
        if not alive or step == max_new_tokens - 1:
            break
        index = torch.tensor(parents)
        cache = [(k.index_select(0, index), v.index_select(0, index)) for k, v in cache]
        logits, cache = forward_cached(model, torch.tensor([[seq[-1]] for seq, _ in alive]), cache)
    start = len(prompt)
    ranked = [(score / length_penalty(len(seq) - start, alpha), seq[start:]) for seq, score in finished + alive]
    score, tokens = max(ranked, key=lambda r: r[0])
    return torch.tensor(tokens, dtype=torch.int64), score
