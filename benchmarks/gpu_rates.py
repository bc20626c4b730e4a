"""Measure the timing model's rates on a GPU: prefill rate r_p, decode rate r_d, KV block copy speed.

Run by hand on a machine with a CUDA GPU (PyTorch and transformers installed; no vLLM needed).
Models are built from their public Hugging Face configs with random bf16 weights, so nothing is
downloaded. Prints a table and writes JSON (``--out``) that the timing model and the replay's
``--simulate`` mode read (``benchmarks/results/``).

What is measured (docs/model.md §2-3):
- r_p: one request's prefill of L tokens, batch 1, logits for the last position only
  (tokens/s = L / wall time, CUDA-synchronised, median of reps).
- r_d: per-request decode steps at context K, batch 1 and 8, with the HF KV cache. This is eager
  PyTorch without CUDA graphs, so it over-states the per-step time against vLLM's graphed decode:
  treat it as a lower bound on r_d.
- Block copy: a vLLM-style paged cache per layer, ``[num_blocks, 2, block_size, H_kv, d_h]``
  bf16; copying one whole block (all layers) to pinned host memory and back (the agent's
  copy-out at the source and copy-in at the target), one block at a time and 64 blocks batched,
  plus the raw pinned D2H / H2D bandwidth.

Usage: ``python benchmarks/gpu_rates.py --out rates.json`` (``--tiny`` runs a toy config on
CPU to check the script itself).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

# Public architecture facts (the models' config.json on the Hugging Face hub).
MODELS: dict[str, dict] = {
    "llama-3-8b": dict(model_type="llama", hidden_size=4096, intermediate_size=14336,
                       num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                       head_dim=128, vocab_size=128256, max_position_embeddings=8192,
                       rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False),
    "qwen3-14b": dict(model_type="qwen3", hidden_size=5120, intermediate_size=17408,
                      num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=8,
                      head_dim=128, vocab_size=151936, max_position_embeddings=40960,
                      rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False),
    "qwen3-32b": dict(model_type="qwen3", hidden_size=5120, intermediate_size=25600,
                      num_hidden_layers=64, num_attention_heads=64, num_key_value_heads=8,
                      head_dim=128, vocab_size=151936, max_position_embeddings=40960,
                      rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False),
}
TINY = dict(model_type="llama", hidden_size=128, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=512,
            max_position_embeddings=4096, tie_word_embeddings=False)


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def timed(fn, dev, reps: int) -> float:
    """Median wall time of ``fn()`` over ``reps`` runs after one warm-up (seconds)."""
    fn()
    sync(dev)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync(dev)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def build(cfg: dict, dev: torch.device, dtype: torch.dtype):
    from transformers import AutoConfig, AutoModelForCausalLM
    c = dict(cfg)
    mt = c.pop("model_type")
    conf = AutoConfig.for_model(mt, **c)
    torch.manual_seed(0)
    with torch.device(dev):
        m = AutoModelForCausalLM.from_config(conf, dtype=dtype)
    return m.eval()


@torch.inference_mode()
def model_rates(name: str, cfg: dict, dev, dtype, prefill_lens, decode_ctx, reps) -> dict:
    t0 = time.perf_counter()
    m = build(cfg, dev, dtype)
    sync(dev)
    out: dict = {"model": name, "build_s": round(time.perf_counter() - t0, 2),
                 "params": sum(p.numel() for p in m.parameters()),
                 "kv_bytes_per_token": 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"]
                 * cfg["head_dim"] * torch.finfo(dtype).bits // 8,
                 "prefill": [], "decode": []}
    V = cfg["vocab_size"]
    g = torch.Generator(device="cpu").manual_seed(1)
    for L in prefill_lens:
        ids = torch.randint(0, V, (1, L), generator=g).to(dev)
        s = timed(lambda: m(input_ids=ids, use_cache=True, logits_to_keep=1), dev, reps)
        out["prefill"].append({"tokens": L, "seconds": s, "tokens_per_s": L / s})
    for K in decode_ctx:
        for bs in (1, 8):
            ids = torch.randint(0, V, (bs, K), generator=g).to(dev)
            res = m(input_ids=ids, use_cache=True, logits_to_keep=1)
            pkv = res.past_key_values
            nxt = res.logits[:, -1:].argmax(-1)
            steps = 24
            for _ in range(3):  # warm-up steps
                r = m(input_ids=nxt, past_key_values=pkv, use_cache=True)
                pkv, nxt = r.past_key_values, r.logits[:, -1:].argmax(-1)
            sync(dev)
            t1 = time.perf_counter()
            for _ in range(steps):
                r = m(input_ids=nxt, past_key_values=pkv, use_cache=True)
                pkv, nxt = r.past_key_values, r.logits[:, -1:].argmax(-1)
            sync(dev)
            step = (time.perf_counter() - t1) / steps
            out["decode"].append({"context": K, "batch": bs, "step_s": step,
                                  "tokens_per_s_per_request": 1.0 / step})
            del pkv, r, res
    del m
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return out


@torch.inference_mode()
def block_copy(cfg: dict, dev, dtype, block_size: int, reps: int) -> dict:
    """Whole-block copies between a paged per-layer KV cache and pinned host memory."""
    Lyr, H, D = cfg["num_hidden_layers"], cfg["num_key_value_heads"], cfg["head_dim"]
    nb = 1024
    caches = [torch.randn(nb, 2, block_size, H, D, device=dev, dtype=dtype) for _ in range(Lyr)]
    pin = dev.type == "cuda"
    blk_bytes = Lyr * caches[0][0].numel() * caches[0].element_size()
    host1 = torch.empty((Lyr,) + tuple(caches[0][0].shape), dtype=dtype, pin_memory=pin)
    ids = torch.arange(0, 128, 2, device=dev)  # 64 scattered blocks
    host64 = torch.empty((Lyr, len(ids)) + tuple(caches[0][0].shape), dtype=dtype, pin_memory=pin)

    def out1():
        for l in range(Lyr):
            host1[l].copy_(caches[l][7], non_blocking=pin)

    def in1():
        for l in range(Lyr):
            caches[l][9].copy_(host1[l], non_blocking=pin)

    def out64():
        for l in range(Lyr):
            host64[l].copy_(caches[l].index_select(0, ids), non_blocking=pin)

    def in64():
        for l in range(Lyr):
            caches[l].index_copy_(0, ids, host64[l].to(dev, non_blocking=pin))

    big = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    bigh = torch.empty(256 << 20, dtype=torch.uint8, pin_memory=pin)
    res = {"block_size": block_size, "block_bytes": blk_bytes}
    for k, fn, nbytes in (("d2h_1_block", out1, blk_bytes), ("h2d_1_block", in1, blk_bytes),
                          ("d2h_64_blocks", out64, 64 * blk_bytes), ("h2d_64_blocks", in64, 64 * blk_bytes),
                          ("d2h_raw_256MiB", lambda: bigh.copy_(big, non_blocking=pin), big.numel()),
                          ("h2d_raw_256MiB", lambda: big.copy_(bigh, non_blocking=pin), big.numel())):
        s = timed(fn, dev, reps)
        res[k] = {"seconds": s, "GB_per_s": nbytes / s / 1e9}
    del caches, big, bigh
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return res


@torch.inference_mode()
def graphed_decode(name: str, cfg: dict, dev, dtype, contexts, steps: int = 32) -> list[dict]:
    """Per-request decode step time with the step captured in a CUDA graph (batch 1).

    vLLM replays CUDA graphs for decode; eager PyTorch is launch-bound, so this is the figure
    closer to a serving engine's r_d. Static KV cache sized to the context plus the steps.
    """
    from transformers import StaticCache
    m = build(cfg, dev, dtype)
    V = cfg["vocab_size"]
    out = []
    for K in contexts:
        cache = StaticCache(config=m.config, max_cache_len=K + steps + 8)
        ids = torch.randint(0, V, (1, K), device=dev)
        m(input_ids=ids, past_key_values=cache, cache_position=torch.arange(K, device=dev),
          use_cache=True, logits_to_keep=1)
        tok = torch.zeros((1, 1), dtype=torch.long, device=dev)
        pos = torch.tensor([K], device=dev)

        def step():
            return m(input_ids=tok, past_key_values=cache, cache_position=pos, use_cache=True).logits

        mode = "eager-static"
        fn = step
        if dev.type == "cuda":
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    step()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                logits = step()
            fn, mode = g.replay, "cuda-graph"
        sync(dev)
        t0 = time.perf_counter()
        for i in range(steps):
            pos.fill_(K + i)
            fn()
        sync(dev)
        st = (time.perf_counter() - t0) / steps
        out.append({"context": K, "batch": 1, "mode": mode, "step_s": st, "tokens_per_s_per_request": 1 / st})
        del cache
    del m
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu_rates.json")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--tiny", action="store_true", help="toy config on CPU (checks the script)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=420.0, help="skip what would start after this")
    ap.add_argument("--graphed-decode-only", action="store_true",
                    help="only the CUDA-graph decode figures, merged into an existing --out file")
    a = ap.parse_args()
    dev = torch.device("cpu" if a.tiny or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if dev.type == "cpu" else torch.bfloat16
    todo = {"tiny": TINY} if a.tiny else {k: MODELS[k] for k in a.models.split(",")}
    t_start = time.perf_counter()
    if a.graphed_decode_only:
        with open(a.out) as f:
            report = json.load(f)
        gd = report.setdefault("graphed_decode", {})
        for name, cfg in todo.items():
            try:
                gd[name] = graphed_decode(name, cfg, dev, dtype, [128] if a.tiny else [1024, 4096])
            except Exception as e:  # report, do not lose the other models' figures
                gd[name] = {"error": repr(e)[:300]}
            print(name, json.dumps(gd[name]), flush=True)
            with open(a.out, "w") as f:
                json.dump(report, f, indent=1)
        return
    report = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor(),
              "torch": torch.__version__, "dtype": str(dtype), "models": [], "block_copy": []}
    try:
        import transformers
        report["transformers"] = transformers.__version__
    except ImportError:
        pass
    for name, cfg in todo.items():
        if time.perf_counter() - t_start > a.budget_s:
            print(f"skip {name}: time budget spent", flush=True)
            continue
        bc = block_copy(cfg, dev, dtype, 16, a.reps)
        bc["model"] = name
        report["block_copy"].append(bc)
        print(f"{name}: block {bc['block_bytes']/1e6:.2f} MB  d2h 1 blk {bc['d2h_1_block']['seconds']*1e6:.0f} us "
              f"({bc['d2h_1_block']['GB_per_s']:.1f} GB/s)  64 blk {bc['d2h_64_blocks']['GB_per_s']:.1f} GB/s  "
              f"h2d 64 blk {bc['h2d_64_blocks']['GB_per_s']:.1f} GB/s  raw d2h {bc['d2h_raw_256MiB']['GB_per_s']:.1f} GB/s",
              flush=True)
        lens = [128, 256] if a.tiny else [512, 1024, 2048, 4096]
        ctx = [128] if a.tiny else [1024, 4096]
        r = model_rates(name, cfg, dev, dtype, lens, ctx, a.reps)
        report["models"].append(r)
        pf = "  ".join(f"{p['tokens']}:{p['tokens_per_s']:.0f}" for p in r["prefill"])
        dc = "  ".join(f"K{d['context']}xB{d['batch']}:{d['tokens_per_s_per_request']:.1f}" for d in r["decode"])
        print(f"{name}: build {r['build_s']} s  prefill tok/s {pf}  decode tok/s/request {dc}", flush=True)
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)
    report["wall_s"] = round(time.perf_counter() - t_start, 1)
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {a.out} in {report['wall_s']} s")


if __name__ == "__main__":
    main()
