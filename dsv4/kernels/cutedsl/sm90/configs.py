"""Tile-shape choice for the sm_90a NVFP4 GEMM (pure Python: unit-testable without a GPU).

Decode-sized problems use ``swap`` (64 weight rows on the WGMMA M side, the few tokens on N) and
split-K so that enough CTAs stream the weights; prefill-sized ones use 128x128 tiles with two
warpgroups. Split counts are chosen so that every split owns at least one k-tile.
"""
from __future__ import annotations

from dataclasses import dataclass

from .gemm_kernel import GemmConfig

DECODE_Q_TILES = (8, 16, 32, 64)
MAX_SPLITS = 16
CTAS_PER_SM = 2  # decode configs use < 100 KB of shared memory


@dataclass(frozen=True)
class Launch:
    cfg: GemmConfig
    grid_x: int
    grid_y: int
    splits: int

    @property
    def tiles(self) -> int:
        return self.grid_x * self.grid_y

    @property
    def workspace_floats(self) -> int:
        return self.tiles * self.splits * self.cfg.p_tile * self.cfg.q_tile if self.splits > 1 else 0


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _vec(k: int) -> int:
    return 16 if k % 32 == 0 else 8


def decode_config(q_tile: int, *, grouped: bool, swiglu: bool, k: int) -> GemmConfig:
    return GemmConfig(swap=True, p_tile=64, q_tile=q_tile, bk=128,
                      raw_stages=6 if q_tile <= 16 else 4, f16_stages=2, grouped=grouped,
                      swiglu=swiglu, split=True, vec_bytes=_vec(k))


def prefill_config(p_tile: int, *, grouped: bool, swiglu: bool, k: int) -> GemmConfig:
    return GemmConfig(swap=False, p_tile=p_tile, q_tile=128, bk=64, raw_stages=4,
                      f16_stages=3 if p_tile == 128 else 2, grouped=grouped, swiglu=swiglu,
                      split=False, vec_bytes=_vec(k))


def _splits(base_ctas: int, k: int, bk: int, num_sms: int) -> int:
    k_tiles = _cdiv(k, bk)
    want = _cdiv(CTAS_PER_SM * num_sms, max(base_ctas, 1))
    s = max(1, min(want, MAX_SPLITS, max(k_tiles // 2, 1)))
    per = _cdiv(k_tiles, s)
    return _cdiv(k_tiles, per)  # no empty split


def dense_launch(m: int, n: int, k: int, *, swiglu: bool, num_sms: int) -> Launch:
    """``m`` tokens, ``n`` weight rows (``[gate; up]`` when ``swiglu``), ``k`` reduction length."""
    n_cols = n // 2 if swiglu else n
    if m <= DECODE_Q_TILES[-1]:
        q = next(t for t in DECODE_Q_TILES if t >= m)
        cfg = decode_config(q, grouped=False, swiglu=swiglu, k=k)
        gx, gy = _cdiv(m, q), _cdiv(n_cols, cfg.col_tile)
        return Launch(cfg, gx, gy, _splits(gx * gy, k, cfg.bk, num_sms))
    cfg = prefill_config(128, grouped=False, swiglu=swiglu, k=k)
    return Launch(cfg, _cdiv(m, cfg.token_tile), _cdiv(n_cols, cfg.col_tile), 1)


def grouped_launch(m_total: int, num_experts: int, n: int, k: int, *, swiglu: bool,
                   num_sms: int) -> Launch:
    """Token tiles are scheduled on the device from the offsets; ``grid_x`` bounds their count
    without reading the offsets: sum_e ceil(m_e / t) <= m_total // t + min(E, m_total)."""
    n_cols = n // 2 if swiglu else n
    avg = m_total / max(num_experts, 1)
    if avg <= 16 or m_total <= 64:
        q = 8 if avg <= 4 else 16
        cfg = decode_config(q, grouped=True, swiglu=swiglu, k=k)
    else:
        cfg = prefill_config(64 if avg <= 96 else 128, grouped=True, swiglu=swiglu, k=k)
    tt = cfg.token_tile
    gx = m_total // tt + min(num_experts, m_total)
    gy = _cdiv(n_cols, cfg.col_tile)
    splits = _splits(gx * gy, k, cfg.bk, num_sms) if cfg.split else 1
    return Launch(cfg, gx, gy, splits)
