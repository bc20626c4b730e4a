"""Random-weight Llama models for tests and the main job (no hub downloads exist here).

Real Llama architecture (transformers ``LlamaForCausalLM``), fp32 safetensors, saved under
``<repo>/.cache/models/<name>`` (gitignored) and reused when present. Weights are random with a
fixed seed; matrices are scaled by ``weight_scale`` so the logits are peaky and greedy decoding
does not sit on near-ties (docs/vllm.md §2), which keeps token-exact comparisons meaningful.

Presets (parameter counts from the built model):

- ``tiny``: 2 layers, hidden 256, 4 heads / 2 KV heads, head_dim 64, vocab 2048 (about 2.2 M).
- ``m152``: 12 layers, hidden 1024, 16 heads / 4 KV heads, head_dim 64, intermediate 2368,
  vocab 16384 (about 152 M); s_kv = 2*12*4*64*4 = 24,576 B/token in fp32 (docs/model.md Eq. 1).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from agent.weights import weights_digest

__all__ = ["PRESETS", "build_model", "num_parameters", "weights_digest", "model_config", "REPO_ROOT"]

REPO_ROOT = Path(__file__).resolve().parent.parent
CACHE_DIR = REPO_ROOT / ".cache" / "models"

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(vocab_size=2048, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                 max_position_embeddings=4096),
    "m152": dict(vocab_size=16384, hidden_size=1024, intermediate_size=2368,
                 num_hidden_layers=12, num_attention_heads=16, num_key_value_heads=4,
                 head_dim=64, max_position_embeddings=4096),
}


def build_model(name: str = "tiny", *, root: str | os.PathLike | None = None, seed: int = 0,
                weight_scale: float = 4.0, overrides: dict[str, Any] | None = None) -> Path:
    """Build (or reuse) a random-weight fp32 Llama and return its directory.

    Args:
        name: a key of :data:`PRESETS` (or any name when ``overrides`` gives a full config).
        root: parent folder; default ``<repo>/.cache/models``.
        seed: torch seed for the weights.
        weight_scale: factor applied to every weight matrix (dim > 1).
        overrides: LlamaConfig fields replacing the preset's.

    Returns:
        Path of a folder vLLM can load (``config.json``, ``model.safetensors``).

    Raises:
        KeyError: unknown preset and no overrides.
    """
    cfg_fields = dict(PRESETS.get(name, {}))
    if not cfg_fields and not overrides:
        raise KeyError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}")
    cfg_fields.update(overrides or {})
    out = Path(root) if root is not None else CACHE_DIR
    path = out / name
    marker = path / "pallas-build.json"
    spec = {"config": cfg_fields, "seed": seed, "weight_scale": weight_scale}
    if marker.exists() and json.loads(marker.read_text()) == spec:
        return path

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                      torch_dtype="float32", **cfg_fields)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(weight_scale)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    marker.write_text(json.dumps(spec))
    (path / "pallas-digest.txt").unlink(missing_ok=True)
    return path


def num_parameters(path: str | os.PathLike) -> int:
    """Parameter count of a saved model folder (from its safetensors headers)."""
    total = 0
    for f in sorted(Path(path).glob("*.safetensors")):
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
        for k, v in header.items():
            if k == "__metadata__":
                continue
            size = 1
            for d in v["shape"]:
                size *= d
            total += size
    return total


def model_config(path: str | os.PathLike) -> dict[str, Any]:
    """The model's ``config.json`` as a dict."""
    return json.loads((Path(path) / "config.json").read_text())
