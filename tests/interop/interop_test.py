"""moecheck's files against the Python ecosystem (CTest `interop`, labels cpu and interop;
docs/building.md "The interop test"). Four checks:

  gguf_py_reads_moecheck_models   gguf-py's GGUFReader on `moecheck gen` files: the keys, types,
                                  values, tensor names, types, shapes and offsets moecheck reports,
                                  the documented layout, and gguf-py's dequantisation of every
                                  tensor bit for bit against moecheck's
                                  (tests/interop/dequant_probe)
  moecheck_runs_gguf_py_models    a model written by gguf-py's GGUFWriter (random valid K-quant
                                  blocks built here) inspected, run and checked by moecheck; the
                                  reference's router logits, routing and expert taps recomputed
                                  from the file with numpy within the f32 error bound
  h5py_reads_moecheck_dumps       `moecheck run` dumps, with and without --taps, read by h5py by
                                  the names, types and shapes of docs/golden-format.md, with
                                  values checked against the model (router logits, routing, the
                                  SHA-256 of every slice read), the run's report (output norms)
                                  and each other (q8_1 against the input, output = bf16(acc),
                                  expert groups against the picks)
  moecheck_runs_gguf_py_conventions  deepseek4 and deepseek41 models written by GGUFWriter (F16
                                  router, per-layer clamps, a hash-routed layer / bias_vl;
                                  tests/interop/conventions.py) inspected, run and checked, the
                                  hash layer refused by name, router logits and every h
                                  recomputed

usage: interop_test.py --moecheck BIN --probe BIN --work DIR
Runs from the virtual environment that `bash .ci/deps` creates (/opt/moecheck-venv); a missing
module is a failure that says so."""

import argparse
import importlib
import importlib.metadata
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import traceback

sys.dont_write_bytecode = True  # no __pycache__ beside the sources
MODULES = ("numpy", "h5py", "gguf")


def require_modules():
    missing = []
    for m in MODULES:
        try:
            importlib.import_module(m)
        except ImportError as e:
            missing.append(f"{m} ({e})")
    if missing:
        print(f"interop: FAILED: Python module(s) missing in {sys.executable}: "
              f"{'; '.join(missing)}.\n  Create the virtual environment with `bash .ci/deps` "
              "(as root: /opt/moecheck-venv from tests/interop/requirements.txt), or configure "
              "with -DMOECHECK_PYTHON=<a python that has them>.", file=sys.stderr)
        sys.exit(1)
    print("interop: " + sys.executable + ": " +
          ", ".join(f"{m} {importlib.metadata.version(m)}" for m in MODULES))


require_modules()

import hashlib  # noqa: E402
import json  # noqa: E402

import gguf  # noqa: E402
import h5py  # noqa: E402
import numpy as np  # noqa: E402

import formats as F  # noqa: E402
from conventions import add_experts, test_moecheck_runs_gguf_py_conventions  # noqa: E402
from checks import (attr, check, check_close, check_routing, dataset, field_value,  # noqa: E402
                    weights)


class Ctx:
    def __init__(self, moecheck, probe, work):
        self.moecheck_bin, self.probe_bin, self.work = moecheck, probe, work

    def run(self, argv, code=0):
        cmd = [str(a) for a in argv]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != code:
            raise AssertionError(f"exit {r.returncode}, expected {code}\n  repro: "
                                 f"{shlex.join(cmd)}\n  stderr: {r.stderr.strip()}")
        return r

    def moecheck(self, *args, code=0):
        return self.run([self.moecheck_bin, *args], code)

    def moecheck_json(self, *args, code=0):
        r = self.moecheck(*args, "--json", code=code)
        try:
            return json.loads(r.stdout)
        except json.JSONDecodeError as e:
            raise AssertionError(f"not JSON ({e}): moecheck {shlex.join(map(str, args))} --json")

    def p(self, name):
        return self.work / name


# ---- gguf-py reads moecheck's models ------------------------------------------------------

