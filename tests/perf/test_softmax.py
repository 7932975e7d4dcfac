"""Attention lasts at least as long as its exponentials take on the special function units."""

from compiler.perf.predict import system_ops

EXPS = 64 * 32768 * 32769 / 2  # 64 query heads over a causal 32K prompt


def _bound_us(ops) -> float:
    return EXPS / (ops.system.gpu.exp_tera_per_s.value * 1e6)


def test_the_exponent_rate_bounds_a_projected_attention():
    """Vera Rubin's curves are GB300's carried onto Rubin's datasheet peaks (assumed): at head
    dim 64 that projection outruns Rubin's special function units, which then set the time;
    at head dim 128 the products are slower and the SFUs keep up."""
    rubin = system_ops("vera-rubin-nvl72")
    assert rubin.attn_prefill("bf16", 32768, 64, 8, 64, True) == _bound_us(rubin)
    assert rubin.attn_prefill("bf16", 32768, 64, 8, 128, True) > _bound_us(rubin)


def test_measured_curves_are_matmul_bound():
    """The H200's and GB200's measured attention (head dim 128) is slower than their SFUs'
    bound: the bound leaves the calibrated curves as they are."""
    for name in ("hgx-h200", "gb200-nvl72"):
        ops = system_ops(name)
        assert ops.attn_prefill("bf16", 32768, 64, 8, 128, True) > _bound_us(ops)
