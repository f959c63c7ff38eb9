"""A tiny random Llama written as an HF folder (config.json, model.safetensors, tokenizer files).

Everything is built in-process: the byte-level BPE tokenizer is trained with ``tokenizers`` on a generated
corpus, the weights come from a seeded generator. Logits are peaked (a large-norm ``lm_head``) so greedy
decoding has no near-ties and float-level differences between implementations cannot flip a token; sublayer
weights are scaled so attention and the MLP matter as much as the embedding (outputs depend on the context).
"""

import json
import random
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS_TOKEN = "<|im_end|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_WORDS = (
    "the a an one two three cat dog bird fish tree river stone cloud rain sun moon star light dark red blue green "
    "quick slow lazy happy small large old new runs jumps sleeps sings eats reads writes over under near far "
    "and or but with without into onto from to of in on at by model token cache block batch prefix adapter "
    "tenant engine kernel serve request stream quota 0 1 2 3 4 5 6 7 8 9 , . ! ? ; : ( ) ' \" é ü 猫 😀"
).split()


def corpus(num_lines: int = 600, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 14))) for _ in range(num_lines)]


def build_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token=EOS_TOKEN, bos_token="<|endoftext|>", pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
    )


def make_tiny_llama(
    folder: Path,
    *,
    seed: int = 0,
    vocab_size: int = 512,
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 16,
    max_position_embeddings: int = 1024,
    tie_word_embeddings: bool = False,
    attention_bias: bool = False,
) -> Path:
    """Write the tiny model's HF folder into ``folder`` (created) and return it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size)
    tokenizer.save_pretrained(folder)
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        head_dim=head_dim, max_position_embeddings=max_position_embeddings, rms_norm_eps=1e-5,
        tie_word_embeddings=tie_word_embeddings, attention_bias=attention_bias,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=eos_id, pad_token_id=tokenizer.pad_token_id,
    )
    config.save_pretrained(folder)
    save_file(_weights(config, seed, eos_id), str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def _weights(config: LlamaConfig, seed: int, eos_id: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    hidden, inter, d = config.hidden_size, config.intermediate_size, config.head_dim
    q_size, kv_size = config.num_attention_heads * d, config.num_key_value_heads * d

    def dense(out_features: int, in_features: int, gain: float = 1.0) -> torch.Tensor:
        return torch.randn(out_features, in_features, generator=gen) * (gain / in_features**0.5)

    def vector(size: int, mean: float, std: float) -> torch.Tensor:
        return mean + std * torch.randn(size, generator=gen)

    embed = torch.randn(config.vocab_size, hidden, generator=gen)
    # Peaked logits: lm_head rows of norm ~6 against a unit-RMS hidden state; EOS never wins greedily.
    lm_head = embed.clone() if config.tie_word_embeddings else dense(config.vocab_size, hidden, gain=6.0)
    lm_head[eos_id] = 0.0
    if config.tie_word_embeddings:
        embed = lm_head
    tensors = {"model.embed_tokens.weight": embed, "model.norm.weight": vector(hidden, 1.0, 0.1)}
    if not config.tie_word_embeddings:
        tensors["lm_head.weight"] = lm_head
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}"
        shapes = {"self_attn.q_proj": (q_size, hidden, 2.0), "self_attn.k_proj": (kv_size, hidden, 2.0),
                  "self_attn.v_proj": (kv_size, hidden, 1.0), "self_attn.o_proj": (hidden, q_size, 1.0),
                  "mlp.gate_proj": (inter, hidden, 1.0), "mlp.up_proj": (inter, hidden, 1.0),
                  "mlp.down_proj": (hidden, inter, 1.0)}
        for name, (out_f, in_f, gain) in shapes.items():
            tensors[f"{p}.{name}.weight"] = dense(out_f, in_f, gain)
            if config.attention_bias and name.startswith("self_attn"):
                tensors[f"{p}.{name}.bias"] = vector(out_f, 0.0, 0.1)
        tensors[f"{p}.input_layernorm.weight"] = vector(hidden, 1.0, 0.1)
        tensors[f"{p}.post_attention_layernorm.weight"] = vector(hidden, 1.0, 0.1)
    return {name: t.contiguous() for name, t in tensors.items()}


def describe(folder: Path) -> dict:
    """The config a test wrote, for assertions."""
    return json.loads((Path(folder) / "config.json").read_text())