def check_metadata(reader, info, path):
    fields = [f for f in reader.fields.values() if not f.name.startswith("GGUF.")]
    meta = info["metadata"]
    check([f.name for f in fields] == list(meta), f"{path}: keys differ:\n  gguf-py "
          f"{[f.name for f in fields]}\n  moecheck {list(meta)}")
    for f in fields:
        tname = gguf.GGUFValueType(f.types[0]).name.lower()
        check(tname == meta[f.name]["type"],
              f"{path}: {f.name}: gguf-py type {tname}, moecheck {meta[f.name]['type']}")
        check(field_value(f) == meta[f.name]["value"], f"{path}: {f.name}: gguf-py "
              f"{field_value(f)!r}, moecheck inspect {meta[f.name]['value']!r}")
        if f.name in F.DOC_KEYS:
            check(tname == F.DOC_KEYS[f.name][0], f"{path}: {f.name} is {tname}, docs/gguf.md "
                  f"says {F.DOC_KEYS[f.name][0]}")
    for k, (_, required) in F.DOC_KEYS.items():
        check(not required or k in meta, f"{path}: required key {k} missing")
    check(meta["general.architecture"]["value"] == "deepseek2", f"{path}: architecture")


def check_tensors(reader, info, path, expected):
    mine = info["tensors"]
    check([t.name for t in reader.tensors] == [t["name"] for t in mine],
          f"{path}: tensor names or order differ")
    for t, m in zip(reader.tensors, mine):
        got = (t.tensor_type.name, [int(x) for x in t.shape], int(t.n_bytes),
               int(t.data_offset) - reader.data_offset)
        want = (m["type"], m["shape"], m["bytes"], m["offset"])
        check(got == want, f"{path}: {t.name}: gguf-py (type, ne, bytes, offset) {got}, "
              f"moecheck {want}")
    layout = {t.name: (t.tensor_type.name, [int(x) for x in t.shape]) for t in reader.tensors}
    check(layout == expected, f"{path}: layout differs from docs/gguf.md:\n  file {layout}\n"
          f"  docs {expected}")


def check_dequant(ctx, reader, path):
    n = 0
    for t in reader.tensors:
        out = ctx.p(f"{path.stem}.{t.name}.f32")
        ctx.run([ctx.probe_bin, path, t.name, out])
        ours = np.fromfile(out, dtype=np.float32)
        theirs = np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type),
                                      dtype=np.float32).ravel()
        repro = (f"{ctx.probe_bin} {path} {t.name} {out}; python: gguf.quants.dequantize("
                 f"GGUFReader('{path}').tensors[{n}].data, {t.tensor_type.name})")
        check(ours.size == t.n_elements == theirs.size,
              f"{t.name}: {ours.size} values from moecheck, {theirs.size} from gguf-py, "
              f"{t.n_elements} in the file\n  repro: {repro}")
        check(bool(np.all(np.isfinite(theirs))) and float(np.std(theirs)) > 0,
              f"{t.name}: gguf-py's values are not finite and varied\n  repro: {repro}")
        at = F.first_bad(ours.view(np.uint32) == theirs.view(np.uint32))
        if at is not None:
            i = at[0]
            raise AssertionError(
                f"{path}: {t.name} ({t.tensor_type.name}): first differing value at flat index "
                f"{i} (row {i // int(t.shape[0])}, col {i % int(t.shape[0])}): moecheck "
                f"{ours[i]!r} ({ours.view(np.uint32)[i]:#010x}), gguf-py {theirs[i]!r} "
                f"({theirs.view(np.uint32)[i]:#010x})\n  repro: {repro}")
        n += 1
    return n


def test_gguf_py_reads_moecheck_models(ctx):
    models = [("tiny.gguf", ["--preset", "tiny", "--layers", "2", "--seed", "1"], "bf16", False),
              ("random.gguf", ["--preset", "tiny", "--layers", "1", "--seed", "5", "--blocks",
                               "random", "--shared", "kquant", "--vision"], "kquant", True)]
    for name, args, shared, vision in models:
        path = ctx.p(name)
        ctx.moecheck("gen", *args, "-o", path)
        info = ctx.moecheck_json("inspect", path)
        reader = gguf.GGUFReader(path)
        check_metadata(reader, info, path)
        c = info["config"]
        expected = {}
        for layer in range(info["layers"]):
            expected.update(F.layer_tensors(layer, c["dim"], c["inter"], c["n_routed"], shared,
                                            vision))
        check_tensors(reader, info, path, expected)
        n = check_dequant(ctx, reader, path)
        print(f"  {name}: {len(reader.fields)} fields, {n} tensors dequantised bit for bit")


# ---- moecheck reads a model gguf-py wrote -------------------------------------------------

