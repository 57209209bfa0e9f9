"""Eviction presses against hand-computed cases (kvpress 0.5.5's definitions)."""

import math

import numpy as np
import pytest
import torch

from kvlib.cache.layout import cache_layers, make_cache
from kvlib.transforms.evict import PRESSES, SnapKV, kept_count, make_press, ratio_at_bits


def cache_of(keys, values=None):
    k = torch.as_tensor(keys, dtype=torch.float32)
    v = torch.as_tensor(values, dtype=torch.float32) if values is not None else k.clone() * 10
    return make_cache([(k, v)])


def kept(press, cache, queries=None):
    out, m = press(cache, queries)
    k, _ = cache_layers(out.cache)[0]
    return k, m, out


def test_registry_names_the_three_presses():
    assert set(PRESSES) == {"streaming_llm", "knorm", "snapkv"}
    with pytest.raises(ValueError, match="not an eviction press.*knorm"):
        make_press("h2o", 0.5)
    with pytest.raises(ValueError, match="compression ratio 1"):
        make_press("knorm", 1.0)


def test_kept_count_is_kvpress_int_truncation():
    assert kept_count(10, 0.5) == 5
    assert kept_count(4096, 1 - 4.25 / 16) == int(4096 * (4.25 / 16)) == 1088
    assert kept_count(7, 0.9) == 1  # compute_n_kept clamps to one token
    assert kept_count(90, 0.3) == 62  # float truncation, as kvpress computes it
    assert ratio_at_bits(4.25) == pytest.approx(0.734375)
    assert ratio_at_bits(32) == 0.0


def test_streaming_llm_keeps_sinks_and_the_recent_tokens():
    # T = 10, ratio 0.5: 5 kept = the 4 sinks and the last token; position values identify tokens.
    keys = torch.arange(10.0).view(1, 1, 10, 1).expand(1, 2, 10, 3).clone()
    k, m, out = kept(make_press("streaming_llm", 0.5), cache_of(keys))
    assert k[0, 0, :, 0].tolist() == [0, 1, 2, 3, 9]
    assert k[0, 1, :, 0].tolist() == [0, 1, 2, 3, 9]
    assert (m.context_tokens, m.kept_tokens, out.seen) == (10, 5, 10)
    assert m.bytes_bf16 == 2 * (2 * 5 * 3) * 2  # K and V, 2 heads x 5 tokens x 3 dims, 2 bytes


def test_knorm_keeps_the_smallest_key_norms_per_head():
    rng = np.random.default_rng(0)
    keys = rng.normal(size=(1, 2, 8, 4)).astype(np.float32)
    k, m, _ = kept(make_press("knorm", 0.75), cache_of(keys))  # int(8 * 0.25) = 2 kept
    for h in range(2):
        want = sorted(np.argsort(np.linalg.norm(keys[0, h], axis=-1))[:2])
        assert k[0, h].numpy().tolist() == keys[0, h, want].tolist()
    assert m.kept_tokens == 2


def test_values_follow_their_keys():
    keys = torch.arange(6.0).view(1, 1, 6, 1).expand(1, 1, 6, 2).clone()
    values = -keys[..., :1] * 100
    out, _ = make_press("knorm", 0.5)(cache_of(keys, values))
    k, v = cache_layers(out.cache)[0]
    assert (v[..., 0] == -k[..., 0] * 100).all()
    assert k[0, 0, :, 0].tolist() == [0, 1, 2]


class TinySnapKV(SnapKV):
    name = "snapkv_tiny_test"
    window = 2
    kernel = 3


def snapkv_by_hand(keys, queries, window, kernel, n_kept):
    """The kvpress SnapKV score in plain NumPy loops, then the kept indices per KV head."""
    _, h_kv, t, d = keys.shape
    h_q = queries.shape[1]
    g = h_q // h_kv
    out = []
    for hk in range(h_kv):
        per_q = []
        for hq in range(hk * g, hk * g + g):
            rows = []
            for wi in range(window):
                qpos = t - window + wi  # the query's own position: keys after it are masked
                logits = [float(np.dot(queries[0, hq, wi], keys[0, hk, j])) / math.sqrt(d) if j <= qpos
                          else -math.inf for j in range(t)]
                e = np.exp(np.array(logits) - max(logits))
                rows.append((e / e.sum())[:t - window])
            mean = np.mean(rows, axis=0)
            padded = np.concatenate([[0.0] * (kernel // 2), mean, [0.0] * (kernel // 2)])
            per_q.append([padded[i:i + kernel].sum() / kernel for i in range(t - window)])
        s = np.mean(per_q, axis=0)
        out.append(s)
    allmax = max(max(s) for s in out) + 1
    scores = [np.concatenate([s, [allmax] * window]) for s in out]
    return [sorted(np.argsort(-s, kind="stable")[:n_kept].tolist()) for s in scores]


def test_snapkv_matches_a_hand_computation_with_gqa():
    rng = np.random.default_rng(3)
    keys = rng.normal(size=(1, 2, 9, 4)).astype(np.float32)
    queries = rng.normal(size=(1, 4, 2, 4)).astype(np.float32)  # 4 query heads over 2 KV heads
    press = TinySnapKV(0.5)  # int(9 * 0.5) = 4 kept: the 2 window tokens and the 2 best others
    k, m, _ = kept(press, cache_of(keys), [torch.from_numpy(queries)])
    want = snapkv_by_hand(keys, queries, 2, 3, 4)
    for h in range(2):
        assert k[0, h].numpy().tolist() == keys[0, h, want[h]].tolist()
        assert {7, 8} <= set(want[h])  # the observation window is always kept


def test_snapkv_without_queries_and_short_contexts_are_refused():
    keys = torch.zeros(1, 1, 3, 2)
    with pytest.raises(ValueError, match="needs the observation window"):
        make_press("snapkv", 0.5)(cache_of(keys))
    with pytest.raises(ValueError, match="not more than its window"):
        make_press("snapkv", 0.5)(cache_of(keys), [torch.zeros(1, 1, 3, 2)])
    with pytest.raises(ValueError, match="not more than its 4 sinks"):
        make_press("streaming_llm", 0.5)(cache_of(torch.zeros(1, 1, 4, 2)))
