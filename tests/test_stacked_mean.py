"""The vectorized backend's uploads as rows of one stack: ``aggregation.weighted_mean``'s one-product
path equals its per-client sum (and the exact float64 mean), rows in any order, falls back
where the rows are not each row of one stack once, and the finiteness check through a stack still catches a bad row."""
from __future__ import annotations

import torch

from fedlatent.federated.failures import all_finite, first_nonfinite
from fedlatent.methods.aggregation import stack_rows, weighted_mean
from fedlatent.methods.feddyn import FedDyn
from fedlatent.methods.fednova import FedNova
from fedlatent.methods.parts import Upload


def _uploads(rows: list[dict[str, torch.Tensor]], sizes: list[int]) -> list[Upload]:
    return [Upload(c, state, n, 1, 0.1, 0.0, {}, {"train_loss": 0.0}) for c, (state, n) in enumerate(zip(rows, sizes))]


def _stacked(clients: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(clients, 4, 3, generator=g), "b": torch.randn(clients, 3, generator=g),
            "d": torch.randn(clients, 2, generator=g, dtype=torch.float64),
            "count": torch.arange(clients, dtype=torch.int64) * 7}


def test_rows_of_a_stack_average_in_one_product_to_the_weighted_mean() -> None:
    stack, sizes = _stacked(6), [14, 15, 14, 3, 20, 15]
    rows = [{k: v[c] for k, v in stack.items()} for c in range(6)]
    assert stack_rows([r["w"] for r in rows]) is not None  # the one-product path is taken
    fast = weighted_mean(_uploads(rows, sizes))
    slow = weighted_mean(_uploads([{k: v.clone() for k, v in r.items()} for r in rows], sizes))
    exact = {k: (v.double() * torch.tensor(sizes, dtype=torch.float64).view(-1, *[1] * (v.dim() - 1))).sum(0)
             / sum(sizes) for k, v in stack.items()}
    for key in ("w", "b"):
        assert fast[key].dtype == torch.float32 and fast[key].shape == stack[key].shape[1:]
        assert torch.allclose(fast[key].double(), exact[key], atol=1e-6, rtol=0)
        assert torch.allclose(fast[key], slow[key], atol=1e-6, rtol=0)
    assert fast["d"].dtype == torch.float64 and torch.allclose(fast["d"], exact["d"], atol=1e-14, rtol=0)
    assert fast["count"].dtype == torch.int64 and torch.equal(fast["count"], slow["count"])


def test_rows_in_any_order_average_in_one_product_and_a_subset_takes_the_per_client_mean() -> None:
    stack, sizes = _stacked(4), [1, 2, 3, 4]
    rows = [{k: v[c] for k, v in stack.items()} for c in range(4)]
    for chosen in ([3, 2, 1, 0], [0, 1, 2], [0, 2, 1, 3], [1, 1, 2, 3]):
        picked = [rows[c] for c in chosen]
        found = stack_rows([r["w"] for r in picked])
        whole = sorted(chosen) == [0, 1, 2, 3]  # each row once: one product, the weights by row
        assert (found is not None) == whole and (not whole or found[1] == chosen)
        got = weighted_mean(_uploads(picked, [sizes[c] for c in chosen]))
        want = weighted_mean(_uploads([{k: v.clone() for k, v in r.items()} for r in picked],
                                      [sizes[c] for c in chosen]))
        for key in ("w", "b"):
            assert torch.allclose(got[key], want[key], atol=1e-6, rtol=0)
    # the weights belong to the uploads: swapping the sizes changes the mean
    swapped = weighted_mean(_uploads(rows, sizes[::-1]))
    assert not torch.allclose(swapped["w"], weighted_mean(_uploads(rows, sizes))["w"])
    # rows of a transposed stack are not rows of its base: the per-client mean
    assert stack_rows(list(torch.randn(3, 4).t().contiguous().t().unbind(0))) is None


def test_a_non_finite_row_of_a_stack_is_found_and_named() -> None:
    stack = _stacked(5)
    rows = [{k: v[c] for k, v in stack.items()} for c in range(5)]
    assert all_finite(rows)
    stack["b"][3, 1] = float("nan")
    assert not all_finite(rows)
    assert not all_finite(rows[:2])  # stricter: the stack is checked as a whole, so callers search
    assert [first_nonfinite(r) for r in rows] == [None, None, None, "b", None]


def test_explicit_coefficients_sum_rows_and_copies_alike() -> None:
    """weighted_mean(..., weights=c): Σ_k c_k · w_k (FedNova's p_k/a_k, FedDyn's 1/K) by hand, on
    rows of a stack in any order and on copies, integer buffers rounded back."""
    stack, coeffs = _stacked(4), [0.5, -1.0, 2.0, 0.25]
    order = [2, 0, 3, 1]
    rows = [{k: v[c] for k, v in stack.items()} for c in order]
    fast = weighted_mean(_uploads(rows, [1] * 4), weights=coeffs)
    slow = weighted_mean(_uploads([{k: v.clone() for k, v in r.items()} for r in rows], [1] * 4), weights=coeffs)
    for key in ("w", "b", "d"):
        want = sum(c * stack[key][r].double() for c, r in zip(coeffs, order))
        assert fast[key].dtype == stack[key].dtype
        torch.testing.assert_close(fast[key].double(), want, rtol=0, atol=1e-5)
        torch.testing.assert_close(slow[key], fast[key], rtol=0, atol=1e-5)
    assert int(fast["count"]) == round(sum(c * 7 * r for c, r in zip(coeffs, order))) == int(slow["count"])


def test_fednova_and_feddyn_aggregate_rows_of_a_stack_as_they_aggregate_copies() -> None:
    """Both replace the server's mean and sum through weighted_mean: the vectorized backend's rows
    and the simulation backend's separate tensors give the same model (float64: to 1e-12), in
    the uploads' key order."""
    g = torch.Generator().manual_seed(5)
    stack = {"w": torch.randn(5, 3, 2, generator=g, dtype=torch.float64),
             "bn": torch.randn(5, 2, generator=g, dtype=torch.float64)}
    old = {k: v[0] + 0.1 for k, v in stack.items()}
    extras = [{"feddyn": {"w": torch.full((3, 2), 0.01 * c, dtype=torch.float64)}} for c in range(5)]

    def uploads(copy: bool) -> list[Upload]:
        return [Upload(c, {k: v[c].clone() if copy else v[c] for k, v in stack.items()}, 10 + c, 1 + c % 3, 0.1, 0.9,
                       extras[c], {"train_loss": 0.0}) for c in range(5)]

    for part in (FedNova(), FedDyn(0.1)):
        state_rows, state_copies = {}, {}
        got = part.aggregate(old, uploads(False), state_rows, {"w"}, num_clients=8)
        want = part.aggregate(old, uploads(True), state_copies, {"w"}, num_clients=8)
        assert list(got) == list(want) == ["w", "bn"]
        for key in got:
            torch.testing.assert_close(got[key], want[key], rtol=0, atol=1e-12)
        torch.testing.assert_close(got["bn"], weighted_mean(uploads(True), ["bn"])["bn"], rtol=0, atol=1e-12)