WCFG = dict(dim=512, inter=256, n_routed=8, topk=2, layers=2, route_scale=2.5, swiglu_limit=7.0,
            gate_temp=1.25, score_func="sigmoid")


def write_gguf_py_model(path, rng):
    c = WCFG
    dim, inter, n = c["dim"], c["inter"], c["n_routed"]
    w = gguf.GGUFWriter(str(path), "deepseek2")
    w.add_name("gguf-py interop model")
    w.add_quantization_version(2)
    w.add_block_count(c["layers"])
    w.add_embedding_length(dim)
    w.add_expert_feed_forward_length(inter)
    w.add_expert_count(n)
    w.add_expert_used_count(c["topk"])
    w.add_expert_shared_count(1)
    w.add_expert_weights_scale(c["route_scale"])
    w.add_expert_weights_norm(True)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_string("moecheck.score_func", c["score_func"])
    w.add_float32("moecheck.swiglu_limit", c["swiglu_limit"])
    w.add_float32("moecheck.gate_temp", c["gate_temp"])
    bf16 = gguf.GGMLQuantizationType.BF16

    def normal_bf16(rows, cols, sigma):
        return F.f32_to_bf16(rng.normal(0, sigma, (rows, cols)).astype(np.float32))

    for L in range(c["layers"]):
        b = f"blk.{L}."
        w.add_tensor(b + "ffn_gate_inp.weight", normal_bf16(n, dim, dim**-0.5), raw_dtype=bf16)
        w.add_tensor(b + "exp_probs_b.bias", rng.normal(0, 0.01, n).astype(np.float32))
        add_experts(w, rng, b, dim, inter, n)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def check_ref_taps(f, reader, cfg, repro):
    """The reference's taps recomputed from the file gguf-py wrote: router logits (f32 sums of
    exact bf16 products), routing, each picked expert's gate (bf16-rounded f32 sum) and down
    (of the bf16-rounded h)."""
    dim, inter = cfg["dim"], cfg["inter"]
    for L in f.attrs["layers"]:
        g = f[f"layers/{L}"]
        x = F.bf16_to_f32(g["input"][...]).astype(np.float64)
        wr = weights(reader, f"blk.{L}.ffn_gate_inp.weight")
        check_close(g["router_logits"][...], x @ wr.T, F.dot_bound(x, wr, dim),
                    f"layer {L} router_logits", repro)
        bias = weights(reader, f"blk.{L}.exp_probs_b.bias")
        clear = check_routing(g["topk_ids"][...], g["topk_weights"][...],
                              g["router_logits"][...], bias, cfg, repro)
        w1 = weights(reader, f"blk.{L}.ffn_gate_exps.weight")
        w2 = weights(reader, f"blk.{L}.ffn_down_exps.weight")
        for name, e in g["experts"].items():
            xt = x[e["tokens"][...]]
            want = xt @ w1[int(name)].T
            b = F.dot_bound(xt, w1[int(name)], dim)
            check_close(e["gate"][...], want, b + F.U_BF16 * (np.abs(want) + b),
                        f"layer {L} expert {name} gate", repro)
            h = F.bf16_to_f32(F.f32_to_bf16(e["h"][...])).astype(np.float64)
            want = h @ w2[int(name)].T
            b = F.dot_bound(h, w2[int(name)], inter)
            check_close(e["down"][...], want, b + F.U_BF16 * (np.abs(want) + b),
                        f"layer {L} expert {name} down", repro)
        print(f"  layer {L}: router logits, routing ({clear} clear tokens), "
              f"{len(g['experts'])} experts' gate and down recomputed from the gguf-py file")


