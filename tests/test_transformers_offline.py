"""transformers, pinned for notebook 15's comparisons, builds the Llama and Qwen3 modules the
notebook matches the learner's against from a small config alone: no checkpoint, no
tokenizer, nothing downloaded. Every socket is refused while they are built and run, so a
module that reached for the network would fail here, not in a learner's kernel.

The pinned version's classes and constructors (transformers 5.23.0), as the notebook uses them:
``LlamaConfig(*, vocab_size, hidden_size, intermediate_size, num_hidden_layers,
num_attention_heads, num_key_value_heads, hidden_act="silu", rms_norm_eps=1e-6, head_dim, ...)``,
``Qwen3Config(...)`` (the same names, ``head_dim`` explicit), ``LlamaRMSNorm(hidden_size, eps=1e-6)``,
``LlamaMLP(config)``, ``LlamaAttention(config, layer_idx)``, ``LlamaDecoderLayer(config, layer_idx)``,
``LlamaRotaryEmbedding(config)`` and Qwen3's of the same names (``Qwen3Attention`` with ``q_norm``
and ``k_norm``, RMSNorms over ``head_dim``); ``Qwen3MoeConfig(..., moe_intermediate_size, num_experts,
num_experts_per_tok, norm_topk_prob)``, ``Qwen3MoeSparseMoeBlock(config)`` (its experts stacked: ``experts.gate_up_proj``,
``experts.down_proj``) and ``load_balancing_loss_func``. About 2 s of CPU (transformers' import): slow."""
from __future__ import annotations

import socket
from importlib import metadata

import pytest
import torch

from tests.test_environment import _constraints

pytestmark = pytest.mark.slow


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("the network was reached while building transformers' modules")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    with pytest.raises(OSError, match="network was reached"):  # the guard itself bites
        socket.create_connection(("127.0.0.1", 9))


def test_the_installed_transformers_is_the_pin():
    assert metadata.version("transformers") == next(iter(_constraints()["transformers"].specifier)).version


