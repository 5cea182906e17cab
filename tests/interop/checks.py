"""Checks shared by the interop test's parts (tests/interop/interop_test.py): assertions that
say what differs and how to reproduce it, gguf-py field values and dequantised weights, the
routing rule of docs/reference.md recomputed in f64, and HDF5 attributes and datasets read by the
names and types of docs/golden-format.md."""

import gguf
import numpy as np

import formats as F


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def check_close(got, want, bound, what, repro):
    got, want, bound = np.broadcast_arrays(np.asarray(got, np.float64), want, bound)
    at = F.first_bad(np.abs(got - want) <= bound)
    if at is not None:
        raise AssertionError(f"{what}: element {tuple(map(int, at))}: got {got[at]!r}, "
                             f"recomputed {want[at]!r}, |diff| {abs(got[at] - want[at]):.3g} > "
                             f"bound {bound[at]:.3g}\n  repro: {repro}")


def field_value(f):
    v = f.contents()
    return float(v) if isinstance(v, (np.floating, float)) else v


def weights(reader, name):
    t = next(t for t in reader.tensors if t.name == name)
    return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float64)


def route(logits, bias, cfg):
    """docs/reference.md "Rounding points": scores of logits / gate_temp, keys score + bias, the
    top-k keys, weights the picked scores normalised and scaled, in f64."""
    z = logits.astype(np.float64) / cfg["gate_temp"]
    f = cfg["score_func"]
    s = (np.sqrt(np.logaddexp(0, z)) if f == "sqrtsoftplus" else 1 / (1 + np.exp(-z))
         if f == "sigmoid" else np.exp(z - z.max(1, keepdims=True)))
    if f == "softmax":
        s /= s.sum(1, keepdims=True)
    keys = s + bias.astype(np.float64)
    order = np.argsort(-keys, axis=1, kind="stable")
    k = cfg["topk"]
    kth = np.take_along_axis(keys, order[:, k - 1:k + 1], 1)
    ids = order[:, :k]
    wts = np.take_along_axis(s, ids, 1)
    if cfg.get("norm_topk_prob", True):
        wts = wts / (wts.sum(1, keepdims=True) + 1e-20)
    return ids, wts * cfg["route_scale"], kth[:, 0] - kth[:, 1]


def check_routing(ids, wts, logits, bias, cfg, repro):
    """Tokens whose top-k boundary margin exceeds 1e-4 (far beyond f32 score error) must pick
    the same experts; their weights agree within 1e-5 relative."""
    want_ids, want_w, margin = route(logits, bias, cfg)
    clear = margin > 1e-4
    check(clear.sum() >= len(margin) // 2, f"only {clear.sum()} of {len(margin)} tokens have a "
          f"clear top-k margin: the routing check would be empty\n  repro: {repro}")
    for t in np.flatnonzero(clear):
        check(sorted(ids[t]) == sorted(want_ids[t]), f"token {t}: picks {list(ids[t])}, "
              f"recomputed {list(want_ids[t])} (margin {margin[t]:.3g})\n  repro: {repro}")
        got = dict(zip(ids[t], wts[t]))
        want = np.array([got[e] for e in want_ids[t]], dtype=np.float64)
        check_close(want, want_w[t], 1e-5 * np.abs(want_w[t]), f"token {t} weights", repro)
    return int(clear.sum())


def attr(obj, name, kind, where):
    """An attribute by its documented name and type class: 'i8' int64, 'u8' uint64, 'f4'
    float32, 'S' fixed-size string (returned decoded), 'i4[]' an int32 array."""
    check(name in obj.attrs, f"{where}: attribute {name} missing")
    dt = obj.attrs.get_id(name).dtype
    ok = dt.kind == "S" if kind == "S" else dt == np.dtype(kind.removesuffix("[]"))
    check(ok, f"{where}: attribute {name} has type {dt}, docs/golden-format.md says {kind}")
    v = obj.attrs[name]
    return v.decode() if kind == "S" else v


def dataset(g, name, dtype, shape, where, bf16=None):
    path = f"{where}/{name}"
    check(name in g, f"{path} missing")
    d = g[name]
    check(d.dtype == np.dtype(dtype) and d.shape == tuple(shape),
          f"{path}: {d.dtype} {d.shape}, docs/golden-format.md says {dtype} {tuple(shape)}")
    if bf16 is not None:
        check(attr(d, "dtype", "S", path) == bf16, f"{path}: dtype attribute is not {bf16}")
    return d[...]