def test_moecheck_runs_gguf_py_models(ctx):
    path = ctx.p("gguf_py.gguf")
    write_gguf_py_model(path, np.random.default_rng(20261201))
    info = ctx.moecheck_json("inspect", path)
    check("not_a_moecheck_model" not in info, f"moecheck refuses the gguf-py model: "
          f"{info.get('not_a_moecheck_model')}\n  repro: moecheck inspect {path}")
    c = info["config"]
    want = {k: WCFG[k] for k in ("dim", "inter", "n_routed", "topk", "route_scale",
                                 "swiglu_limit", "gate_temp", "score_func")}
    check({k: c[k] for k in want} == want and c["norm_topk_prob"] is True and
          info["layers"] == WCFG["layers"], f"config read back {c}, written {WCFG}")
    ref = ctx.p("gguf_py_ref.h5")
    rj = ctx.moecheck_json("run", "--impl", "ref", "--model", path, "--tokens", "16", "--taps",
                           "-o", ref)
    ej = ctx.moecheck_json("run", "--impl", "emu", "--model", path, "-o", ctx.p("gguf_py_emu.h5"))
    for j in (rj, ej):
        norms = [layer["output_l2"] for layer in j["layers"]]
        check(all(np.isfinite(v) and v > 0 for v in norms),
              f"{j['implementation']}: output norms {norms}")
    cj = ctx.moecheck_json("check", "--model", path, "--tokens", "4")
    check(cj["pass"] is True, f"moecheck check on the gguf-py model did not pass\n  repro: "
          f"{ctx.moecheck_bin} check --model {path} --tokens 4")
    with h5py.File(ref, "r") as f:
        check_ref_taps(f, gguf.GGUFReader(path), dict(WCFG, norm_topk_prob=True),
                       f"{ctx.moecheck_bin} run --impl ref --model {path} --tokens 16 --taps "
                       f"-o {ref}")


# ---- h5py reads moecheck's dumps ----------------------------------------------------------

def check_root(f, path, model, reader, taps, run_json):
    md = {k: field_value(v) for k, v in reader.fields.items()}
    with open(model, "rb") as m:
        header = m.read(reader.data_offset)
    want = {("format_version", "i8"): 2, ("implementation", "S"): "emu",
            ("variant", "S"): run_json["variant"], ("knob.router", "S"): "staged",
            ("knob.expert_warps", "S"): "8", ("device", "S"): "cpu",
            ("model_file", "S"): model.name, ("model_sha256", "S"): "",
            ("model_header_sha256", "S"): hashlib.sha256(header).hexdigest(),
            ("config.dim", "i8"): md["deepseek2.embedding_length"],
            ("config.inter", "i8"): md["deepseek2.expert_feed_forward_length"],
            ("config.n_routed", "i8"): md["deepseek2.expert_count"],
            ("config.topk", "i8"): md["deepseek2.expert_used_count"],
            ("config.n_shared", "i8"): md["deepseek2.expert_shared_count"],
            ("config.score_func", "S"): md["moecheck.score_func"],
            ("config.route_scale", "f4"): md["deepseek2.expert_weights_scale"],
            ("config.swiglu_limit", "f4"): md["moecheck.swiglu_limit"],
            ("config.gate_temp", "f4"): md["moecheck.gate_temp"],
            ("config.norm_topk_prob", "i8"): 1, ("model_seed", "u8"): md["moecheck.generator.seed"],
            ("input_source", "S"): "seed", ("input_seed", "u8"): 1, ("tokens", "i8"): 8,
            ("taps", "i8"): int(taps), ("routing_weight_at", "S"): "accumulate"}
    for (name, kind), v in want.items():
        got = attr(f, name, kind, path)
        check(got == v, f"{path}: attribute {name} = {got!r}, expected {v!r}")
    for name in ("tool_version", "git_commit"):
        check(attr(f, name, "S", path) != "", f"{path}: {name} empty")
    check(list(attr(f, "layers", "i4[]", path)) == [0, 1], f"{path}: layers attribute")


def check_layer(g, where, cfg, T, reader, run_l2, repro):
    dim, n, k = cfg["dim"], cfg["n_routed"], cfg["topk"]
    L = int(attr(g, "layer", "i8", where))
    check(attr(g, "tokens", "i8", where) == T, f"{where}: tokens attribute")
    x = dataset(g, "input", np.uint16, (T, dim), where, bf16="bfloat16")
    logits = dataset(g, "router_logits", np.float32, (T, n), where)
    ids = dataset(g, "topk_ids", np.int32, (T, k), where)
    wts = dataset(g, "topk_weights", np.float32, (T, k), where)
    y = dataset(g, "output", np.uint16, (T, dim), where, bf16="bfloat16")
    check(bool(np.all((ids >= 0) & (ids < n))), f"{where}/topk_ids: ids outside [0, {n})")
    check(all(len(set(r)) == k for r in ids), f"{where}/topk_ids: a token picks an expert twice")
    xf = F.bf16_to_f32(x).astype(np.float64)
    wr = weights(reader, f"blk.{L}.ffn_gate_inp.weight")
    check_close(logits, xf @ wr.T, F.dot_bound(xf, wr, dim), f"{where}/router_logits", repro)
    bias = weights(reader, f"blk.{L}.exp_probs_b.bias")
    check_routing(ids, wts, logits, bias, cfg, repro)
    l2 = 0.0  # moecheck's order: a double sum of squares, element by element
    for v in F.bf16_to_f32(y).astype(np.float64).ravel().tolist():
        l2 += v * v
    check(l2**0.5 == run_l2, f"{where}/output: L2 norm {l2**0.5!r}, `moecheck run --json` said "
          f"{run_l2!r}")
    return x, ids, wts, y