def test_llama_and_qwen3_modules_build_and_run_offline_from_a_small_config(no_network):
    from transformers import LlamaConfig, Qwen3Config
    from transformers.models.llama.modeling_llama import (LlamaAttention, LlamaDecoderLayer, LlamaMLP,
                                                          LlamaRMSNorm, LlamaRotaryEmbedding)
    from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention, Qwen3DecoderLayer

    small = dict(vocab_size=32, hidden_size=16, intermediate_size=40, num_hidden_layers=1,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=4)
    llama, qwen = LlamaConfig(**small), Qwen3Config(**small)
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)

    norm = LlamaRMSNorm(16, eps=1e-6)
    assert list(norm.state_dict()) == ["weight"]
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 2.0, 16))
    expected = norm.weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(norm(x), expected)

    mlp = LlamaMLP(llama)
    assert {k: tuple(v.shape) for k, v in mlp.state_dict().items()} == {
        "gate_proj.weight": (40, 16), "up_proj.weight": (40, 16), "down_proj.weight": (16, 40)}
    gate, up, down = mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight
    torch.testing.assert_close(mlp(x), (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ down.T)

    position_embeddings = LlamaRotaryEmbedding(llama)(x, torch.arange(5)[None].expand(2, 5))
    mask = torch.full((5, 5), float("-inf")).triu(1)[None, None]
    attention = LlamaAttention(llama, layer_idx=0)
    assert sorted(attention.state_dict()) == ["k_proj.weight", "o_proj.weight", "q_proj.weight", "v_proj.weight"]
    assert attention(x, position_embeddings, mask)[0].shape == (2, 5, 16)
    assert LlamaDecoderLayer(llama, layer_idx=0)(x, attention_mask=mask,
                                                 position_embeddings=position_embeddings).shape == (2, 5, 16)

    qk_norm = Qwen3Attention(qwen, layer_idx=0)
    assert {k: tuple(v.shape) for k, v in qk_norm.state_dict().items() if "norm" in k} == {
        "q_norm.weight": (4,), "k_norm.weight": (4,)}, "Qwen3's QK-norm: one RMSNorm over head_dim each"
    block = Qwen3DecoderLayer(qwen, layer_idx=0)
    assert "self_attn.q_norm.weight" in block.state_dict()
    assert block(x, attention_mask=mask, position_embeddings=position_embeddings).shape == (2, 5, 16)


def _renamed(theirs, ours, names):
    """transformers' module with weights drawn from seed 1 (std 0.5, norms' weights too), and ours with
    the same weights, each renamed by ``names`` (their submodule -> ours; a name absent is the same)."""
    torch.manual_seed(1)
    theirs = theirs.eval()
    for p in theirs.parameters():
        torch.nn.init.normal_(p, std=0.5)
    ours.load_state_dict({names.get(k.split(".")[0], k.split(".")[0]) + ".weight": v
                          for k, v in theirs.state_dict().items()}, strict=True)
    return theirs, ours


def _stepped(ours, theirs, x, chunks=(3, 1, 2)):
    """Feed x (batch, seq_len, d_model) chunk by chunk to our module (with the cache it returns) and to
    ``theirs(chunk, positions, additive_mask)`` (which keeps its own cache); assert equal outputs at every
    step; return our last cache."""
    mine, start, batch = None, 0, x.shape[0]
    with torch.no_grad():
        for new in chunks:
            chunk = x[:, start:start + new]
            allowed = torch.ones(new, start + new, dtype=torch.bool).tril(diagonal=start)
            mask = torch.zeros(new, start + new).masked_fill(~allowed, float("-inf"))[None, None]
            expected = theirs(chunk, torch.arange(start, start + new)[None].expand(batch, new), mask)
            got, mine = ours(chunk, mine)
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
            start += new
    return mine


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_the_reference_attention_equals_transformers_step_by_step_with_a_cache(no_network, family):
    """grader's reference Attention (modern_decoder-Attention) with transformers' weights renamed: the same
    outputs and cached keys for tokens fed 3 + 1 + 2 at a time, driven as the model drives its attention
    (position_embeddings from its rotary embedding, an additive causal mask, a DynamicCache)."""
    from transformers import DynamicCache, LlamaConfig, Qwen3Config
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding
    from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention, Qwen3RotaryEmbedding

    from grader.checks.reference.modern_decoder import Attention

    config_class, attention_class, rotary_class = {
        "qwen3": (Qwen3Config, Qwen3Attention, Qwen3RotaryEmbedding),
        "llama": (LlamaConfig, LlamaAttention, LlamaRotaryEmbedding)}[family]
    config = config_class(vocab_size=32, hidden_size=12, intermediate_size=40, num_hidden_layers=1,
                          num_attention_heads=6, num_key_value_heads=2, head_dim=4, rope_theta=300.0,
                          attn_implementation="eager")
    theirs, ours = _renamed(attention_class(config, layer_idx=0), Attention(12, 6, 2, 4, rope_theta=300.0,
                                                                            qk_norm=family == "qwen3"),
                            {"q_proj": "W_q", "k_proj": "W_k", "v_proj": "W_v", "o_proj": "W_o"})
    rotary, cache = rotary_class(config), DynamicCache(config=config)
    mine = _stepped(ours, lambda chunk, positions, mask: theirs(chunk, rotary(chunk, positions), mask,
                                                                past_key_values=cache)[0], torch.randn(2, 6, 12))
    torch.testing.assert_close(mine[0], cache.layers[0].keys, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(mine[1], cache.layers[0].values, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_the_reference_moe_equals_transformers_qwen3_moe_block_and_its_loss(no_network, norm_topk_prob):
    """grader's reference SparseMoE (modern_decoder-SparseMoE) with Qwen3MoeSparseMoeBlock's weights unstacked
    (experts.gate_up_proj[e] = W_gate over W_up, experts.down_proj[e] = W_down): the same output and router
    logits, and its load-balancing loss equal to load_balancing_loss_func's, of one layer's logits and of two
    layers' (concatenated for ours)."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock, load_balancing_loss_func

    from grader.checks.reference.modern_decoder import SparseMoE

    config = Qwen3MoeConfig(vocab_size=32, hidden_size=12, moe_intermediate_size=10, num_experts=6,
                            num_experts_per_tok=2, norm_topk_prob=norm_topk_prob, num_hidden_layers=1,
                            num_attention_heads=2, num_key_value_heads=1)
    torch.manual_seed(2)
    theirs = Qwen3MoeSparseMoeBlock(config).eval()
    for p in theirs.parameters():
        torch.nn.init.normal_(p, std=0.5)
    ours = SparseMoE(12, 10, 6, 2, norm_topk_prob=norm_topk_prob)
    state = {"gate.weight": theirs.gate.weight}
    for e in range(6):
        gate, up = theirs.experts.gate_up_proj[e].chunk(2, dim=0)
        state.update({f"experts.{e}.W_gate.weight": gate, f"experts.{e}.W_up.weight": up,
                      f"experts.{e}.W_down.weight": theirs.experts.down_proj[e]})
    ours.load_state_dict(state, strict=True)
    x, y = torch.randn(2, 7, 12), torch.randn(3, 12)
    with torch.no_grad():
        out, logits = ours(x)
        torch.testing.assert_close(out, theirs(x), atol=1e-5, rtol=1e-4)
        their_logits = theirs.gate(x.reshape(-1, 12))[0]
        torch.testing.assert_close(logits, their_logits, atol=1e-5, rtol=1e-4)
        other = theirs.gate(y)[0]
        torch.testing.assert_close(ours.load_balancing_loss(logits), load_balancing_loss_func((their_logits,), 6, 2))
        torch.testing.assert_close(ours.load_balancing_loss(torch.cat([logits, other])),
                                   load_balancing_loss_func((their_logits, other), 6, 2))


def test_the_reference_latent_attention_equals_deepseek_v2_step_by_step_with_a_cache(no_network):
    """grader's reference LatentAttention (serving-LatentAttention) with the weights of transformers'
    ``DeepseekV2Attention(config, layer_idx)`` renamed (``DeepseekV2Config(..., q_lora_rank=None, kv_lora_rank,
    qk_nope_head_dim, qk_rope_head_dim, v_head_dim, num_key_value_heads=num_attention_heads)``; its rotary
    embedding ``DeepseekV2RotaryEmbedding(config)`` returns complex ``freqs_cis``, the interleaved layout):
    the same outputs for tokens fed 3 + 1 + 2 at a time, and a DynamicCache holding only the normalized
    latents and the rotated shared RoPE keys, (batch, 1, positions, d) each."""
    from transformers import DeepseekV2Config, DynamicCache
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Attention, DeepseekV2RotaryEmbedding

    from grader.checks.reference.serving import LatentAttention

    config = DeepseekV2Config(vocab_size=32, hidden_size=16, intermediate_size=40, num_hidden_layers=1,
                              num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=6,
                              qk_nope_head_dim=2, qk_rope_head_dim=4, v_head_dim=5, rope_theta=300.0,
                              attn_implementation="eager")
    theirs, ours = _renamed(DeepseekV2Attention(config, layer_idx=0),
                            LatentAttention(16, 4, 6, 2, 4, 5, rope_theta=300.0),
                            {"q_proj": "W_q", "kv_a_proj_with_mqa": "W_dkv", "kv_a_layernorm": "kv_norm",
                             "kv_b_proj": "W_ukv", "o_proj": "W_o"})
    rotary, cache = DeepseekV2RotaryEmbedding(config), DynamicCache(config=config)
    mine = _stepped(ours, lambda chunk, positions, mask: theirs(chunk, mask, past_key_values=cache,
                                                                position_embeddings=rotary(chunk, positions))[0],
                    torch.randn(2, 6, 16))
    assert cache.layers[0].keys.shape == (2, 1, 6, 6) and cache.layers[0].values.shape == (2, 1, 6, 4)
    torch.testing.assert_close(mine[0], cache.layers[0].keys[:, 0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(mine[1], cache.layers[0].values[:, 0], atol=1e-5, rtol=1e-4)
