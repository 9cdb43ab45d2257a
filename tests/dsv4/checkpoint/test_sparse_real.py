"""Full-size sparse checkpoints of the real releases: every real name, shape, dtype and offset, no
weights (holes in sparse files). The tensor counts and byte totals are the published ones (release
records of the April / 0731 / 0813 checkpoints: the indexes' tensor counts and total sizes)."""
from __future__ import annotations

import json

import pytest

from dsv4.checkpoint import open_checkpoint
from dsv4.checkpoint.sparse import DTYPE_BYTES, expected_tensors, main as sparse_main, sparse_checkpoint
from dsv4.config import preset

# (preset, layout) -> (tensors in the published index, total_size bytes or None when not published to us)
PUBLISHED = {
    ("flash", "official"): (69_187, None),
    ("flash-0731", "official-dspark"): (72_317, 166_878_536_440),
    ("pro", "official"): (145_116, None),
    ("pro-0813", "official-dspark"): (149_782, 892_727_580_904),
}


pytestmark = pytest.mark.slow   # slow: real-shaped layers streamed (~50 s)


def _bytes(t):
    n = 0
    for dtype, shape in t.values():
        k = DTYPE_BYTES[dtype]
        for d in shape:
            k *= d
        n += k
    return n


@pytest.mark.parametrize("key", list(PUBLISHED), ids=lambda k: f"{k[0]}-{k[1]}")
def test_expected_tensor_set_matches_the_published_index(key):
    names, total = PUBLISHED[key]
    t = expected_tensors(preset(key[0]), key[1])
    assert len(t) == names
    if total is not None:
        assert _bytes(t) == total


@pytest.fixture(scope="module")
def flash_0731(tmp_path_factory):
    out = tmp_path_factory.mktemp("sparse") / "flash-0731"
    return sparse_checkpoint(preset("flash-0731"), "official-dspark", out)


def test_sparse_flash_0731_opens_validates_and_reads_lazily(flash_0731):
    on_disk = sum(f.stat().st_blocks * 512 for f in flash_0731.iterdir())
    apparent = sum(f.stat().st_size for f in flash_0731.iterdir())
    assert apparent > 1.6e11 and on_disk < 64e6        # 167 GB promised, a few MB of headers on disk
    r = open_checkpoint(flash_0731)
    assert r.flavor == "official-dspark" and r.config.dspark_stages == 3
    assert len(r.tensor_names()) == 72_317
    w = r.weight("ffn.experts.255.w2", 42)
    assert tuple(w.tensors["weight"].shape) == (4096, 1024) and w.fmt.kind == "mxfp4"
    assert float(w.tensors["weight"].abs().max()) == 0.0   # holes read as zeros
    assert tuple(r.get_tensor("mtp.2.markov_head.markov_w1.weight").shape) == (129280, 256)


def test_dry_run_plans_flash_0731_on_one_h200_and_eight_b200(flash_0731, tmp_path):
    from parity.first_token import main

    one = tmp_path / "one.json"
    assert main(["--checkpoint", str(flash_0731), "--dry-run", "--device", "cuda:0", "--json", str(one)]) == 0
    est = json.loads(one.read_text())["dry_run"]
    assert set(est["peak_per_device"]) == {"cuda:0"}
    c = preset("flash-0731")
    dmap = {"embed": "cuda:0", "head": "cuda:7", **{str(i): f"cuda:{i * 8 // c.num_hidden_layers}"
                                                    for i in range(c.num_hidden_layers)}}
    eight = tmp_path / "eight.json"
    assert main(["--checkpoint", str(flash_0731), "--dry-run", "--device-map", json.dumps(dmap),
                 "--json", str(eight)]) == 0
    est8 = json.loads(eight.read_text())["dry_run"]
    assert len(est8["peak_per_device"]) == 8
    assert max(est8["peak_per_device"].values()) < est["peak_per_device"]["cuda:0"] / 4


def test_sparse_cli_writes_published_headers(tmp_path):
    headers = {"model-00001-of-00001.safetensors": {
        "embed.weight": {"dtype": "BF16", "shape": [512, 256]}, "__metadata__": {"format": "pt"}}}
    f = tmp_path / "h.json"
    f.write_text(json.dumps(headers))
    assert sparse_main(["--preset", "tiny", "--headers", str(f), "--out", str(tmp_path / "o")]) == 0
    idx = json.loads((tmp_path / "o" / "model.safetensors.index.json").read_text())
    assert idx["weight_map"] == {"embed.weight": "model-00001-of-00001.safetensors"}
    assert sparse_main(["--preset", "tiny", "--headers", str(tmp_path / "none.json"), "--out", str(tmp_path)]) == 2


def _layers_on_zeros(path, layers):
    """Real-shaped layers of the streaming reference on zero weights and zero activations."""
    import torch

    from dsv4.config import layer_devices
    from reference.model import ReferenceModel
    from reference.profiles import get_profile

    r = open_checkpoint(path)
    m = ReferenceModel(r, profile=get_profile("bf16"), dtype=torch.bfloat16,
                       devices=layer_devices(r.config, "cpu", None), cache_weights=False)
    ids = torch.arange(8)
    state = m.new_state(ids)
    x = torch.zeros(8, r.config.hc_mult, r.config.hidden_size, dtype=torch.bfloat16)
    out = {}
    for i in layers:
        y = m.layer(i, x, state)
        out[r.config.layer_kind(i)] = (tuple(y.shape), bool(torch.isfinite(y).all()))
    return out


def test_real_shaped_layers_of_flash_0731_stream_through_the_reference(flash_0731):
    got = _layers_on_zeros(flash_0731, (0, 2, 3))
    assert got == {k: ((8, 4, 4096), True) for k in ("window", "csa", "hca")}


@pytest.mark.parametrize("flavor", ["nvidia-nvfp4", "hf", "compressed-tensors"])
def test_a_real_shaped_csa_layer_of_the_other_layouts_streams(tmp_path, flavor):
    from dsv4.checkpoint.verify import scan_values

    ck = sparse_checkpoint(preset("flash"), flavor, tmp_path / flavor)
    r = open_checkpoint(ck)
    assert r.flavor == flavor
    scalars = [n for n in r.tensor_names() if n.endswith(("weight_scale_2", "weight_global_scale"))]
    assert not scan_values(_Only(r, scalars))                        # scales read 1.0, never 0
    assert bool(scalars) == (flavor != "hf")                         # hf: BF16 fused experts
    assert _layers_on_zeros(ck, (2,)) == {"csa": ((8, 4, 4096), True)}


class _Only:
    """A reader view restricted to some tensors (the scan of a few names of a 160 GB checkpoint)."""

    def __init__(self, reader, names):
        self._r, self._names, self.config = reader, names, reader.config

    def tensor_names(self):
        return self._names

    def __getattr__(self, name):
        return getattr(self._r, name)