TENSOR_CODES = ["ffn_gate_inp.weight", "exp_probs_b.bias", "ffn_gate_exps.weight",
                "ffn_up_exps.weight", "ffn_down_exps.weight", "ffn_gate_shexp.weight",
                "ffn_up_shexp.weight", "ffn_down_shexp.weight", "exp_probs_b_vl.bias"]


def check_provenance(g, where, reader, L, ids, repro):
    """/layers/<L>/tensors: each recorded SHA-256 is that of the tensor's bytes (a stacked
    tensor's expert slice: expert e of n at e * nbytes / n), hashed here from gguf-py's view of
    the file; the slices are those of the picked experts."""
    tg = f"{where}/tensors"
    code = dataset(g["tensors"], "tensor", np.int32, (g["tensors/tensor"].shape[0],), tg)
    n = len(code)
    expert = dataset(g["tensors"], "expert", np.int32, (n,), tg)
    digest = dataset(g["tensors"], "sha256", np.uint8, (n, 32), tg)
    by_name = {t.name: t for t in reader.tensors}
    for c, e, h in zip(code, expert, digest):
        t = by_name[f"blk.{L}.{TENSOR_CODES[c]}"]
        raw = t.data.view(np.uint8).reshape(-1)
        if e >= 0:
            per = raw.size // int(t.shape[-1])
            raw = raw[e * per:(e + 1) * per]
        check(hashlib.sha256(raw.tobytes()).digest() == h.tobytes(),
              f"{tg}: sha256 of {t.name} expert {e} is not that of the file's bytes\n"
              f"  repro: {repro}")
    picked = sorted(set(ids.ravel().tolist()))
    for c in (2, 3, 4):
        check(sorted(expert[code == c].tolist()) == picked, f"{tg}: slices of "
              f"{TENSOR_CODES[c]} {sorted(expert[code == c].tolist())}, picked {picked}")
    return n


