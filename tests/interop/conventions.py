"""The interop test's conventions part (tests/interop/interop_test.py): DeepSeek-V4 and V4.1
models written by gguf-py's GGUFWriter (docs/gguf.md "Conventions": llama.cpp's deepseek4 /
deepseek41 keys, an F16 router, per-layer clamp arrays for the routed and the shared experts,
expert_weights_norm and gate_temp left to their defaults; deepseek4's layer 0 hash-routed with a
ffn_gate_tid2eid table and no exp_probs_b; deepseek41 with V4.1's vision bias exp_probs_b_vl) read,
run and checked by moecheck; the hash-routed layer refused by name; the reference's router logits
and every expert's h recomputed from the file with the layer's own clamp.

Also a script: `conventions.py OUTDIR` writes v4.gguf and v41.gguf there (what .ci/gpu-suite
stage carries to the GPU machine, which has no Python packages, to check them three ways)."""

import pathlib
import sys

import gguf
import h5py
import numpy as np

import formats as F
from checks import check, check_close, weights

V4 = dict(dim=512, inter=256, n_routed=8, topk=2, layers=3, route_scale=1.5, vocab=64,
          clamp_exp=[10.0, 10.0, 0.75], clamp_shexp=[10.0, 6.0, 0.25])


def add_experts(w, rng, b, dim, inter, n):
    """A layer's routed experts (random valid Q2_K gate / up, Q3_K down: gguf-py has no K-quant
    quantiser) and its bf16 shared expert, under the tensor names of docs/gguf.md."""
    def normal_bf16(rows, cols, sigma):
        return F.f32_to_bf16(rng.normal(0, sigma, (rows, cols)).astype(np.float32))

    for proj in ("gate", "up"):
        blocks = F.random_q2k(rng, n * inter * dim // F.QK_K, dim**-0.5)
        w.add_tensor(b + f"ffn_{proj}_exps.weight", blocks.reshape(n, inter, -1),
                     raw_dtype=gguf.GGMLQuantizationType.Q2_K)
    blocks = F.random_q3k(rng, n * dim * inter // F.QK_K, inter**-0.5)
    w.add_tensor(b + "ffn_down_exps.weight", blocks.reshape(n, dim, -1),
                 raw_dtype=gguf.GGMLQuantizationType.Q3_K)
    for proj in ("gate", "up"):
        w.add_tensor(b + f"ffn_{proj}_shexp.weight", normal_bf16(inter, dim, dim**-0.5),
                     raw_dtype=gguf.GGMLQuantizationType.BF16)
    w.add_tensor(b + "ffn_down_shexp.weight", normal_bf16(dim, inter, inter**-0.5),
                 raw_dtype=gguf.GGMLQuantizationType.BF16)


def write_deepseek4_model(path, rng, arch="deepseek4"):
    """arch deepseek4: layer 0 hash-routed. deepseek41: no hash layer (hash_layer_count 0, as
    llama.cpp's V4.1 loader reads V4's keys) and every layer with V4.1's exp_probs_b_vl."""
    c = V4
    dim, inter, n = c["dim"], c["inter"], c["n_routed"]
    hashed = arch == "deepseek4"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_quantization_version(2)
    w.add_block_count(c["layers"])
    w.add_embedding_length(dim)
    w.add_expert_feed_forward_length(inter)
    w.add_expert_count(n)
    w.add_expert_used_count(c["topk"])
    w.add_expert_shared_count(1)
    w.add_expert_weights_scale(c["route_scale"])
    w.add_uint32(f"{arch}.expert_gating_func", 4)  # llama.cpp's sqrtsoftplus id
    w.add_uint32(f"{arch}.hash_layer_count", 1 if hashed else 0)
    w.add_array(f"{arch}.swiglu_clamp_exp", c["clamp_exp"])
    w.add_array(f"{arch}.swiglu_clamp_shexp", c["clamp_shexp"])
    for L in range(c["layers"]):
        b = f"blk.{L}."
        w.add_tensor(b + "ffn_gate_inp.weight",
                     rng.normal(0, dim**-0.5, (n, dim)).astype(np.float16))
        if hashed and L == 0:  # hash-routed: experts by token id
            table = (np.arange(c["vocab"])[:, None] + np.arange(c["topk"])[None, :] * 3) % n
            w.add_tensor(b + "ffn_gate_tid2eid.weight", table.astype(np.int32))
        else:
            w.add_tensor(b + "exp_probs_b.bias", rng.normal(0, 0.01, n).astype(np.float32))
        if not hashed:
            w.add_tensor(b + "exp_probs_b_vl.bias", rng.normal(0, 0.05, n).astype(np.float32))
        add_experts(w, rng, b, dim, inter, n)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def swiglu(g, u, limit):
    g, u = g.astype(np.float64), u.astype(np.float64)
    if limit > 0:
        g, u = np.minimum(g, limit), np.clip(u, -limit, limit)
    return g / (1 + np.exp(-g)) * u


def check_h(group, limit, weighted, what, repro):
    """h from the group's own gate and up taps with the layer's clamp (times the routing weight
    where the reference applies it): a wrong clamp moves h by far more than the f32 / bf16
    rounding allowed here."""
    g, u, h = group["gate"][...], group["up"][...], group["h"][...]
    want = swiglu(g, u, limit)
    if weighted:
        want = want * group["weights"][...].astype(np.float64)[:, None]
    check_close(h, want, 2.0**-7 * np.abs(want) + 1e-6, what, repro)


def run_convention(ctx, arch):
    hashed = arch == "deepseek4"
    path = ctx.p(f"gguf_py_{arch}.gguf")
    write_deepseek4_model(path, np.random.default_rng(20261202), arch)
    info = ctx.moecheck_json("inspect", path)
    check("not_a_moecheck_model" not in info, f"moecheck refuses the gguf-py deepseek4 model: "
          f"{info.get('not_a_moecheck_model')}\n  repro: moecheck inspect {path}")
    check(info["convention"] == arch and info["router_type"] == "F16" and
          info["hash_layers"] == (1 if hashed else 0) and info["layers"] == V4["layers"],
          f"convention read back: {info['convention']}, router {info['router_type']}, hash "
          f"layers {info['hash_layers']}\n  repro: moecheck inspect {path} --json")
    check(info["swiglu_clamp_exp"] == V4["clamp_exp"] and
          info["swiglu_clamp_shexp"] == V4["clamp_shexp"],
          f"clamps read back {info['swiglu_clamp_exp']} / {info['swiglu_clamp_shexp']}")
    check(set(info["defaulted"]) == {f"{arch}.expert_weights_norm", "moecheck.gate_temp"},
          f"defaulted keys {info['defaulted']}, expected expert_weights_norm and gate_temp")
    if hashed:
        r = ctx.moecheck("run", "--impl", "emu", "--model", path, "--layers", "0", "-o",
                         ctx.p("v4_hash.h5"), code=2)
        check("layer 0 is hash-routed" in r.stderr and "blk.0.ffn_gate_tid2eid.weight" in r.stderr,
              f"the hash-routed layer's refusal does not name it: {r.stderr.strip()}")
    extra = [] if hashed else ["--image-tokens", "1-3"]  # deepseek41: bias_vl for those tokens
    cj = ctx.moecheck_json("check", "--model", path, "--tokens", "6", *extra)
    check(cj["pass"] is True, f"moecheck check on the gguf-py {arch} model did not pass\n  "
          f"repro: {ctx.moecheck_bin} check --model {path} --tokens 6 {' '.join(extra)}")
    for impl in ("ref", "emu"):
        out = ctx.p(f"{arch}_{impl}.h5")
        ctx.moecheck("run", "--impl", impl, "--model", path, "--tokens", "12", "--taps", "-o", out)
        repro = f"{ctx.moecheck_bin} run --impl {impl} --model {path} --tokens 12 --taps -o {out}"
        reader = gguf.GGUFReader(path)
        with h5py.File(out, "r") as f:
            routed = [1, 2] if hashed else [0, 1, 2]
            check(list(f.attrs["layers"]) == routed, f"{impl}: layers {list(f.attrs['layers'])}, "
                  f"expected the routed layers {routed}")
            weighted = f.attrs["routing_weight_at"] == (b"h" if isinstance(
                f.attrs["routing_weight_at"], bytes) else "h")
            for L in routed:
                g = f[f"layers/{L}"]
                x = F.bf16_to_f32(g["input"][...]).astype(np.float64)
                wr = weights(reader, f"blk.{L}.ffn_gate_inp.weight")  # f16, widened
                check_close(g["router_logits"][...], x @ wr.T, F.dot_bound(x, wr, V4["dim"]),
                            f"{impl} layer {L} router_logits (F16 router)", repro)
                for name, e in g["experts"].items():
                    check_h(e, V4["clamp_exp"][L], weighted,
                            f"{impl} layer {L} expert {name} h (clamp {V4['clamp_exp'][L]})", repro)
                check_h(g["shared"], V4["clamp_shexp"][L], False,
                        f"{impl} layer {L} shared h (clamp {V4['clamp_shexp'][L]})", repro)
        print(f"  {arch} {impl}: F16 router logits and every expert's h with the layer's clamps "
              "recomputed from the gguf-py file")


def test_moecheck_runs_gguf_py_conventions(ctx):
    for arch in ("deepseek4", "deepseek41"):
        run_convention(ctx, arch)


if __name__ == "__main__":
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    write_deepseek4_model(out / "v4.gguf", np.random.default_rng(20261202), "deepseek4")
    write_deepseek4_model(out / "v41.gguf", np.random.default_rng(20261202), "deepseek41")
