"""Helpers of the interop test (tests/interop/interop_test.py), written from moecheck's documents
(docs/gguf.md, docs/golden-format.md, docs/reference.md) and independent of moecheck's code:
bf16 and q8_1 decoding, random valid Q2_K / Q3_K blocks, the documented metadata keys and
tensors of a layer, and the f32 dot-product error bound the value checks use."""

import numpy as np

QK_K = 256
Q2K_BYTES = 84  # scales[16] qs[64] d(f16) dmin(f16)
Q3K_BYTES = 110  # hmask[32] qs[64] scales[12] d(f16)
U32 = 2.0**-24  # f32 unit roundoff
U_BF16 = 2.0**-8  # bf16 unit roundoff

# docs/gguf.md "Metadata keys": key -> (GGUF value type, required).
DOC_KEYS = {
    "general.architecture": ("string", True),
    "general.alignment": ("uint32", False),
    "general.quantization_version": ("uint32", False),
    "general.name": ("string", False),
    "deepseek2.block_count": ("uint32", True),
    "deepseek2.embedding_length": ("uint32", True),
    "deepseek2.expert_feed_forward_length": ("uint32", True),
    "deepseek2.expert_count": ("uint32", True),
    "deepseek2.expert_used_count": ("uint32", True),
    "deepseek2.expert_shared_count": ("uint32", True),
    "deepseek2.expert_weights_scale": ("float32", True),
    "deepseek2.expert_weights_norm": ("bool", True),
    "deepseek2.expert_gating_func": ("uint32", False),
    "moecheck.score_func": ("string", True),
    "moecheck.swiglu_limit": ("float32", True),
    "moecheck.gate_temp": ("float32", False),
    "moecheck.generator.seed": ("uint64", False),
    "moecheck.generator.preset": ("string", False),
    "moecheck.generator.version": ("uint32", False),
    "moecheck.generator.fast_blocks": ("bool", False),
}


def layer_tensors(layer, dim, inter, n_routed, shared_type="BF16", vision=False):
    """docs/gguf.md "Tensors of layer N": name -> (ggml type name, ne in ggml order)."""
    sq, sd = ("Q2_K", "Q3_K") if shared_type == "kquant" else ("BF16", "BF16")
    b = f"blk.{layer}."
    t = {
        b + "ffn_gate_inp.weight": ("BF16", [dim, n_routed]),
        b + "exp_probs_b.bias": ("F32", [n_routed]),
        b + "ffn_gate_exps.weight": ("Q2_K", [dim, inter, n_routed]),
        b + "ffn_up_exps.weight": ("Q2_K", [dim, inter, n_routed]),
        b + "ffn_down_exps.weight": ("Q3_K", [inter, dim, n_routed]),
        b + "ffn_gate_shexp.weight": (sq, [dim, inter]),
        b + "ffn_up_shexp.weight": (sq, [dim, inter]),
        b + "ffn_down_shexp.weight": (sd, [inter, dim]),
    }
    if vision:
        t[b + "exp_probs_b_vl.bias"] = ("F32", [n_routed])
    return t


def bf16_to_f32(u16):
    return (np.asarray(u16, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(f32):
    """Round to nearest even (finite values), as bit patterns."""
    u = np.asarray(f32, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def f16_bytes(x):
    """Positive scales as little-endian f16 bytes [n, 2], at least f16's smallest normal."""
    h = np.maximum(np.asarray(x, dtype=np.float64), 2.0**-14).astype("<f2")
    return h.view(np.uint8).reshape(-1, 2)


def random_q2k(rng, n_blocks, sigma):
    """docs/gguf.md section 5, random-valid Q2_K: random scales and quants, d = f16(a u),
    dmin = f16(1.5 a u'), u, u' uniform in [0.5, 1.5), a = sigma / 14."""
    b = np.empty((n_blocks, Q2K_BYTES), dtype=np.uint8)
    b[:, :80] = rng.integers(0, 256, size=(n_blocks, 80), dtype=np.uint8)
    a = sigma / 14
    b[:, 80:82] = f16_bytes(a * rng.uniform(0.5, 1.5, n_blocks))
    b[:, 82:84] = f16_bytes(1.5 * a * rng.uniform(0.5, 1.5, n_blocks))
    return b


def random_q3k(rng, n_blocks, sigma):
    """Random-valid Q3_K: random hmask, quants and 6-bit scales, d = f16(a u), a = sigma / 43."""
    b = np.empty((n_blocks, Q3K_BYTES), dtype=np.uint8)
    b[:, :108] = rng.integers(0, 256, size=(n_blocks, 108), dtype=np.uint8)
    b[:, 108:110] = f16_bytes(sigma / 43 * rng.uniform(0.5, 1.5, n_blocks))
    return b


def decode_q8_1(blocks):
    """block_q8_1 bytes [..., 36] (d f16, s f16, 32 x int8) -> (d [..., 1], values [..., 32])."""
    b = np.ascontiguousarray(blocks)
    d = b[..., 0:2].copy().view("<f2").astype(np.float64)
    q = b[..., 4:36].copy().view(np.int8).astype(np.float64)
    return d, d * q


def dot_bound(x, w, n):
    """|f32 sum of n products - exact| <= n u sum |x w| (any summation order), per element of
    x @ w.T; x [T, n], w [R, n] in f64."""
    return n * U32 * (np.abs(x) @ np.abs(w).T)


def first_bad(ok):
    """The first index (row-major) where the boolean array `ok` is False, as a tuple."""
    flat = np.flatnonzero(~np.asarray(ok).ravel())
    return None if flat.size == 0 else np.unravel_index(flat[0], np.shape(ok))