def check_taps(g, where, cfg, T, x, ids, wts, y, repro):
    dim, inter = cfg["dim"], cfg["inter"]
    q8 = dataset(g, "x_q8", np.uint8, (T, dim // 32, 36), where, bf16="block_q8_1")
    # q = round(x / d) with d = amax / 127 in f32, d stored as f16 (relative error 2^-11):
    # |x - d16 q| <= d / 2 + 127 * 2^-11 d.
    d, xq = F.decode_q8_1(q8)
    xf = F.bf16_to_f32(x).astype(np.float64).reshape(T, dim // 32, 32)
    check_close(xq, xf, d * (0.5 + 127 * 2.0**-11) * (1 + 2.0**-10), f"{where}/x_q8 (d q "
                "against the input)", repro)
    acc = dataset(g, "acc", np.float32, (T, dim), where)
    at = F.first_bad(F.f32_to_bf16(acc) == y)
    check(at is None, f"{where}: output {at} is not acc rounded to bf16")
    groups = g["experts"]
    check(sorted(map(int, groups)) == sorted(set(ids.ravel().tolist())),
          f"{where}/experts: groups {sorted(groups)} are not the picked experts")
    seen = 0
    for name, e in groups.items():
        ew = f"{where}/experts/{name}"
        check(attr(e, "expert", "i8", ew) == int(name), f"{ew}: expert attribute")
        toks = e["tokens"][...]
        nt = len(toks)
        check(e["tokens"].dtype == np.int32 and bool(np.all(np.diff(toks) > 0)),
              f"{ew}/tokens: not ascending int32")
        for t, wt in zip(toks, dataset(e, "weights", np.float32, (nt,), ew)):
            pos = np.flatnonzero(ids[t] == int(name))
            check(len(pos) == 1 and wts[t, pos[0]] == wt, f"{ew}: token {t} did not pick it "
                  f"with that weight")
        for s, cols in (("gate", inter), ("up", inter), ("h", inter), ("down", dim)):
            dataset(e, s, np.float32, (nt, cols), ew)
        dataset(e, "h_q8", np.uint8, (nt, inter // 32, 36), ew, bf16="block_q8_1")
        seen += nt
    check(seen == T * cfg["topk"], f"{where}/experts: {seen} token picks, expected {T} x topk")
    s = g["shared"]
    check(attr(s, "expert", "i8", f"{where}/shared") == -1, f"{where}/shared: expert attribute")
    check(list(s["tokens"][...]) == list(range(T)) and bool(np.all(s["weights"][...] == 1)),
          f"{where}/shared: not every token with weight 1")
    return len(groups)


def test_h5py_reads_moecheck_dumps(ctx):
    model = ctx.p("dump_model.gguf")
    ctx.moecheck("gen", "--preset", "tiny", "--layers", "2", "--seed", "1", "-o", model)
    reader = gguf.GGUFReader(model)
    md = {k: field_value(v) for k, v in reader.fields.items()}
    cfg = {k: md[key] for k, key in (
        ("dim", "deepseek2.embedding_length"), ("inter", "deepseek2.expert_feed_forward_length"),
        ("n_routed", "deepseek2.expert_count"), ("topk", "deepseek2.expert_used_count"),
        ("route_scale", "deepseek2.expert_weights_scale"), ("gate_temp", "moecheck.gate_temp"),
        ("score_func", "moecheck.score_func"), ("norm_topk_prob", "deepseek2.expert_weights_norm"))}
    outs = {}
    for taps in (False, True):
        path = ctx.p(f"emu{'_taps' if taps else ''}.h5")
        extra = ["--taps"] if taps else []
        rj = ctx.moecheck_json("run", "--impl", "emu", "--model", model, "--tokens", "8", *extra,
                               "-o", path)
        repro = (f"{ctx.moecheck_bin} run --impl emu --model {model} --tokens 8 "
                 f"{' '.join(extra)} -o {path}")
        with h5py.File(path, "r") as f:
            check_root(f, path, model, reader, taps, rj)
            for li, L in enumerate((0, 1)):
                where = f"{path}:/layers/{L}"
                g = f[f"layers/{L}"]
                l2 = rj["layers"][li]["output_l2"]
                x, ids, wts, y = check_layer(g, where, cfg, 8, reader, l2, repro)
                hashed = check_provenance(g, where, reader, L, ids, repro)
                outs.setdefault(L, []).append((x, ids, y))
                if taps:
                    n = check_taps(g, where, cfg, 8, x, ids, wts, y, repro)
                    print(f"  {where}: {hashed} sha256 slices, {n} expert groups and shared "
                          "checked")
                else:
                    for s in ("x_q8", "acc", "experts", "shared"):
                        check(s not in g, f"{where}/{s}: present without --taps\n  repro: {repro}")
    for L, (plain, tapped) in outs.items():
        check(all(np.array_equal(a, b) for a, b in zip(plain, tapped)),
              f"layer {L}: --taps changed the input, picks or output bits")


TESTS = [test_gguf_py_reads_moecheck_models, test_moecheck_runs_gguf_py_models,
         test_h5py_reads_moecheck_dumps, test_moecheck_runs_gguf_py_conventions]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--moecheck", required=True, type=pathlib.Path)
    ap.add_argument("--probe", required=True, type=pathlib.Path)
    ap.add_argument("--work", required=True, type=pathlib.Path)
    a = ap.parse_args()
    for b in (a.moecheck, a.probe):
        check(os.access(b, os.X_OK), f"{b} is not built (cmake --build build)")
    shutil.rmtree(a.work, ignore_errors=True)
    a.work.mkdir(parents=True)
    ctx, failed = Ctx(a.moecheck, a.probe, a.work), 0
    for t in TESTS:
        print(f"[ RUN  ] {t.__name__}", flush=True)
        try:
            t(ctx)
            print(f"[  OK  ] {t.__name__}", flush=True)
        except Exception:  # every failure is reported, then the next check runs
            failed += 1
            print(f"[FAILED] {t.__name__}\n{traceback.format_exc()}", flush=True)
    print(f"interop: {len(TESTS) - failed} passed, {failed} failed")
    if not failed:
        shutil.rmtree(a.work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
