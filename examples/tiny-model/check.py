"""Check that this folder is a loadable model without vLLM: transformers builds it with random
weights from config.json, the tokenizer round-trips text, and a short greedy generation runs.

    python examples/tiny-model/check.py        (needs torch and transformers)
"""

from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

HERE = Path(__file__).resolve().parent

config = AutoConfig.from_pretrained(HERE)
tokenizer = AutoTokenizer.from_pretrained(HERE)
assert len(tokenizer) == config.vocab_size, "every id the model can emit must decode"
text = "Hello, wörld!"
ids = tokenizer(text)["input_ids"]
assert tokenizer.decode(ids, skip_special_tokens=True) == text, "tokenizer does not round-trip"
device = "cuda" if torch.cuda.is_available() else "cpu"
model = AutoModelForCausalLM.from_config(config).to(device=device, dtype=torch.bfloat16)
params = sum(p.numel() for p in model.parameters())
out = model.generate(torch.tensor([ids], device=device), max_new_tokens=8, do_sample=False)
assert out.shape == (1, len(ids) + 8), out.shape
print(f"tiny-model ok: {config.model_type}, {params / 1e6:.1f}M parameters, generated on {device}")
