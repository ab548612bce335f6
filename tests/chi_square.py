"""Chi-square tests without scipy (the README's set-up does not install it): the same p-values as
scipy.stats.chisquare and chi2_contingency, through the regularized upper incomplete gamma
function torch has (the chi-square survival function: P(X > x) = Q(df / 2, x / 2))."""

from __future__ import annotations

from typing import Sequence

import torch


def survival(statistic: float, df: int) -> float:
    """P(X > statistic) for X chi-square with `df` degrees of freedom."""
    if df <= 0:
        return 1.0
    a, x = (
        torch.tensor(df / 2, dtype=torch.float64),
        torch.tensor(statistic / 2, dtype=torch.float64),
    )
    return float(torch.special.gammaincc(a, x))


def goodness_p(observed: Sequence[float], expected: Sequence[float]) -> float:
    """scipy.stats.chisquare(observed, expected).pvalue: counts against expected counts of the
    same total, len - 1 degrees of freedom."""
    o = torch.as_tensor(observed, dtype=torch.float64)
    e = torch.as_tensor(expected, dtype=torch.float64)
    return survival(float(((o - e) ** 2 / e).sum()), len(o) - 1)


def contingency_p(table: Sequence[Sequence[float]]) -> float:
    """scipy.stats.chi2_contingency(table)[1]: independence of rows and columns, expected counts
    from the margins, (r - 1)(c - 1) degrees of freedom, and Yates' continuity correction where
    that is 1 (each |observed - expected| made smaller by up to 0.5), as scipy does by default."""
    o = torch.as_tensor(table, dtype=torch.float64)
    e = o.sum(1, keepdim=True) * o.sum(0, keepdim=True) / o.sum()
    df = (o.shape[0] - 1) * (o.shape[1] - 1)
    if df == 1:
        diff = e - o
        o = o + torch.sign(diff) * diff.abs().clamp(max=0.5)
    return survival(float(((o - e) ** 2 / e).sum()), df)
