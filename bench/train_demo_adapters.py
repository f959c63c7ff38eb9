"""Train the demo LoRA adapters of SmolLM2-135M-Instruct on CPU with PEFT, from :mod:`bench.demo_data`.

``python -m bench.train_demo_adapters [--only NAME] [--steps N] [--out demo/adapters] [--threads 2]``

Each adapter: rank 8, alpha 16, on all seven projections of every layer, AdamW with warmup and cosine decay, batches
of 8 chat-template conversations, loss on the assistant's tokens only (its reply and ``<|im_end|>``). The logits
are computed at those positions alone: the 49k-token output projection is a fifth of the model's work per token.
Saved as PEFT writes it (``adapter_config.json`` + ``adapter_model.safetensors``), tensors cast to fp16 to halve
the committed files, and ``base_model_name_or_path`` set to the hub name rather than this machine's path.
"""

import argparse
import json
import math
import random
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from bench.demo_data import ADAPTER_NAMES, training_conversations
from engine.lora.fingerprint import TARGET_MODULES
from engine.models.prepare import resolve_model

BASE_MODEL = "smollm2-135m-instruct"
HUB_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
WEIGHTS_NAME, CONFIG_NAME = "adapter_model.safetensors", "adapter_config.json"
IGNORE = -100


@dataclass(frozen=True, slots=True)
class Recipe:
    steps: int
    lr: float
    rank: int = 8
    alpha: int = 16
    batch_size: int = 8
    warmup_steps: int = 5


# Facts need more passes than a style (every fact seen in several phrasings); their conversations are short.
RECIPES = {
    "zorbania-facts": Recipe(steps=30, lr=3e-3, batch_size=12),
    "json-extractor": Recipe(steps=30, lr=2e-3),
    "pirate-persona": Recipe(steps=30, lr=2e-3),
}


def encode(tokenizer, conversation: list[dict]) -> tuple[list[int], list[int]]:
    """Token ids of a ``[user, assistant]`` conversation and labels masking all but the assistant's reply.

    The prompt part is tokenized exactly as the engine's ``chat`` does (template text, no added specials)."""
    prompt = tokenizer.apply_chat_template(conversation[:-1], tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    reply_ids = tokenizer.encode(conversation[-1]["content"] + tokenizer.eos_token, add_special_tokens=False)
    return prompt_ids + reply_ids, [IGNORE] * len(prompt_ids) + reply_ids


def batches(examples: list[tuple[list[int], list[int]]], batch_size: int, pad_id: int, seed: int):
    """Endless right-padded batches ``(ids [B, T], attention_mask [B, T], labels [B, T])``, reshuffled each epoch."""
    rng = random.Random(seed)
    while True:
        order = list(range(len(examples)))
        rng.shuffle(order)
        for start in range(0, len(order) - batch_size + 1, batch_size):
            chosen = [examples[i] for i in order[start:start + batch_size]]
            width = max(len(ids) for ids, _ in chosen)
            ids = torch.full((batch_size, width), pad_id)
            labels = torch.full((batch_size, width), IGNORE)
            mask = torch.zeros((batch_size, width), dtype=torch.long)
            for row, (seq, lab) in enumerate(chosen):
                ids[row, :len(seq)], labels[row, :len(lab)], mask[row, :len(seq)] = (
                    torch.tensor(seq), torch.tensor(lab), 1)
            yield ids, mask, labels


def reply_loss(peft_model, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy over the labelled positions, projecting only those hidden states to the vocabulary."""
    causal_lm = peft_model.base_model.model
    hidden = causal_lm.model(input_ids=ids, attention_mask=mask).last_hidden_state  # [B, T, hidden]
    targets = labels[:, 1:]  # [B, T-1]
    selected = targets != IGNORE
    logits = causal_lm.lm_head(hidden[:, :-1][selected])  # [num_reply_tokens, vocab]
    return torch.nn.functional.cross_entropy(logits.float(), targets[selected])


def learning_rate(step: int, recipe: Recipe, total: int) -> float:
    if step < recipe.warmup_steps:
        return recipe.lr * (step + 1) / recipe.warmup_steps
    progress = (step - recipe.warmup_steps) / max(1, total - recipe.warmup_steps)
    return recipe.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train_adapter(name: str, out_dir: Path, *, steps: int | None = None, batch_size: int | None = None, seed: int = 0,
                  log=print) -> float:
    """Train adapter ``name`` into ``out_dir`` (``steps`` and ``batch_size`` override its recipe); return the
    training time in seconds, model load excluded."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    recipe = RECIPES[name] if batch_size is None else replace(RECIPES[name], batch_size=batch_size)
    total = steps if steps is not None else recipe.steps
    model_dir = resolve_model(BASE_MODEL)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(r=recipe.rank, lora_alpha=recipe.alpha, lora_dropout=0.0, bias="none",
                        target_modules=list(TARGET_MODULES), task_type="CAUSAL_LM")
    model = get_peft_model(base, config).train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=recipe.lr, weight_decay=0.0)
    examples = [encode(tokenizer, c) for c in training_conversations(name, seed)]
    stream = batches(examples, recipe.batch_size, tokenizer.pad_token_id, seed)
    log(f"[{name}] {len(examples)} conversations, {total} steps of {recipe.batch_size}, lr {recipe.lr}")
    start = time.perf_counter()
    for step in range(total):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, recipe, total)
        loss = reply_loss(model, *next(stream))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 5 == 0 or step == total - 1:
            log(f"[{name}] step {step + 1}/{total} loss {loss.item():.4f} elapsed {time.perf_counter() - start:.0f}s")
    elapsed = time.perf_counter() - start
    save_adapter(model, out_dir)
    return elapsed


def save_adapter(peft_model, out_dir: Path) -> None:
    """PEFT's own files, then the tensors in fp16 and a config that names the hub model, not a local folder."""
    out_dir.mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(out_dir, safe_serialization=True)
    weights = out_dir / WEIGHTS_NAME
    tensors = {k: v.to(torch.float16).contiguous() for k, v in load_file(weights).items()}
    save_file(tensors, weights, metadata={"format": "pt"})
    config_path = out_dir / CONFIG_NAME
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = HUB_NAME
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    readme = out_dir / "README.md"  # PEFT's model-card template, with nothing filled in
    readme.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=ADAPTER_NAMES, help="train just this adapter")
    parser.add_argument("--steps", type=int, help="override every recipe's number of steps")
    parser.add_argument("--out", type=Path, default=Path("demo/adapters"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    for name in [args.only] if args.only else ADAPTER_NAMES:
        elapsed = train_adapter(name, args.out / name, steps=args.steps, seed=args.seed,
                                log=lambda line: print(line, flush=True))
        size = (args.out / name / WEIGHTS_NAME).stat().st_size
        print(f"[{name}] trained in {elapsed:.0f}s, {size / 1e6:.1f} MB -> {args.out / name}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
